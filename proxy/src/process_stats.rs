//! The process-wide stats Envoy lists from its start that revoy's subsystems do not make
//! themselves: the cluster and listener managers' counts of the bootstrap's static
//! resources, and the `server.*`, `cluster_manager.*`, `listener_manager.*`, `http1.*` and
//! overload stats of events revoy never has, listed at 0.

use crate::stats::{Slot, Store};

/// `server.*` stats that stay 0 in revoy: not a FIPS build, no hot restart (epoch, parent
/// connections), no debug assertions, `ENVOY_BUG`s or notifications, no stats sinks to drop
/// a flush, no work-in-progress protos.
static SERVER: [Slot; 8] = [
    Slot::gauge("compilation_settings.fips_mode"),
    Slot::counter("debug_assertion_failures"),
    Slot::counter("dropped_stat_flushes"),
    Slot::counter("envoy_bug_failures"),
    Slot::counter("envoy_notifications"),
    Slot::gauge("hot_restart_epoch"),
    Slot::gauge("parent_connections"),
    Slot::counter("wip_protos"),
];

/// `cluster_manager.*` that stay 0 until xDS counts them (a bootstrap's static clusters are
/// never modified or removed), and the merge window's, which revoy does not have.
static CLUSTER_MANAGER: [Slot; 6] = [
    Slot::counter("cluster_modified"),
    Slot::counter("cluster_removed"),
    Slot::counter("cluster_updated_via_merge"),
    Slot::counter("update_merge_cancelled"),
    Slot::counter("update_out_of_merge_window"),
    Slot::gauge("warming_clusters"),
];

/// `listener_manager.*` that stay 0 until xDS counts them (a static listener is never
/// modified, updated in place, removed or warming) or `/drain_listeners` stops a listener,
/// and those revoy never has: a listener's creation failing on a worker (revoy fails to
/// start instead), workers pinned.
static LISTENER_MANAGER: [Slot; 8] = [
    Slot::counter("listener_create_failure"),
    Slot::counter("listener_in_place_updated"),
    Slot::counter("listener_modified"),
    Slot::counter("listener_removed"),
    Slot::counter("listener_stopped"),
    Slot::gauge("total_listeners_draining"),
    Slot::gauge("total_listeners_warming"),
    Slot::gauge("workers_pinned"),
];

/// `http1.*` (the downstream HTTP/1 codec's process-wide stats) that revoy never has: no
/// METADATA frames to refuse, no response-flood protection.
static HTTP1: [Slot; 2] = [
    Slot::counter("metadata_not_supported_error"),
    Slot::counter("response_flood"),
];

/// The overload manager's action counter, with no overload manager.
static OVERLOAD: [Slot; 1] = [Slot::counter("")];

/// Lists the process-wide stats in `store`, and counts the bootstrap's `clusters` static
/// clusters and `listeners` static listeners (created on each of `workers`) as Envoy's
/// managers do; without `dynamic_resources`, `cluster_manager.active_clusters` is their
/// number (with it, the xDS handler keeps it).
pub fn publish(store: &Store, clusters: usize, listeners: usize, workers: usize, dynamic: bool) {
    store.block_with_zeros("server.", &[], &SERVER);
    store.block_with_zeros("cluster_manager.", &[], &CLUSTER_MANAGER);
    store.block_with_zeros("listener_manager.", &[], &LISTENER_MANAGER);
    store.block_with_zeros("http1.", &[], &HTTP1);
    store.block_with_zeros(
        "envoy.overload_actions.reset_high_memory_stream.count",
        &[],
        &OVERLOAD,
    );
    store
        .counter("cluster_manager.cluster_added")
        .add(clusters as u64);
    if !dynamic {
        store
            .gauge("cluster_manager.active_clusters")
            .set(clusters as u64);
    }
    store
        .counter("listener_manager.listener_added")
        .add(listeners as u64);
    store
        .counter("listener_manager.listener_create_success")
        .add((listeners * workers) as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_resources_are_counted_and_the_zeros_listed() {
        let store = Store::new();
        publish(&store, 3, 2, 4, false);
        let listed: Vec<(String, u64)> = store
            .snapshot()
            .into_iter()
            .map(|(n, m)| (n, m.value()))
            .collect();
        let value = |name: &str| listed.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        assert_eq!(value("cluster_manager.cluster_added"), Some(3));
        assert_eq!(value("cluster_manager.active_clusters"), Some(3));
        assert_eq!(value("cluster_manager.warming_clusters"), Some(0));
        assert_eq!(value("listener_manager.listener_added"), Some(2));
        assert_eq!(value("listener_manager.listener_create_success"), Some(8));
        assert_eq!(value("server.hot_restart_epoch"), Some(0));
        assert_eq!(
            value("envoy.overload_actions.reset_high_memory_stream.count"),
            Some(0)
        );
    }
}
