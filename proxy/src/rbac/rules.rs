//! What compiled RBAC rules (`config::rbac::rules`) decide for one request or connection
//! ([`Facts`]).

use std::sync::Arc;

use crate::config::filter_chain_match::Cidr;
use crate::config::rbac::rules::{Action, Permission, Policy, Principal, Rules};
use crate::filter_state::FilterState;
use crate::route::matcher::{HeaderMatcher, StringMatcher, header_value, strip_query};

use super::Facts;

/// What [`Rules::decide`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request or connection may continue.
    pub allowed: bool,
    /// The first policy (by name) that matched, if any.
    pub policy: Option<Arc<str>>,
}

impl Rules {
    /// Envoy's engine: the first matching policy by name, then the action.
    pub fn decide(&self, facts: &Facts<'_>) -> Decision {
        let policy = self
            .policies
            .iter()
            .find(|(_, p)| p.matches(facts))
            .map(|(name, _)| name.clone());
        let allowed = match self.action {
            Action::Allow => policy.is_some(),
            Action::Deny => policy.is_none(),
            Action::Log => true,
        };
        Decision { allowed, policy }
    }
}

impl Policy {
    fn matches(&self, facts: &Facts<'_>) -> bool {
        self.permissions.iter().any(|p| p.matches(facts))
            && self.principals.iter().any(|p| p.matches(facts))
    }
}

impl Permission {
    /// Whether it matches.
    pub fn matches(&self, facts: &Facts<'_>) -> bool {
        match self {
            Permission::Any => true,
            Permission::And(all) => all.iter().all(|p| p.matches(facts)),
            Permission::Or(any) => any.iter().any(|p| p.matches(facts)),
            Permission::Not(p) => !p.matches(facts),
            Permission::Header(h) => header_matches(h, facts),
            Permission::Path(m) => facts
                .request
                .is_some_and(|r| m.matches(strip_query(r.path))),
            Permission::UriTemplate(re) => facts
                .request
                .is_some_and(|r| re.is_match(strip_query(r.path))),
            Permission::DestinationIp(cidr) => cidr.contains(facts.local.ip()),
            Permission::DestinationPort(port) => u32::from(facts.local.port()) == *port,
            Permission::DestinationPortRange(start, end) => {
                (*start..*end).contains(&u32::from(facts.local.port()))
            }
            Permission::RequestedServerName(m) => m.matches(facts.server_name),
            Permission::Metadata(m) => m.matches(facts.metadata),
        }
    }
}

impl Principal {
    /// Whether it matches.
    pub fn matches(&self, facts: &Facts<'_>) -> bool {
        match self {
            Principal::Any => true,
            Principal::And(all) => all.iter().all(|p| p.matches(facts)),
            Principal::Or(any) => any.iter().any(|p| p.matches(facts)),
            Principal::Not(p) => !p.matches(facts),
            Principal::Authenticated(name) => authenticated(name.as_ref(), facts),
            Principal::SourceIp(cidr) => ip_in(cidr, facts.source),
            Principal::DirectRemoteIp(cidr) => ip_in(cidr, facts.direct_remote),
            Principal::RemoteIp(cidr) => ip_in(cidr, facts.remote),
            Principal::Header(h) => header_matches(h, facts),
            Principal::Path(m) => facts
                .request
                .is_some_and(|r| m.matches(strip_query(r.path))),
            Principal::Metadata(m) => m.matches(facts.metadata),
            Principal::FilterState { key, matcher } => facts
                .tls
                .and_then(|t| t.filter_state(key))
                .is_some_and(|v| matcher.matches(v)),
            Principal::AbsentFilterState => false,
        }
    }
}

fn ip_in(cidr: &Cidr, addr: std::net::IpAddr) -> bool {
    cidr.contains(addr)
}

/// A header matcher against the request's headers; a connection has none.
fn header_matches(h: &HeaderMatcher, facts: &Facts<'_>) -> bool {
    match facts.request {
        Some(r) => h.matches_value(header_value(r, &h.name).as_deref()),
        None => h.matches_value(None),
    }
}

/// Envoy's `authenticated` principal: any TLS connection when no name is given, else the
/// name matches a URI SAN, a DNS SAN, or the subject of the peer certificate (`""` without
/// one).
fn authenticated(name: Option<&StringMatcher>, facts: &Facts<'_>) -> bool {
    let Some(tls) = facts.tls else {
        return false;
    };
    let Some(name) = name else {
        return true;
    };
    match tls.peer() {
        Some(cert) => {
            cert.uri_sans().any(|u| name.matches(u))
                || cert.dns_sans().any(|d| name.matches(d))
                || name.matches(&cert.subject)
        }
        None => name.matches(""),
    }
}
