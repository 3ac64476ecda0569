//! `envoy.filters.http.csrf`: a mutating request (POST, PUT, DELETE, PATCH) whose source
//! origin (the host and port of `Origin`, else of `Referer`; an `Origin` of `null` is none)
//! is missing, or is neither its destination (`Host`) nor one of the policy's additional
//! origins, is refused with 403 `Invalid origin` (only counted in shadow mode), as Envoy 1.40
//! does. The policy is the most specific per-route one, else the filter's.

use std::sync::Arc;

use http::{Method, Response, StatusCode, header};

use super::{FilterRequest, sampled};
use crate::body::Body;
use crate::config::http_filter::csrf::CsrfConfig;
use crate::http::local_reply::local_reply;
use crate::stats::{Counter, Store};

/// The CSRF filter of one connection manager.
#[derive(Debug)]
pub(super) struct Csrf {
    config: Arc<CsrfConfig>,
    missing_source_origin: Counter,
    request_invalid: Counter,
    request_valid: Counter,
}

impl Csrf {
    /// The filter with `config`, its stats under `http.<stat_prefix>.csrf.`.
    pub(super) fn new(config: &Arc<CsrfConfig>, store: &Store, stat_prefix: &str) -> Csrf {
        let counter = |name: &str| store.counter(&format!("http.{stat_prefix}.csrf.{name}"));
        Csrf {
            config: config.clone(),
            missing_source_origin: counter("missing_source_origin"),
            request_invalid: counter("request_invalid"),
            request_valid: counter("request_valid"),
        }
    }

    /// Checks `req`'s origin under the route's policy (else the filter's).
    pub(super) fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        route_policy: Option<&CsrfConfig>,
    ) -> Option<Response<Body>> {
        let policy = route_policy.unwrap_or(&self.config);
        let runtime = &req.conn.shared.runtime;
        let enabled = sampled(runtime, &policy.filter_enabled);
        let shadow = policy
            .shadow_enabled
            .as_ref()
            .is_some_and(|f| sampled(runtime, f));
        if !enabled && !shadow {
            return None;
        }
        if ![Method::POST, Method::PUT, Method::DELETE, Method::PATCH].contains(req.method) {
            return None;
        }
        let header = |name| {
            req.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
        };
        // An opaque origin (`null`) is no source origin, and the referer does not stand in.
        let source = match header(header::ORIGIN) {
            Some("null") => "",
            Some(origin) => host_and_port(origin),
            None => header(header::REFERER).map_or("", host_and_port),
        };
        if source.is_empty() {
            self.missing_source_origin.inc();
        } else if source == host_and_port(req.authority)
            || policy.additional_origins.iter().any(|m| m.matches(source))
        {
            self.request_valid.inc();
            return None;
        } else {
            self.request_invalid.inc();
        }
        if !enabled {
            return None;
        }
        req.note_details("csrf_origin_mismatch");
        Some(local_reply(StatusCode::FORBIDDEN, "Invalid origin"))
    }
}

/// The host and port of an absolute URL (`scheme://host:port/...`); a value that is not one
/// is taken whole, as Envoy does.
fn host_and_port(value: &str) -> &str {
    let Some((scheme, rest)) = value.split_once("://") else {
        return value;
    };
    let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if !scheme_ok || host.is_empty() {
        return value;
    }
    host
}

#[cfg(test)]
mod tests {
    use super::host_and_port;

    #[test]
    fn source_origins_are_host_and_port_of_absolute_urls() {
        assert_eq!(
            host_and_port("https://a.example:8443/x?y"),
            "a.example:8443"
        );
        assert_eq!(host_and_port("http://user@a.example/"), "a.example");
        assert_eq!(host_and_port("null"), "null");
        assert_eq!(host_and_port("a.example:80"), "a.example:80");
        assert_eq!(host_and_port(""), "");
    }
}
