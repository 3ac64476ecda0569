//! `envoy.filters.network.rbac` on a filter chain: each connection is checked once, in the
//! chain's filter order, when it is accepted (after the TLS handshake on a TLS chain, so the
//! peer certificate is known). A denied connection is closed as Envoy closes it: once the
//! client has sent its first bytes (or closed), after `delay_deny` when set, and without
//! reaching the chain's terminal filter, so a TCP proxy never connects upstream for it.
//!
//! Envoy counts a connection at its first bytes; revoy counts it at the check, so a client
//! that connects and never sends anything is counted by revoy and not by Envoy.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::{Facts, Stats};
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

/// Why a connection is closed: the denying filter's `delay_deny`.
#[derive(Debug, Clone, Copy)]
pub struct Denied {
    delay: Option<std::time::Duration>,
}

/// Runs `filters` in order on a connection: the first that denies closes it (later filters
/// are not run, as in Envoy's filter chain).
pub fn check(filters: &[NetworkRbac], facts: &Facts<'_>) -> Result<(), Denied> {
    for f in filters {
        let decision = f.config.engines.check(facts, &f.stats);
        if let Some(d) = decision.filter(|d| !d.allowed) {
            tracing::debug!(
                policy = d.policy.as_deref().unwrap_or("none"),
                "network rbac: connection denied"
            );
            return Err(Denied {
                delay: f.config.delay_deny,
            });
        }
    }
    Ok(())
}

impl Denied {
    /// Waits until the client sends something (or closes), then for `delay_deny`; the caller
    /// then drops the connection. What was read is discarded.
    pub async fn close<S: AsyncRead + Unpin>(self, stream: &mut S) {
        let mut buf = [0u8; 4096];
        let _ = stream.read(&mut buf).await;
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
    }
}
