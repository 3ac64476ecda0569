//! Envoy's drain decisions: whether a connection should start its drain (the one its
//! connection limits start, `crate::http::conn_limits`: HTTP/1.1 `connection: close` while it
//! lasts, HTTP/2 GOAWAYs at its start and end) because the server failed its health checks
//! (`/healthcheck/fail`) or its listener is draining (`/drain_listeners`).
//!
//! As in Envoy 1.40 (each probed): a failed health check tells every connection at once,
//! whatever `--drain-strategy`, except on listeners with `drain_type: MODIFY_ONLY`; a listener
//! drain (`/drain_listeners`, with or without
//! `graceful` or `skip_exit`) tells connections per `--drain-strategy`: `immediate` at once,
//! `gradual` (the default) with a chance that grows from 0 to 1 over the first half of
//! `--drain-time-s`, as measured on Envoy 1.40 (see `gradual`).
//! A connection not draining yet is told at its next response; idle ones are left alone, as
//! Envoy 1.40 leaves them, also once `/drain_listeners` stopped their listener.
//!
//! A filter chain that a listener update changed or removed drains on its own
//! ([`Retirement`]): its connections are told at their next response per `--drain-strategy`
//! from the drain's start, and whatever is left of them is closed when `--drain-time-s` ends,
//! idle ones included, as Envoy 1.40 drains and closes the connections of its draining
//! listeners and filter chains (probed: under the gradual strategy none of 20 connections
//! was told half a second into a 10 s drain of a removed listener or a changed chain, 6 a
//! second later, all after 6.5 s).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

/// `--drain-strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Connections are told with a chance that grows over the drain time.
    Gradual,
    /// Connections are told as soon as the drain starts.
    Immediate,
}

impl Strategy {
    /// Parses Envoy's `--drain-strategy` value (`gradual` or `immediate`, lower case only, as
    /// Envoy 1.40 accepts).
    pub fn parse(value: &str) -> Result<Strategy, String> {
        match value {
            "gradual" => Ok(Strategy::Gradual),
            "immediate" => Ok(Strategy::Immediate),
            other => Err(format!(
                "unknown drain-strategy '{other}' (gradual or immediate)"
            )),
        }
    }
}

/// What of a listener decides whether a drain concerns it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scope {
    /// `traffic_direction: INBOUND` (`/drain_listeners?inboundonly`).
    pub inbound: bool,
    /// `drain_type: MODIFY_ONLY` (not drained by `/healthcheck/fail`).
    pub modify_only: bool,
}

/// The process's drain state, read by every connection on each response.
pub struct Drain {
    strategy: Strategy,
    drain_time: Duration,
    health_failed: AtomicBool,
    /// Anything above is set: the one load a response pays while nothing drains.
    any: AtomicBool,
    /// When `/drain_listeners` started draining every listener.
    all: OnceLock<Instant>,
    /// When `/drain_listeners?inboundonly` started draining the inbound listeners.
    inbound: OnceLock<Instant>,
}

impl Drain {
    /// Nothing draining yet.
    pub fn new(strategy: Strategy, drain_time: Duration) -> Drain {
        Drain {
            strategy,
            drain_time,
            health_failed: AtomicBool::new(false),
            any: AtomicBool::new(false),
            all: OnceLock::new(),
            inbound: OnceLock::new(),
        }
    }

    /// `/healthcheck/fail` (`true`) and `/healthcheck/ok` (`false`).
    pub fn set_health_failed(&self, failed: bool) {
        self.health_failed.store(failed, Ordering::Relaxed);
        self.update_any();
    }

    /// Whether `/healthcheck/fail` is in force.
    pub fn health_failed(&self) -> bool {
        self.health_failed.load(Ordering::Relaxed)
    }

    /// Starts draining every listener, or only the inbound ones; a drain already started keeps
    /// its start time.
    pub fn start(&self, inbound_only: bool) {
        let now = Instant::now();
        let _ = if inbound_only {
            self.inbound.set(now)
        } else {
            self.all.set(now)
        };
        self.update_any();
    }

    fn update_any(&self) {
        let any = self.health_failed() || self.all.get().is_some() || self.inbound.get().is_some();
        self.any.store(any, Ordering::Relaxed);
    }

    /// Whether a connection of a listener (inbound or not, drained by health checks unless
    /// `drain_type: MODIFY_ONLY`) should close after its current response (Envoy's
    /// `DrainManager::drainClose`).
    pub fn close_connection(&self, listener: Scope) -> bool {
        if !self.any.load(Ordering::Relaxed) {
            return false;
        }
        if self.health_failed() && !listener.modify_only {
            return true;
        }
        let inbound = listener.inbound;
        let started = match (self.all.get(), self.inbound.get().filter(|_| inbound)) {
            (Some(a), Some(i)) => *a.min(i),
            (Some(s), None) | (None, Some(s)) => *s,
            (None, None) => return false,
        };
        self.told(started, self.drain_time)
    }

    /// Whether a connection of a chain that `retirement` drains should start its drain now:
    /// per `--drain-strategy`, over the retirement's drain time.
    pub fn close_retired(&self, retirement: &Retirement) -> bool {
        let Some((started, drain_time)) = retirement.started.get() else {
            return false;
        };
        self.told(*started, *drain_time)
    }

    /// Whether a connection of a drain that began at `started` and lasts `drain_time` is told
    /// now, per `--drain-strategy`.
    fn told(&self, started: Instant, drain_time: Duration) -> bool {
        match self.strategy {
            Strategy::Immediate => true,
            Strategy::Gradual => gradual(started.elapsed(), drain_time, &mut rand::rng()),
        }
    }
}

/// The drain of one filter chain that a listener update changed or removed.
#[derive(Debug, Default)]
pub struct Retirement {
    /// When the drain started, and its drain time: connections start their own drain at a
    /// response from then ([`Drain::close_retired`]).
    started: OnceLock<(Instant, Duration)>,
    /// Cancelled when the drain time ends: the remaining connections close.
    ended: CancellationToken,
}

impl Retirement {
    /// Starts the drain; it ends `drain_time` from now. Called on a tokio runtime (the
    /// applier's callers: xDS's), whose timer ends it.
    pub fn start(&self, drain_time: Duration) {
        if self.started.set((Instant::now(), drain_time)).is_err() {
            return;
        }
        let ended = self.ended.clone();
        tokio::spawn(async move {
            tokio::time::sleep(drain_time).await;
            ended.cancel();
        });
    }

    /// Completes when the drain time has ended.
    pub fn ended(&self) -> WaitForCancellationFuture<'_> {
        self.ended.cancelled()
    }

    /// [`Retirement::ended`] for a task of its own (an upgraded connection's tunnel).
    pub fn ended_owned(&self) -> WaitForCancellationFutureOwned {
        self.ended.clone().cancelled_owned()
    }
}

/// The gradual drain as Envoy 1.40 behaves: with `elapsed` whole seconds of a `drain_time`
/// drain gone, close with the chance `elapsed / ⌈drain_time / 2⌉` (never in the first second,
/// always from half the drain time on). Measured on Envoy, not read from its source, which
/// predicts `⌈elapsed⌉ / drain_time` (README, "gradual").
fn gradual(elapsed: Duration, drain_time: Duration, rng: &mut impl Rng) -> bool {
    let half = drain_time.as_secs().div_ceil(2);
    if half == 0 {
        return true;
    }
    elapsed.as_secs() > rng.random_range(0..half)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::Poll;

    const INBOUND: Scope = Scope {
        inbound: true,
        modify_only: false,
    };
    const OTHER: Scope = Scope {
        inbound: false,
        modify_only: false,
    };
    const MODIFY_ONLY: Scope = Scope {
        inbound: false,
        modify_only: true,
    };

    #[test]
    fn nothing_closes_until_something_drains() {
        let d = Drain::new(Strategy::Immediate, Duration::from_secs(600));
        assert!(!d.close_connection(INBOUND) && !d.close_connection(OTHER));
        d.start(true);
        assert!(d.close_connection(INBOUND), "inbound listeners drain");
        assert!(!d.close_connection(OTHER), "the others do not");
        d.start(false);
        assert!(d.close_connection(OTHER));
        assert!(
            d.close_connection(MODIFY_ONLY),
            "a listener drain drains them all"
        );
    }

    #[test]
    fn a_failed_health_check_closes_at_once_whatever_the_strategy() {
        let d = Drain::new(Strategy::Gradual, Duration::from_secs(600));
        d.set_health_failed(true);
        assert!(d.close_connection(OTHER));
        assert!(
            !d.close_connection(MODIFY_ONLY),
            "MODIFY_ONLY listeners are spared"
        );
        d.set_health_failed(false);
        assert!(!d.close_connection(OTHER));
    }

    #[test]
    fn gradual_never_closes_in_the_first_second_and_always_from_half_the_drain() {
        let mut rng = rand::rng();
        let ten = Duration::from_secs(10);
        let seven = Duration::from_secs(7);
        let secs = Duration::from_secs;
        assert!((0..200).all(|_| !gradual(Duration::from_millis(900), ten, &mut rng)));
        assert!((0..200).all(|_| gradual(secs(5), ten, &mut rng)));
        assert!((0..200).all(|_| gradual(secs(4), seven, &mut rng)));
        assert!(!(0..200).all(|_| gradual(secs(3), seven, &mut rng)));
        assert!((0..200).all(|_| !gradual(Duration::from_millis(600), secs(1), &mut rng)));
        assert!(gradual(Duration::ZERO, Duration::ZERO, &mut rng));
    }

    #[tokio::test]
    async fn a_retirement_tells_per_strategy_and_ends_after_the_drain_time() {
        let immediate = Drain::new(Strategy::Immediate, Duration::from_secs(600));
        let gradual = Drain::new(Strategy::Gradual, Duration::from_secs(600));
        let long = Retirement::default();
        assert!(!immediate.close_retired(&long));
        long.start(Duration::from_secs(600));
        assert!(
            immediate.close_retired(&long),
            "immediate: connections are told from the start"
        );
        assert!(
            (0..200).all(|_| !gradual.close_retired(&long)),
            "gradual: not in the first second"
        );
        let mut ended = std::pin::pin!(long.ended());
        let polled = std::future::poll_fn(|cx| Poll::Ready(ended.as_mut().poll(cx).is_ready()));
        assert!(!polled.await, "the drain has not ended");
        let short = Retirement::default();
        short.start(Duration::ZERO);
        short.ended().await;
    }

    #[test]
    fn only_envoys_spellings_are_strategies() {
        assert_eq!(Strategy::parse("immediate"), Ok(Strategy::Immediate));
        assert_eq!(Strategy::parse("gradual"), Ok(Strategy::Gradual));
        assert!(Strategy::parse("Immediate").is_err());
    }
}
