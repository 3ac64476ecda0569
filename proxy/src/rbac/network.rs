//! `envoy.filters.network.rbac` on a filter chain. Each connection is decided once, in the
//! chain's filter order, when it is accepted (after the TLS handshake on a TLS chain, so the
//! peer certificate is known): the decision depends only on the connection. As in Envoy it
//! counts once the client's first bytes arrive (a client that connects and closes without
//! sending anything is not counted), and a denied connection is closed then, after
//! `delay_deny` when set. A denied connection never reaches the chain's terminal filter, so a
//! TCP proxy does not connect upstream for it (Envoy's does, and closes that connection again).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt};

use super::{Facts, Stats, Verdict};
use crate::config::rbac::NetworkRbacConfig;
use crate::stats::Store;

/// One network RBAC filter with its stats handles.
#[derive(Debug)]
pub struct NetworkRbac {
    config: Arc<NetworkRbacConfig>,
    stats: Stats,
}

impl NetworkRbac {
    /// Resolves the filter's `<stat_prefix>rbac.*` counters.
    pub fn new(config: Arc<NetworkRbacConfig>, store: &Store) -> Self {
        let base = format!("{}rbac.", config.stat_prefix);
        let stats = Stats::new(store, &base, "", &config.shadow_rules_stat_prefix);
        NetworkRbac { config, stats }
    }
}

/// A connection's verdicts from a chain's network RBAC filters, counted once its first bytes
/// arrive.
#[derive(Debug)]
pub struct Checked<'a> {
    /// The filters that ran (up to the one that denied), with their verdicts.
    ran: Vec<(&'a NetworkRbac, Verdict)>,
    counted: AtomicBool,
}

/// Runs `filters` in order on a connection; the first that denies stops the chain (later
/// filters do not run, as in Envoy's filter chain).
pub fn check<'a>(filters: &'a [NetworkRbac], facts: &Facts<'_>) -> Checked<'a> {
    let mut ran = Vec::with_capacity(filters.len());
    for f in filters {
        let verdict = f.config.engines.decide(facts);
        let allowed = verdict.allowed();
        ran.push((f, verdict));
        if !allowed {
            break;
        }
    }
    Checked {
        ran,
        counted: AtomicBool::new(false),
    }
}

impl Checked<'_> {
    /// Whether every filter let the connection through.
    pub fn allowed(&self) -> bool {
        self.ran.iter().all(|(_, v)| v.allowed())
    }

    /// Counts the verdicts, the first time it is called (when the first bytes arrive).
    pub fn count(&self) {
        if self.counted.swap(true, Ordering::Relaxed) {
            return;
        }
        for (f, v) in &self.ran {
            f.stats.record(v);
        }
    }

    /// For a denied connection: waits until the client sends something (counting the
    /// verdicts) or closes, then for the denying filter's `delay_deny`; the caller then drops
    /// the connection. What was read is discarded.
    pub async fn close<S: AsyncRead + Unpin>(&self, stream: &mut S) {
        // On the heap: an array here would be part of every connection's future (its
        // listener's task and a TLS connection's boxed future), denied or not.
        let mut buf = vec![0u8; 16 * 1024];
        if !matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {
            return;
        }
        self.count();
        if let Some((f, v)) = self.ran.last() {
            tracing::debug!(
                policy = v
                    .enforced
                    .as_ref()
                    .and_then(|d| d.policy.as_deref())
                    .unwrap_or("none"),
                "network rbac: connection denied"
            );
            if let Some(delay) = f.config.delay_deny {
                tokio::time::sleep(delay).await;
            }
        }
    }
}
