//! `http.<stat_prefix>.*` stats of a connection manager.

use crate::stats::{Connections, Counter, Gauge, Store};

/// Resolved handles for one connection manager's stats.
#[derive(Debug, Clone)]
pub struct HcmStats {
    /// `downstream_cx_total` and `downstream_cx_active`.
    pub cx: Connections,
    /// `downstream_rq_total`.
    pub rq_total: Counter,
    /// `downstream_rq_active`.
    pub rq_active: Gauge,
    /// `downstream_rq_1xx` .. `downstream_rq_5xx`.
    pub rq_class: [Counter; 5],
    /// `downstream_cx_drain_close`: connections told to close because the server drains.
    pub cx_drain_close: Counter,
    /// `downstream_rq_fail_closed` (revoy's own), present only on a connection manager that
    /// denies every request for a filter revoy does not implement.
    pub rq_fail_closed: Option<Counter>,
}

impl HcmStats {
    /// Resolves the handles under `http.<prefix>.`; `denies` adds `downstream_rq_fail_closed`.
    pub fn new(store: &Store, prefix: &str, denies: bool) -> Self {
        let name = |s: &str| format!("http.{prefix}.{s}");
        HcmStats {
            cx: Connections::new(store, &format!("http.{prefix}")),
            rq_total: store.counter(&name("downstream_rq_total")),
            rq_active: store.gauge(&name("downstream_rq_active")),
            rq_class: [1, 2, 3, 4, 5]
                .map(|c| store.counter(&name(&format!("downstream_rq_{c}xx")))),
            cx_drain_close: store.counter(&name("downstream_cx_drain_close")),
            rq_fail_closed: denies.then(|| store.counter(&name("downstream_rq_fail_closed"))),
        }
    }

    /// Counts a response with `status` in its class.
    pub fn response(&self, status: u16) {
        if let Some(c) = self.rq_class.get(usize::from(status / 100).wrapping_sub(1)) {
            c.inc();
        }
    }
}
