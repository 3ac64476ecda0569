//! Per-request retry state with Envoy's semantics: the route's `retry_policy` merged with the
//! `x-envoy-retry-on` / `x-envoy-max-retries` / `x-envoy-retriable-*` request headers, which
//! conditions are retriable, the retry budget, and the jittered exponential back-off.

use std::time::Duration;

use http::{HeaderMap, HeaderName, StatusCode};

use crate::route::RouteRequest;
use crate::route::matcher::HeaderMatcher;
use crate::route::policy::RetryPolicy;
use crate::upstream::{ClusterStats, ResetReason, UpstreamError};

static RETRY_ON: HeaderName = HeaderName::from_static("x-envoy-retry-on");
static RETRY_GRPC_ON: HeaderName = HeaderName::from_static("x-envoy-retry-grpc-on");
static MAX_RETRIES: HeaderName = HeaderName::from_static("x-envoy-max-retries");
static HEDGE_ON_PER_TRY_TIMEOUT: HeaderName =
    HeaderName::from_static("x-envoy-hedge-on-per-try-timeout");
static RETRIABLE_HEADER_NAMES: HeaderName =
    HeaderName::from_static("x-envoy-retriable-header-names");
static RETRIABLE_STATUS_CODES: HeaderName =
    HeaderName::from_static("x-envoy-retriable-status-codes");
static RATE_LIMITED: HeaderName = HeaderName::from_static("x-envoy-ratelimited");

/// The name of Envoy's `previous_hosts` retry host predicate.
const PREVIOUS_HOSTS: &str = "envoy.retry_host_predicates.previous_hosts";

/// A set of `retry_on` conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryOn(u16);

impl RetryOn {
    /// `5xx`: any 5xx response, any reset.
    pub const FIVE_XX: RetryOn = RetryOn(1);
    /// `gateway-error`: 502, 503, 504, any reset.
    pub const GATEWAY_ERROR: RetryOn = RetryOn(1 << 1);
    /// `connect-failure`.
    pub const CONNECT_FAILURE: RetryOn = RetryOn(1 << 2);
    /// `retriable-4xx`: 409.
    pub const RETRIABLE_4XX: RetryOn = RetryOn(1 << 3);
    /// `refused-stream`.
    pub const REFUSED_STREAM: RetryOn = RetryOn(1 << 4);
    /// `retriable-status-codes`.
    pub const RETRIABLE_STATUS_CODES: RetryOn = RetryOn(1 << 5);
    /// `retriable-headers`.
    pub const RETRIABLE_HEADERS: RetryOn = RetryOn(1 << 6);
    /// `reset`: any reset or per-try timeout.
    pub const RESET: RetryOn = RetryOn(1 << 7);
    /// `envoy-ratelimited`: responses carrying `x-envoy-ratelimited`.
    pub const ENVOY_RATE_LIMITED: RetryOn = RetryOn(1 << 8);

    /// Parses a comma-separated list (unknown names are ignored, like Envoy's header parsing).
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> RetryOn {
        names
            .into_iter()
            .map(|n| match n.trim() {
                "5xx" => RetryOn::FIVE_XX,
                "gateway-error" => RetryOn::GATEWAY_ERROR,
                "connect-failure" => RetryOn::CONNECT_FAILURE,
                "retriable-4xx" => RetryOn::RETRIABLE_4XX,
                "refused-stream" => RetryOn::REFUSED_STREAM,
                "retriable-status-codes" => RetryOn::RETRIABLE_STATUS_CODES,
                "retriable-headers" => RetryOn::RETRIABLE_HEADERS,
                "reset" => RetryOn::RESET,
                "envoy-ratelimited" => RetryOn::ENVOY_RATE_LIMITED,
                _ => RetryOn(0),
            })
            .fold(RetryOn(0), |a, b| RetryOn(a.0 | b.0))
    }

    /// Whether any condition of `other` is set.
    pub fn any(self, other: RetryOn) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether no condition is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// Why an attempt did not produce a usable response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The connection could not be established (refused, timed out).
    Connect,
    /// The stream was reset by the peer with REFUSED_STREAM.
    RefusedStream,
    /// Any other reset before the response head.
    Reset,
    /// A circuit breaker refused the request: never retried.
    Overflow,
    /// The per-try timeout fired (Envoy resets the attempt locally).
    PerTryTimeout,
}

impl Failure {
    /// Classifies an upstream error; `None` for errors that are not resets (no healthy host),
    /// which end the request at once.
    pub fn of(err: &UpstreamError) -> Option<Failure> {
        match err {
            UpstreamError::NoHealthyUpstream | UpstreamError::RequestBody { .. } => None,
            UpstreamError::Overflow => Some(Failure::Overflow),
            UpstreamError::ConnectFailure { .. }
            | UpstreamError::BindFailure { .. }
            | UpstreamError::ConnectTimeout { .. }
            | UpstreamError::TlsFailure { .. }
            | UpstreamError::SecretsNotReady { .. }
            | UpstreamError::TransportRefused { .. } => Some(Failure::Connect),
            UpstreamError::Reset {
                reason: ResetReason::RemoteRefusedStreamReset,
                ..
            } => Some(Failure::RefusedStream),
            UpstreamError::Reset { .. } => Some(Failure::Reset),
        }
    }
}

/// The verdict on one failed or retriable attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not retriable: hand the outcome downstream.
    No,
    /// Retriable, but `num_retries` is used up (`upstream_rq_retry_limit_exceeded`).
    LimitExceeded,
    /// Retry after this back-off (`upstream_rq_retry`).
    RetryAfter(Duration),
}

/// The retry state of one request.
#[derive(Debug)]
pub struct RetryState<'p> {
    on: RetryOn,
    remaining: u32,
    policy: Option<&'p RetryPolicy>,
    header_status_codes: Vec<u16>,
    header_retriable_names: Vec<HeaderName>,
    next_interval: Duration,
    max_interval: Duration,
    retried: bool,
}

/// Removes every retry header Envoy consumes; returns what the request asked for.
struct RetryHeaders {
    on: RetryOn,
    max_retries: Option<u32>,
    status_codes: Vec<u16>,
    names: Vec<HeaderName>,
}

fn take_headers(headers: &mut HeaderMap) -> Option<RetryHeaders> {
    if !headers.keys().any(|n| n.as_str().starts_with("x-envoy-")) {
        return None;
    }
    let on = headers.remove(&RETRY_ON);
    let grpc_on = headers.remove(&RETRY_GRPC_ON);
    let max = headers.remove(&MAX_RETRIES);
    let codes = headers.remove(&RETRIABLE_STATUS_CODES);
    let names = headers.remove(&RETRIABLE_HEADER_NAMES);
    headers.remove(&HEDGE_ON_PER_TRY_TIMEOUT);
    if on.is_none() && grpc_on.is_none() && max.is_none() && codes.is_none() && names.is_none() {
        return None;
    }
    let text = |v: &Option<http::HeaderValue>| {
        v.as_ref()
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    Some(RetryHeaders {
        on: RetryOn::parse(text(&on).split(',')),
        max_retries: max
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok()),
        status_codes: text(&codes)
            .split(',')
            .filter_map(|c| c.trim().parse().ok())
            .collect(),
        names: text(&names)
            .split(',')
            .filter_map(|n| HeaderName::from_bytes(n.trim().to_ascii_lowercase().as_bytes()).ok())
            .collect(),
    })
}

/// Whether the policy's `retriable_request_headers` (if any) match the request: when they do
/// not, the request is not retried.
pub fn request_retriable(policy: Option<&RetryPolicy>, req: &RouteRequest<'_>) -> bool {
    policy.is_none_or(|p| {
        p.retriable_request_headers.is_empty()
            || p.retriable_request_headers.iter().any(|m| m.matches(req))
    })
}

impl<'p> RetryState<'p> {
    /// The retry state for a request, or `None` when nothing can be retried. Always consumes
    /// the retry request headers (Envoy never forwards them); their values count only when
    /// `honour_headers` (the request is internal: Envoy strips them from the others);
    /// `request_retriable` comes from [`request_retriable`].
    pub fn new(
        policy: Option<&'p RetryPolicy>,
        request_retriable: bool,
        headers: &mut HeaderMap,
        honour_headers: bool,
    ) -> Option<RetryState<'p>> {
        let from_headers = take_headers(headers).filter(|_| honour_headers);
        let mut on = policy.map_or(RetryOn::default(), |p| {
            RetryOn::parse(p.retry_on.iter().map(String::as_str))
        });
        if let Some(h) = &from_headers {
            on = RetryOn(on.0 | h.on.0);
        }
        if policy.is_none() && from_headers.as_ref().is_none_or(|h| h.on.is_empty()) {
            return None;
        }
        if !request_retriable {
            on = RetryOn::default();
        }
        let mut remaining = policy.map_or(1, |p| p.num_retries);
        let (mut header_status_codes, mut header_retriable_names) = (Vec::new(), Vec::new());
        if let Some(h) = from_headers {
            if let Some(max) = h.max_retries.filter(|_| !on.is_empty()) {
                remaining = max;
            }
            header_status_codes = h.status_codes;
            header_retriable_names = h.names;
        }
        let base = policy.map_or(Duration::from_millis(25), |p| p.back_off_base);
        let max = policy.map_or(base * 10, |p| p.back_off_max);
        Some(RetryState {
            on,
            remaining,
            policy,
            header_status_codes,
            header_retriable_names,
            next_interval: base,
            max_interval: max,
            retried: false,
        })
    }

    /// Whether failed hosts should be avoided on the next attempt (`previous_hosts`).
    pub fn avoids_previous_hosts(&self) -> bool {
        self.policy
            .is_some_and(|p| p.host_predicates.iter().any(|n| n == PREVIOUS_HOSTS))
    }

    /// Whether a response with this head is retriable under the conditions in effect.
    pub fn retriable_response(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        if headers.contains_key(&RATE_LIMITED) {
            return self.on.any(RetryOn::ENVOY_RATE_LIMITED);
        }
        let code = status.as_u16();
        if self.on.any(RetryOn::FIVE_XX) && status.is_server_error() {
            return true;
        }
        if self.on.any(RetryOn::GATEWAY_ERROR) && matches!(code, 502..=504) {
            return true;
        }
        if self.on.any(RetryOn::RETRIABLE_4XX) && code == 409 {
            return true;
        }
        if self.on.any(RetryOn::RETRIABLE_STATUS_CODES) {
            let configured = self
                .policy
                .is_some_and(|p| p.retriable_status_codes.contains(&code));
            if configured || self.header_status_codes.contains(&code) {
                return true;
            }
        }
        if self.on.any(RetryOn::RETRIABLE_HEADERS) {
            let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
            let configured = self.policy.is_some_and(|p| {
                p.retriable_headers
                    .iter()
                    .any(|m: &HeaderMatcher| m.matches_value(value(&m.name)))
            });
            if configured
                || self
                    .header_retriable_names
                    .iter()
                    .any(|n| headers.contains_key(n))
            {
                return true;
            }
        }
        false
    }

    /// Whether a failed attempt is retriable under the conditions in effect.
    pub fn retriable_failure(&self, failure: Failure) -> bool {
        match failure {
            Failure::Overflow => false,
            _ if self.on.any(RetryOn::RESET) => true,
            _ if self
                .on
                .any(RetryOn(RetryOn::FIVE_XX.0 | RetryOn::GATEWAY_ERROR.0)) =>
            {
                true
            }
            Failure::RefusedStream => self.on.any(RetryOn::REFUSED_STREAM),
            Failure::Connect => self.on.any(RetryOn::CONNECT_FAILURE),
            Failure::Reset | Failure::PerTryTimeout => false,
        }
    }

    /// Envoy's `shouldRetry`: charges the retry stats and decides. `retriable` is the verdict
    /// of [`RetryState::retriable_response`] or [`RetryState::retriable_failure`];
    /// `overflow` tells whether the cluster's `max_retries` circuit breaker is open.
    pub fn decide(&mut self, retriable: bool, overflow: bool, stats: &ClusterStats) -> Verdict {
        if !retriable {
            if self.retried {
                stats.upstream_rq_retry_success().inc();
            }
            return Verdict::No;
        }
        if self.remaining == 0 {
            stats.upstream_rq_retry_limit_exceeded().inc();
            return Verdict::LimitExceeded;
        }
        self.remaining -= 1;
        if overflow {
            stats.upstream_rq_retry_overflow().inc();
            return Verdict::No;
        }
        self.retried = true;
        stats.upstream_rq_retry().inc();
        stats.upstream_rq_retry_backoff_exponential().inc();
        Verdict::RetryAfter(self.next_back_off(rand::random()))
    }

    /// Envoy's fully jittered exponential back-off: a random value below the current
    /// interval (capped at the maximum); the interval doubles after each retry up to the maximum.
    fn next_back_off(&mut self, random: u64) -> Duration {
        let interval = self.next_interval.as_millis().max(1) as u64;
        let max = self.max_interval.as_millis() as u64;
        self.next_interval = if self.next_interval <= self.max_interval / 2 {
            self.next_interval * 2
        } else {
            self.max_interval
        };
        Duration::from_millis((random % interval).min(max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Store;

    fn policy(retry_on: &str, num_retries: u32) -> RetryPolicy {
        RetryPolicy {
            retry_on: retry_on.split(',').map(str::to_owned).collect(),
            num_retries,
            back_off_base: Duration::from_millis(25),
            back_off_max: Duration::from_millis(250),
            ..Default::default()
        }
    }

    fn state<'p>(p: Option<&'p RetryPolicy>, headers: &mut HeaderMap) -> Option<RetryState<'p>> {
        let method = http::Method::GET;
        let empty = HeaderMap::new();
        let req = RouteRequest::new(&method, "h", "/", &empty);
        RetryState::new(p, request_retriable(p, &req), headers, true)
    }

    fn stats(store: &Store) -> ClusterStats {
        ClusterStats::new(store, "c")
    }

    #[test]
    fn no_policy_and_no_header_means_no_state_but_headers_are_consumed() {
        let mut h = HeaderMap::new();
        h.insert("x-envoy-max-retries", "3".parse().unwrap());
        h.insert("x-envoy-retriable-status-codes", "418".parse().unwrap());
        assert!(state(None, &mut h).is_none());
        assert!(h.is_empty());
    }

    #[test]
    fn headers_of_external_requests_are_dropped_unread() {
        let mut h = HeaderMap::new();
        h.insert("x-envoy-retry-on", "5xx".parse().unwrap());
        assert!(RetryState::new(None, true, &mut h, false).is_none());
        assert!(h.is_empty());
    }

    #[test]
    fn header_retry_on_merges_with_policy_and_max_retries_overrides() {
        let p = policy("connect-failure", 1);
        let mut h = HeaderMap::new();
        h.insert("x-envoy-retry-on", "5xx".parse().unwrap());
        h.insert("x-envoy-max-retries", "4".parse().unwrap());
        let s = state(Some(&p), &mut h).unwrap();
        assert!(s.retriable_response(StatusCode::INTERNAL_SERVER_ERROR, &HeaderMap::new()));
        assert!(s.retriable_failure(Failure::Connect));
        assert_eq!(s.remaining, 4);
        assert!(h.is_empty());
    }

    #[test]
    fn conditions_follow_envoy() {
        let empty = HeaderMap::new();
        let gw = policy("gateway-error", 1);
        let s = state(Some(&gw), &mut HeaderMap::new()).unwrap();
        assert!(!s.retriable_response(StatusCode::INTERNAL_SERVER_ERROR, &empty));
        assert!(s.retriable_response(StatusCode::BAD_GATEWAY, &empty));
        assert!(s.retriable_failure(Failure::Reset));
        assert!(s.retriable_failure(Failure::PerTryTimeout));
        assert!(!s.retriable_failure(Failure::Overflow));

        let cf = policy("connect-failure,refused-stream", 1);
        let s = state(Some(&cf), &mut HeaderMap::new()).unwrap();
        assert!(s.retriable_failure(Failure::Connect));
        assert!(s.retriable_failure(Failure::RefusedStream));
        assert!(!s.retriable_failure(Failure::Reset));
        assert!(!s.retriable_failure(Failure::PerTryTimeout));
        assert!(!s.retriable_response(StatusCode::SERVICE_UNAVAILABLE, &empty));

        let mut codes = policy("retriable-status-codes,retriable-4xx", 1);
        codes.retriable_status_codes = vec![418];
        let s = state(Some(&codes), &mut HeaderMap::new()).unwrap();
        assert!(s.retriable_response(StatusCode::IM_A_TEAPOT, &empty));
        assert!(s.retriable_response(StatusCode::CONFLICT, &empty));
        assert!(!s.retriable_response(StatusCode::NOT_FOUND, &empty));

        let mut limited = HeaderMap::new();
        limited.insert("x-envoy-ratelimited", "true".parse().unwrap());
        let all = policy("5xx", 1);
        let s = state(Some(&all), &mut HeaderMap::new()).unwrap();
        assert!(!s.retriable_response(StatusCode::TOO_MANY_REQUESTS, &limited));
        assert!(!s.retriable_response(StatusCode::SERVICE_UNAVAILABLE, &limited));
        let rl = policy("envoy-ratelimited", 1);
        let s = state(Some(&rl), &mut HeaderMap::new()).unwrap();
        assert!(s.retriable_response(StatusCode::TOO_MANY_REQUESTS, &limited));
    }

    #[test]
    fn retriable_header_names_from_the_request() {
        let p = policy("retriable-headers", 1);
        let mut h = HeaderMap::new();
        h.insert(
            "x-envoy-retriable-header-names",
            "X-Upstream-Pushback, other".parse().unwrap(),
        );
        let s = state(Some(&p), &mut h).unwrap();
        let mut resp = HeaderMap::new();
        assert!(!s.retriable_response(StatusCode::OK, &resp));
        resp.insert("x-upstream-pushback", "1".parse().unwrap());
        assert!(s.retriable_response(StatusCode::OK, &resp));
    }

    #[test]
    fn budget_and_stats_follow_should_retry() {
        let store = Store::new();
        let st = stats(&store);
        let p = policy("5xx", 2);
        let mut s = state(Some(&p), &mut HeaderMap::new()).unwrap();
        assert!(matches!(s.decide(true, false, &st), Verdict::RetryAfter(_)));
        assert!(matches!(s.decide(true, false, &st), Verdict::RetryAfter(_)));
        assert_eq!(s.decide(true, false, &st), Verdict::LimitExceeded);
        assert_eq!(store.counter("cluster.c.upstream_rq_retry").value(), 2);
        assert_eq!(
            store
                .counter("cluster.c.upstream_rq_retry_limit_exceeded")
                .value(),
            1
        );
        assert_eq!(s.decide(false, false, &st), Verdict::No);
        assert_eq!(
            store.counter("cluster.c.upstream_rq_retry_success").value(),
            1
        );

        let mut s = state(Some(&p), &mut HeaderMap::new()).unwrap();
        assert_eq!(s.decide(true, true, &st), Verdict::No);
        assert_eq!(
            store
                .counter("cluster.c.upstream_rq_retry_overflow")
                .value(),
            1
        );
        assert_eq!(s.decide(false, false, &st), Verdict::No);
        assert_eq!(
            store.counter("cluster.c.upstream_rq_retry_success").value(),
            1
        );
    }

    #[test]
    fn back_off_is_jittered_below_a_doubling_interval_capped_at_max() {
        let p = policy("5xx", 5);
        let mut s = state(Some(&p), &mut HeaderMap::new()).unwrap();
        assert_eq!(
            s.next_back_off(u64::MAX),
            Duration::from_millis(u64::MAX % 25)
        );
        assert_eq!(s.next_back_off(49), Duration::from_millis(49));
        assert_eq!(s.next_back_off(99), Duration::from_millis(99));
        assert_eq!(s.next_back_off(199), Duration::from_millis(199));
        assert_eq!(s.next_back_off(249), Duration::from_millis(249));
        assert_eq!(s.next_back_off(1000), Duration::from_millis(0));
    }
}
