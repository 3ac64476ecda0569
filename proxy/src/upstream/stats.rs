//! Cluster stats (`cluster.<name>.*`), resolved once per cluster so the hot path only touches
//! atomics.

use std::sync::OnceLock;

use crate::stats::{Counter, Gauge, Store};

/// The lowest and highest status codes that get their own `upstream_rq_<code>` counter.
const FIRST_CODE: u16 = 100;
const CODES: usize = 500;

/// Handles for one cluster's stats, named like Envoy's.
#[derive(Debug)]
pub struct ClusterStats {
    store: Store,
    prefix: String,
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
    /// `membership_healthy`.
    pub membership_healthy: Gauge,
    /// `membership_total`.
    pub membership_total: Gauge,
    /// `membership_change`.
    pub membership_change: Counter,
    classes: [Counter; 5],
    codes: OnceLock<Box<[OnceLock<Counter>]>>,
}

impl ClusterStats {
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
            membership_healthy: g("membership_healthy"),
            membership_total: g("membership_total"),
            membership_change: c("membership_change"),
            classes: [
                c("upstream_rq_1xx"),
                c("upstream_rq_2xx"),
                c("upstream_rq_3xx"),
                c("upstream_rq_4xx"),
                c("upstream_rq_5xx"),
            ],
            codes: OnceLock::new(),
            store: store.clone(),
            prefix,
        }
    }

    /// Charges a response status: `upstream_rq_<class>xx`, `upstream_rq_<code>` and
    /// `upstream_rq_completed`.
    pub fn charge_status(&self, status: u16) {
        self.upstream_rq_completed.inc();
        if let Some(class) = self.classes.get(usize::from(status / 100).wrapping_sub(1)) {
            class.inc();
        }
        let Some(i) = status
            .checked_sub(FIRST_CODE)
            .map(usize::from)
            .filter(|i| *i < CODES)
        else {
            return;
        };
        let codes = self
            .codes
            .get_or_init(|| (0..CODES).map(|_| OnceLock::new()).collect());
        codes[i]
            .get_or_init(|| {
                self.store
                    .counter(&format!("{}upstream_rq_{status}", self.prefix))
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_charges_class_code_and_completed() {
        let store = Store::new();
        let s = ClusterStats::new(&store, "web");
        s.charge_status(503);
        s.charge_status(503);
        s.charge_status(200);
        assert_eq!(store.counter("cluster.web.upstream_rq_503").value(), 2);
        assert_eq!(store.counter("cluster.web.upstream_rq_5xx").value(), 2);
        assert_eq!(store.counter("cluster.web.upstream_rq_2xx").value(), 1);
        assert_eq!(
            store.counter("cluster.web.upstream_rq_completed").value(),
            3
        );
    }
}
