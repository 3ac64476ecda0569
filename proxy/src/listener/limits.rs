//! The network filters that limit a chain's connections, run on each new connection before
//! the chain's terminal filter (and before a TLS handshake), as Envoy runs them when it makes
//! the connection's filter chain: a connection over a limit is closed without being read.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::network_limits::{ConnectionLimitConfig, NetworkLimit};
use crate::limits::{SharedBuckets, TokenBucket};
use crate::stats::{Counter, Gauge, Store};

/// One chain's limiting filters with their state (shared by every worker).
pub struct NetworkLimiters(Vec<Limiter>);

enum Limiter {
    Rate {
        enabled: bool,
        bucket: Arc<TokenBucket>,
        rate_limited: Counter,
    },
    Connections(ConnectionLimiter),
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
                    enabled: r.enabled,
                    bucket: shared.get(&r.share_key, r.bucket),
                    rate_limited: stats
                        .counter(&format!("local_rate_limit.{}.rate_limited", r.stat_prefix)),
                },
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
    pub async fn admit(&self) -> Option<Admitted<'_>> {
        let mut admitted = Admitted(Vec::new());
        for limiter in &self.0 {
            match limiter {
                Limiter::Rate {
                    enabled,
                    bucket,
                    rate_limited,
                } => {
                    if *enabled && !bucket.try_take() {
                        rate_limited.inc();
                        tracing::debug!("local_rate_limit: rate limiting connection");
                        return None;
                    }
                }
                Limiter::Connections(c) => {
                    if !c.config.enabled {
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
