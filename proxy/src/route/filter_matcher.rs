//! An HTTP filter's `ExtensionWithMatcher` at run time: an xDS matcher tree or list over the
//! request (compiled in `config::http_filter::matching`) whose one action, `SkipFilter`, skips
//! the wrapped filter for the request.
//!
//! Envoy's semantics: a list tries its field matchers in order, and the first whose
//! predicate holds decides, unless its `on_match` is a nested matcher that does not match,
//! when the list goes on; a map looks the input's value up (a prefix map from the longest
//! prefix to the shortest); with no decision, `on_no_match` applies; with none, no action.
//! An input the request lacks (a missing header) matches nothing.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use super::RouteRequest;
use super::matcher::{StringMatcher, header_value, query_of, query_param};

/// A compiled matcher whose only action is `SkipFilter`.
#[derive(Debug, Clone)]
pub enum Matcher {
    /// `matcher_list`.
    List {
        /// `matchers`: a predicate and what follows when it holds, in order.
        matchers: Vec<(Predicate, OnMatch)>,
        /// `on_no_match`.
        on_no_match: Option<Box<OnMatch>>,
    },
    /// `matcher_tree`.
    Tree {
        /// `input`.
        input: Input,
        /// `exact_match_map` or `prefix_match_map`.
        map: Map,
        /// `on_no_match`.
        on_no_match: Option<Box<OnMatch>>,
    },
}

/// A matcher tree's map.
#[derive(Debug, Clone)]
pub enum Map {
    /// `exact_match_map`.
    Exact(HashMap<String, OnMatch>),
    /// `prefix_match_map`, longest prefix first.
    Prefix(Vec<(String, OnMatch)>),
}

/// What follows a match.
#[derive(Debug, Clone)]
pub enum OnMatch {
    /// The `envoy.filters.action.skip` action (`SkipFilter`).
    Skip,
    /// A nested matcher.
    Matcher(Box<Matcher>),
}

/// A matcher list's predicate.
#[derive(Debug, Clone)]
pub enum Predicate {
    /// `single_predicate`: the input's value matches.
    Single(Input, StringMatcher),
    /// `or_matcher`.
    Or(Vec<Predicate>),
    /// `and_matcher`.
    And(Vec<Predicate>),
    /// `not_matcher`.
    Not(Box<Predicate>),
}

/// What a matcher reads from the request or its connection.
#[derive(Debug, Clone)]
pub enum Input {
    /// `HttpRequestHeaderMatchInput`: a header's values (lower-case name), joined with `,`.
    Header(String),
    /// `HttpRequestQueryParamMatchInput`: a query parameter's first value, percent-decoded.
    QueryParam(String),
    /// `SourceIPInput`: the downstream's address as the connection manager reckons it.
    SourceIp,
    /// `DirectSourceIPInput`: the connection's peer address.
    DirectSourceIp,
    /// `DestinationIPInput`: the connection's local (original destination) address.
    DestinationIp,
    /// `DestinationPortInput`: its port.
    DestinationPort,
}

/// The connection facts a matcher may read.
#[derive(Debug, Clone, Copy)]
pub struct Connection {
    /// The downstream's address as the connection manager reckons it (`x-forwarded-for` as
    /// configured).
    pub remote: IpAddr,
    /// The connection's peer address.
    pub direct_remote: IpAddr,
    /// The connection's local address (its original destination when redirected).
    pub local: SocketAddr,
}

/// What a matcher reads: the request and its connection.
pub struct Data<'r> {
    /// The request.
    pub request: RouteRequest<'r>,
    /// Its connection.
    pub connection: Connection,
}

impl Input {
    fn value<'r>(&self, data: &Data<'r>) -> Option<Cow<'r, str>> {
        let conn = &data.connection;
        match self {
            Input::Header(name) => header_value(&data.request, name),
            Input::QueryParam(name) => query_param(query_of(data.request.path), name),
            Input::SourceIp => Some(Cow::Owned(conn.remote.to_string())),
            Input::DirectSourceIp => Some(Cow::Owned(conn.direct_remote.to_string())),
            Input::DestinationIp => Some(Cow::Owned(conn.local.ip().to_string())),
            Input::DestinationPort => Some(Cow::Owned(conn.local.port().to_string())),
        }
    }
}

impl Predicate {
    fn holds(&self, req: &Data<'_>) -> bool {
        match self {
            Predicate::Single(input, m) => input.value(req).is_some_and(|v| m.matches(&v)),
            Predicate::Or(ps) => ps.iter().any(|p| p.holds(req)),
            Predicate::And(ps) => ps.iter().all(|p| p.holds(req)),
            Predicate::Not(p) => !p.holds(req),
        }
    }
}

impl OnMatch {
    fn skips(&self, req: &Data<'_>) -> bool {
        match self {
            OnMatch::Skip => true,
            OnMatch::Matcher(m) => m.skips(req),
        }
    }
}

impl Matcher {
    /// Whether the matcher ends in `SkipFilter` for `req`: the wrapped filter does not run.
    pub fn skips(&self, req: &Data<'_>) -> bool {
        let (decided, on_no_match) = match self {
            Matcher::List {
                matchers,
                on_no_match,
            } => (
                matchers
                    .iter()
                    .any(|(p, then)| p.holds(req) && then.skips(req)),
                on_no_match,
            ),
            Matcher::Tree {
                input,
                map,
                on_no_match,
            } => {
                let value = input.value(req);
                let decided = value.is_some_and(|v| match map {
                    Map::Exact(m) => m.get(v.as_ref()).is_some_and(|then| then.skips(req)),
                    Map::Prefix(m) => m
                        .iter()
                        .any(|(prefix, then)| v.starts_with(prefix.as_str()) && then.skips(req)),
                });
                (decided, on_no_match)
            }
        };
        decided || on_no_match.as_ref().is_some_and(|o| o.skips(req))
    }
}
