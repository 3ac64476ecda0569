//! Cluster stats (`cluster.<name>.*`), resolved once per cluster so the hot path only touches
//! atomics. The stats every cluster has live in one block of the store (see
//! [`crate::stats`]): their names are its prefix and a static list.

use std::sync::OnceLock;
use std::sync::atomic::AtomicU32;

use crate::stats::{
    Block, Counter, CounterRef, GaugeRef, Histogram, HistogramBlock, HistogramRef, Kind, Layout,
    Slot, Store,
};

/// Distinct status codes per counter set whose `upstream_rq_<code>` handle is kept; further
/// codes are looked up in the store by name.
const CODE_SLOTS: usize = 8;

/// Declares the block's slots once: the layout (names, kinds, whether each exists from the
/// start), the index of each slot, and an accessor per slot on [`ClusterStats`].
macro_rules! cluster_block {
    ($($(#[doc = $doc:literal])* $kind:ident $eager:literal $name:ident;)*) => {
        /// The slots of [`LAYOUT`], by name.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy)]
        enum Index {
            $($name,)*
        }

        /// `cluster.<name>.*`: every cluster's stats, sorted by name; those not eager are
        /// created on first use, as Envoy's.
        static LAYOUT: &Layout = &[$(Slot {
            name: stringify!($name),
            kind: Kind::$kind,
            eager: $eager,
        },)*];

        impl ClusterStats {
            $(cluster_block!(@accessor $kind $name $(#[doc = $doc])*);)*
        }
    };
    (@accessor Counter $name:ident $(#[doc = $doc:literal])*) => {
        $(#[doc = $doc])*
        pub fn $name(&self) -> CounterRef<'_> {
            self.block.counter(Index::$name as usize)
        }
    };
    (@accessor Gauge $name:ident $(#[doc = $doc:literal])*) => {
        $(#[doc = $doc])*
        pub fn $name(&self) -> GaugeRef<'_> {
            self.block.gauge(Index::$name as usize)
        }
    };
}

cluster_block! {
    /// `init_fetch_timeout`: the EDS subscription's initial fetch timed out (from the
    /// subscription's start).
    Counter false init_fetch_timeout;
    /// `max_host_weight`: the largest load-balancing weight among the hosts.
    Gauge true max_host_weight;
    /// `membership_change`.
    Counter true membership_change;
    /// `membership_degraded`: hosts whose health is DEGRADED.
    Gauge true membership_degraded;
    /// `membership_healthy`: hosts whose health is HEALTHY (or UNKNOWN).
    Gauge true membership_healthy;
    /// `membership_total`.
    Gauge true membership_total;
    /// `retry_or_shadow_abandoned`: a body too large to buffer for a retry or a shadow.
    Counter true retry_or_shadow_abandoned;
    /// `update_attempt`: lookups a DNS cluster started, one per endpoint per refresh; the EDS
    /// subscription's start and each outcome after it.
    Counter true update_attempt;
    /// `update_empty`: EDS updates without the cluster's assignment (Envoy keeps the counter
    /// for every cluster): a Delta removal of the assignment, its hosts kept.
    Counter true update_empty;
    /// `update_failure`: DNS lookups that failed (the endpoint's last addresses kept).
    Counter true update_failure;
    /// `update_no_rebuild`: EDS updates that left the cluster's hosts as they were.
    Counter true update_no_rebuild;
    /// `update_rejected`: EDS responses whose assignment was rejected (from the EDS
    /// subscription's start).
    Counter false update_rejected;
    /// `update_success`: DNS lookups that answered (the endpoint's addresses replaced); EDS
    /// responses applied.
    Counter true update_success;
    /// `update_time`: when the last EDS update was applied, in ms since the epoch (from the
    /// EDS subscription's start).
    Gauge false update_time;
    /// `upstream_cx_active`.
    Gauge true upstream_cx_active;
    /// `upstream_cx_connect_fail`.
    Counter true upstream_cx_connect_fail;
    /// `upstream_cx_connect_timeout`.
    Counter true upstream_cx_connect_timeout;
    /// `upstream_cx_destroy`: connections ended, each attempt that failed or lost a race
    /// included (with `upstream_cx_active` it adds up to `upstream_cx_total`, as Envoy's).
    Counter true upstream_cx_destroy;
    /// `upstream_cx_fail_closed` (revoy's own, from its first count): connections never
    /// made because the host's transport socket is one revoy does not implement.
    Counter false upstream_cx_fail_closed;
    /// `upstream_cx_http1_total`.
    Counter true upstream_cx_http1_total;
    /// `upstream_cx_http2_total`.
    Counter true upstream_cx_http2_total;
    /// `upstream_cx_none_healthy`.
    Counter true upstream_cx_none_healthy;
    /// `upstream_cx_overflow`.
    Counter true upstream_cx_overflow;
    /// `upstream_cx_total`.
    Counter true upstream_cx_total;
    /// `upstream_rq_active`.
    Gauge true upstream_rq_active;
    /// `upstream_rq_completed`.
    Counter true upstream_rq_completed;
    /// `upstream_rq_max_duration_reached`: upstream streams ended by the cluster's
    /// `max_stream_duration` (charged by the router).
    Counter true upstream_rq_max_duration_reached;
    /// `upstream_rq_pending_active`: requests waiting for a connection (one being opened, or
    /// one to be released when `max_connections` is reached).
    Gauge true upstream_rq_pending_active;
    /// `upstream_rq_pending_failure_eject`.
    Counter true upstream_rq_pending_failure_eject;
    /// `upstream_rq_pending_overflow`.
    Counter true upstream_rq_pending_overflow;
    /// `upstream_rq_pending_total`.
    Counter true upstream_rq_pending_total;
    /// `upstream_rq_per_try_timeout`.
    Counter true upstream_rq_per_try_timeout;
    /// `upstream_rq_retry` (charged by the router).
    Counter true upstream_rq_retry;
    /// `upstream_rq_retry_backoff_exponential` (charged by the router).
    Counter true upstream_rq_retry_backoff_exponential;
    /// `upstream_rq_retry_limit_exceeded`.
    Counter true upstream_rq_retry_limit_exceeded;
    /// `upstream_rq_retry_overflow`.
    Counter true upstream_rq_retry_overflow;
    /// `upstream_rq_retry_success`.
    Counter true upstream_rq_retry_success;
    /// `upstream_rq_timeout` (charged by the router).
    Counter true upstream_rq_timeout;
    /// `upstream_rq_total`.
    Counter true upstream_rq_total;
    /// `version`: Envoy's hash of the `version_info` of the last EDS response applied (0 for a
    /// cluster without EDS).
    Gauge true version;
}

/// `cluster.<name>.*` stats Envoy lists for every cluster that stay 0 in revoy, which never
/// has their events: no zone-aware routing, load-balancer subsets, HTTP/3 or 0-RTT, internal
/// redirects, overload manager, EDS leases or cached assignments, rate-limited retry back-off,
/// runtime maintenance mode, upstream `max_stream_duration` or `max_connection_duration`,
/// connection-pool limits, preconnects, or Envoy's flow-control events; the upstream HTTP/1
/// codec's errors revoy's codec does not have; and no request at `HIGH` routing priority,
/// so that priority's circuit breakers never open (the default priority's are made when the
/// admin renders stats, from the live counts: [`crate::upstream::Cluster`]).
static ZEROS: [Slot; 44] = [
    Slot::counter("assignment_stale"),
    Slot::counter("assignment_timeout_received"),
    Slot::counter("assignment_use_cached"),
    Slot::gauge("circuit_breakers.default.cx_pool_open"),
    Slot::gauge("circuit_breakers.high.cx_open"),
    Slot::gauge("circuit_breakers.high.cx_pool_open"),
    Slot::gauge("circuit_breakers.high.rq_open"),
    Slot::gauge("circuit_breakers.high.rq_pending_open"),
    Slot::gauge("circuit_breakers.high.rq_retry_open"),
    Slot::counter("http1.dropped_headers_with_underscores"),
    Slot::counter("http1.metadata_not_supported_error"),
    Slot::counter("http1.requests_rejected_with_underscores_in_headers"),
    Slot::counter("http1.response_flood"),
    Slot::counter("lb_local_cluster_not_ok"),
    Slot::counter("lb_recalculate_zone_structures"),
    Slot::gauge("lb_subsets_active"),
    Slot::counter("lb_subsets_created"),
    Slot::counter("lb_subsets_fallback"),
    Slot::counter("lb_subsets_fallback_panic"),
    Slot::counter("lb_subsets_removed"),
    Slot::counter("lb_subsets_selected"),
    Slot::counter("lb_zone_cluster_too_small"),
    Slot::counter("lb_zone_no_capacity_left"),
    Slot::counter("lb_zone_routing_all_directly"),
    Slot::counter("lb_zone_routing_cross_zone"),
    Slot::counter("lb_zone_routing_sampled"),
    Slot::gauge("membership_excluded"),
    Slot::counter("upstream_cx_connect_with_0_rtt"),
    Slot::counter("upstream_cx_http3_total"),
    Slot::counter("upstream_cx_max_duration_reached"),
    Slot::counter("upstream_cx_pool_overflow"),
    Slot::counter("upstream_cx_preconnect_skipped"),
    Slot::counter("upstream_flow_control_backed_up_total"),
    Slot::counter("upstream_flow_control_drained_total"),
    Slot::counter("upstream_flow_control_paused_reading_total"),
    Slot::counter("upstream_flow_control_resumed_reading_total"),
    Slot::counter("upstream_http3_broken"),
    Slot::counter("upstream_internal_redirect_failed_total"),
    Slot::counter("upstream_internal_redirect_succeeded_total"),
    Slot::gauge("upstream_queue_overloaded"),
    Slot::counter("upstream_rq_0rtt"),
    Slot::counter("upstream_rq_maintenance_mode"),
    Slot::counter("upstream_rq_retry_backoff_ratelimited"),
    Slot::gauge("warming_state"),
];

/// The histograms every cluster has (`cluster.<name>.*`), in [`HISTOGRAMS`] order.
const HISTOGRAMS: [&str; 4] = [
    "upstream_cx_connect_ms",
    "upstream_cx_length_ms",
    "upstream_rq_per_cx",
    "upstream_rq_time",
];

/// Handles for one cluster's stats, named like Envoy's.
#[derive(Debug)]
pub struct ClusterStats {
    store: Store,
    /// `cluster.<stat name>.*` (shared by every version of the cluster).
    block: Block,
    /// Its histograms (shared likewise).
    histograms: HistogramBlock,
    /// `external.upstream_rq_time` and `internal.upstream_rq_time`, made at first use.
    rq_time_by_origin: [OnceLock<Histogram>; 2],
    /// Retries in flight, for the `max_retries` circuit breaker.
    pub retries_in_flight: AtomicU32,
    codes: LazyCodes,
    external: LazyCodes,
    internal: LazyCodes,
    retried: LazyCodes,
}

/// A [`CodeStats`] made at the first response: a cluster that never answers (most of an
/// Istio sidecar's thousands) pays 16 bytes for it instead of some 400.
#[derive(Debug, Default)]
struct LazyCodes(OnceLock<Box<CodeStats>>);

impl LazyCodes {
    /// Charges `status` to `<prefix><sub>upstream_rq_*`.
    fn charge(&self, store: &Store, prefix: &str, sub: &str, status: u16) {
        self.0
            .get_or_init(|| Box::new(CodeStats::new(format!("{prefix}{sub}"))))
            .charge(store, status);
    }
}

/// `<prefix>upstream_rq_<code|class>` and `upstream_rq_completed`, created on first use like
/// Envoy's dynamic stat names.
#[derive(Debug)]
struct CodeStats {
    prefix: String,
    completed: OnceLock<Counter>,
    classes: [OnceLock<Counter>; 5],
    /// The codes seen so far, filled in order; a cluster answers with few distinct codes.
    codes: [OnceLock<(u16, Counter)>; CODE_SLOTS],
}

impl CodeStats {
    fn new(prefix: String) -> Self {
        CodeStats {
            prefix,
            completed: OnceLock::new(),
            classes: Default::default(),
            codes: Default::default(),
        }
    }

    fn charge(&self, store: &Store, status: u16) {
        let counter = |name: &str| store.counter(&format!("{}{name}", self.prefix));
        self.completed
            .get_or_init(|| counter("upstream_rq_completed"))
            .inc();
        let class = usize::from(status / 100);
        if let Some(slot) = self.classes.get(class.wrapping_sub(1)) {
            slot.get_or_init(|| counter(&format!("upstream_rq_{class}xx")))
                .inc();
        }
        let name = || format!("upstream_rq_{status}");
        for slot in &self.codes {
            let (code, c) = slot.get_or_init(|| (status, counter(&name())));
            if *code == status {
                c.inc();
                return;
            }
        }
        counter(&name()).inc();
    }
}

impl ClusterStats {
    /// The block of `cluster.<stat_name>.*`, created on first use: a cluster's, or that of
    /// a cluster still warming (its EDS responses are counted before it exists).
    pub fn block(store: &Store, stat_name: &str) -> Block {
        store.block_with_zeros(&format!("cluster.{stat_name}."), LAYOUT, &ZEROS)
    }

    /// Counts `upstream_cx_fail_closed`: a connection never made because the host's
    /// transport socket is one revoy does not implement.
    pub fn fail_closed(&self) {
        self.block.declare(Index::upstream_cx_fail_closed as usize);
        self.upstream_cx_fail_closed().inc();
    }

    /// Resolves the handles for `cluster.<stat_name>.`.
    pub fn new(store: &Store, stat_name: &str) -> Self {
        static NAMES: [&str; 4] = HISTOGRAMS;
        ClusterStats {
            histograms: store.histogram_block(&format!("cluster.{stat_name}."), &NAMES),
            rq_time_by_origin: Default::default(),
            block: Self::block(store, stat_name),
            retries_in_flight: AtomicU32::new(0),
            codes: LazyCodes::default(),
            external: LazyCodes::default(),
            internal: LazyCodes::default(),
            retried: LazyCodes::default(),
            store: store.clone(),
        }
    }

    /// `upstream_cx_connect_ms`: how long a connection took to open (TCP, and TLS when used).
    pub fn cx_connect_ms(&self) -> HistogramRef<'_> {
        self.histograms.get(0)
    }

    /// `upstream_cx_length_ms`: how long a connection lived.
    pub fn cx_length_ms(&self) -> HistogramRef<'_> {
        self.histograms.get(1)
    }

    /// `upstream_rq_per_cx`: how many requests a connection carried, when it closed.
    pub fn rq_per_cx(&self) -> HistogramRef<'_> {
        self.histograms.get(2)
    }

    /// Records a response's `upstream_rq_time`, and the same under `internal.` or
    /// `external.` (per `x-envoy-internal`).
    pub fn record_rq_time(&self, ms: u64, internal: bool) {
        self.histograms.get(3).record(ms);
        let (i, sub) = if internal {
            (1, "internal.")
        } else {
            (0, "external.")
        };
        self.rq_time_by_origin[i]
            .get_or_init(|| {
                self.store
                    .histogram(&format!("{}{sub}upstream_rq_time", self.prefix()))
            })
            .record(ms);
    }

    /// `cluster.<stat name>.`.
    pub fn prefix(&self) -> &str {
        self.block.prefix()
    }

    /// Charges a response status (from the upstream, or of a local reply caused by the
    /// upstream): `upstream_rq_<class>xx`, `upstream_rq_<code>`, `upstream_rq_completed`, and
    /// the same under `internal.` or `external.` (per `x-envoy-internal`).
    pub fn charge_status(&self, status: u16, internal: bool) {
        self.codes.charge(&self.store, self.prefix(), "", status);
        if internal {
            self.internal
                .charge(&self.store, self.prefix(), "internal.", status);
        } else {
            self.external
                .charge(&self.store, self.prefix(), "external.", status);
        }
    }

    /// Charges the status of a response that the router retries instead of returning, as
    /// Envoy does: `retry.upstream_rq_<code>`, `retry.upstream_rq_<class>xx`,
    /// `retry.upstream_rq_completed` only.
    pub fn charge_retried(&self, status: u16) {
        self.retried
            .charge(&self.store, self.prefix(), "retry.", status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_charges_class_code_and_completed() {
        let store = Store::new();
        let s = ClusterStats::new(&store, "web");
        s.charge_status(503, false);
        s.charge_status(503, false);
        s.charge_status(200, true);
        assert_eq!(store.counter("cluster.web.upstream_rq_503").value(), 2);
        assert_eq!(store.counter("cluster.web.upstream_rq_5xx").value(), 2);
        assert_eq!(store.counter("cluster.web.upstream_rq_2xx").value(), 1);
        assert_eq!(
            store.counter("cluster.web.upstream_rq_completed").value(),
            3
        );
    }

    #[test]
    fn the_layout_is_sorted_by_name() {
        let names: Vec<&str> = LAYOUT.iter().map(|s| s.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }

    #[test]
    fn a_cluster_lists_envoys_stats_and_the_lazy_ones_once_used() {
        let store = Store::new();
        let s = ClusterStats::new(&store, "web");
        let names = || -> Vec<String> { store.snapshot().into_iter().map(|(n, _)| n).collect() };
        assert_eq!(names().len(), 36 + ZEROS.len());
        assert!(
            !names()
                .iter()
                .any(|n| n.ends_with(".upstream_cx_fail_closed"))
        );
        s.fail_closed();
        assert_eq!(
            store.counter("cluster.web.upstream_cx_fail_closed").value(),
            1
        );
        assert_eq!(names().len(), 37 + ZEROS.len());
        // A second version of the cluster shares the first one's stats.
        let again = ClusterStats::new(&store, "web");
        again.upstream_rq_total().inc();
        assert_eq!(s.upstream_rq_total().value(), 1);
        assert_eq!(names().len(), 37 + ZEROS.len());
    }

    #[test]
    fn more_distinct_codes_than_slots_are_all_counted() {
        let store = Store::new();
        let s = ClusterStats::new(&store, "web");
        let codes: Vec<u16> = (0..CODE_SLOTS as u16 + 3).map(|i| 200 + i).collect();
        for _ in 0..2 {
            for &code in &codes {
                s.charge_status(code, false);
            }
        }
        for code in codes {
            let name = format!("cluster.web.upstream_rq_{code}");
            assert_eq!(store.counter(&name).value(), 2, "{name}");
        }
    }
}
