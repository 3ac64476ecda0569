//! `envoy.filters.http.local_ratelimit`: token buckets in the proxy (the filter's, or a
//! route's own configuration), `429 local_rate_limited` over the limit.

use std::sync::Arc;

use http::Response;

use super::{Encoder, Encoders, FilterRequest};
use crate::access_log::ResponseFlag;
use crate::body::Body;
use crate::config::http_filter::local_ratelimit::LocalRateLimitConfig;
use crate::http::local_reply::{local_reply, local_reply_with_grpc_status};
use crate::limits::LocalLimiter;
use crate::limits::http_local::{LocalStats, LocalVerdict, decide};
use crate::route::rate_limit::DescriptorSource;
use crate::stats::Store;

/// gRPC RESOURCE_EXHAUSTED, for `rate_limited_as_resource_exhausted`.
const RESOURCE_EXHAUSTED: u16 = 8;
/// The body and the response code details of a refused request.
const LOCAL_RATE_LIMITED: &str = "local_rate_limited";

/// The filter of one connection manager.
#[derive(Debug)]
pub(super) struct LocalRateLimit {
    config: Arc<LocalRateLimitConfig>,
    store: Store,
}

impl LocalRateLimit {
    /// The filter with `config`; its stats (`<stat_prefix>.http_local_rate_limit.*`) are
    /// resolved now, a route configuration's on its first request.
    pub(super) fn new(config: &Arc<LocalRateLimitConfig>, store: &Store) -> LocalRateLimit {
        config
            .stats
            .get_or_init(|| LocalStats::new(store, &config.stat_prefix));
        LocalRateLimit {
            config: config.clone(),
            store: store.clone(),
        }
    }

    /// Takes `req`'s tokens per its route's configuration, else the filter's; the local reply
    /// when it is refused.
    pub(super) fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        route_config: Option<&Arc<LocalRateLimitConfig>>,
        encoders: &mut Encoders,
    ) -> Option<Response<Body>> {
        let config = route_config.unwrap_or(&self.config);
        let stats = config
            .stats
            .get_or_init(|| LocalStats::new(&self.store, &config.stat_prefix));
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
        let decision = decide(config, limiter, stats, rand::random(), || {
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
