//! Envoy's RBAC at run time: what a request or a connection is checked against.
//!
//! [`rules`] holds the compiled policies (compiled by `config::rbac`) and decides for one
//! [`Facts`] view; [`Engines`] pairs the enforced rules with the shadow rules and counts
//! Envoy's `rbac.allowed|denied|shadow_allowed|shadow_denied`; [`network`] is
//! `envoy.filters.network.rbac` on a listener's filter chain.

pub mod network;
pub mod rules;

use std::net::SocketAddr;

use crate::route::RouteRequest;
use crate::stats::{Counter, Store};
use crate::tls::PeerTls;

pub use rules::{Decision, Rules};

/// What is known about the request or connection being checked.
#[derive(Clone, Copy)]
pub struct Facts<'a> {
    /// The request (`None` for a connection: no headers, no path).
    pub request: Option<&'a RouteRequest<'a>>,
    /// The downstream local address (after an `original_dst` restore).
    pub local: SocketAddr,
    /// The connection's peer address (`source_ip`).
    pub source: SocketAddr,
    /// The downstream's direct peer address (`direct_remote_ip`).
    pub direct_remote: SocketAddr,
    /// The downstream's address as the connection manager reckons it (`remote_ip`).
    pub remote: SocketAddr,
    /// The connection's TLS, when it is TLS (with or without a client certificate).
    pub tls: Option<&'a PeerTls>,
    /// The server name the client asked for (empty when none).
    pub server_name: &'a str,
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
    /// and the shadow ones after `shadow_prefix`, joined as Envoy's `statPrefixJoin`.
    pub fn new(store: &Store, base: &str, rules_prefix: &str, shadow_prefix: &str) -> Self {
        let rules = stat_prefix_join(base, rules_prefix);
        let shadow = stat_prefix_join(base, shadow_prefix);
        let c = |p: &str, n: &str| store.counter(&format!("{p}{n}"));
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

/// An RBAC filter's enforced and shadow rules (either may be absent: no engine).
#[derive(Debug, Clone, Default)]
pub struct Engines {
    /// `rules`.
    pub enforced: Option<Rules>,
    /// `shadow_rules`.
    pub shadow: Option<Rules>,
}

impl Engines {
    /// Runs the shadow rules, then the enforced ones, counting both; the enforced decision,
    /// `None` when there are no enforced rules (allowed, nothing counted).
    pub fn check(&self, facts: &Facts<'_>, stats: &Stats) -> Option<Decision> {
        if let Some(shadow) = &self.shadow {
            let d = shadow.decide(facts);
            if d.allowed {
                stats.shadow_allowed.inc();
            } else {
                stats.shadow_denied.inc();
            }
        }
        let d = self.enforced.as_ref()?.decide(facts);
        if d.allowed {
            stats.allowed.inc();
        } else {
            stats.denied.inc();
        }
        Some(d)
    }
}

#[cfg(test)]
mod tests;
