//! Per-worker handles on shared values (route tables, clusters), so that the data path can
//! hold one for a request without writing the shared value's reference count: every worker
//! thread wraps each value it uses in an `Arc` of its own, whose count only that worker's
//! requests touch. The publisher clears every worker's handles when it replaces the values,
//! so a removed value is not kept alive by a worker that has not looked since.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard};

use thread_local::ThreadLocal;

/// A worker's wrapper of a shared value: the data path holds an `Arc` of it, whose count
/// only that worker writes.
#[derive(Debug)]
pub struct Local<T>(Arc<T>);

impl<T> Deref for Local<T> {
    type Target = Arc<T>;

    fn deref(&self) -> &Arc<T> {
        &self.0
    }
}

/// Each worker thread's handles on one publisher's values, by name.
pub struct ThreadHandles<T: Send + Sync> {
    /// One map per thread, locked by that thread per lookup (never contended but by
    /// [`ThreadHandles::clear`]).
    slots: ThreadLocal<Mutex<HashMap<String, Arc<Local<T>>>>>,
}

impl<T: Send + Sync> Default for ThreadHandles<T> {
    fn default() -> Self {
        ThreadHandles {
            slots: ThreadLocal::new(),
        }
    }
}

impl<T: Send + Sync> std::fmt::Debug for ThreadHandles<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ThreadHandles")
    }
}

fn lock<M>(m: &Mutex<M>) -> MutexGuard<'_, M> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<T: Send + Sync> ThreadHandles<T> {
    /// This thread's handle on the value named `name`, made from `shared` (the publisher's
    /// current value) the first time this thread asks since the last [`ThreadHandles::clear`];
    /// `None` when there is no such value.
    pub fn get(
        &self,
        name: &str,
        shared: impl FnOnce() -> Option<Arc<T>>,
    ) -> Option<Arc<Local<T>>> {
        let mut handles = lock(self.slots.get_or_default());
        if let Some(handle) = handles.get(name) {
            return Some(handle.clone());
        }
        // Made under the lock, so a clear that follows the publisher's swap cannot miss a
        // handle made from the value it replaced.
        let handle = Arc::new(Local(shared()?));
        handles.insert(name.to_owned(), handle.clone());
        Some(handle)
    }

    /// Drops every thread's handles; the publisher calls it after replacing its values.
    pub fn clear(&self) {
        for slot in self.slots.iter() {
            lock(slot).clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_is_made_once_until_cleared_and_wraps_the_shared_value() {
        let shared = Arc::new(7u32);
        let handles = ThreadHandles::default();
        let first = handles.get("a", || Some(shared.clone())).expect("a");
        let again = handles.get("a", || panic!("made twice")).expect("a");
        assert!(Arc::ptr_eq(&first, &again));
        assert!(Arc::ptr_eq(&**first, &shared));
        // The shared count moved once (the handle's), not per holder.
        assert_eq!(Arc::strong_count(&shared), 2);
        assert!(handles.get("b", || None).is_none());
        drop((first, again));
        // A clear drops the handle, from this thread as from any other.
        let elsewhere = std::thread::scope(|s| {
            s.spawn(|| handles.get("a", || Some(shared.clone())))
                .join()
                .expect("thread")
        });
        assert_eq!(Arc::strong_count(&shared), 3);
        drop(elsewhere);
        handles.clear();
        assert_eq!(Arc::strong_count(&shared), 1);
        let newer = handles.get("a", || Some(Arc::new(8))).expect("a");
        assert_eq!(***newer, 8);
    }
}
