//! Compiled `envoy.config.rbac.v3.RBAC` rules: policies of permission and principal trees,
//! and what they decide for one request or connection ([`Facts`]).

use std::sync::Arc;

use regex::Regex;

use crate::config::filter_chain_match::Cidr;
use crate::route::matcher::{HeaderMatcher, StringMatcher, header_value, strip_query};

use super::Facts;

/// What matching a policy means (`RBAC.action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Allowed only when some policy matches.
    Allow,
    /// Denied when some policy matches.
    Deny,
    /// Always allowed; whether a policy matched is only recorded.
    Log,
}

/// A compiled `RBAC`: its action and its policies in name order (Envoy keeps them in a
/// sorted map, so the first match by name is the effective policy).
#[derive(Debug, Clone)]
pub struct Rules {
    /// `action`.
    pub action: Action,
    /// `policies`, sorted by name.
    pub policies: Vec<(Arc<str>, Policy)>,
}

/// What [`Rules::decide`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request or connection may continue.
    pub allowed: bool,
    /// The first policy (by name) that matched, if any.
    pub policy: Option<Arc<str>>,
}

impl Rules {
    /// Whether some rule reads dynamic metadata or filter state, which a filter revoy skips
    /// might have set in Envoy.
    pub fn reads_metadata(&self) -> bool {
        self.policies.iter().any(|(_, p)| {
            p.permissions.iter().any(Permission::reads_metadata)
                || p.principals.iter().any(Principal::reads_metadata)
        })
    }

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

/// A compiled `Policy`: some permission and some principal must match.
#[derive(Debug, Clone)]
pub struct Policy {
    /// `permissions` (any one).
    pub permissions: Vec<Permission>,
    /// `principals` (any one).
    pub principals: Vec<Principal>,
}

impl Policy {
    fn matches(&self, facts: &Facts<'_>) -> bool {
        self.permissions.iter().any(|p| p.matches(facts))
            && self.principals.iter().any(|p| p.matches(facts))
    }
}

/// A compiled `Permission`: what the request or connection asks for.
#[derive(Debug, Clone)]
pub enum Permission {
    /// `any`.
    Any,
    /// `and_rules`.
    And(Vec<Permission>),
    /// `or_rules`.
    Or(Vec<Permission>),
    /// `not_rule`.
    Not(Box<Permission>),
    /// `header` (no headers on a connection: the matcher sees none).
    Header(HeaderMatcher),
    /// `url_path`: the path without query and fragment (never on a connection).
    Path(StringMatcher),
    /// `uri_template`: the path without query and fragment against the template's regex.
    UriTemplate(Box<Regex>),
    /// `destination_ip`: the downstream local address.
    DestinationIp(Cidr),
    /// `destination_port`.
    DestinationPort(u32),
    /// `destination_port_range`: `[start, end)`.
    DestinationPortRange(u32, u32),
    /// `requested_server_name` (empty when the client sent none).
    RequestedServerName(StringMatcher),
    /// `metadata` / `sourced_metadata` from dynamic metadata, which revoy never has.
    AbsentMetadata(AbsentMetadata),
}

impl Permission {
    fn reads_metadata(&self) -> bool {
        match self {
            Permission::And(all) | Permission::Or(all) => all.iter().any(Self::reads_metadata),
            Permission::Not(p) => p.reads_metadata(),
            Permission::AbsentMetadata(_) => true,
            _ => false,
        }
    }

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
            Permission::AbsentMetadata(m) => m.matches(),
        }
    }
}

/// A compiled `Principal`: who asks.
#[derive(Debug, Clone)]
pub enum Principal {
    /// `any`.
    Any,
    /// `and_ids`.
    And(Vec<Principal>),
    /// `or_ids`.
    Or(Vec<Principal>),
    /// `not_id`.
    Not(Box<Principal>),
    /// `authenticated`: a TLS connection whose peer's URI SANs, else DNS SANs, else subject
    /// match (`None`: any TLS connection).
    Authenticated(Option<StringMatcher>),
    /// `source_ip`: the connection's peer address.
    SourceIp(Cidr),
    /// `direct_remote_ip`: the downstream's direct peer address.
    DirectRemoteIp(Cidr),
    /// `remote_ip`: the downstream's address after `x-forwarded-for` processing.
    RemoteIp(Cidr),
    /// `header`.
    Header(HeaderMatcher),
    /// `url_path`.
    Path(StringMatcher),
    /// `metadata` / `sourced_metadata`, which revoy never has.
    AbsentMetadata(AbsentMetadata),
    /// `filter_state`: revoy keeps no filter state, so it never matches (as in Envoy when
    /// no filter set the key).
    AbsentFilterState,
}

impl Principal {
    fn reads_metadata(&self) -> bool {
        match self {
            Principal::And(all) | Principal::Or(all) => all.iter().any(Self::reads_metadata),
            Principal::Not(p) => p.reads_metadata(),
            Principal::AbsentMetadata(_) | Principal::AbsentFilterState => true,
            _ => false,
        }
    }

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
            Principal::AbsentMetadata(m) => m.matches(),
            Principal::AbsentFilterState => false,
        }
    }
}

/// A metadata matcher evaluated where there is no metadata: Envoy's value matchers all fail
/// on a missing value, so the result is its `invert`.
#[derive(Debug, Clone, Copy)]
pub struct AbsentMetadata {
    /// `invert`.
    pub invert: bool,
}

impl AbsentMetadata {
    fn matches(self) -> bool {
        self.invert
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
