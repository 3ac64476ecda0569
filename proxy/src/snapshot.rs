//! The RDS route tables the data path reads: one immutable snapshot, published whole by the
//! applier and read by workers through per-thread handles, so finding and holding a route
//! table costs no atomic write on a shared cache line while nothing changes. (The active listeners are
//! published apart, by `listener::ActiveListeners`, so this module stays below the listeners.)

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::route::RouteTable;
use crate::thread_handles::{Local, ThreadHandles};

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
    /// The workers' handles on the current snapshot's tables, cleared on every store.
    tables: ThreadHandles<RouteTable>,
}

impl Default for Published {
    fn default() -> Self {
        Published {
            current: ArcSwap::from_pointee(Snapshot::default()),
            tables: ThreadHandles::default(),
        }
    }
}

impl Published {
    /// Replaces the snapshot; readers see it on their next lookup.
    pub fn store(&self, next: Snapshot) {
        self.current.store(Arc::new(next));
        self.tables.clear();
    }

    /// The current snapshot (an `Arc` for callers that keep it, such as admin).
    pub fn load_full(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// This worker's handle on the current RDS route table named `name`: holding it for a
    /// request writes no reference count another worker writes.
    pub fn route_table(&self, name: &str) -> Option<Arc<Local<RouteTable>>> {
        self.tables
            .get(name, || self.current.load().route_table(name).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_each_store_and_caches_do_not_cross_owners() {
        let a = Published::default();
        let b = Published::default();
        assert!(a.route_table("r").is_none());
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
        let held = a.route_table("r").expect("stored");
        // The same handle again, wrapping the stored table.
        assert!(Arc::ptr_eq(&held, &a.route_table("r").expect("stored")));
        assert!(Arc::ptr_eq(&**held, &a.load_full().routes["r"]));
        assert!(b.route_table("r").is_none());
        assert!(a.route_table("r").is_some());
        a.store(Snapshot::default());
        assert!(a.route_table("r").is_none());
    }
}
