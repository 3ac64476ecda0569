//! Stats handles made on first use for a name known only per request (a cluster, a
//! downstream service), kept so that later requests neither format the stat names again nor
//! look them up in the store (which also frees a metric nothing holds).

use std::collections::HashMap;
use std::sync::Mutex;

/// Handles of type `T` by key, each made once by the caller's `make`.
#[derive(Debug)]
pub struct Keyed<T>(Mutex<HashMap<Box<str>, T>>);

impl<T> Default for Keyed<T> {
    fn default() -> Self {
        Keyed(Mutex::default())
    }
}

impl<T: Clone> Keyed<T> {
    /// The handles for `key`, made with `make` the first time.
    pub fn get(&self, key: &str, make: impl FnOnce() -> T) -> T {
        let mut by = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = by.get(key) {
            return t.clone();
        }
        let t = make();
        by.insert(key.into(), t.clone());
        t
    }
}
