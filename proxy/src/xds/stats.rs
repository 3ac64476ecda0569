//! The xDS stats, with Envoy's names: `cluster_manager.cds.*`, `listener_manager.lds.*`, the
//! cluster and listener managers' counts, `control_plane.*`.

use std::hash::{Hash, Hasher};

use crate::stats::{Counter, Gauge, Store};

/// One subscription's `update_*` stats and `version`.
pub struct UpdateStats {
    /// `update_attempt`: responses received.
    pub attempt: Counter,
    /// `update_success`: responses applied whole.
    pub success: Counter,
    /// `update_rejected`: responses with a rejected resource.
    pub rejected: Counter,
    /// `update_failure`: the stream failed.
    pub failure: Counter,
    /// `version`: a hash of the last accepted `version_info`.
    pub version: Gauge,
}

impl UpdateStats {
    /// The stats of the subscription named by `prefix` (`cluster.<name>` for EDS,
    /// `http.<stat_prefix>.rds.<route_config>` for RDS).
    pub fn new(store: &Store, prefix: &str) -> Self {
        UpdateStats {
            attempt: store.counter(&format!("{prefix}.update_attempt")),
            success: store.counter(&format!("{prefix}.update_success")),
            rejected: store.counter(&format!("{prefix}.update_rejected")),
            failure: store.counter(&format!("{prefix}.update_failure")),
            version: store.gauge(&format!("{prefix}.version")),
        }
    }

    /// Counts one update of the subscriptions named by `prefixes`: an attempt, and its outcome.
    pub fn count(store: &Store, prefixes: &[String], version_info: &str, accepted: bool) {
        for p in prefixes {
            let stats = UpdateStats::new(store, p);
            stats.attempt.inc();
            stats.finish(version_info, accepted);
        }
    }

    /// Counts a response's outcome.
    pub fn finish(&self, version_info: &str, accepted: bool) {
        if accepted {
            self.success.inc();
            let mut h = std::collections::hash_map::DefaultHasher::new();
            version_info.hash(&mut h);
            self.version.set(h.finish());
        } else {
            self.rejected.inc();
        }
    }
}

/// Every xDS stat the handler keeps.
pub struct XdsStats {
    /// `cluster_manager.cds.*`.
    pub cds: UpdateStats,
    /// `listener_manager.lds.*`.
    pub lds: UpdateStats,
    /// `cluster_manager.cluster_added`.
    pub cluster_added: Counter,
    /// `cluster_manager.cluster_modified`.
    pub cluster_modified: Counter,
    /// `cluster_manager.cluster_removed`.
    pub cluster_removed: Counter,
    /// `cluster_manager.active_clusters`.
    pub active_clusters: Gauge,
    /// `cluster_manager.warming_clusters`.
    pub warming_clusters: Gauge,
    /// `listener_manager.listener_added`.
    pub listener_added: Counter,
    /// `listener_manager.listener_modified`.
    pub listener_modified: Counter,
    /// `listener_manager.listener_removed`.
    pub listener_removed: Counter,
    /// `listener_manager.listener_in_place_updated`.
    pub listener_in_place_updated: Counter,
    /// `listener_manager.total_listeners_warming`.
    pub warming_listeners: Gauge,
    /// `control_plane.connected_state`.
    pub connected_state: Gauge,
    /// `control_plane.rate_limit_enforced`.
    pub rate_limit_enforced: Counter,
    /// `control_plane.pending_requests`: the requests waiting for the rate limit.
    pub pending_requests: Gauge,
}

impl XdsStats {
    /// Resolves the handles in `store`.
    pub fn new(store: &Store) -> Self {
        let c = |n: &str| store.counter(n);
        let g = |n: &str| store.gauge(n);
        XdsStats {
            cds: UpdateStats::new(store, "cluster_manager.cds"),
            lds: UpdateStats::new(store, "listener_manager.lds"),
            cluster_added: c("cluster_manager.cluster_added"),
            cluster_modified: c("cluster_manager.cluster_modified"),
            cluster_removed: c("cluster_manager.cluster_removed"),
            active_clusters: g("cluster_manager.active_clusters"),
            warming_clusters: g("cluster_manager.warming_clusters"),
            listener_added: c("listener_manager.listener_added"),
            listener_modified: c("listener_manager.listener_modified"),
            listener_removed: c("listener_manager.listener_removed"),
            listener_in_place_updated: c("listener_manager.listener_in_place_updated"),
            warming_listeners: g("listener_manager.total_listeners_warming"),
            connected_state: g("control_plane.connected_state"),
            rate_limit_enforced: c("control_plane.rate_limit_enforced"),
            pending_requests: g("control_plane.pending_requests"),
        }
    }
}
