//! Resilience and load-balancing policies carried by a route: retries, hashing, mirroring.

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;
use std::time::Duration;

use regex::Regex;

use super::RouteRequest;
use super::matcher::{HeaderMatcher, RuntimeFraction, header_value, query_of, query_param};

/// A compiled `RetryPolicy`.
#[derive(Debug, Clone, Default)]
pub struct RetryPolicy {
    /// `retry_on` conditions, split on `,` and trimmed (`5xx`, `gateway-error`, ...).
    pub retry_on: Vec<String>,
    /// `num_retries` (default 1).
    pub num_retries: u32,
    /// `per_try_timeout`.
    pub per_try_timeout: Option<Duration>,
    /// `per_try_idle_timeout`.
    pub per_try_idle_timeout: Option<Duration>,
    /// `retriable_status_codes`.
    pub retriable_status_codes: Vec<u16>,
    /// Back-off base interval (default 25 ms).
    pub back_off_base: Duration,
    /// Back-off maximum (default 10 x base).
    pub back_off_max: Duration,
    /// `retry_host_predicate` names (`envoy.retry_host_predicates.previous_hosts`, ...).
    pub host_predicates: Vec<String>,
    /// `host_selection_retry_max_attempts`.
    pub host_selection_retry_max_attempts: i64,
    /// `retriable_headers`: a response matching any of these is retried.
    pub retriable_headers: Vec<HeaderMatcher>,
    /// `retriable_request_headers`: only requests matching one of these are retried.
    pub retriable_request_headers: Vec<HeaderMatcher>,
}

impl RetryPolicy {
    /// Whether `retry_on` lists `condition`.
    pub fn retries_on(&self, condition: &str) -> bool {
        self.retry_on.iter().any(|c| c == condition)
    }
}

/// What a hash policy hashes.
#[derive(Debug, Clone)]
pub enum HashKind {
    /// A request header's value, optionally rewritten by a regex.
    Header(String, Option<(Regex, String)>),
    /// A cookie's value (`ttl` would make Envoy generate the cookie: the caller does that).
    Cookie {
        /// Cookie name.
        name: String,
        /// TTL for a generated cookie.
        ttl: Option<Duration>,
        /// Path for a generated cookie.
        path: String,
    },
    /// The downstream source IP.
    SourceIp,
    /// A query parameter.
    QueryParameter(String),
    /// A filter-state key (never present in revoy: contributes nothing).
    FilterState(String),
}

/// A compiled `HashPolicy`.
#[derive(Debug, Clone)]
pub struct HashPolicy {
    /// What is hashed.
    pub kind: HashKind,
    /// `terminal`: stop at the first policy that produced a hash.
    pub terminal: bool,
}

/// Computes the request hash from `policies` like Envoy: each policy that yields a value is
/// folded in as `rotl(hash, 1) ^ h`; a terminal policy that yields a value stops the walk.
pub fn compute_hash(
    policies: &[HashPolicy],
    req: &RouteRequest<'_>,
    source_ip: Option<IpAddr>,
) -> Option<u64> {
    let mut hash: Option<u64> = None;
    for p in policies {
        let h = match &p.kind {
            HashKind::Header(name, rewrite) => header_value(req, name).map(|v| match rewrite {
                Some((re, sub)) => hash_str(&re.replace_all(&v, sub.as_str())),
                None => hash_str(&v),
            }),
            HashKind::Cookie { name, .. } => cookie(req, name).map(hash_str),
            HashKind::SourceIp => source_ip.map(|ip| hash_str(&ip.to_string())),
            HashKind::QueryParameter(name) => {
                query_param(query_of(req.path), name).map(|v| hash_str(&v))
            }
            HashKind::FilterState(_) => None,
        };
        if let Some(h) = h {
            hash = Some(hash.map_or(h, |prev| prev.rotate_left(1) ^ h));
            if p.terminal {
                break;
            }
        }
    }
    hash
}

fn hash_str(s: &str) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// The value of cookie `name` in the request's `cookie` headers.
pub fn cookie<'r>(req: &RouteRequest<'r>, name: &str) -> Option<&'r str> {
    cookie_in(req.headers, name)
}

/// The value of cookie `name` in the `cookie` headers of `headers` (surrounding quotes
/// removed).
pub fn cookie_in<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then(|| v.trim_matches('"'))
        })
}

/// A compiled `RequestMirrorPolicy`.
#[derive(Debug, Clone)]
pub struct MirrorPolicy {
    /// Shadow cluster (empty when `cluster_header` is used).
    pub cluster: String,
    /// Take the shadow cluster from this request header.
    pub cluster_header: Option<String>,
    /// `runtime_fraction` (default: always).
    pub runtime_fraction: Option<RuntimeFraction>,
    /// `disable_shadow_host_suffix_append`: do not append `-shadow` to the host.
    pub disable_shadow_host_suffix_append: bool,
    /// `host_rewrite_literal` for the mirrored request.
    pub host_rewrite_literal: Option<String>,
}

impl MirrorPolicy {
    /// The shadow cluster for this request, when it is mirrored at all. Borrows only the
    /// policy: a name read from a request header is owned.
    pub fn shadow_cluster<'t>(&'t self, req: &RouteRequest<'_>) -> Option<Cow<'t, str>> {
        if let Some(f) = &self.runtime_fraction
            && !f.enabled(req)
        {
            return None;
        }
        match &self.cluster_header {
            Some(h) => header_value(req, h)
                .filter(|v| !v.is_empty())
                .map(|v| Cow::Owned(v.into_owned())),
            None => Some(Cow::Borrowed(self.cluster.as_str())),
        }
    }

    /// The `:authority` of the mirrored request given the original one.
    pub fn shadow_host(&self, authority: &str) -> String {
        if let Some(h) = &self.host_rewrite_literal {
            return h.clone();
        }
        if self.disable_shadow_host_suffix_append {
            return authority.to_owned();
        }
        let host = super::domain::strip_port(authority);
        format!("{host}-shadow{}", &authority[host.len()..])
    }
}
