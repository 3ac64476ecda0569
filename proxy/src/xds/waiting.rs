//! Resources accepted but not yet in use (a cluster waiting for its endpoints, a listener for
//! its route configurations), each with the timer that ends its wait. A resource that stops
//! waiting cancels its timer, so a 10,000-cluster push does not leave 10,000 sleeping tasks
//! that all wake at the end of the initial fetch timeout.

use std::collections::BTreeMap;

use tokio::task::AbortHandle;

/// What waits, by name.
pub struct Waiting<T> {
    entries: BTreeMap<String, (T, Option<AbortHandle>)>,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Waiting {
            entries: BTreeMap::new(),
        }
    }
}

impl<T> Waiting<T> {
    /// `name` waits with `value` (replacing what waited under that name, and its timer).
    pub fn insert(&mut self, name: String, value: T) {
        if let Some((_, Some(timer))) = self.entries.insert(name, (value, None)) {
            timer.abort();
        }
    }

    /// The timer that ends `name`'s wait.
    pub fn set_timer(&mut self, name: &str, timer: AbortHandle) {
        if let Some((_, slot)) = self.entries.get_mut(name) {
            *slot = Some(timer);
        } else {
            timer.abort();
        }
    }

    /// `name` stops waiting; answers what waited.
    pub fn remove(&mut self, name: &str) -> Option<T> {
        let (value, timer) = self.entries.remove(name)?;
        if let Some(timer) = timer {
            timer.abort();
        }
        Some(value)
    }

    /// What waits under `name`.
    pub fn get(&self, name: &str) -> Option<&T> {
        self.entries.get(name).map(|(v, _)| v)
    }

    /// What waits under `name`, to change.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut T> {
        self.entries.get_mut(name).map(|(v, _)| v)
    }

    /// Whether `name` waits.
    pub fn contains_key(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The names that wait.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.entries.keys()
    }

    /// What waits.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.values().map(|(v, _)| v)
    }

    /// How many wait.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_resource_that_stops_waiting_cancels_its_timer() {
        let mut waiting = Waiting::default();
        let timer = tokio::spawn(std::future::pending::<()>());
        waiting.insert("c".to_owned(), 1);
        waiting.set_timer("c", timer.abort_handle());
        assert_eq!(waiting.remove("c"), Some(1));
        assert!(timer.await.expect_err("aborted").is_cancelled());

        let timer = tokio::spawn(std::future::pending::<()>());
        waiting.insert("d".to_owned(), 2);
        waiting.set_timer("d", timer.abort_handle());
        waiting.insert("d".to_owned(), 3);
        assert!(timer.await.expect_err("aborted").is_cancelled());
        assert_eq!(waiting.remove("d"), Some(3));
        assert!(waiting.is_empty());
    }
}
