//! The server's lifecycle: `server.state` (and `server.live`), the health-check flag, the drain
//! state connections consult, and quitting. Admin and the wiring call it; the data path only
//! reads the drain state (through [`crate::shared::Shared`]).

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::drain::Drain;
use crate::stats::{Gauge, Histogram, Store};

/// Envoy's `server.state` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// Serving.
    Live = 0,
    /// Draining listeners.
    Draining = 1,
    /// Before initialisation.
    PreInitializing = 2,
    /// Initialising (waiting for clusters/listeners).
    Initializing = 3,
}

/// State, health, drain and quit of the process.
pub struct Lifecycle {
    /// Health-check failure and listener drains, which tell connections to close.
    pub drain: Arc<Drain>,
    state: Mutex<ServerState>,
    /// Start-up parts not finished yet (Envoy's init targets): the server is LIVE after the
    /// last.
    starting: Mutex<usize>,
    /// `server.state`.
    state_gauge: Gauge,
    /// `server.live`: 1 while LIVE and passing health checks.
    live_gauge: Gauge,
    /// `listener_manager.workers_started`: set to 1 at the first LIVE, when Envoy starts its
    /// workers (pilot-agent's readiness probe requires it; unset before, as in Envoy).
    workers_started: Gauge,
    quit: Mutex<Option<Sender<i32>>>,
    /// When the lifecycle began, and `server.initialization_time_ms` (recorded at the first
    /// LIVE; `None` once recorded).
    initializing: Mutex<Option<(Instant, Histogram)>>,
    /// What starts the workers (their listeners listen from then on), run at the first LIVE.
    start_workers: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Lifecycle {
    /// PRE_INITIALIZING, healthy, nothing draining.
    pub fn new(stats: &Store, drain: Arc<Drain>) -> Lifecycle {
        let lifecycle = Lifecycle {
            drain,
            state: Mutex::new(ServerState::PreInitializing),
            starting: Mutex::new(0),
            state_gauge: stats.gauge("server.state"),
            live_gauge: stats.gauge("server.live"),
            workers_started: stats.gauge("listener_manager.workers_started"),
            quit: Mutex::new(None),
            initializing: Mutex::new(Some((
                Instant::now(),
                stats.histogram("server.initialization_time_ms"),
            ))),
            start_workers: Mutex::new(None),
        };
        lifecycle.publish();
        lifecycle
    }

    /// Sets what starts the workers at the first LIVE (as Envoy starts its workers, and with
    /// them its listeners, once its init manager is done).
    pub fn on_workers_start(&self, start: impl FnOnce() + Send + 'static) {
        *self.start_workers.lock().expect("workers start") = Some(Box::new(start));
    }

    /// Sets the server's own state (`server.state`, `server.live`).
    pub fn set_state(&self, s: ServerState) {
        *self.state.lock().expect("server state") = s;
        let first_live = s == ServerState::Live
            && self
                .initializing
                .lock()
                .expect("server state")
                .take()
                .map(|(since, h)| h.record(since.elapsed().as_millis() as u64))
                .is_some();
        if first_live {
            if let Some(start) = self.start_workers.lock().expect("workers start").take() {
                start();
            }
            self.workers_started.set(1);
        }
        self.publish();
    }

    /// Start-up waits for one more part (the static listeners' secrets, the initial xDS
    /// configuration) before the server is LIVE.
    pub fn await_part(&self) {
        *self.starting.lock().expect("start-up parts") += 1;
    }

    /// A start-up part finished; after the last the server is LIVE.
    pub fn part_done(&self) {
        let mut starting = self.starting.lock().expect("start-up parts");
        *starting = starting.saturating_sub(1);
        if *starting == 0 {
            self.set_state(ServerState::Live);
            tracing::info!("start-up finished; revoy is live");
        }
    }

    /// The state `/ready`, `/server_info` and `server.state` report: DRAINING while health
    /// checks fail (`/healthcheck/fail`), as in Envoy.
    pub fn state(&self) -> ServerState {
        let own = *self.state.lock().expect("server state");
        if self.drain.health_failed() {
            ServerState::Draining
        } else {
            own
        }
    }

    /// `/healthcheck/fail` (`true`) or `/healthcheck/ok` (`false`).
    pub fn set_health_failed(&self, failed: bool) {
        self.drain.set_health_failed(failed);
        self.publish();
    }

    /// Where [`Lifecycle::quit`] sends its exit code (the main thread waits on the receiver).
    pub fn on_quit(&self, tx: Sender<i32>) {
        *self.quit.lock().expect("quit") = Some(tx);
    }

    /// Asks the process to exit with `code` (`/quitquitquit`, a signal).
    pub fn quit(&self, code: i32) {
        if let Some(tx) = self.quit.lock().expect("quit").as_ref() {
            let _ = tx.send(code);
        }
    }

    fn publish(&self) {
        let s = self.state();
        self.state_gauge.set(s as u64);
        self.live_gauge.set(u64::from(s == ServerState::Live));
    }
}
