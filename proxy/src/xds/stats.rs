//! The xDS stats, with Envoy's names: `cluster_manager.cds.*`, `listener_manager.lds.*`, the
//! cluster and listener managers' counts, `control_plane.*`.

use std::hash::{Hash, Hasher};

use crate::stats::{Block, Counter, Gauge, Store};
use crate::upstream::ClusterStats;

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
    /// The stats of the subscription named by `prefix` (`cluster_manager.cds`,
    /// `listener_manager.lds`, `http.<stat_prefix>.rds.<route_config>` for RDS).
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

    /// The EDS stats of a cluster, in its block (`cluster.<name>.update_*`, `version`).
    fn in_block(block: &Block) -> Self {
        let c = |n: &str| {
            block
                .named_counter(n)
                .expect("the cluster layout has the update stats")
        };
        UpdateStats {
            attempt: c("update_attempt"),
            success: c("update_success"),
            rejected: c("update_rejected"),
            failure: c("update_failure"),
            version: block
                .named_gauge("version")
                .expect("the cluster layout has the version gauge"),
        }
    }

    /// Counts one EDS update of the clusters whose stat names are `clusters`, in each one's
    /// block (created here for a cluster that still warms).
    pub fn count_eds(store: &Store, clusters: &[String], version_info: &str, accepted: bool) {
        for name in clusters {
            let stats = UpdateStats::in_block(&ClusterStats::block(store, name));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eds_updates_count_in_the_cluster_block_before_and_after_the_cluster() {
        let store = Store::new();
        // The cluster still warms: its first EDS response makes its block.
        UpdateStats::count_eds(&store, &["c".to_owned()], "v1", true);
        let cluster = ClusterStats::new(&store, "c");
        assert_eq!(cluster.update_attempt().value(), 1);
        assert_eq!(cluster.update_success().value(), 1);
        UpdateStats::count_eds(&store, &["c".to_owned()], "v2", false);
        assert_eq!(cluster.update_attempt().value(), 2);
        assert_eq!(cluster.update_rejected().value(), 1);
        let snap = store.snapshot();
        let names: Vec<&str> = snap.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"cluster.c.update_rejected"));
        assert!(names.contains(&"cluster.c.version"));
        assert_eq!(names.len(), 31);
    }

    #[test]
    fn a_cluster_without_eds_has_no_rejected_or_version_stat() {
        let store = Store::new();
        let _cluster = ClusterStats::new(&store, "static");
        let snap = store.snapshot();
        assert!(
            !snap
                .iter()
                .any(|(n, _)| n.ends_with(".update_rejected") || n.ends_with(".version"))
        );
    }
}
