//! Envoy's RBAC at run time: what a request or a connection is checked against.
//!
//! [`rules`] decides for one [`Facts`] view what the compiled policies (`config::rbac::rules`)
//! say; [`Engines`] pairs the enforced rules with the shadow rules into a [`Verdict`], which [`Stats`] counts as Envoy's
//! `rbac.allowed|denied|shadow_allowed|shadow_denied`; [`network`] is
//! `envoy.filters.network.rbac` on a listener's filter chain.

pub mod network;
pub mod rules;

use std::net::{IpAddr, SocketAddr};

use crate::route::RouteRequest;
use crate::stats::{Counter, Store};
use crate::tls::PeerTls;

pub use crate::config::rbac::rules::{Engines, Rules};
pub use rules::Decision;

/// What is known about the request or connection being checked.
#[derive(Clone, Copy)]
pub struct Facts<'a> {
    /// The request (`None` for a connection: no headers, no path).
    pub request: Option<&'a RouteRequest<'a>>,
    /// The downstream local address (after an `original_dst` restore).
    pub local: SocketAddr,
    /// The connection's peer address (`source_ip`).
    pub source: IpAddr,
    /// The downstream's direct peer address (`direct_remote_ip`).
    pub direct_remote: IpAddr,
    /// The downstream's address as the connection manager reckons it from
    /// `x-forwarded-for` (`remote_ip`; the peer's on a connection).
    pub remote: IpAddr,
    /// The connection's TLS, when it is TLS (with or without a client certificate).
    pub tls: Option<&'a PeerTls>,
    /// The server name the client asked for (empty when none).
    pub server_name: &'a str,
    /// The request's dynamic metadata (`None` on a connection).
    pub metadata: Option<&'a crate::route::metadata::DynamicMetadata>,
}

/// The four counters of one RBAC filter.
#[derive(Debug, Clone)]
pub struct Stats {
    allowed: Counter,
    denied: Counter,
    shadow_allowed: Counter,
    shadow_denied: Counter,
}

impl Stats {
    /// The counters under `base` (`<prefix>rbac.`), the enforced ones after `rules_prefix`
    /// and the shadow ones after `shadow_prefix`, each step joined as Envoy's
    /// `statPrefixJoin` (Envoy 1.40 names them `tcp.rbac.dry_.shadow_allowed` for
    /// `shadow_rules_stat_prefix: dry_`).
    pub fn new(store: &Store, base: &str, rules_prefix: &str, shadow_prefix: &str) -> Self {
        let rules = stat_prefix_join(base, rules_prefix);
        let shadow = stat_prefix_join(base, shadow_prefix);
        let c = |p: &str, n: &str| store.counter(&stat_prefix_join(p, n));
        Stats {
            allowed: c(&rules, "allowed"),
            denied: c(&rules, "denied"),
            shadow_allowed: c(&shadow, "shadow_allowed"),
            shadow_denied: c(&shadow, "shadow_denied"),
        }
    }
}

/// Envoy's `statPrefixJoin`: `token` after `prefix`, with a `.` between unless `prefix` is
/// empty or already ends in one.
fn stat_prefix_join(prefix: &str, token: &str) -> String {
    if prefix.is_empty() || prefix.ends_with('.') {
        format!("{prefix}{token}")
    } else {
        format!("{prefix}.{token}")
    }
}

/// What an RBAC filter's engines decided for one request or connection.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// The shadow rules' decision (`None`: no shadow rules).
    pub shadow: Option<Decision>,
    /// The enforced rules' decision (`None`: no rules, so allowed).
    pub enforced: Option<Decision>,
}

impl Verdict {
    /// Whether the request or connection may continue.
    pub fn allowed(&self) -> bool {
        self.enforced.as_ref().is_none_or(|d| d.allowed)
    }
}

impl Engines {
    /// Runs the shadow rules and the enforced ones.
    pub fn decide(&self, facts: &Facts<'_>) -> Verdict {
        Verdict {
            shadow: self.shadow.as_ref().map(|r| r.decide(facts)),
            enforced: self.enforced.as_ref().map(|r| r.decide(facts)),
        }
    }
}

impl Stats {
    /// Counts a verdict: shadow first, then enforced, as Envoy counts them.
    pub fn record(&self, v: &Verdict) {
        if let Some(d) = &v.shadow {
            let c = if d.allowed {
                &self.shadow_allowed
            } else {
                &self.shadow_denied
            };
            c.inc();
        }
        if let Some(d) = &v.enforced {
            let c = if d.allowed {
                &self.allowed
            } else {
                &self.denied
            };
            c.inc();
        }
    }
}

#[cfg(test)]
mod tests;
