//! `envoy.filters.http.local_ratelimit`: token buckets in the proxy (the filter's, or a
//! route's own configuration), `429 local_rate_limited` over the limit.

use std::sync::Arc;

use std::collections::HashMap;
use std::sync::Mutex;

use http::{HeaderMap, HeaderName, HeaderValue, Response};

use super::{Encoder, Encoders, FilterRequest};
use crate::access_log::ResponseFlag;
use crate::body::Body;
use crate::config::http_filter::local_ratelimit::LocalRateLimitConfig;
use crate::http::local_reply::{local_reply, local_reply_with_grpc_status};
use crate::limits::{LocalLimiter, TokenBucket};
use crate::route::matcher::RuntimeFraction;
use crate::route::rate_limit::Descriptor;
use crate::route::rate_limit::DescriptorSource;
use crate::stats::{Counter, Store};

/// gRPC RESOURCE_EXHAUSTED, for `rate_limited_as_resource_exhausted`.
const RESOURCE_EXHAUSTED: u16 = 8;
/// The body and the response code details of a refused request.
const LOCAL_RATE_LIMITED: &str = "local_rate_limited";

/// The filter of one connection manager.
#[derive(Debug)]
pub(super) struct LocalRateLimit {
    config: Arc<LocalRateLimitConfig>,
    /// The filter's own configuration's stats.
    stats: LocalStats,
    /// The stats of route configurations, by stat prefix, resolved on first use.
    route_stats: Mutex<HashMap<String, LocalStats>>,
    store: Store,
}

impl LocalRateLimit {
    /// The filter with `config`; its stats (`<stat_prefix>.http_local_rate_limit.*`) are
    /// resolved now, a route configuration's on its first request.
    pub(super) fn new(config: &Arc<LocalRateLimitConfig>, store: &Store) -> LocalRateLimit {
        LocalRateLimit {
            stats: LocalStats::new(store, &config.stat_prefix),
            config: config.clone(),
            route_stats: Mutex::default(),
            store: store.clone(),
        }
    }

    /// The stats of a route's configuration.
    fn route_stats(&self, stat_prefix: &str) -> LocalStats {
        let mut known = self.route_stats.lock().unwrap_or_else(|e| e.into_inner());
        known
            .entry(stat_prefix.to_owned())
            .or_insert_with(|| LocalStats::new(&self.store, stat_prefix))
            .clone()
    }

    /// Takes `req`'s tokens per its route's configuration, else the filter's; the local reply
    /// when it is refused.
    pub(super) fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        route_config: Option<&LocalRateLimitConfig>,
        encoders: &mut Encoders,
    ) -> Option<Response<Body>> {
        let route_stats;
        let (config, stats) = match route_config {
            Some(c) => {
                route_stats = self.route_stats(&c.stat_prefix);
                (c, &route_stats)
            }
            None => (&*self.config, &self.stats),
        };
        let source = DescriptorSource {
            own: &config.rate_limits,
            stage: config.stage,
            vh: config.vh_rate_limits,
            skip_disable_keys: true,
        };
        let limiter: &LocalLimiter = if config.per_connection {
            req.conn.rate_limiter.get_or_init(|| {
                Box::new(LocalLimiter::new(
                    config.bucket,
                    &config.descriptors,
                    config.always_consume_default,
                ))
            })
        } else {
            &config.limiter
        };
        let runtime = &req.conn.shared.runtime;
        let sampled = |f: &RuntimeFraction| super::sampled(runtime, f);
        let decision = decide(config, limiter, stats, sampled, || {
            req.rate_limit_descriptors(&source)
        })?;
        if let Some(bucket) = decision.headers_from {
            encoders.0.push(Encoder::XRateLimit(bucket));
        }
        match decision.verdict {
            LocalVerdict::Pass => None,
            LocalVerdict::NotEnforced => {
                let mut headers = std::mem::take(req.headers);
                config
                    .request_headers_when_not_enforced
                    .apply_request(&mut headers, &req.format_context());
                *req.headers = headers;
                None
            }
            LocalVerdict::Refused => {
                req.note(ResponseFlag::RateLimited, Some(LOCAL_RATE_LIMITED));
                let mut resp = if config.resource_exhausted {
                    local_reply_with_grpc_status(
                        config.status,
                        LOCAL_RATE_LIMITED,
                        RESOURCE_EXHAUSTED,
                    )
                } else {
                    local_reply(config.status, LOCAL_RATE_LIMITED)
                };
                config
                    .response_headers
                    .apply_response(resp.headers_mut(), &req.format_context());
                Some(resp)
            }
        }
    }
}

/// What the filter does with a request it is enabled for.
#[derive(Debug)]
enum LocalVerdict {
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
struct LocalDecision {
    /// What to do.
    verdict: LocalVerdict,
    /// The bucket the response's `x-ratelimit-*` headers describe, when the filter adds them.
    headers_from: Option<Arc<TokenBucket>>,
}

/// Decides for a request: `None` when the filter is not enabled for it (`filter_enabled`
/// unset, or its fraction not drawn; `sampled` draws each fraction, as Envoy's runtime does). `descriptors` is asked only when the configuration has descriptors to match
/// them against.
fn decide(
    config: &LocalRateLimitConfig,
    limiter: &LocalLimiter,
    stats: &LocalStats,
    sampled: impl Fn(&RuntimeFraction) -> bool,
    descriptors: impl FnOnce() -> Vec<Descriptor>,
) -> Option<LocalDecision> {
    if !config.filter_enabled.as_ref().is_some_and(&sampled) {
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
        let enforced = config.filter_enforced.as_ref().is_some_and(&sampled);
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

/// The filter's stats, `<stat_prefix>.http_local_rate_limit.*`.
#[derive(Debug, Clone)]
pub(super) struct LocalStats {
    /// `enabled`.
    enabled: Counter,
    /// `enforced`.
    enforced: Counter,
    /// `rate_limited`.
    rate_limited: Counter,
    /// `ok`.
    ok: Counter,
}

impl LocalStats {
    /// Resolves the stats of `stat_prefix` in `store` (all of them, so they show at 0 as
    /// Envoy's do).
    fn new(store: &Store, stat_prefix: &str) -> Self {
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

/// Adds the `x-ratelimit-limit`, `-remaining` and `-reset` headers describing `bucket`.
pub(super) fn add_x_ratelimit_headers(headers: &mut HeaderMap, bucket: &TokenBucket) {
    for (name, value) in [
        ("x-ratelimit-limit", u64::from(bucket.spec().max_tokens)),
        ("x-ratelimit-remaining", u64::from(bucket.remaining())),
        ("x-ratelimit-reset", bucket.reset_seconds()),
    ] {
        headers.append(HeaderName::from_static(name), HeaderValue::from(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> LocalRateLimitConfig {
        let codec = proto::Codec::new();
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        let p = codec.decode(value, false).unwrap().message;
        let io = crate::config::FakeIo::new();
        crate::config::http_filter::local_ratelimit::compile_local(
            &crate::config::Context::new(&io),
            &p,
            false,
        )
        .unwrap()
    }

    fn verdicts(c: &LocalRateLimitConfig, n: usize) -> Vec<Option<String>> {
        let store = Store::new();
        let stats = LocalStats::new(&store, &c.stat_prefix);
        (0..n)
            .map(|_| {
                decide(c, &c.limiter, &stats, |f| f.default.enabled(0), Vec::new)
                    .map(|d| format!("{:?}", d.verdict))
            })
            .collect()
    }

    const BUCKET: &str = "token_bucket: {max_tokens: 1, fill_interval: 3600s}";

    #[test]
    fn disabled_counting_and_enforcing() {
        let off = config(&format!("{{stat_prefix: s, {BUCKET}}}"));
        assert_eq!(verdicts(&off, 2), [None, None]);
        let counting = config(&format!(
            "{{stat_prefix: s, {BUCKET}, filter_enabled: {{runtime_key: e, default_value: {{numerator: 100}}}}}}"
        ));
        assert_eq!(
            verdicts(&counting, 2),
            [Some("Pass".to_owned()), Some("NotEnforced".to_owned())]
        );
        let enforcing = config(&format!(
            "{{stat_prefix: s, {BUCKET}, filter_enabled: {{runtime_key: e, default_value: {{numerator: 100}}}}, \
             filter_enforced: {{runtime_key: f, default_value: {{numerator: 100}}}}}}"
        ));
        assert_eq!(
            verdicts(&enforcing, 2),
            [Some("Pass".to_owned()), Some("Refused".to_owned())]
        );
    }
}
