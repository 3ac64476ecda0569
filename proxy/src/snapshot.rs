//! The RDS route tables the data path reads: one immutable snapshot, published whole by the
//! applier and read by workers through a per-thread cache, so finding a route table costs no
//! atomic write on a shared cache line while nothing changes. (The active listeners are
//! published apart, by `listener::ActiveListeners`, so this module stays below the listeners.)

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::route::RouteTable;

/// The RDS route tables in force at one moment.
#[derive(Default)]
pub struct Snapshot {
    /// Route tables delivered by RDS, by name.
    pub routes: HashMap<String, Arc<RouteTable>>,
}

impl Snapshot {
    /// The RDS route table named `name`.
    pub fn route_table(&self, name: &str) -> Option<&Arc<RouteTable>> {
        self.routes.get(name)
    }
}

/// The published snapshot: one writer stores, many workers read.
pub struct Published {
    current: ArcSwap<Snapshot>,
    /// Bumped on every store; a worker's cached snapshot is current while this is unchanged
    /// (a shared read, never a write, per lookup).
    generation: AtomicU64,
}

thread_local! {
    /// Per worker thread: the owner (a `Published`'s address), the generation and the snapshot
    /// it last read.
    static CACHE: RefCell<Option<(usize, u64, Arc<Snapshot>)>> = const { RefCell::new(None) };
}

impl Default for Published {
    fn default() -> Self {
        Published {
            current: ArcSwap::from_pointee(Snapshot::default()),
            generation: AtomicU64::new(0),
        }
    }
}

impl Published {
    /// Replaces the snapshot; readers see it on their next lookup.
    pub fn store(&self, next: Snapshot) {
        self.current.store(Arc::new(next));
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The current snapshot (an `Arc` for callers that keep it, such as admin).
    pub fn load_full(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Runs `f` on the current snapshot as this thread last cached it, refreshing the cache
    /// when the writer published since.
    pub fn with<R>(&self, f: impl FnOnce(&Snapshot) -> R) -> R {
        let owner = self as *const Self as usize;
        let generation = self.generation.load(Ordering::Acquire);
        CACHE.with(|cell| {
            let mut cache = cell.borrow_mut();
            let fresh = matches!(&*cache, Some((o, g, _)) if *o == owner && *g == generation);
            if !fresh {
                *cache = Some((owner, generation, self.current.load_full()));
            }
            let (_, _, snapshot) = cache.as_ref().expect("cache filled above");
            f(snapshot)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_each_store_and_caches_do_not_cross_owners() {
        let a = Published::default();
        let b = Published::default();
        assert_eq!(a.with(|s| s.routes.len()), 0);
        let mut next = Snapshot::default();
        let rc = proto::pb::envoy::config::route::v3::RouteConfiguration {
            name: "r".into(),
            ..Default::default()
        };
        let io = crate::config::FakeIo::new();
        let ctx = crate::config::Context::new(&io);
        let table = crate::config::route::compile_route_config(
            &ctx,
            &rc,
            None,
            &mut crate::config::Warnings::new(),
        )
        .expect("table");
        next.routes.insert("r".into(), Arc::new(table));
        a.store(next);
        assert!(a.with(|s| s.route_table("r").is_some()));
        assert!(b.with(|s| s.route_table("r").is_none()));
        assert!(a.with(|s| s.route_table("r").is_some()));
        a.store(Snapshot::default());
        assert!(a.with(|s| s.route_table("r").is_none()));
    }
}
