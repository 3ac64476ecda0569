//! The router's timeouts for one request (Envoy's `finalTimeout`): the route timeout (for a
//! gRPC request on a route with the deprecated `max_grpc_timeout`, its `grpc-timeout`) and the
//! per-try timeout, overridden by `x-envoy-upstream-rq-timeout-ms` /
//! `x-envoy-upstream-rq-per-try-timeout-ms` when those survived the connection manager (which
//! strips them from external requests), and the `x-envoy-expected-rq-timeout-ms` (and then
//! `grpc-timeout`) sent upstream.

use std::time::Duration;

use http::{HeaderMap, HeaderName};

use super::grpc_timeout::{self, GRPC_TIMEOUT};
use super::local_reply::is_grpc;
use crate::route::action::{Forward, StreamTimeouts};

static RQ_TIMEOUT: HeaderName = HeaderName::from_static("x-envoy-upstream-rq-timeout-ms");
static PER_TRY_TIMEOUT: HeaderName =
    HeaderName::from_static("x-envoy-upstream-rq-per-try-timeout-ms");
static EXPECTED_TIMEOUT: HeaderName = HeaderName::from_static("x-envoy-expected-rq-timeout-ms");

/// The timeouts in force for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// The whole exchange up to the response head, all retries included; `None`: disabled.
    pub global: Option<Duration>,
    /// Each attempt; `None`: none (or not shorter than the global timeout).
    pub per_try: Option<Duration>,
    /// Each attempt, between response bytes (`per_try_idle_timeout`).
    pub per_try_idle: Option<Duration>,
    /// Each attempt's `grpc-timeout` is rewritten to its expected timeout (a gRPC request on a
    /// route with `max_grpc_timeout`).
    pub grpc_header: bool,
}

fn header_ms(headers: &mut HeaderMap, name: &HeaderName) -> Option<Duration> {
    let value = headers.remove(name)?;
    value
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
        .map(Duration::from_millis)
}

impl Timeouts {
    /// Resolves the timeouts of `fwd` for a request and consumes the timeout headers; their
    /// values count only when `honour_headers` (the request is internal). A route with
    /// `max_stream_duration` has no route timeout (Envoy's "new timeouts").
    pub fn resolve(fwd: &Forward, headers: &mut HeaderMap, honour_headers: bool) -> Timeouts {
        let policy = fwd.retry_policy.as_deref();
        let (global, grpc_header) = match fwd.stream_timeouts.as_deref() {
            Some(StreamTimeouts::Duration(_)) => (None, false),
            Some(&StreamTimeouts::LegacyGrpc { max, offset }) if is_grpc(headers) => {
                (legacy_grpc_timeout(headers, max, offset), true)
            }
            _ => (fwd.timeout, false),
        };
        let mut t = Timeouts {
            global,
            per_try: policy.and_then(|p| p.per_try_timeout),
            per_try_idle: policy.and_then(|p| p.per_try_idle_timeout),
            grpc_header,
        };
        // One pass over the names first: most requests carry none of these, and removing an
        // absent custom header still hashes its name.
        let timeout_header =
            |n: &HeaderName| *n == RQ_TIMEOUT || *n == PER_TRY_TIMEOUT || *n == EXPECTED_TIMEOUT;
        if headers.keys().any(timeout_header) {
            let global = header_ms(headers, &RQ_TIMEOUT).filter(|_| honour_headers);
            let per_try = header_ms(headers, &PER_TRY_TIMEOUT).filter(|_| honour_headers);
            if !honour_headers {
                headers.remove(&EXPECTED_TIMEOUT);
            }
            if let Some(ms) = global {
                t.global = (!ms.is_zero()).then_some(ms);
            }
            if let Some(ms) = per_try {
                t.per_try = (!ms.is_zero()).then_some(ms);
            }
        }
        if let (Some(p), Some(g)) = (t.per_try, t.global)
            && p >= g
        {
            t.per_try = None;
        }
        t
    }

    /// The `x-envoy-expected-rq-timeout-ms` of an attempt started `elapsed` after the first:
    /// what is left of the global timeout, or the per-try timeout when that is shorter.
    pub fn expected_ms(&self, elapsed: Duration) -> Option<u64> {
        let elapsed = Duration::from_millis(elapsed.as_millis() as u64);
        let left = self.global.map(|g| g.saturating_sub(elapsed));
        let expected = match (left, self.per_try) {
            (Some(l), Some(p)) => l.min(p),
            (l, p) => l.or(p)?,
        };
        Some(expected.as_millis() as u64).filter(|ms| *ms > 0)
    }

    /// Sets the timeout headers of an attempt started `elapsed` after the first:
    /// `x-envoy-expected-rq-timeout-ms` when `expected_header`, and `grpc-timeout` when the
    /// route's `max_grpc_timeout` governs it.
    pub fn set_headers(&self, headers: &mut HeaderMap, elapsed: Duration, expected_header: bool) {
        let Some(ms) = self.expected_ms(elapsed) else {
            return;
        };
        if expected_header {
            headers.insert(&EXPECTED_TIMEOUT, super::int_value::int_value(ms));
        }
        if self.grpc_header {
            headers.insert(
                &GRPC_TIMEOUT,
                grpc_timeout::encode(Duration::from_millis(ms)),
            );
        }
    }
}

/// The route timeout of a gRPC request under `max_grpc_timeout`: its `grpc-timeout` (none:
/// unlimited) less `offset` when that leaves some, capped at `max` unless `max` is 0.
fn legacy_grpc_timeout(
    headers: &HeaderMap,
    max: Duration,
    offset: Option<Duration>,
) -> Option<Duration> {
    let mut t = grpc_timeout::of(headers).unwrap_or_default();
    if let Some(off) = offset
        && off < t
    {
        t -= off;
    }
    if !max.is_zero() && (t.is_zero() || t > max) {
        t = max;
    }
    (!t.is_zero()).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected(global: Option<u64>, per_try: Option<u64>, elapsed: u64) -> Option<u64> {
        Timeouts {
            global: global.map(Duration::from_millis),
            per_try: per_try.map(Duration::from_millis),
            per_try_idle: None,
            grpc_header: false,
        }
        .expected_ms(Duration::from_millis(elapsed))
    }

    #[test]
    fn expected_timeout_is_the_shorter_of_what_is_left_and_per_try() {
        assert_eq!(expected(Some(15_000), None, 0), Some(15_000));
        assert_eq!(expected(Some(1_000), Some(200), 0), Some(200));
        assert_eq!(expected(Some(1_000), Some(200), 900), Some(100));
        assert_eq!(expected(None, Some(200), 5_000), Some(200));
        assert_eq!(expected(None, None, 0), None);
        assert_eq!(expected(Some(100), None, 200), None);
        assert_eq!(
            Timeouts {
                global: Some(Duration::from_secs(15)),
                ..Default::default()
            }
            .expected_ms(Duration::from_micros(900)),
            Some(15_000)
        );
    }
}
