//! The ACKs and NACKs clients sent: kept for tests and logged with tracing.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::Verdict;

/// How many events the log keeps (the oldest are dropped first).
const CAPACITY: usize = 10_000;

/// Which variant of the protocol a stream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// State of the world (`StreamAggregatedResources`).
    Sotw,
    /// Incremental (`DeltaAggregatedResources`).
    Delta,
}

impl Protocol {
    /// The variant's name in logs.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Protocol::Sotw => "SotW",
            Protocol::Delta => "Delta",
        }
    }
}

/// A client's answer to one response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientEvent {
    /// The client's `node.id` (empty if it never sent one).
    pub node_id: String,
    /// The stream's protocol.
    pub protocol: Protocol,
    /// The type URL of the response answered.
    pub type_url: String,
    /// The version of the response answered (`version_info` / `system_version_info` sent).
    pub version: String,
    /// The nonce of the response answered.
    pub nonce: String,
    /// ACK, or NACK with the `error_detail` message.
    pub verdict: Verdict,
    /// When the answer arrived.
    pub at: SystemTime,
}

/// The event log: a bounded list plus a counter that wakes waiters.
pub(crate) struct EventLog {
    events: Mutex<VecDeque<ClientEvent>>,
    added: watch::Sender<u64>,
}

impl EventLog {
    pub(crate) fn new() -> Self {
        EventLog {
            events: Mutex::new(VecDeque::new()),
            added: watch::Sender::new(0),
        }
    }

    /// Records `event` and logs it (a NACK at warn, with its reason).
    pub(crate) fn record(&self, event: ClientEvent) {
        match &event.verdict {
            Verdict::Ack => tracing::info!(
                node = %event.node_id, type_url = %event.type_url, version = %event.version,
                nonce = %event.nonce, "ACK"
            ),
            Verdict::Nack(reason) => tracing::warn!(
                node = %event.node_id, type_url = %event.type_url, version = %event.version,
                nonce = %event.nonce, %reason, "NACK"
            ),
        }
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if events.len() == CAPACITY {
            events.pop_front();
        }
        events.push_back(event);
        drop(events);
        self.added.send_modify(|n| *n += 1);
    }

    /// Every event kept, oldest first.
    pub(crate) fn snapshot(&self) -> Vec<ClientEvent> {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.iter().cloned().collect()
    }

    /// Waits until `found` answers `Some` for the events kept, or `timeout` passes.
    pub(crate) async fn wait_for<T>(
        &self,
        mut found: impl FnMut(&[ClientEvent]) -> Option<T>,
        timeout: Duration,
    ) -> Option<T> {
        let mut added = self.added.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            added.borrow_and_update();
            if let Some(t) = found(&self.snapshot()) {
                return Some(t);
            }
            match tokio::time::timeout_at(deadline, added.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }
}
