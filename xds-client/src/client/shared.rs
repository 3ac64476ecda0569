//! The state [`super::Client::status`] reads, written by the engine.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::push_log::PushLog;
use crate::{Push, Status, TypeStatus};

/// Connection state, per-type status and the push log, behind a lock held only to copy.
#[derive(Debug)]
pub(super) struct Shared {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    connected: bool,
    streams: u64,
    types: Vec<TypeStatus>,
    log: PushLog,
}

impl Shared {
    pub(super) fn new(push_log_len: usize) -> Self {
        Shared {
            state: Mutex::new(State {
                connected: false,
                streams: 0,
                types: Vec::new(),
                log: PushLog::new(push_log_len),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A stream came up.
    pub(super) fn stream_opened(&self) {
        let mut state = self.lock();
        state.connected = true;
        state.streams += 1;
    }

    /// The stream went down (or the client stopped).
    pub(super) fn disconnected(&self) {
        self.lock().connected = false;
    }

    pub(super) fn set_types(&self, types: Vec<TypeStatus>) {
        self.lock().types = types;
    }

    pub(super) fn record(&self, push: Push) {
        self.lock().log.record(push);
    }

    pub(super) fn status(&self) -> Status {
        let state = self.lock();
        Status {
            connected: state.connected,
            streams: state.streams,
            types: state.types.clone(),
            pushes: state.log.newest_first(),
        }
    }
}
