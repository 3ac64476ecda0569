//! A downstream connection's limits, `common_http_protocol_options`' `idle_timeout`,
//! `max_connection_duration` and `max_requests_per_connection`, and the drain they start, as
//! Envoy 1.40's connection manager runs them (each probed with HTTP/1.1 and HTTP/2 clients):
//!
//! - The idle timer runs while the connection has no stream: from its start and from the end
//!   of each stream that leaves none. Each time it fires it counts `downstream_cx_idle_timeout`
//!   (again in a later idle period, even while draining) and, unless the connection drains
//!   already, starts the drain.
//! - `max_connection_duration` from the connection's start counts
//!   `downstream_cx_max_duration_reached` and starts the drain.
//! - Either closes at once, undrained, a connection that has sent no byte yet (Envoy has made no
//!   codec for it).
//! - The drain ([`ConnLimits::start_drain`]) lasts `drain_timeout`: an HTTP/2 connection gets a
//!   GOAWAY (last stream 2^31-1, `NO_ERROR`) at its start and its final GOAWAY at its end;
//!   every HTTP/1 response meanwhile says `connection: close`, and the connection still serves
//!   the requests that come. At its end a connection closes once its streams are done, after
//!   Envoy's delayed close: up to [`DELAYED_CLOSE`] waiting for the client to close first; no
//!   timer fires any more then.
//! - The server's drains (`/healthcheck/fail`, `/drain_listeners`, a listener update; see
//!   [`crate::drain`]) start the same drain at a response of a connection not draining yet,
//!   as Envoy's `drainClose` check does (`super::ConnContext::server_drain`).
//! - The request that reaches `max_requests_per_connection` (and each one after it) counts
//!   `downstream_cx_max_requests_reached`; on HTTP/1 its response says `connection: close` and
//!   the connection closes after it, on HTTP/2 the drain starts.
//!
//! The state is shared by a connection's streams (hyper serves HTTP/2 streams on tasks of their
//! own), so it is kept in atomics; one driver, the loop serving the connection, fires the
//! timers ([`ConnLimits::advance`]) when [`LimitTimer`] says one may be due.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::{ConnContext, HcmStats};
use crate::config::hcm::ConnectionLimits;

/// How long a connection closing at the end of its drain waits for the client to close first:
/// Envoy's default `delayed_close_timeout`.
pub(super) const DELAYED_CLOSE: Duration = Duration::from_secs(1);

/// Not draining.
const OPEN: u8 = 0;
/// Draining: HTTP/1 responses say `connection: close`.
const DRAINING: u8 = 1;
/// The drain ended: the connection closes once its streams are done, after the delayed close.
const CLOSING_DELAYED: u8 = 2;
/// The request limit was reached on HTTP/1: the connection closes after its response.
const CLOSING: u8 = 3;

/// Where one connection stands against its limits (the limits themselves are its connection
/// manager's, passed in: a connection keeps no copy).
#[derive(Debug)]
pub struct ConnLimits {
    opened: Instant,
    /// Requests begun.
    requests: AtomicU32,
    /// Streams begun and not done.
    active: AtomicU32,
    /// Nanoseconds from `opened` to when the last stream that left none ended.
    idle_since: AtomicU64,
    /// `idle_since` + 1 of the idle period whose timeout fired (0: none did).
    idle_fired: AtomicU64,
    /// `max_connection_duration` was reached.
    duration_fired: AtomicBool,
    /// [`OPEN`], [`DRAINING`], [`CLOSING_DELAYED`] or [`CLOSING`].
    state: AtomicU8,
    /// Nanoseconds from `opened` to the start of the drain.
    drain_started: AtomicU64,
    /// The next HTTP/1.1 response head hyper writes gets the drain's `connection: close`
    /// on its way out (see [`ConnLimits::notice_next_head`]).
    notice: AtomicBool,
}

/// What [`ConnLimits::advance`] found due.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Due {
    /// The connection has sent nothing yet and closes now, without a drain.
    pub close_now: bool,
    /// The drain started (HTTP/2: its first GOAWAY goes out).
    pub drain_started: bool,
    /// The drain ended: the connection closes once its streams are done.
    pub drain_ended: bool,
}

/// What an HTTP/1 response says of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Http1Close {
    /// Nothing.
    Keep,
    /// `connection: close`, and the connection stays open (draining).
    Notice,
    /// `connection: close`, and the connection closes after it (the request limit).
    Now,
    /// `connection: close`, and the connection closes after it with the delayed close (the
    /// drain ended).
    Delayed,
}

impl ConnLimits {
    /// A connection accepted at `opened`.
    pub fn new(opened: Instant) -> ConnLimits {
        ConnLimits {
            opened,
            requests: AtomicU32::new(0),
            active: AtomicU32::new(0),
            idle_since: AtomicU64::new(0),
            idle_fired: AtomicU64::new(0),
            duration_fired: AtomicBool::new(false),
            state: AtomicU8::new(OPEN),
            drain_started: AtomicU64::new(0),
            notice: AtomicBool::new(false),
        }
    }

    fn at(&self, nanos: u64) -> Instant {
        self.opened + Duration::from_nanos(nanos)
    }

    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.opened).as_nanos() as u64
    }

    /// A request (stream) begins; whether it reaches the request limit (counted then).
    pub(super) fn stream_started(&self, limits: &ConnectionLimits, stats: &HcmStats) -> bool {
        self.active.fetch_add(1, Relaxed);
        let n = self.requests.fetch_add(1, Relaxed) + 1;
        let reached = limits.max_requests.is_some_and(|max| n >= max);
        if reached {
            stats.cx_max_requests_reached.inc();
        }
        reached
    }

    /// A stream ended at `now`.
    pub(super) fn stream_ended(&self, limits: &ConnectionLimits, now: Instant) {
        if self.active.fetch_sub(1, Relaxed) == 1 && limits.idle_timeout.is_some() {
            self.idle_since.store(self.nanos(now), Relaxed);
        }
    }

    /// Whether a stream is in progress.
    pub(super) fn busy(&self) -> bool {
        self.active.load(Relaxed) > 0
    }

    /// Starts the drain at `at`; whether it started now (not before).
    pub(super) fn start_drain(&self, at: Instant) -> bool {
        // A connection is served on one worker thread: nothing reads the state between the two
        // stores.
        let started = self
            .state
            .compare_exchange(OPEN, DRAINING, Relaxed, Relaxed)
            .is_ok();
        if started {
            self.drain_started.store(self.nanos(at), Relaxed);
        }
        started
    }

    /// The HTTP/1 request that reached the limit: the connection closes after its response.
    pub(super) fn close_after_response(&self) {
        self.state.store(CLOSING, Relaxed);
    }

    /// Whether the drain ended (the connection closes once its streams are done).
    pub(super) fn drain_ended(&self) -> bool {
        self.state.load(Relaxed) == CLOSING_DELAYED
    }

    /// Whether the connection drains or closes.
    pub(super) fn draining(&self) -> bool {
        self.state.load(Relaxed) != OPEN
    }

    /// What a response on an HTTP/1 connection says now.
    pub(super) fn http1_close(&self) -> Http1Close {
        match self.state.load(Relaxed) {
            OPEN => Http1Close::Keep,
            DRAINING => Http1Close::Notice,
            CLOSING_DELAYED => Http1Close::Delayed,
            _ => Http1Close::Now,
        }
    }

    /// A response hyper serves over HTTP/1.1 while the connection drains: hyper would close a
    /// connection whose response says `connection: close`, so the notice goes into the head
    /// on its way out instead ([`super::envoy_errors`]), and the connection stays open.
    pub(super) fn notice_next_head(&self) {
        self.notice.store(true, Relaxed);
    }

    /// Whether the response head being written gets the drain's notice (taken once).
    pub(super) fn take_head_notice(&self) -> bool {
        self.notice.load(Relaxed) && self.notice.swap(false, Relaxed)
    }

    /// Whether anything can fall due while a stream is in progress (the duration, or the end
    /// of a drain): otherwise a stream need not look at the clock for the limits.
    pub(super) fn timed_while_busy(&self, limits: &ConnectionLimits) -> bool {
        let duration =
            limits.max_connection_duration.is_some() && !self.duration_fired.load(Relaxed);
        duration || self.state.load(Relaxed) == DRAINING
    }

    fn idle_deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        let idle = limits.idle_timeout?;
        let since = self.idle_since.load(Relaxed);
        (self.active.load(Relaxed) == 0 && self.idle_fired.load(Relaxed) != since + 1)
            .then(|| self.at(since) + idle)
    }

    fn duration_deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        let max = limits.max_connection_duration?;
        (!self.duration_fired.load(Relaxed)).then(|| self.opened + max)
    }

    fn drain_deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        (self.state.load(Relaxed) == DRAINING)
            .then(|| self.at(self.drain_started.load(Relaxed)) + limits.drain_timeout)
    }

    /// When to look again at the limits: the earliest of the idle timeout (when no stream is
    /// in progress; while one is, not before `now` + the timeout, `now` given), the duration
    /// and the end of the drain. `None`: never.
    pub(super) fn next_deadline(
        &self,
        limits: &ConnectionLimits,
        now: Option<Instant>,
    ) -> Option<Instant> {
        let idle = match (self.idle_deadline(limits), now, limits.idle_timeout) {
            (Some(at), _, _) => Some(at),
            (None, Some(now), Some(idle)) if self.busy() => Some(now + idle),
            _ => None,
        };
        [
            idle,
            self.duration_deadline(limits),
            self.drain_deadline(limits),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Fires, in their order, the timers due by `now`, counting them in `stats`; `codec` says
    /// whether the connection has sent anything yet.
    pub(super) fn advance(
        &self,
        limits: &ConnectionLimits,
        now: Instant,
        stats: &HcmStats,
        codec: bool,
    ) -> Due {
        let mut due = Due::default();
        loop {
            let idle = self.idle_deadline(limits).filter(|t| *t <= now);
            let duration = self.duration_deadline(limits).filter(|t| *t <= now);
            let drain = self.drain_deadline(limits).filter(|t| *t <= now);
            let Some(at) = [idle, duration, drain].into_iter().flatten().min() else {
                return due;
            };
            if drain == Some(at) {
                self.state.store(CLOSING_DELAYED, Relaxed);
                due.drain_ended = true;
                continue;
            }
            if idle == Some(at) {
                self.idle_fired
                    .store(self.idle_since.load(Relaxed) + 1, Relaxed);
                stats.cx_idle_timeout.inc();
            } else {
                self.duration_fired.store(true, Relaxed);
                stats.cx_max_duration_reached.inc();
            }
            if self.state.load(Relaxed) != OPEN {
                continue;
            }
            if !codec {
                due.close_now = true;
                return due;
            }
            due.drain_started |= self.start_drain(at);
        }
    }
}

/// A stream in progress on a connection hyper serves, which ends when this drops: with the
/// response body once hyper has sent it, or with the request given up.
pub(super) struct StreamEnd(Arc<ConnContext>);

impl StreamEnd {
    /// Begins a stream on `ctx`'s connection; whether it reaches the request limit.
    pub(super) fn start(ctx: Arc<ConnContext>) -> (StreamEnd, bool) {
        let limits = &ctx.hcm.config.connection_limits;
        let reached = ctx.limits.stream_started(limits, &ctx.hcm.stats);
        (StreamEnd(ctx), reached)
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        let ctx = &self.0;
        ctx.limits
            .stream_ended(&ctx.hcm.config.connection_limits, Instant::now());
    }
}

/// Completes when the idle timeout or the duration (counted then) closes `ctx`'s connection,
/// which has sent nothing yet; never when neither is set.
pub(super) async fn silent_until_closed(ctx: &ConnContext) {
    let limits = &ctx.hcm.config.connection_limits;
    let mut timer = LimitTimer::default();
    loop {
        timer.until(ctx.limits.next_deadline(limits, None)).await;
        let now = Instant::now();
        if ctx
            .limits
            .advance(limits, now, &ctx.hcm.stats, false)
            .close_now
        {
            return;
        }
    }
}

/// The one timer a connection's limits need, kept across waits: it is reset only when the
/// deadline it should fire at comes before the one it has; one that fires early (a later idle
/// period moved the idle deadline on) is reset then. A connection served back to back thus
/// keeps one registration in the timer wheel instead of making one per request.
#[derive(Default)]
pub(super) struct LimitTimer(Option<Pin<Box<Sleep>>>);

impl LimitTimer {
    /// Completes at `deadline` (never when `None`).
    pub(super) fn until(&mut self, deadline: Option<Instant>) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.poll_until(cx, deadline))
    }

    fn poll_until(&mut self, cx: &mut Context<'_>, deadline: Option<Instant>) -> Poll<()> {
        let Some(deadline) = deadline else {
            return Poll::Pending;
        };
        let sleep = self
            .0
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        loop {
            if sleep.deadline() > deadline {
                sleep.as_mut().reset(deadline);
            }
            ready!(sleep.as_mut().poll(cx));
            if sleep.deadline() >= deadline {
                return Poll::Ready(());
            }
            sleep.as_mut().reset(deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(idle: u64, duration: Option<u64>, max: Option<u32>) -> ConnectionLimits {
        ConnectionLimits {
            idle_timeout: Some(Duration::from_secs(idle)),
            max_connection_duration: duration.map(Duration::from_secs),
            max_requests: max,
            drain_timeout: Duration::from_secs(5),
        }
    }

    fn stats() -> (crate::stats::Store, HcmStats) {
        let store = crate::stats::Store::new();
        let stats = HcmStats::new(&store, "t", "listener.l");
        (store, stats)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn idle_timeout_counts_each_idle_period_and_drains_once() {
        let (store, stats) = stats();
        let l = limits(1, None, None);
        let c = ConnLimits::new(Instant::now());
        let t0 = c.opened;
        assert_eq!(c.next_deadline(&l, None), Some(t0 + secs(1)));
        let due = c.advance(&l, t0 + secs(1), &stats, true);
        assert!(due.drain_started && !due.drain_ended);
        assert_eq!(c.http1_close(), Http1Close::Notice);
        assert_eq!(c.next_deadline(&l, None), Some(t0 + secs(6)));
        // A request in the drain, ended at 2 s: its idle period fires at 3 s, counted again.
        c.stream_started(&l, &stats);
        c.stream_ended(&l, t0 + secs(2));
        let due = c.advance(&l, t0 + secs(3), &stats, true);
        assert_eq!(due, Due::default());
        let idle = store.counter("http.t.downstream_cx_idle_timeout");
        assert_eq!(idle.value(), 2);
        let due = c.advance(&l, t0 + secs(6), &stats, true);
        assert!(due.drain_ended);
        assert_eq!(c.http1_close(), Http1Close::Delayed);
        assert_eq!(c.next_deadline(&l, None), None);
    }

    #[test]
    fn a_connection_that_sent_nothing_closes_at_once() {
        let (store, stats) = stats();
        let l = limits(10, Some(1), None);
        let c = ConnLimits::new(Instant::now());
        let due = c.advance(&l, c.opened + secs(1), &stats, false);
        assert!(due.close_now && !due.drain_started);
        let reached = store.counter("http.t.downstream_cx_max_duration_reached");
        assert_eq!(reached.value(), 1);
    }

    #[test]
    fn the_duration_drains_a_busy_connection_from_when_it_was_reached() {
        let (_store, stats) = stats();
        let l = limits(10, Some(1), None);
        let c = ConnLimits::new(Instant::now());
        let t0 = c.opened;
        c.stream_started(&l, &stats);
        assert!(c.timed_while_busy(&l));
        // Looked at late (at a response): the drain began at 1 s and ended at 6 s.
        let due = c.advance(&l, t0 + secs(7), &stats, true);
        assert!(due.drain_started && due.drain_ended);
        assert_eq!(
            c.next_deadline(&l, Some(t0 + secs(7))),
            Some(t0 + secs(17)),
            "the idle timeout, no sooner than a full period after a busy moment"
        );
    }

    #[test]
    fn a_drain_keeps_its_start() {
        let l = limits(10, None, None);
        let c = ConnLimits::new(Instant::now());
        let t0 = c.opened;
        assert!(c.start_drain(t0 + secs(1)));
        assert!(!c.start_drain(t0 + secs(3)));
        assert_eq!(c.next_deadline(&l, None), Some(t0 + secs(6)));
        c.close_after_response();
        assert_eq!(c.http1_close(), Http1Close::Now);
    }

    #[test]
    fn the_request_limit_counts_every_request_from_it_on() {
        let (store, stats) = stats();
        let l = limits(10, None, Some(2));
        let c = ConnLimits::new(Instant::now());
        assert!(!c.stream_started(&l, &stats));
        assert!(c.stream_started(&l, &stats));
        assert!(c.stream_started(&l, &stats));
        let reached = store.counter("http.t.downstream_cx_max_requests_reached");
        assert_eq!(reached.value(), 2);
    }
}
