//! The active listeners, published whole by the applier on every listener change: what a
//! `use_original_dst` listener searches for the listener of a connection's original
//! destination, and what admin lists. Kept apart from the RDS route tables
//! ([`crate::snapshot`]), which connection managers read and which must not name listeners.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Listener;

/// The active listeners: static ones first, then dynamic ones in the order they were added.
#[derive(Default)]
pub struct ActiveListeners(ArcSwap<Vec<Arc<Listener>>>);

impl ActiveListeners {
    /// Replaces the list; connections accepted from now on hand off among these.
    pub fn store(&self, listeners: Vec<Arc<Listener>>) {
        self.0.store(Arc::new(listeners));
    }

    /// The current list.
    pub fn load_full(&self) -> Arc<Vec<Arc<Listener>>> {
        self.0.load_full()
    }
}
