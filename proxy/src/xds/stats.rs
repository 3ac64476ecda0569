//! The xDS stats, with Envoy's names: `cluster_manager.cds.*`, `listener_manager.lds.*`, the
//! cluster and listener managers' counts, `control_plane.*`.

use std::time::Instant;

use crate::stats::{Block, Counter, Gauge, Histogram, Store, TextReadout};
use crate::upstream::ClusterStats;

/// One subscription's stats, as Envoy's subscriptions keep them: `update_attempt` counts the
/// subscription's start and every outcome after it (an update applied or rejected, a lost
/// stream, the initial fetch timing out).
pub struct UpdateStats {
    attempt: Counter,
    success: Counter,
    rejected: Counter,
    failure: Counter,
    init_fetch_timeout: Counter,
    /// `update_time`: when the last update was applied, in ms since the epoch.
    update_time: Gauge,
    /// `version`: Envoy's hash (XXH64) of the last applied `version_info`.
    version: Gauge,
    /// `version_text`: the last applied `version_info` itself.
    version_text: TextReadout,
    /// `update_duration`: the ms each applied update took to apply.
    update_duration: Histogram,
}

impl UpdateStats {
    /// The stats of the subscription named by `prefix` (`cluster_manager.cds`,
    /// `listener_manager.lds`, `http.<stat_prefix>.rds.<route_config>` for RDS).
    pub fn new(store: &Store, prefix: &str) -> Self {
        UpdateStats::named(
            store,
            &format!("{prefix}."),
            |n| store.counter(&format!("{prefix}.{n}")),
            |n| store.gauge(&format!("{prefix}.{n}")),
        )
    }

    /// The EDS stats of a cluster: its counters and gauges in its block
    /// (`cluster.<name>.update_*`, `version`), `version_text` and `update_duration` by name.
    fn in_block(store: &Store, block: &Block) -> Self {
        let missing = "the cluster layout has the EDS subscription stats";
        UpdateStats::named(
            store,
            block.prefix(),
            |n| block.named_counter(n).expect(missing),
            |n| block.named_gauge(n).expect(missing),
        )
    }

    /// The stats `counter` and `gauge` answer by their names after the prefix, and the text
    /// readout and histogram under `prefix` (which ends with a dot).
    fn named(
        store: &Store,
        prefix: &str,
        counter: impl Fn(&str) -> Counter,
        gauge: impl Fn(&str) -> Gauge,
    ) -> Self {
        UpdateStats {
            version_text: store.text_readout(&format!("{prefix}version_text")),
            update_duration: store.control_histogram(&format!("{prefix}update_duration")),
            attempt: counter("update_attempt"),
            success: counter("update_success"),
            rejected: counter("update_rejected"),
            failure: counter("update_failure"),
            init_fetch_timeout: counter("init_fetch_timeout"),
            update_time: gauge("update_time"),
            version: gauge("version"),
        }
    }

    /// The EDS subscription stats of the cluster whose stat name is `cluster` (its block is
    /// made here for a cluster that still warms).
    pub fn of_cluster(store: &Store, cluster: &str) -> Self {
        UpdateStats::in_block(store, &ClusterStats::block(store, cluster))
    }

    /// An EDS update, whose applying began at `since`, that left the hosts of the cluster
    /// whose stat name is `cluster` as they were: applied, without a rebuild
    /// (`update_no_rebuild`).
    pub fn eds_unchanged(store: &Store, cluster: &str, version_info: &str, since: Instant) {
        UpdateStats::eds_accepted_as(store, cluster, version_info, since, "update_no_rebuild");
    }

    /// An EDS update, whose applying began at `since`, that removed the assignment of the
    /// cluster whose stat name is `cluster` (over Delta): applied as one without it
    /// (`update_empty`), the hosts kept, as Envoy's EDS does.
    pub fn eds_empty(store: &Store, cluster: &str, version_info: &str, since: Instant) {
        UpdateStats::eds_accepted_as(store, cluster, version_info, since, "update_empty");
    }

    /// An EDS update of `cluster` applied, counted in its block's counter `also` too.
    fn eds_accepted_as(
        store: &Store,
        cluster: &str,
        version_info: &str,
        since: Instant,
        also: &str,
    ) {
        let block = ClusterStats::block(store, cluster);
        UpdateStats::in_block(store, &block).accepted(version_info, since);
        block
            .named_counter(also)
            .unwrap_or_else(|| panic!("the cluster layout has {also}"))
            .inc();
    }

    /// The subscription started.
    pub fn started(&self) {
        self.attempt.inc();
    }

    /// An update, whose applying began at `since`, was applied whole: recorded as Envoy's
    /// subscriptions do once their callbacks return.
    pub fn accepted(&self, version_info: &str, since: Instant) {
        self.attempt.inc();
        self.success.inc();
        self.update_time.set(now_ms());
        self.version.set(xxh64(version_info.as_bytes()));
        self.version_text.set(version_info);
        self.update_duration
            .record(since.elapsed().as_millis() as u64);
    }

    /// An update was rejected (in part). Over Delta, Envoy counts an attempt before it applies
    /// an update and another for the rejection.
    pub fn rejected(&self, delta: bool) {
        self.attempt.add(if delta { 2 } else { 1 });
        self.rejected.inc();
    }

    /// The outcome of an update that came over Delta (`delta`) or state of the world, whose
    /// applying began at `since`: [`UpdateStats::accepted`] or [`UpdateStats::rejected`].
    pub fn finish(&self, version_info: &str, accepted: bool, delta: bool, since: Instant) {
        if accepted {
            self.accepted(version_info, since);
        } else {
            self.rejected(delta);
        }
    }

    /// The stream carrying the subscription failed.
    pub fn disconnected(&self) {
        self.attempt.inc();
        self.failure.inc();
    }

    /// The initial fetch timed out.
    pub fn timed_out(&self) {
        self.attempt.inc();
        self.init_fetch_timeout.inc();
    }
}

/// `config_reload` and `config_reload_time_ms` of CDS and of an RDS subscription: updates
/// that changed the configuration in force.
pub struct Reloads {
    count: Counter,
    time_ms: Gauge,
}

impl Reloads {
    /// The reload stats under `prefix`.
    pub fn new(store: &Store, prefix: &str) -> Self {
        Reloads {
            count: store.counter(&format!("{prefix}.config_reload")),
            time_ms: store.gauge(&format!("{prefix}.config_reload_time_ms")),
        }
    }

    /// The configuration changed.
    pub fn reloaded(&self) {
        self.count.inc();
        self.time_ms.set(now_ms());
    }
}

/// Now, in ms since the epoch (Envoy's `update_time` and `config_reload_time_ms`).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// XXH64 with seed 0, the hash Envoy's `version` gauges show of a `version_info` (so the
/// gauge of a proxy and of Envoy on the same version agree).
fn xxh64(input: &[u8]) -> u64 {
    const P1: u64 = 0x9E37_79B1_85EB_CA87;
    const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
    const P3: u64 = 0x1656_67B1_9E37_79F9;
    const P4: u64 = 0x85EB_CA77_C2B2_AE63;
    const P5: u64 = 0x27D4_EB2F_1656_67C5;
    let round = |acc: u64, lane: u64| {
        acc.wrapping_add(lane.wrapping_mul(P2))
            .rotate_left(31)
            .wrapping_mul(P1)
    };
    let merge = |h: u64, v: u64| (h ^ round(0, v)).wrapping_mul(P1).wrapping_add(P4);
    let u64_at = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let mut rest = input;
    let mut h = if input.len() >= 32 {
        let mut v = [P1.wrapping_add(P2), P2, 0, 0u64.wrapping_sub(P1)];
        while rest.len() >= 32 {
            for (i, acc) in v.iter_mut().enumerate() {
                *acc = round(*acc, u64_at(&rest[i * 8..]));
            }
            rest = &rest[32..];
        }
        let h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        v.iter().fold(h, |h, &lane| merge(h, lane))
    } else {
        P5
    };
    h = h.wrapping_add(input.len() as u64);
    while rest.len() >= 8 {
        h = (h ^ round(0, u64_at(rest)))
            .rotate_left(27)
            .wrapping_mul(P1)
            .wrapping_add(P4);
        rest = &rest[8..];
    }
    if rest.len() >= 4 {
        let word = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
        h = (h ^ u64::from(word).wrapping_mul(P1))
            .rotate_left(23)
            .wrapping_mul(P2)
            .wrapping_add(P3);
        rest = &rest[4..];
    }
    for &byte in rest {
        h = (h ^ u64::from(byte).wrapping_mul(P5))
            .rotate_left(11)
            .wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

/// Every xDS stat the handler keeps.
pub struct XdsStats {
    /// `cluster_manager.cds.*`.
    pub cds: UpdateStats,
    /// `cluster_manager.cds.config_reload*`.
    pub cds_reloads: Reloads,
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
    /// `listener_manager.listener_create_success`: listeners created on a worker, one per
    /// worker for each listener added or updated.
    pub listener_create_success: Counter,
    /// `listener_manager.total_listeners_warming`.
    pub warming_listeners: Gauge,
    /// `listener_manager.total_listeners_draining`.
    pub draining_listeners: Gauge,
    /// `control_plane.connected_state`.
    pub connected_state: Gauge,
    /// `control_plane.rate_limit_enforced`.
    pub rate_limit_enforced: Counter,
    /// `control_plane.pending_requests`: the requests waiting for the rate limit.
    pub pending_requests: Gauge,
    /// `control_plane.identifier`: the control plane's `identifier` in the last response
    /// that named one.
    pub identifier: TextReadout,
}

impl XdsStats {
    /// Resolves the handles in `store`.
    pub fn new(store: &Store) -> Self {
        let c = |n: &str| store.counter(n);
        let g = |n: &str| store.gauge(n);
        XdsStats {
            cds: UpdateStats::new(store, "cluster_manager.cds"),
            cds_reloads: Reloads::new(store, "cluster_manager.cds"),
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
            listener_create_success: c("listener_manager.listener_create_success"),
            warming_listeners: g("listener_manager.total_listeners_warming"),
            draining_listeners: g("listener_manager.total_listeners_draining"),
            connected_state: g("control_plane.connected_state"),
            rate_limit_enforced: c("control_plane.rate_limit_enforced"),
            pending_requests: g("control_plane.pending_requests"),
            identifier: store.text_readout("control_plane.identifier"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_hashes_are_envoys() {
        // XXH64's reference values, and the `version` Envoy 1.40 showed for `version_info`s.
        assert_eq!(xxh64(b""), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"9c4bba08591fd2cc"), 3_861_947_411_826_306_299);
        assert_eq!(xxh64(b"v1"), 9_194_640_092_791_331_756);
        assert_eq!(xxh64(b"v2"), 17_234_765_554_138_278_603);
        // Longer than one 32-byte stripe (python-xxhash's values).
        assert_eq!(
            xxh64(b"Nobody inspects the spammish repetition"),
            18_144_624_926_692_707_313
        );
        assert_eq!(
            xxh64(b"a version_info longer than one 32-byte stripe of XXH64"),
            3_473_997_071_341_947_565
        );
    }

    #[test]
    fn eds_updates_count_in_the_cluster_block_before_and_after_the_cluster() {
        let store = Store::new();
        // The cluster still warms: its subscription's start makes its block.
        UpdateStats::of_cluster(&store, "c").started();
        let now = Instant::now();
        UpdateStats::of_cluster(&store, "c").finish("v1", true, false, now);
        let cluster = ClusterStats::new(&store, "c");
        assert_eq!(cluster.update_attempt().value(), 2);
        assert_eq!(cluster.update_success().value(), 1);
        UpdateStats::of_cluster(&store, "c").finish("v2", false, false, now);
        assert_eq!(cluster.update_attempt().value(), 3);
        assert_eq!(cluster.update_rejected().value(), 1);
        UpdateStats::of_cluster(&store, "c").finish("v3", false, true, now);
        assert_eq!(
            cluster.update_attempt().value(),
            5,
            "Delta counts two per rejection"
        );
        assert_eq!(cluster.update_rejected().value(), 2);
        let snap = store.snapshot();
        let names: Vec<&str> = snap.iter().map(|(n, _)| n.as_str()).collect();
        for eds_only in ["update_rejected", "init_fetch_timeout", "update_time"] {
            assert!(names.contains(&format!("cluster.c.{eds_only}").as_str()));
        }
        // The version applied last, not that of a rejected update.
        let texts = store.text_readouts();
        assert_eq!(texts.len(), 1);
        assert_eq!(texts[0].0, "cluster.c.version_text");
        assert_eq!(texts[0].1.value(), "v1");
        store.flush_histograms();
        let durations: Vec<_> = store
            .histogram_views()
            .into_iter()
            .filter(|h| h.name == "cluster.c.update_duration")
            .collect();
        assert_eq!(durations.len(), 1);
        assert_eq!(
            crate::stats::circllhist::count(durations[0].cumulative()),
            1,
            "one value: the applied update's"
        );
    }

    #[test]
    fn a_cluster_without_eds_has_no_rejected_or_fetch_timeout_stat() {
        let store = Store::new();
        let _cluster = ClusterStats::new(&store, "static");
        let snap = store.snapshot();
        let names: Vec<&str> = snap.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"cluster.static.version"));
        assert!(names.contains(&"cluster.static.update_no_rebuild"));
        assert!(
            !names
                .iter()
                .any(|n| n.ends_with(".update_rejected") || n.ends_with(".init_fetch_timeout"))
        );
        assert!(store.text_readouts().is_empty());
        assert!(
            !store
                .histogram_views()
                .iter()
                .any(|h| h.name.ends_with(".update_duration"))
        );
    }
}
