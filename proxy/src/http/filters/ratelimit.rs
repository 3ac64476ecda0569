//! `envoy.filters.http.ratelimit`: asks the rate limit service about each request that has
//! descriptors, and answers over-limit requests itself (429, `x-envoy-ratelimited`).

use std::sync::Arc;

use http::{HeaderValue, Response, header};

use super::rls::{Verdict, should_rate_limit};
use super::{Encoder, Encoders, FilterRequest};
use crate::access_log::ResponseFlag;
use crate::body::{self, Body};
use crate::config::http_filter::ratelimit::{
    RateLimitPerRoute, RateLimitServiceConfig, RequestType,
};
use crate::http::local_reply::{local_reply, local_reply_with_grpc_status};
use crate::route::Action;
use crate::route::rate_limit::{DescriptorSource, VhRateLimits};
use crate::stats::keyed::Keyed;
use crate::stats::{Counter, Store};

/// gRPC RESOURCE_EXHAUSTED, for `rate_limited_as_resource_exhausted`.
const RESOURCE_EXHAUSTED: u16 = 8;

/// The filter of one connection manager.
#[derive(Debug)]
pub(super) struct RateLimit {
    config: Arc<RateLimitServiceConfig>,
    store: Store,
    /// `cluster.<route cluster>.[<stat_prefix>.]ratelimit.*`, by cluster.
    by_cluster: Keyed<Arc<[Counter; 4]>>,
}

/// The counters of [`RateLimit::by_cluster`], in this order.
const COUNTERS: [&str; 4] = ["ok", "over_limit", "error", "failure_mode_allowed"];

impl RateLimit {
    /// The filter with `config`.
    pub(super) fn new(config: &Arc<RateLimitServiceConfig>, store: &Store) -> RateLimit {
        RateLimit {
            config: config.clone(),
            store: store.clone(),
            by_cluster: Keyed::default(),
        }
    }

    /// Counts `cluster.<cluster>.[<stat_prefix>.]ratelimit.<name>` (`name` one of
    /// [`COUNTERS`]).
    fn count(&self, cluster: &str, name: &str) {
        let counters = self.by_cluster.get(cluster, || {
            let prefix = match self.config.stat_prefix.as_str() {
                "" => String::new(),
                p => format!("{p}."),
            };
            Arc::new(COUNTERS.map(|n| {
                self.store
                    .counter(&format!("cluster.{cluster}.{prefix}ratelimit.{n}"))
            }))
        });
        if let Some(i) = COUNTERS.iter().position(|n| *n == name) {
            counters[i].inc();
        }
    }

    /// Calls the service for `req` (when its route forwards to a known cluster and its
    /// policies make descriptors); the local reply when it is over the limit, or when the call
    /// failed under `failure_mode_deny`.
    pub(super) async fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        route_config: Option<&RateLimitPerRoute>,
        encoders: &mut Encoders,
    ) -> Option<Response<Body>> {
        let config = &self.config;
        let internal = req.route_request().is_internal();
        match config.request_type {
            RequestType::Internal if !internal => return None,
            RequestType::External if internal => return None,
            _ => {}
        }
        let route = req.route?;
        let Action::Forward(forward) = &route.route.action else {
            return None;
        };
        let cluster = forward
            .pick_cluster(&req.route_request())?
            .name
            .into_owned();
        let target = req.conn.shared.clusters.get(&cluster)?;
        let own = route_config
            .filter(|r| !r.rate_limits.is_empty())
            .map_or(&config.rate_limits[..], |r| &r.rate_limits[..]);
        let source = DescriptorSource {
            own,
            stage: config.stage,
            vh: route_config.map_or(VhRateLimits::Override, |r| r.vh_rate_limits),
            skip_disable_keys: false,
        };
        let descriptors = req.rate_limit_descriptors(&source);
        if descriptors.is_empty() {
            return None;
        }
        let domain = route_config
            .and_then(|r| r.domain.as_deref())
            .unwrap_or(&config.domain);
        let verdict = should_rate_limit(
            &req.conn.shared.clusters,
            config.as_ref().into(),
            domain,
            &descriptors,
        )
        .await;
        match verdict {
            Verdict::Ok(answer) => {
                self.count(&cluster, "ok");
                for (name, value) in answer.request_headers {
                    req.headers.append(name, value);
                }
                if !answer.response_headers.is_empty() {
                    encoders
                        .0
                        .push(Encoder::AddHeaders(answer.response_headers));
                }
                None
            }
            Verdict::OverLimit(answer) => {
                self.count(&cluster, "over_limit");
                // Envoy charges the refusal to the route's cluster as an internal 429.
                target.stats().charge_status(429, true);
                req.note(ResponseFlag::RateLimited, Some("request_rate_limited"));
                let text = String::from_utf8_lossy(&answer.body);
                let mut resp = if config.resource_exhausted {
                    local_reply_with_grpc_status(
                        config.rate_limited_status,
                        &text,
                        RESOURCE_EXHAUSTED,
                    )
                } else {
                    local_reply(config.rate_limited_status, &text)
                };
                let headers = resp.headers_mut();
                if answer
                    .response_headers
                    .iter()
                    .any(|(n, _)| n == header::CONTENT_TYPE)
                {
                    headers.remove(header::CONTENT_TYPE);
                }
                for (name, value) in answer.response_headers {
                    headers.append(name, value);
                }
                if config.x_envoy_ratelimited {
                    headers.insert("x-envoy-ratelimited", HeaderValue::from_static("true"));
                }
                config
                    .response_headers
                    .apply_response(resp.headers_mut(), &req.format_context());
                Some(resp)
            }
            Verdict::Error(why) => {
                self.count(&cluster, "error");
                tracing::debug!(error = %why, "rate limit service call failed");
                if !config.failure_mode_deny {
                    self.count(&cluster, "failure_mode_allowed");
                    return None;
                }
                req.note(
                    ResponseFlag::RateLimitServiceError,
                    Some("rate_limiter_error"),
                );
                let mut resp = local_reply(config.status_on_error, "");
                *resp.body_mut() = body::empty();
                Some(resp)
            }
        }
    }
}
