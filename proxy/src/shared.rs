//! The state the data path reads: stats, clusters, live secrets, the RDS route tables, the
//! tracers and the drain state. It names no data-path module (http/, listener/), and neither
//! the applier, the bootstrap nor xDS: those are the control side's ([`crate::process`]), so
//! the data path depends on this module and never on the wiring.

use std::sync::Arc;

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
}

impl Shared {
    /// The data path's state over these handles, with no RDS route table yet.
    pub fn new(
        stats: Store,
        clusters: ClusterManager,
        secrets: Arc<crate::tls::SecretStore>,
        tracers: Tracers,
        drain: Arc<Drain>,
    ) -> Shared {
        Shared {
            stats,
            clusters,
            secrets,
            snapshot: Published::default(),
            tracers,
            drain,
        }
    }

    /// The drain state connections consult.
    pub fn drain(&self) -> &Drain {
        &self.drain
    }
}
