//! The HTTP local rate limit filter's decision for one request, apart from how the filter
//! chain runs it: enabled or not, which buckets the request takes from, whether a limited
//! request is refused, and the stats and `x-ratelimit-*` headers that go with it.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::{LocalLimiter, TokenBucket};
use crate::config::http_filter::local_ratelimit::LocalRateLimitConfig;
use crate::route::rate_limit::Descriptor;
use crate::stats::{Counter, Store};

/// The filter's stats, `<stat_prefix>.http_local_rate_limit.*`.
#[derive(Debug, Clone)]
pub struct LocalStats {
    enabled: Counter,
    enforced: Counter,
    rate_limited: Counter,
    ok: Counter,
}

impl LocalStats {
    /// Resolves the stats of `stat_prefix` in `store` (all of them, so they show at 0 as
    /// Envoy's do).
    pub fn new(store: &Store, stat_prefix: &str) -> Self {
        let counter =
            |name: &str| store.counter(&format!("{stat_prefix}.http_local_rate_limit.{name}"));
        // Envoy also declares `shadow_mode`, which revoy's configs never count (shadow-mode
        // descriptors are refused at compile).
        counter("shadow_mode");
        LocalStats {
            enabled: counter("enabled"),
            enforced: counter("enforced"),
            rate_limited: counter("rate_limited"),
            ok: counter("ok"),
        }
    }
}

/// What the filter does with a request it is enabled for.
#[derive(Debug)]
pub enum LocalVerdict {
    /// The request goes on.
    Pass,
    /// The request is over the limit but the filter does not enforce: it goes on with
    /// `request_headers_to_add_when_not_enforced`.
    NotEnforced,
    /// The request is refused with the configured status and `local_rate_limited`.
    Refused,
}

/// The decision for one request.
#[derive(Debug)]
pub struct LocalDecision {
    /// What to do.
    pub verdict: LocalVerdict,
    /// The bucket the response's `x-ratelimit-*` headers describe, when the filter adds them.
    pub headers_from: Option<Arc<TokenBucket>>,
}

/// Decides for a request: `None` when the filter is not enabled for it (`filter_enabled`
/// unset, or its fraction not drawn by `random`). `descriptors` is asked only when the
/// configuration has descriptors to match them against.
pub fn decide(
    config: &LocalRateLimitConfig,
    limiter: &LocalLimiter,
    stats: &LocalStats,
    random: u64,
    descriptors: impl FnOnce() -> Vec<Descriptor>,
) -> Option<LocalDecision> {
    if !config
        .filter_enabled
        .as_ref()
        .is_some_and(|f| f.default.enabled(random))
    {
        return None;
    }
    stats.enabled.inc();
    let descriptors = if config.descriptors.is_empty() {
        Vec::new()
    } else {
        descriptors()
    };
    let decision = limiter.request_allowed(&descriptors);
    let headers_from = decision.bucket.filter(|_| config.x_ratelimit_headers);
    let verdict = if decision.allowed {
        stats.ok.inc();
        LocalVerdict::Pass
    } else {
        stats.rate_limited.inc();
        let enforced = config
            .filter_enforced
            .as_ref()
            .is_some_and(|f| f.default.enabled(random));
        if enforced {
            stats.enforced.inc();
            LocalVerdict::Refused
        } else {
            LocalVerdict::NotEnforced
        }
    };
    Some(LocalDecision {
        verdict,
        headers_from,
    })
}

/// Adds the `x-ratelimit-limit`, `-remaining` and `-reset` headers describing `bucket`.
pub fn add_x_ratelimit_headers(headers: &mut HeaderMap, bucket: &TokenBucket) {
    for (name, value) in [
        ("x-ratelimit-limit", u64::from(bucket.spec().max_tokens)),
        ("x-ratelimit-remaining", u64::from(bucket.remaining())),
        ("x-ratelimit-reset", bucket.reset_seconds()),
    ] {
        headers.append(HeaderName::from_static(name), HeaderValue::from(value));
    }
}
