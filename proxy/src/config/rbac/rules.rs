//! The compiled form of `envoy.config.rbac.v3.RBAC` (compiled by `config::rbac`, evaluated by
//! `crate::rbac`): policies of permission and principal trees.

use std::sync::Arc;

use regex::Regex;

use crate::config::filter_chain_match::Cidr;
use crate::route::matcher::{HeaderMatcher, StringMatcher};
use crate::route::metadata::matcher::MetadataMatcher;

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

impl Rules {
    /// Whether some rule reads dynamic metadata or filter state, which a filter revoy skips
    /// might have set in Envoy.
    pub fn reads_metadata(&self) -> bool {
        self.policies.iter().any(|(_, p)| {
            p.permissions.iter().any(Permission::reads_metadata)
                || p.principals.iter().any(Principal::reads_metadata)
        })
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
    /// `metadata` / `sourced_metadata`: the request's dynamic metadata (none on a
    /// connection).
    Metadata(MetadataMatcher),
}

impl Permission {
    fn reads_metadata(&self) -> bool {
        match self {
            Permission::And(all) | Permission::Or(all) => all.iter().any(Self::reads_metadata),
            Permission::Not(p) => p.reads_metadata(),
            Permission::Metadata(_) => true,
            _ => false,
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
    /// `metadata` / `sourced_metadata`: the request's dynamic metadata (none on a
    /// connection).
    Metadata(MetadataMatcher),
    /// `filter_state` of a key Istio's `istio_authn` sets (a peer or local principal).
    FilterState {
        /// The key.
        key: Arc<str>,
        /// What its string value must match.
        matcher: StringMatcher,
    },
    /// `filter_state` of a key no filter of revoy's sets: it never matches (as in Envoy when
    /// no filter set the key).
    AbsentFilterState,
}

impl Principal {
    fn reads_metadata(&self) -> bool {
        match self {
            Principal::And(all) | Principal::Or(all) => all.iter().any(Self::reads_metadata),
            Principal::Not(p) => p.reads_metadata(),
            // Only `istio_authn` sets the keys a FilterState reads (and it is implemented);
            // any other key might be set by a filter revoy skips.
            Principal::Metadata(_) | Principal::AbsentFilterState => true,
            _ => false,
        }
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
    /// Whether the enforced rules read dynamic metadata or filter state (the shadow rules
    /// only count).
    pub fn enforced_reads_metadata(&self) -> bool {
        self.enforced.as_ref().is_some_and(Rules::reads_metadata)
    }
}
