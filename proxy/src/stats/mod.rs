//! Counters and gauges with Envoy's names. Handles are resolved once (at config compile time)
//! and then only touch atomics; the store is read by the admin API.

mod render;
pub mod tags;

pub use render::{render_json, render_prometheus, render_text};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A monotonically increasing count (Envoy counter).
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<Cell>);

/// A value that goes up and down (Envoy gauge).
#[derive(Clone, Debug, Default)]
pub struct Gauge(Arc<Cell>);

#[derive(Debug, Default)]
struct Cell {
    value: AtomicU64,
    used: AtomicBool,
}

impl Cell {
    fn mark(&self) {
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }
}

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.value.fetch_add(n, Ordering::Relaxed);
        self.0.mark();
    }
    /// The current value.
    pub fn value(&self) -> u64 {
        self.0.value.load(Ordering::Relaxed)
    }
}

impl Gauge {
    /// Adds one.
    pub fn inc(&self) {
        self.0.value.fetch_add(1, Ordering::Relaxed);
        self.0.mark();
    }
    /// Subtracts one (saturating at zero is the caller's contract: every dec follows an inc).
    pub fn dec(&self) {
        self.0.value.fetch_sub(1, Ordering::Relaxed);
        self.0.mark();
    }
    /// Sets the value.
    pub fn set(&self, v: u64) {
        self.0.value.store(v, Ordering::Relaxed);
        self.0.mark();
    }
    /// The current value.
    pub fn value(&self) -> u64 {
        self.0.value.load(Ordering::Relaxed)
    }
}

/// One named metric in the store.
#[derive(Clone, Debug)]
pub enum Metric {
    /// A counter.
    Counter(Counter),
    /// A gauge.
    Gauge(Gauge),
}

impl Metric {
    /// The current value.
    pub fn value(&self) -> u64 {
        match self {
            Metric::Counter(c) => c.value(),
            Metric::Gauge(g) => g.value(),
        }
    }
    /// Whether it was ever written (Envoy's `usedonly`).
    pub fn used(&self) -> bool {
        let cell = match self {
            Metric::Counter(c) => &c.0,
            Metric::Gauge(g) => &g.0,
        };
        cell.used.load(Ordering::Relaxed)
    }
}

/// `<prefix>.downstream_cx_total` and `<prefix>.downstream_cx_active` of a listener, one of
/// its workers, or a connection manager.
#[derive(Clone, Debug)]
pub struct Connections {
    total: Counter,
    active: Gauge,
}

impl Connections {
    /// Resolves the two handles under `prefix`.
    pub fn new(store: &Store, prefix: &str) -> Self {
        Connections {
            total: store.counter(&format!("{prefix}.downstream_cx_total")),
            active: store.gauge(&format!("{prefix}.downstream_cx_active")),
        }
    }

    /// Counts a connection; it stays active until the guard drops (also when its task is
    /// cancelled).
    pub fn open(&self) -> Open<'_> {
        self.total.inc();
        self.active.inc();
        Open(&self.active)
    }
}

/// A connection counted active by [`Connections::open`].
#[derive(Debug)]
pub struct Open<'a>(&'a Gauge);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The process-wide registry of metrics by full name. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Store {
    metrics: Arc<Mutex<BTreeMap<String, Metric>>>,
}

impl Store {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The counter named `name`, created on first use. Asking again returns the same counter.
    pub fn counter(&self, name: &str) -> Counter {
        let mut m = self.metrics.lock().expect("stats lock");
        match m.get(name) {
            Some(Metric::Counter(c)) => c.clone(),
            _ => {
                let c = Counter::default();
                m.insert(name.to_owned(), Metric::Counter(c.clone()));
                c
            }
        }
    }

    /// The gauge named `name`, created on first use.
    pub fn gauge(&self, name: &str) -> Gauge {
        let mut m = self.metrics.lock().expect("stats lock");
        match m.get(name) {
            Some(Metric::Gauge(g)) => g.clone(),
            _ => {
                let g = Gauge::default();
                m.insert(name.to_owned(), Metric::Gauge(g.clone()));
                g
            }
        }
    }

    /// A sorted copy of every metric, for rendering.
    pub fn snapshot(&self) -> Vec<(String, Metric)> {
        let m = self.metrics.lock().expect("stats lock");
        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Drops the metrics named `prefix*` that nothing but the store holds any more (those of
    /// a removed cluster or listener, once its last connection or request let go). Answers
    /// whether some under `prefix` are still held, so the caller can try again later.
    pub fn release(&self, prefix: &str) -> bool {
        let mut m = self.metrics.lock().expect("stats lock");
        let mut held = false;
        let unheld: Vec<String> = m
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(name, _)| name.starts_with(prefix))
            .filter(|(_, metric)| {
                let cell = match metric {
                    Metric::Counter(c) => &c.0,
                    Metric::Gauge(g) => &g.0,
                };
                let keep = Arc::strong_count(cell) > 1;
                held |= keep;
                !keep
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in unheld {
            m.remove(&name);
        }
        held
    }

    /// Sets every counter back to zero (`/reset_counters`).
    pub fn reset_counters(&self) {
        let m = self.metrics.lock().expect("stats lock");
        for metric in m.values() {
            if let Metric::Counter(c) = metric {
                c.0.value.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_active_until_its_guard_drops() {
        let s = Store::new();
        let cx = Connections::new(&s, "listener.a");
        let open = cx.open();
        let (total, active) = (
            s.counter("listener.a.downstream_cx_total"),
            s.gauge("listener.a.downstream_cx_active"),
        );
        assert_eq!((total.value(), active.value()), (1, 1));
        drop(open);
        assert_eq!((total.value(), active.value()), (1, 0));
    }

    #[test]
    fn release_drops_only_what_nothing_else_holds() {
        let s = Store::new();
        let held = s.counter("cluster.gone.upstream_rq_total");
        s.gauge("cluster.gone.membership_total");
        s.counter("cluster.gone2.upstream_rq_total");
        assert!(s.release("cluster.gone."));
        let names: Vec<String> = s.snapshot().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "cluster.gone.upstream_rq_total",
                "cluster.gone2.upstream_rq_total"
            ]
        );
        drop(held);
        assert!(!s.release("cluster.gone."));
        assert_eq!(s.snapshot().len(), 1);
    }

    #[test]
    fn handles_share_one_value_and_track_use() {
        let s = Store::new();
        let a = s.counter("cluster.x.upstream_rq_total");
        let b = s.counter("cluster.x.upstream_rq_total");
        let g = s.gauge("server.state");
        assert!(!s.snapshot().iter().any(|(_, m)| m.used()));
        a.inc();
        b.add(2);
        g.set(0);
        assert_eq!(a.value(), 3);
        let snap = s.snapshot();
        assert_eq!(snap.len(), 2);
        assert!(snap.iter().all(|(_, m)| m.used()));
        s.reset_counters();
        assert_eq!(b.value(), 0);
    }
}
