//! `envoy.filters.http.health_check`: answers health checks at the proxy (or passes them
//! upstream and caches the answer), and tells every client when the proxy fails its own
//! health check (`/healthcheck/fail`).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::{HeaderName, HeaderValue, Response, StatusCode};

use super::{Encoder, Encoders, FilterRequest};
use crate::access_log::ResponseFlag;
use crate::body::Body;
use crate::config::http_filter::health_check::HealthCheckConfig;
use crate::http::local_reply::local_reply;
use crate::stats::{Counter, Store};

static HEALTHCHECKED_CLUSTER: HeaderName =
    HeaderName::from_static("x-envoy-upstream-healthchecked-cluster");
static IMMEDIATE_FAIL: HeaderName = HeaderName::from_static("x-envoy-immediate-health-check-fail");
static DEGRADED: HeaderName = HeaderName::from_static("x-envoy-degraded");

/// The health-check filter of one connection manager.
#[derive(Debug)]
pub(super) struct HealthCheck {
    config: Arc<HealthCheckConfig>,
    /// The last upstream answer to a health check, kept until the cache window it arrived in
    /// ends (windows of `cache_time` from the filter's creation, as Envoy's timer).
    cache: Option<Arc<Cache>>,
    stats: Stats,
}

/// `http.<prefix>.health_check.*`: the checks the filter answered itself (one passed
/// upstream counts in none).
#[derive(Debug)]
struct Stats {
    request_total: Counter,
    ok: Counter,
    /// Answered with a failure: the proxy failing, a cached failure, a cluster's health.
    failed: Counter,
    cached_response: Counter,
    failed_cluster_not_found: Counter,
    failed_cluster_empty: Counter,
    failed_cluster_unhealthy: Counter,
    /// Answered with `x-envoy-degraded`.
    degraded: Counter,
}

/// Why `cluster_min_healthy_percentages` failed a check.
enum ClusterFailure {
    NotFound,
    Empty,
    Unhealthy,
}

#[derive(Debug)]
pub(super) struct Cache {
    since: Instant,
    /// (window, status, degraded) of the last answer.
    last: Mutex<Option<(u128, StatusCode, bool)>>,
}

impl Cache {
    fn window(&self) -> u128 {
        self.since.elapsed().as_nanos()
    }
}

/// A request's health-check state, acting on its response.
#[derive(Debug)]
pub(super) enum Answer {
    /// A health check: the response names the proxy's cluster (and feeds the cache).
    HealthCheck {
        /// The proxy's cluster (`--service-cluster` / `node.cluster`).
        cluster: HeaderValue,
        /// The cache and its window length, in pass-through mode with `cache_time`.
        cache: Option<(Arc<Cache>, u128)>,
        /// The proxy fails its own health check.
        failing: bool,
    },
    /// Another request while the proxy fails its health check.
    Failing,
}

impl HealthCheck {
    /// The filter with `config`, its stats under `http.<stat_prefix>.health_check.`.
    pub(super) fn new(
        config: &Arc<HealthCheckConfig>,
        store: &Store,
        stat_prefix: &str,
    ) -> HealthCheck {
        let counter = |n: &str| store.counter(&format!("http.{stat_prefix}.health_check.{n}"));
        HealthCheck {
            stats: Stats {
                request_total: counter("request_total"),
                ok: counter("ok"),
                failed: counter("failed"),
                cached_response: counter("cached_response"),
                failed_cluster_not_found: counter("failed_cluster_not_found"),
                failed_cluster_empty: counter("failed_cluster_empty"),
                failed_cluster_unhealthy: counter("failed_cluster_unhealthy"),
                degraded: counter("degraded"),
            },
            config: config.clone(),
            cache: config.cache_time.map(|_| {
                Arc::new(Cache {
                    since: Instant::now(),
                    last: Mutex::new(None),
                })
            }),
        }
    }

    /// Answers a health check here when it must (not pass-through, the proxy failing, or a
    /// fresh cached answer); marks what the response must carry.
    pub(super) async fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        encoders: &mut Encoders,
    ) -> Option<Response<Body>> {
        let failing = req.conn.shared.drain().health_failed();
        let route_req = req.route_request();
        let is_check = self.config.headers.iter().all(|h| h.matches(&route_req));
        if !is_check {
            if failing {
                encoders.0.push(Encoder::HealthCheck(Answer::Failing));
            }
            return None;
        }
        if let Some(r) = req.record.as_deref_mut() {
            r.health_check = true;
        }
        let window = self.config.cache_time.map_or(1, |t| t.as_nanos().max(1));
        let cached = self.cache.as_ref().and_then(|c| {
            let last = *c.last.lock().unwrap_or_else(|e| e.into_inner());
            last.filter(|(w, _, _)| *w == c.window() / window)
                .map(|(_, status, degraded)| (status, degraded))
        });
        let cluster = HeaderValue::from_str(&req.conn.shared.tracers.local.cluster)
            .unwrap_or_else(|_| HeaderValue::from_static(""));
        encoders.0.push(Encoder::HealthCheck(Answer::HealthCheck {
            cluster,
            cache: self.cache.clone().map(|c| (c, window)),
            failing,
        }));
        if self.config.pass_through && !failing && cached.is_none() {
            return None;
        }
        // Envoy answers once the whole request has arrived.
        let body = std::mem::replace(req.body, crate::body::empty());
        let _ = http_body_util::BodyExt::collect(body).await;
        let stats = &self.stats;
        stats.request_total.inc();
        let (status, degraded) = if failing {
            (StatusCode::SERVICE_UNAVAILABLE, false)
        } else if let Some(c) = cached {
            stats.cached_response.inc();
            c
        } else {
            match self.min_healthy_failure(req) {
                None => (StatusCode::OK, false),
                Some(why) => {
                    match why {
                        ClusterFailure::NotFound => &stats.failed_cluster_not_found,
                        ClusterFailure::Empty => &stats.failed_cluster_empty,
                        ClusterFailure::Unhealthy => &stats.failed_cluster_unhealthy,
                    }
                    .inc();
                    (StatusCode::SERVICE_UNAVAILABLE, false)
                }
            }
        };
        if status.is_success() {
            stats.ok.inc();
        } else {
            stats.failed.inc();
        }
        if degraded {
            stats.degraded.inc();
        }
        if failing || !status.is_success() {
            req.note(ResponseFlag::FailedLocalHealthCheck, None);
        }
        let mut resp = local_reply(status, "");
        if degraded {
            resp.headers_mut()
                .insert(&DEGRADED, HeaderValue::from_static(""));
        }
        Some(resp)
    }

    /// Why a cluster of `cluster_min_healthy_percentages` fails the check (missing, or with
    /// too few healthy hosts: degraded ones count as healthy, as in Envoy); `None` when all
    /// pass.
    fn min_healthy_failure(&self, req: &FilterRequest<'_>) -> Option<ClusterFailure> {
        for (name, min) in &self.config.min_healthy {
            let Some(cluster) = req.conn.shared.clusters.get(name) else {
                return Some(ClusterFailure::NotFound);
            };
            let stats = cluster.stats();
            let total = stats.membership_total().value();
            let healthy = stats.membership_healthy().value() + stats.membership_degraded().value();
            if total == 0 && *min == 0 {
                continue;
            }
            if total == 0 {
                return Some(ClusterFailure::Empty);
            }
            if healthy.saturating_mul(100) < total.saturating_mul(*min) {
                return Some(ClusterFailure::Unhealthy);
            }
        }
        None
    }
}

impl Answer {
    /// Adds the headers Envoy's filter adds, and caches an upstream's answer.
    pub(super) fn encode(&self, resp: &mut Response<Body>) {
        match self {
            Answer::HealthCheck {
                cluster,
                cache,
                failing,
            } => {
                if let Some((c, window)) = cache {
                    let degraded = resp.headers().contains_key(&DEGRADED);
                    *c.last.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some((c.window() / window, resp.status(), degraded));
                }
                resp.headers_mut()
                    .insert(&HEALTHCHECKED_CLUSTER, cluster.clone());
                if *failing {
                    immediate_fail(resp);
                }
            }
            Answer::Failing => immediate_fail(resp),
        }
    }
}

/// `x-envoy-immediate-health-check-fail: true`: the proxy fails its health check.
fn immediate_fail(resp: &mut Response<Body>) {
    resp.headers_mut()
        .insert(&IMMEDIATE_FAIL, HeaderValue::from_static("true"));
}
