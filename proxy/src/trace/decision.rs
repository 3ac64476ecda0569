//! The connection manager's trace decision for one request (Envoy's
//! `mutateTracingRequestHeader`): a request already marked in its `x-request-id` keeps its
//! mark; otherwise `x-client-trace-id` (under `client_sampling`), `x-envoy-force-trace`, then
//! `random_sampling` (drawn from the request id) may mark it; `overall_sampling` caps all.

use http::HeaderMap;

use super::request_id::{self, Reason};
use crate::config::tracing::RequestIdConfig;
use crate::route::tracing::Sampling;

static X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
static X_CLIENT_TRACE_ID: http::HeaderName = http::HeaderName::from_static("x-client-trace-id");
/// `x-envoy-force-trace` (kept only on internal requests by the connection manager).
pub static X_ENVOY_FORCE_TRACE: http::HeaderName =
    http::HeaderName::from_static("x-envoy-force-trace");

/// A request's trace decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Why it is traced, or not.
    pub reason: Reason,
    /// The `x-request-id` to send on with the decision packed in, when it changed.
    pub request_id: Option<http::HeaderValue>,
}

/// Decides whether the request with `headers` is traced, and the `x-request-id` that records
/// it (when `pack_trace_reason`). `client_draw` is a fresh random number for `client_sampling`.
pub fn decide(
    sampling: &Sampling,
    rid: RequestIdConfig,
    headers: &HeaderMap,
    client_draw: u64,
) -> Decision {
    let unchanged = |reason| Decision {
        reason,
        request_id: None,
    };
    if !rid.use_for_sampling {
        return unchanged(Reason::Sampling);
    }
    let Some(id) = headers.get(&X_REQUEST_ID) else {
        return unchanged(Reason::NotTraceable);
    };
    let Some(draw) = request_id::to_integer(id.as_bytes()) else {
        return unchanged(Reason::NotTraceable);
    };
    let draw = draw % 10_000;
    let marked = request_id::reason(id.as_bytes());
    let mut reason = marked;
    if reason == Reason::NotTraceable {
        if headers.contains_key(&X_CLIENT_TRACE_ID) && sampling.client.enabled(client_draw) {
            reason = Reason::ClientForced;
        } else if headers.contains_key(&X_ENVOY_FORCE_TRACE) {
            reason = Reason::ServiceForced;
        } else if sampling.random.enabled(draw) {
            reason = Reason::Sampling;
        }
    }
    if reason != Reason::NotTraceable && !sampling.overall.enabled(draw) {
        reason = Reason::NotTraceable;
    }
    let request_id = (rid.pack_trace_reason && reason != marked)
        .then(|| request_id::with_reason(id, reason))
        .flatten();
    Decision { reason, request_id }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::tracing::Fraction;

    fn pct(n: u32) -> Fraction {
        Fraction {
            numerator: n,
            denominator: 10_000,
        }
    }

    fn sampling(client: u32, random: u32, overall: u32) -> Sampling {
        Sampling {
            client: pct(client),
            random: pct(random),
            overall: pct(overall),
        }
    }

    /// Headers with an `x-request-id` whose first 8 hex digits make `draw` (mod 10 000).
    fn with_id(draw: u32, extra: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        let id = format!("{draw:08x}-0000-4000-8000-000000000000");
        h.insert(&X_REQUEST_ID, id.parse().unwrap());
        for name in extra {
            h.insert(*name, "1".parse().unwrap());
        }
        h
    }

    /// The trace nibble of the id the decision sends on (`-` when unchanged).
    fn nibble(d: &Decision) -> char {
        d.request_id
            .as_ref()
            .map_or('-', |id| id.to_str().unwrap().as_bytes()[14] as char)
    }

    #[test]
    fn random_sampling_draws_from_the_request_id() {
        let rid = RequestIdConfig::default();
        let d = decide(&sampling(0, 2_500, 10_000), rid, &with_id(2_499, &[]), 0);
        assert_eq!((d.reason, nibble(&d)), (Reason::Sampling, '9'));
        let d = decide(&sampling(0, 2_500, 10_000), rid, &with_id(2_500, &[]), 0);
        assert_eq!((d.reason, nibble(&d)), (Reason::NotTraceable, '-'));
    }

    #[test]
    fn client_and_force_come_before_random_and_overall_caps_them() {
        let rid = RequestIdConfig::default();
        let both = with_id(9_000, &["x-client-trace-id", "x-envoy-force-trace"]);
        let d = decide(&sampling(10_000, 0, 10_000), rid, &both, 5);
        assert_eq!((d.reason, nibble(&d)), (Reason::ClientForced, 'b'));
        let d = decide(&sampling(0, 0, 10_000), rid, &both, 5);
        assert_eq!((d.reason, nibble(&d)), (Reason::ServiceForced, 'a'));
        let d = decide(
            &sampling(0, 0, 9_000),
            rid,
            &with_id(9_000, &["x-envoy-force-trace"]),
            5,
        );
        assert_eq!((d.reason, nibble(&d)), (Reason::NotTraceable, '-'));
    }

    #[test]
    fn a_marked_request_keeps_its_mark_unless_overall_sampling_clears_it() {
        let mut h = with_id(9_999, &[]);
        let marked = request_id::with_reason(&h[&X_REQUEST_ID], Reason::ServiceForced).unwrap();
        h.insert(&X_REQUEST_ID, marked);
        let none = sampling(0, 0, 10_000);
        let d = decide(&none, RequestIdConfig::default(), &h, 0);
        assert_eq!((d.reason, nibble(&d)), (Reason::ServiceForced, '-'));
        let d = decide(&sampling(0, 0, 9_999), RequestIdConfig::default(), &h, 0);
        assert_eq!((d.reason, nibble(&d)), (Reason::NotTraceable, '4'));
    }

    #[test]
    fn options_turn_packing_and_id_sampling_off() {
        let quiet = RequestIdConfig {
            pack_trace_reason: false,
            use_for_sampling: true,
        };
        let d = decide(&sampling(0, 10_000, 10_000), quiet, &with_id(1, &[]), 0);
        assert_eq!((d.reason, nibble(&d)), (Reason::Sampling, '-'));
        let unsampled = RequestIdConfig {
            pack_trace_reason: true,
            use_for_sampling: false,
        };
        let d = decide(&sampling(0, 0, 0), unsampled, &HeaderMap::new(), 0);
        assert_eq!(d.reason, Reason::Sampling);
    }
}
