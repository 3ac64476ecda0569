//! `envoy.filters.http.cors`: preflight requests answered from the route's CORS policies, and
//! the allowed origin (with credentials and exposed headers) set on every response to a CORS
//! request.
//!
//! As in Envoy, a request's policies are the filter's per-route `CorsPolicy` entries (route,
//! virtual host, route configuration), or, when no level has one, the deprecated `cors` fields
//! of the route action and virtual host; each attribute comes from the most specific policy
//! that sets it, and `filter_enabled` / `shadow_enabled` from the most specific policy.

use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};

use super::{Encoder, Encoders, FilterRequest, sampled};
use crate::body::{self, Body};
use crate::config::http_filter::cors::CorsPolicy;
use crate::route::Action;
use crate::runtime::LiveRuntime;
use crate::stats::{Counter, Store};

static REQUEST_METHOD: HeaderName = HeaderName::from_static("access-control-request-method");
static REQUEST_HEADERS: HeaderName = HeaderName::from_static("access-control-request-headers");
static REQUEST_PRIVATE_NETWORK: HeaderName =
    HeaderName::from_static("access-control-request-private-network");
static ALLOW_ORIGIN: HeaderName = HeaderName::from_static("access-control-allow-origin");
static ALLOW_CREDENTIALS: HeaderName = HeaderName::from_static("access-control-allow-credentials");
static ALLOW_METHODS: HeaderName = HeaderName::from_static("access-control-allow-methods");
static ALLOW_HEADERS: HeaderName = HeaderName::from_static("access-control-allow-headers");
static MAX_AGE: HeaderName = HeaderName::from_static("access-control-max-age");
static EXPOSE_HEADERS: HeaderName = HeaderName::from_static("access-control-expose-headers");
static ALLOW_PRIVATE_NETWORK: HeaderName =
    HeaderName::from_static("access-control-allow-private-network");

/// The CORS filter of one connection manager.
#[derive(Debug)]
pub(super) struct Cors {
    origin_valid: Counter,
    origin_invalid: Counter,
}

/// What a CORS request's response gets: the allowed origin, credentials, exposed headers.
#[derive(Debug)]
pub(super) struct CorsResponse {
    origin: HeaderValue,
    credentials: bool,
    expose: Option<HeaderValue>,
}

/// A request's policies, most specific first.
struct Policies<'a>(Vec<&'a CorsPolicy>);

impl Cors {
    /// The filter, its stats under `http.<stat_prefix>.cors.`.
    pub(super) fn new(store: &Store, stat_prefix: &str) -> Cors {
        Cors {
            origin_valid: store.counter(&format!("http.{stat_prefix}.cors.origin_valid")),
            origin_invalid: store.counter(&format!("http.{stat_prefix}.cors.origin_invalid")),
        }
    }

    /// Answers a preflight request, or notes what the response to a CORS request gets.
    pub(super) fn decode(
        &self,
        name: &str,
        req: &mut FilterRequest<'_>,
        encoders: &mut Encoders,
    ) -> Option<Response<Body>> {
        let route = req.route?;
        // Envoy's filter passes requests whose route answers directly (no route entry).
        if matches!(
            route.route.action,
            Action::DirectResponse(_) | Action::Redirect(_)
        ) {
            return None;
        }
        let mut policies: Vec<&CorsPolicy> = route.filter_configs(name).collect();
        if policies.is_empty() {
            policies.extend(route.legacy_cors::<CorsPolicy>());
        }
        let policies = Policies(policies);
        let runtime = &req.conn.shared.runtime;
        let enabled = policies.enabled(runtime);
        if !enabled && !policies.shadow_enabled(runtime) {
            return None;
        }
        let origin = req
            .headers
            .get(header::ORIGIN)
            .filter(|o| !o.is_empty())?
            .clone();
        let allowed = policies.origin_allowed(&origin);
        if allowed {
            self.origin_valid.inc();
        } else {
            self.origin_invalid.inc();
        }
        if !enabled {
            return None;
        }
        if allowed {
            encoders.0.push(Encoder::Cors(CorsResponse {
                origin: origin.clone(),
                credentials: policies.allow_credentials(),
                expose: value(policies.first(|p| &p.expose_headers)),
            }));
        }
        if req.method != Method::OPTIONS {
            return None;
        }
        let request_method = req
            .headers
            .get(&REQUEST_METHOD)
            .filter(|m| !m.is_empty())?
            .clone();
        if !allowed && policies.forward_not_matching_preflights() {
            return None;
        }
        req.note_details("cors_response");
        Some(preflight(&policies, req, origin, allowed, request_method))
    }
}

/// Envoy's answer to a preflight request: 200 with the policies' headers.
fn preflight(
    policies: &Policies<'_>,
    req: &FilterRequest<'_>,
    origin: HeaderValue,
    allowed: bool,
    request_method: HeaderValue,
) -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    if allowed {
        h.insert(&ALLOW_ORIGIN, origin);
    }
    if policies.allow_credentials() {
        h.insert(&ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
    }
    match policies.first(|p| &p.allow_methods) {
        "" => {}
        "*" => {
            h.insert(&ALLOW_METHODS, request_method);
        }
        m => h.extend(value(m).map(|v| (ALLOW_METHODS.clone(), v))),
    }
    match policies.first(|p| &p.allow_headers) {
        "" => {}
        "*" => {
            let asked = req.headers.get(&REQUEST_HEADERS).cloned();
            h.insert(
                &ALLOW_HEADERS,
                asked.unwrap_or(HeaderValue::from_static("")),
            );
        }
        a => h.extend(value(a).map(|v| (ALLOW_HEADERS.clone(), v))),
    }
    h.extend(value(policies.first(|p| &p.max_age)).map(|v| (MAX_AGE.clone(), v)));
    if policies.allow_private_network_access()
        && req
            .headers
            .get(&REQUEST_PRIVATE_NETWORK)
            .is_some_and(|v| v == "true")
    {
        h.insert(&ALLOW_PRIVATE_NETWORK, HeaderValue::from_static("true"));
    }
    resp
}

/// A configured header value, if non-empty and valid.
fn value(s: &str) -> Option<HeaderValue> {
    (!s.is_empty())
        .then(|| HeaderValue::from_str(s).ok())
        .flatten()
}

impl Policies<'_> {
    /// The most specific non-empty value of a string attribute.
    fn first(&self, field: impl Fn(&CorsPolicy) -> &String) -> &str {
        self.0
            .iter()
            .map(|p| field(p).as_str())
            .find(|v| !v.is_empty())
            .unwrap_or("")
    }

    /// The most specific set value of a boolean attribute.
    fn flag(&self, field: impl Fn(&CorsPolicy) -> Option<bool>) -> Option<bool> {
        self.0.iter().find_map(|p| field(p))
    }

    fn allow_credentials(&self) -> bool {
        self.flag(|p| p.allow_credentials).unwrap_or(false)
    }

    fn allow_private_network_access(&self) -> bool {
        self.flag(|p| p.allow_private_network_access)
            .unwrap_or(false)
    }

    fn forward_not_matching_preflights(&self) -> bool {
        self.flag(|p| p.forward_not_matching_preflights)
            .unwrap_or(true)
    }

    /// The most specific policy's `filter_enabled` (enabled when unset).
    fn enabled(&self, runtime: &LiveRuntime) -> bool {
        self.0.first().is_some_and(|p| {
            p.filter_enabled
                .as_ref()
                .is_none_or(|f| sampled(runtime, f))
        })
    }

    /// The most specific policy's `shadow_enabled` (off when unset).
    fn shadow_enabled(&self, runtime: &LiveRuntime) -> bool {
        self.0.first().is_some_and(|p| {
            p.shadow_enabled
                .as_ref()
                .is_some_and(|f| sampled(runtime, f))
        })
    }

    /// Whether the most specific non-empty `allow_origin_string_match` admits `origin` (or
    /// admits `*`, which allows every origin).
    fn origin_allowed(&self, origin: &HeaderValue) -> bool {
        let Some(matchers) = self
            .0
            .iter()
            .map(|p| &p.allow_origins)
            .find(|m| !m.is_empty())
        else {
            return false;
        };
        let origin = origin.to_str().unwrap_or_default();
        matchers.iter().any(|m| m.matches("*") || m.matches(origin))
    }
}

impl CorsResponse {
    /// Sets the allowed origin, credentials and exposed headers on `resp`.
    pub(super) fn encode(&self, resp: &mut Response<Body>) {
        let h = resp.headers_mut();
        h.insert(&ALLOW_ORIGIN, self.origin.clone());
        if self.credentials {
            h.insert(&ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        }
        if let Some(e) = &self.expose {
            h.insert(&EXPOSE_HEADERS, e.clone());
        }
    }
}
