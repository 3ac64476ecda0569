//! The ring buffer of the last responses received, for `/xds`.

use std::collections::VecDeque;

use crate::Push;

/// The last `capacity` pushes.
#[derive(Debug)]
pub(super) struct PushLog {
    capacity: usize,
    pushes: VecDeque<Push>,
}

impl PushLog {
    pub(super) fn new(capacity: usize) -> Self {
        PushLog {
            capacity,
            pushes: VecDeque::with_capacity(capacity),
        }
    }

    /// Records a push, dropping the oldest one when full.
    pub(super) fn record(&mut self, push: Push) {
        if self.capacity == 0 {
            return;
        }
        if self.pushes.len() == self.capacity {
            self.pushes.pop_front();
        }
        self.pushes.push_back(push);
    }

    /// The pushes, newest first.
    pub(super) fn newest_first(&self) -> Vec<Push> {
        self.pushes.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::Verdict;

    fn push(version: &str) -> Push {
        Push {
            at: SystemTime::now(),
            type_url: String::new(),
            version: version.to_string(),
            nonce: String::new(),
            resources: Default::default(),
            added: Default::default(),
            changed: Default::default(),
            unchanged: 0,
            removed: Default::default(),
            rejected: Vec::new(),
            rejected_count: 0,
            verdict: Verdict::Ack,
            apply_time: Duration::ZERO,
        }
    }

    #[test]
    fn keeps_the_newest_first() {
        let mut log = PushLog::new(2);
        for version in ["1", "2", "3"] {
            log.record(push(version));
        }
        let versions: Vec<String> = log.newest_first().into_iter().map(|p| p.version).collect();
        assert_eq!(versions, ["3", "2"]);
        let mut off = PushLog::new(0);
        off.record(push("1"));
        assert!(off.newest_first().is_empty());
    }
}
