//! The filters that limit connections. A chain's network filters run on each new connection
//! before the chain's terminal filter (and before a TLS handshake), as Envoy runs them when
//! it makes the connection's filter chain: a connection over a limit is closed without being
//! read. The listener's `local_ratelimit` runs on each accepted socket, before any chain.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::access_log::record::{Downstream, Record};
use crate::config::network_limits::{
    ConnectionLimitConfig, ListenerRateLimit, NetworkLimit, NetworkRateLimitService,
};
use crate::config::runtime::RuntimeFlag;
use crate::http::filters::rls::{self, Verdict};
use crate::limits::{Descriptor, SharedBuckets, TokenBucket};
use crate::runtime::LiveRuntime;
use crate::stats::{Counter, Gauge, Store};
use crate::upstream::ClusterManager;

/// A listener's `envoy.filters.listener.local_ratelimit`: its bucket and counter.
pub struct ListenerRateLimiter {
    enabled: RuntimeFlag,
    bucket: TokenBucket,
    rate_limited: Counter,
}

impl ListenerRateLimiter {
    /// The limiter of `config`, its counter resolved in `stats`.
    pub fn new(config: &ListenerRateLimit, stats: &Store) -> Self {
        ListenerRateLimiter {
            enabled: config.enabled.clone(),
            bucket: TokenBucket::new(config.bucket),
            rate_limited: stats.counter(&format!(
                "listener_local_ratelimit.{}.rate_limited",
                config.stat_prefix
            )),
        }
    }

    /// Whether an accepted socket may go on (it took a token, or `runtime` has the limit
    /// off); else the caller closes it.
    pub fn admit(&self, runtime: &LiveRuntime) -> bool {
        if !runtime.flag(&self.enabled) || self.bucket.try_take() {
            return true;
        }
        self.rate_limited.inc();
        tracing::debug!("listener_local_ratelimit: rate limiting socket");
        false
    }
}

/// One chain's limiting filters with their state (shared by every worker).
pub struct NetworkLimiters(Vec<Limiter>);

enum Limiter {
    Rate {
        enabled: RuntimeFlag,
        bucket: Arc<TokenBucket>,
        rate_limited: Counter,
    },
    Connections(ConnectionLimiter),
    Service(ServiceLimiter),
}

/// An `envoy.filters.network.ratelimit` filter: its config and `ratelimit.<stat_prefix>.*`.
struct ServiceLimiter {
    config: NetworkRateLimitService,
    total: Counter,
    ok: Counter,
    error: Counter,
    over_limit: Counter,
    failure_mode_allowed: Counter,
    cx_closed: Counter,
    active: Gauge,
}

impl ServiceLimiter {
    fn new(config: &NetworkRateLimitService, stats: &Store) -> Self {
        let counter = |n: &str| stats.counter(&format!("ratelimit.{}.{n}", config.stat_prefix));
        ServiceLimiter {
            total: counter("total"),
            ok: counter("ok"),
            error: counter("error"),
            over_limit: counter("over_limit"),
            failure_mode_allowed: counter("failure_mode_allowed"),
            cx_closed: counter("cx_closed"),
            active: stats.gauge(&format!("ratelimit.{}.active", config.stat_prefix)),
            config: config.clone(),
        }
    }

    /// The descriptors for a connection from `downstream`, their values rendered.
    fn descriptors(&self, downstream: Downstream) -> Vec<Descriptor> {
        let record = Record::new(downstream);
        self.config
            .descriptors
            .iter()
            .map(|entries| {
                Descriptor(
                    entries
                        .iter()
                        .map(|(key, value)| {
                            let mut out = String::new();
                            value.render_text(&record, false, &mut out);
                            (key.clone(), out)
                        })
                        .collect(),
                )
            })
            .collect()
    }

    /// Asks the service about a new connection from `downstream`: whether it may go on.
    async fn admit(&self, clusters: &ClusterManager, downstream: Downstream) -> bool {
        let c = &self.config;
        let descriptors = self.descriptors(downstream);
        let service = rls::Service {
            cluster: &c.cluster,
            authority: &c.authority,
            timeout: c.timeout,
            x_ratelimit_headers: false,
        };
        self.total.inc();
        self.active.inc();
        let verdict = rls::should_rate_limit(clusters, service, &c.domain, &descriptors).await;
        self.active.dec();
        let admitted = match verdict {
            Verdict::Ok(_) => {
                self.ok.inc();
                true
            }
            Verdict::OverLimit(_) => {
                self.over_limit.inc();
                false
            }
            Verdict::Error(e) => {
                self.error.inc();
                tracing::debug!(error = %e, "ratelimit: rate limit service call failed");
                if !c.failure_mode_deny {
                    self.failure_mode_allowed.inc();
                }
                !c.failure_mode_deny
            }
        };
        if !admitted {
            self.cx_closed.inc();
            tracing::debug!("ratelimit: closing connection");
        }
        admitted
    }
}

/// A `connection_limit` filter: its open connections and stats.
struct ConnectionLimiter {
    config: ConnectionLimitConfig,
    open: AtomicU64,
    limited: Counter,
    active: Gauge,
}

/// A connection admitted by every limit: it holds its place in the connection limits until
/// dropped (when the connection closes).
pub struct Admitted<'a>(Vec<&'a ConnectionLimiter>);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        for limiter in &self.0 {
            limiter.open.fetch_sub(1, Ordering::Relaxed);
            limiter.active.dec();
        }
    }
}

impl NetworkLimiters {
    /// The limiters of `limits` (a chain's, in order), their stats resolved in `stats`,
    /// rate limits with a `share_key` taking their bucket from `shared`.
    pub fn new(limits: &[NetworkLimit], stats: &Store, shared: &SharedBuckets) -> Self {
        let limiters = limits
            .iter()
            .map(|l| match l {
                NetworkLimit::RateLimit(r) => Limiter::Rate {
                    enabled: r.enabled.clone(),
                    bucket: shared.get(&r.share_key, r.bucket),
                    rate_limited: stats
                        .counter(&format!("local_rate_limit.{}.rate_limited", r.stat_prefix)),
                },
                NetworkLimit::Service(c) => Limiter::Service(ServiceLimiter::new(c, stats)),
                NetworkLimit::ConnectionLimit(c) => {
                    let prefix = format!("connection_limit.{}", c.stat_prefix);
                    Limiter::Connections(ConnectionLimiter {
                        config: c.clone(),
                        open: AtomicU64::new(0),
                        limited: stats.counter(&format!("{prefix}.limited_connections")),
                        active: stats.gauge(&format!("{prefix}.active_connections")),
                    })
                }
            })
            .collect();
        NetworkLimiters(limiters)
    }

    /// Runs the limits in order on a new connection. `None`: a limit refused it, and the
    /// caller closes it (after a `connection_limit`'s `delay`, which this waits out holding
    /// the connection's place, as Envoy does); else the connection's places in the limits.
    /// A rate limit service is called through `clusters`, about a connection from
    /// `downstream()` (made only then); `runtime` turns limits on and off.
    pub async fn admit(
        &self,
        clusters: &ClusterManager,
        runtime: &LiveRuntime,
        downstream: impl Fn() -> Downstream,
    ) -> Option<Admitted<'_>> {
        let mut admitted = Admitted(Vec::new());
        for limiter in &self.0 {
            match limiter {
                Limiter::Rate {
                    enabled,
                    bucket,
                    rate_limited,
                } => {
                    if runtime.flag(enabled) && !bucket.try_take() {
                        rate_limited.inc();
                        tracing::debug!("local_rate_limit: rate limiting connection");
                        return None;
                    }
                }
                Limiter::Service(service) => {
                    // Boxed: the gRPC call is kilobytes that every connection's task would
                    // otherwise carry for its whole life, rate limited or not.
                    let call = crate::spawn::boxed(|| service.admit(clusters, downstream()));
                    if !call.await {
                        return None;
                    }
                }
                Limiter::Connections(c) => {
                    if !runtime.flag(&c.config.enabled) {
                        continue;
                    }
                    c.active.inc();
                    let within = c
                        .open
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            (n < c.config.max_connections).then_some(n + 1)
                        })
                        .is_ok();
                    if !within {
                        c.open.fetch_add(1, Ordering::Relaxed);
                    }
                    admitted.0.push(c);
                    if !within {
                        c.limited.inc();
                        tracing::debug!("connection_limit: connection limiting connection");
                        if let Some(delay) = c.config.delay {
                            tokio::time::sleep(delay).await;
                        }
                        return None;
                    }
                }
            }
        }
        Some(admitted)
    }
}
