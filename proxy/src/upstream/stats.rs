//! Cluster stats (`cluster.<name>.*`), resolved once per cluster so the hot path only touches
//! atomics.

use std::sync::OnceLock;
use std::sync::atomic::AtomicU32;

use crate::stats::{Counter, Gauge, Store};

/// Distinct status codes per counter set whose `upstream_rq_<code>` handle is kept; further
/// codes are looked up in the store by name.
const CODE_SLOTS: usize = 8;

/// Handles for one cluster's stats, named like Envoy's.
#[derive(Debug)]
pub struct ClusterStats {
    store: Store,
    /// `upstream_cx_total`.
    pub upstream_cx_total: Counter,
    /// `upstream_cx_active`.
    pub upstream_cx_active: Gauge,
    /// `upstream_cx_connect_fail`.
    pub upstream_cx_connect_fail: Counter,
    /// `upstream_cx_connect_timeout`.
    pub upstream_cx_connect_timeout: Counter,
    /// `upstream_cx_http1_total`.
    pub upstream_cx_http1_total: Counter,
    /// `upstream_cx_http2_total`.
    pub upstream_cx_http2_total: Counter,
    /// `upstream_cx_none_healthy`.
    pub upstream_cx_none_healthy: Counter,
    /// `upstream_cx_overflow`.
    pub upstream_cx_overflow: Counter,
    /// `upstream_rq_total`.
    pub upstream_rq_total: Counter,
    /// `upstream_rq_active`.
    pub upstream_rq_active: Gauge,
    /// `upstream_rq_completed`.
    pub upstream_rq_completed: Counter,
    /// `upstream_rq_pending_overflow`.
    pub upstream_rq_pending_overflow: Counter,
    /// `upstream_rq_pending_failure_eject`.
    pub upstream_rq_pending_failure_eject: Counter,
    /// `upstream_rq_timeout` (charged by the router).
    pub upstream_rq_timeout: Counter,
    /// `upstream_rq_retry` (charged by the router).
    pub upstream_rq_retry: Counter,
    /// `upstream_rq_retry_backoff_exponential` (charged by the router).
    pub upstream_rq_retry_backoff_exponential: Counter,
    /// `upstream_rq_retry_success`.
    pub upstream_rq_retry_success: Counter,
    /// `upstream_rq_retry_overflow`.
    pub upstream_rq_retry_overflow: Counter,
    /// `upstream_rq_retry_limit_exceeded`.
    pub upstream_rq_retry_limit_exceeded: Counter,
    /// `upstream_rq_per_try_timeout`.
    pub upstream_rq_per_try_timeout: Counter,
    /// `retry_or_shadow_abandoned`: a body too large to buffer for a retry or a shadow.
    pub retry_or_shadow_abandoned: Counter,
    /// Retries in flight, for the `max_retries` circuit breaker.
    pub retries_in_flight: AtomicU32,
    /// `membership_healthy`.
    pub membership_healthy: Gauge,
    /// `membership_total`.
    pub membership_total: Gauge,
    /// `membership_change`.
    pub membership_change: Counter,
    /// `upstream_rq_pending_total`.
    pub upstream_rq_pending_total: Counter,
    /// `upstream_rq_pending_active`: requests waiting for a connection (one being opened, or
    /// one to be released when `max_connections` is reached).
    pub upstream_rq_pending_active: Gauge,
    /// `update_attempt`: lookups a DNS cluster started, one per endpoint per refresh.
    pub update_attempt: Counter,
    /// `update_success`: DNS lookups that answered (the endpoint's addresses replaced).
    pub update_success: Counter,
    /// `update_failure`: DNS lookups that failed (the endpoint's last addresses kept).
    pub update_failure: Counter,
    fail_closed: OnceLock<Counter>,
    /// `cluster.<stat name>.`.
    prefix: Box<str>,
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
    /// Counts `upstream_cx_fail_closed` (revoy's own, created on first use): a connection
    /// never made because the host's transport socket is one revoy does not implement.
    pub fn fail_closed(&self) {
        self.fail_closed
            .get_or_init(|| {
                self.store
                    .counter(&format!("{}upstream_cx_fail_closed", self.prefix))
            })
            .inc();
    }

    /// Resolves the handles for `cluster.<stat_name>.`.
    pub fn new(store: &Store, stat_name: &str) -> Self {
        let prefix = format!("cluster.{stat_name}.");
        let c = |n: &str| store.counter(&format!("{prefix}{n}"));
        let g = |n: &str| store.gauge(&format!("{prefix}{n}"));
        ClusterStats {
            upstream_cx_total: c("upstream_cx_total"),
            upstream_cx_active: g("upstream_cx_active"),
            upstream_cx_connect_fail: c("upstream_cx_connect_fail"),
            upstream_cx_connect_timeout: c("upstream_cx_connect_timeout"),
            upstream_cx_http1_total: c("upstream_cx_http1_total"),
            upstream_cx_http2_total: c("upstream_cx_http2_total"),
            upstream_cx_none_healthy: c("upstream_cx_none_healthy"),
            upstream_cx_overflow: c("upstream_cx_overflow"),
            upstream_rq_total: c("upstream_rq_total"),
            upstream_rq_active: g("upstream_rq_active"),
            upstream_rq_completed: c("upstream_rq_completed"),
            upstream_rq_pending_overflow: c("upstream_rq_pending_overflow"),
            upstream_rq_pending_failure_eject: c("upstream_rq_pending_failure_eject"),
            upstream_rq_timeout: c("upstream_rq_timeout"),
            upstream_rq_retry: c("upstream_rq_retry"),
            upstream_rq_retry_backoff_exponential: c("upstream_rq_retry_backoff_exponential"),
            upstream_rq_retry_success: c("upstream_rq_retry_success"),
            upstream_rq_retry_overflow: c("upstream_rq_retry_overflow"),
            upstream_rq_retry_limit_exceeded: c("upstream_rq_retry_limit_exceeded"),
            upstream_rq_per_try_timeout: c("upstream_rq_per_try_timeout"),
            retry_or_shadow_abandoned: c("retry_or_shadow_abandoned"),
            retries_in_flight: AtomicU32::new(0),
            membership_healthy: g("membership_healthy"),
            membership_total: g("membership_total"),
            membership_change: c("membership_change"),
            upstream_rq_pending_total: c("upstream_rq_pending_total"),
            upstream_rq_pending_active: g("upstream_rq_pending_active"),
            update_attempt: c("update_attempt"),
            update_success: c("update_success"),
            update_failure: c("update_failure"),
            fail_closed: OnceLock::new(),
            codes: LazyCodes::default(),
            external: LazyCodes::default(),
            internal: LazyCodes::default(),
            retried: LazyCodes::default(),
            prefix: prefix.into(),
            store: store.clone(),
        }
    }

    /// Charges a response status (from the upstream, or of a local reply caused by the
    /// upstream): `upstream_rq_<class>xx`, `upstream_rq_<code>`, `upstream_rq_completed`, and
    /// the same under `internal.` or `external.` (per `x-envoy-internal`).
    pub fn charge_status(&self, status: u16, internal: bool) {
        self.codes.charge(&self.store, &self.prefix, "", status);
        if internal {
            self.internal
                .charge(&self.store, &self.prefix, "internal.", status);
        } else {
            self.external
                .charge(&self.store, &self.prefix, "external.", status);
        }
    }

    /// Charges the status of a response that the router retries instead of returning, as
    /// Envoy does: `retry.upstream_rq_<code>`, `retry.upstream_rq_<class>xx`,
    /// `retry.upstream_rq_completed` only.
    pub fn charge_retried(&self, status: u16) {
        self.retried
            .charge(&self.store, &self.prefix, "retry.", status);
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
