//! The state the data path reads: stats, clusters, live secrets, the RDS route tables, the
//! tracers, the drain state and the local Istio workload. It names no data-path module (http/, listener/), and neither
//! the applier, the bootstrap nor xDS: those are the control side's ([`crate::process`]), so
//! the data path depends on this module and never on the wiring.

use std::sync::Arc;

use crate::config::istio::workload::LocalWorkload;
use crate::drain::Drain;
use crate::snapshot::Published;
use crate::stats::Store;
use crate::trace::Tracers;
use crate::upstream::ClusterManager;

/// Process-wide state every connection reads.
pub struct Shared {
    /// All stats.
    pub stats: Store,
    /// Clusters by name.
    pub clusters: ClusterManager,
    /// The secrets TLS contexts use (static, SDS), as live values.
    pub secrets: Arc<crate::tls::SecretStore>,
    /// The RDS route tables; only the applier stores.
    pub snapshot: Published,
    /// The tracers connection managers report spans to.
    pub tracers: Tracers,
    /// Health-check failure and listener drains (set through the lifecycle).
    drain: Arc<Drain>,
    /// This proxy's Istio workload (from the node's metadata), which Istio's filters send
    /// and report.
    pub local_workload: Arc<LocalWorkload>,
    /// The runtime (the bootstrap's layers and the admin layer's overrides).
    pub runtime: Arc<crate::runtime::LiveRuntime>,
}

impl Shared {
    /// The data path's state over these handles, with no RDS route table yet.
    pub fn new(
        stats: Store,
        clusters: ClusterManager,
        secrets: Arc<crate::tls::SecretStore>,
        tracers: Tracers,
        drain: Arc<Drain>,
        local_workload: LocalWorkload,
        runtime: Arc<crate::runtime::LiveRuntime>,
    ) -> Shared {
        Shared {
            stats,
            clusters,
            secrets,
            snapshot: Published::default(),
            tracers,
            drain,
            local_workload: Arc::new(local_workload),
            runtime,
        }
    }

    /// The drain state connections consult.
    pub fn drain(&self) -> &Drain {
        &self.drain
    }
}
