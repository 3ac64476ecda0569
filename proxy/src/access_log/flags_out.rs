//! Where a request's record publishes its final response flags and wire bytes, for what must
//! wait for them (`istio.stats` records a request once they are final, as Istio's proxy does
//! from its access-log hook).

use std::sync::Mutex;

use super::record::Settled;

/// A waiter for what the record publishes: `None` when it went away without settling.
type Waiter = Box<dyn FnOnce(Option<&Settled>) + Send>;

/// What the record published, or those waiting for it. Dropped unpublished (the record went
/// away without settling), it runs its waiters without flags.
#[derive(Default)]
pub struct FlagsOut(Mutex<State>);

enum State {
    Waiting(Vec<Waiter>),
    Settled(Settled),
}

impl Default for State {
    fn default() -> State {
        State::Waiting(Vec::new())
    }
}

impl std::fmt::Debug for FlagsOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlagsOut").finish_non_exhaustive()
    }
}

impl FlagsOut {
    /// Publishes the final flags and bytes (the first time only) and runs the waiters.
    pub fn publish(&self, settled: Settled) {
        let waiters = {
            let mut state = self.0.lock().expect("flags lock");
            match &mut *state {
                State::Settled(_) => return,
                State::Waiting(w) => {
                    let w = std::mem::take(w);
                    *state = State::Settled(settled);
                    w
                }
            }
        };
        for w in waiters {
            w(Some(&settled));
        }
    }

    /// What was published, once it was.
    pub fn get(&self) -> Option<Settled> {
        match &*self.0.lock().expect("flags lock") {
            State::Settled(settled) => Some(*settled),
            State::Waiting(_) => None,
        }
    }

    /// Runs `then` with what the record publishes: now when it has, else when it does (or
    /// with `None` if the record goes away first).
    pub fn when_settled(&self, then: impl FnOnce(Option<&Settled>) + Send + 'static) {
        let mut state = self.0.lock().expect("flags lock");
        match &mut *state {
            State::Settled(settled) => {
                let settled = *settled;
                drop(state);
                then(Some(&settled));
            }
            State::Waiting(w) => w.push(Box::new(then)),
        }
    }
}

impl Drop for FlagsOut {
    fn drop(&mut self) {
        if let State::Waiting(waiters) = std::mem::take(self.0.get_mut().expect("flags lock")) {
            for w in waiters {
                w(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::access_log::{Flags, ResponseFlag};

    #[test]
    fn a_waiter_runs_once_the_flags_are_published() {
        let out = FlagsOut::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        out.when_settled(move |f| s.lock().unwrap().push(f.map(|f| f.flags.render(false))));
        assert!(seen.lock().unwrap().is_empty());
        let mut flags = Flags::default();
        flags.set(ResponseFlag::NoRouteFound);
        out.publish(Settled {
            flags,
            wire: Default::default(),
        });
        let s = seen.clone();
        out.when_settled(move |f| s.lock().unwrap().push(f.map(|f| f.flags.render(false))));
        assert_eq!(
            *seen.lock().unwrap(),
            vec![Some("NR".to_owned()), Some("NR".to_owned())]
        );
    }

    #[test]
    fn a_record_gone_unsettled_runs_its_waiters_without_flags() {
        let out = FlagsOut::default();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        out.when_settled(move |f| {
            assert!(f.is_none());
            r.fetch_add(1, Ordering::Relaxed);
        });
        drop(out);
        assert_eq!(ran.load(Ordering::Relaxed), 1);
    }
}
