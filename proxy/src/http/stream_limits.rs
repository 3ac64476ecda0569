//! A stream's limits: its idle timeout (the route's `idle_timeout`, else the connection
//! manager's `stream_idle_timeout`; 0 disables either) and its time limit: the route's
//! `max_stream_duration` (or, with `grpc_timeout_header_max`, the request's `grpc-timeout`),
//! else the connection manager's. Before the response head they end the request with Envoy's
//! local replies (504 `stream timeout`; 504 `downstream duration timeout`, gRPC
//! DEADLINE_EXCEEDED); afterwards they cut the response body, which resets the downstream
//! stream as Envoy does. The idle timer before the response head is armed only when it could
//! fire before the route timeout; before and after the response head, the request body's
//! frames restart it (see [`BodyActivity`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep, sleep, sleep_until};

use http::{HeaderMap, Response, StatusCode};

use super::Hcm;
use super::body_activity::BodyActivity;
use super::grpc_timeout::{self, GRPC_TIMEOUT};
use super::local_reply::{
    GRPC_DEADLINE_EXCEEDED, is_grpc, local_reply, local_reply_with_grpc_status,
};
use super::stats::HcmStats;
use crate::access_log::{Record, ResponseFlag};
use crate::body::{Body, BoxError};
use crate::route::action::{Forward, StreamTimeouts};
use crate::upstream::ClusterStats;

/// Which limit ended a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The route's `idle_timeout` or the connection manager's `stream_idle_timeout`.
    Idle,
    /// The stream's time limit (`max_stream_duration` or `grpc-timeout`).
    Duration,
    /// The upstream stream's time limit (its cluster's `max_stream_duration`), reached after
    /// the response head (before it, the router answers; see `attempts`).
    Upstream,
}

impl Limit {
    /// Envoy's local reply body for it.
    fn text(self) -> &'static str {
        match self {
            Limit::Idle => "stream timeout",
            Limit::Duration => "downstream duration timeout",
            Limit::Upstream => "upstream max stream duration reached",
        }
    }

    /// Notes it in a request's record as Envoy's connection manager does: `SI` and
    /// `stream_idle_timeout`, or (no flag; `DT` is tcp_proxy's) `max_duration_timeout`.
    pub fn note(self, rec: &mut Record) {
        match self {
            Limit::Idle => {
                rec.flags.set(ResponseFlag::StreamIdleTimeout);
                rec.details = Some("stream_idle_timeout".into());
            }
            Limit::Duration => rec.details = Some("max_duration_timeout".into()),
            Limit::Upstream => {
                rec.flags
                    .set(ResponseFlag::UpstreamMaxStreamDurationReached);
                rec.details = Some("upstream_max_stream_duration_reached".into());
            }
        }
    }

    /// Counts it in the connection manager's `downstream_rq_idle_timeout` or
    /// `downstream_rq_max_duration_reached`, or the cluster's
    /// `upstream_rq_max_duration_reached` (`upstream`).
    pub fn count(self, stats: &HcmStats, upstream: Option<&ClusterStats>) {
        match self {
            Limit::Idle => stats.rq_idle_timeout.inc(),
            Limit::Duration => stats.rq_max_duration_reached.inc(),
            Limit::Upstream => {
                if let Some(c) = upstream {
                    c.upstream_rq_max_duration_reached().inc();
                }
            }
        }
    }

    /// Envoy's local reply when it fires before the response head: 504 (an idle timeout
    /// before the request body ended: 408), and for a gRPC request past its time limit
    /// DEADLINE_EXCEEDED (other limits map from the status).
    pub fn reply(self, request_ended: bool) -> Response<Body> {
        match self {
            Limit::Idle if !request_ended => local_reply(StatusCode::REQUEST_TIMEOUT, self.text()),
            Limit::Idle | Limit::Upstream => local_reply(StatusCode::GATEWAY_TIMEOUT, self.text()),
            Limit::Duration => local_reply_with_grpc_status(
                StatusCode::GATEWAY_TIMEOUT,
                self.text(),
                GRPC_DEADLINE_EXCEEDED,
            ),
        }
    }
}

/// The limits of one stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    idle: Option<Duration>,
    deadline: Option<Instant>,
    /// When the upstream stream reaches its cluster's `max_stream_duration`.
    upstream: Option<Instant>,
}

impl StreamLimits {
    /// The limits of a stream that started at `start` on route `fwd`, under the connection
    /// manager's `stream_idle_timeout` `hcm_idle` and `max_stream_duration` `hcm_max`; `None`
    /// when it has none. On a route with
    /// `max_stream_duration`, a gRPC request's `grpc-timeout` is set to its time limit, as
    /// Envoy tells the upstream.
    pub fn of(
        fwd: &Forward,
        hcm_idle: Option<Duration>,
        hcm_max: Option<Duration>,
        headers: &mut HeaderMap,
        start: Instant,
    ) -> Option<StreamLimits> {
        let idle = match fwd.idle_timeout() {
            Some(route) => Some(route).filter(|i| !i.is_zero()),
            None => hcm_idle,
        };
        let route = match fwd.stream_timeouts.as_deref() {
            Some(StreamTimeouts::Duration(d)) => Some(d),
            _ => None,
        };
        // The header is looked up only where it counts: most routes lack the setting.
        let requested = route
            .and_then(|d| d.grpc_timeout_header_max)
            .and_then(|max| Some((grpc_timeout::of(headers)?, max)));
        let limit = match requested {
            Some((requested, max)) => {
                let mut t = if !max.is_zero() && requested > max {
                    max
                } else {
                    requested
                };
                if let Some(offset) = route.and_then(|d| d.grpc_timeout_header_offset)
                    && !t.is_zero()
                {
                    t = t.saturating_sub(offset);
                }
                Some(t)
            }
            None => match route.and_then(|d| d.max) {
                Some(max) => Some(max).filter(|m| !m.is_zero()),
                None => hcm_max,
            },
        };
        if let Some(t) = limit
            && route.is_some()
            && is_grpc(headers)
        {
            headers.insert(&GRPC_TIMEOUT, grpc_timeout::encode(t));
        }
        let deadline = limit.map(|t| start + t);
        (idle.is_some() || deadline.is_some()).then_some(StreamLimits {
            idle,
            deadline,
            upstream: None,
        })
    }

    /// `limits` with the upstream stream's own time limit ending `at` (`None`: it has none)
    /// for the response body; `None` when there is no limit at all.
    pub fn with_upstream(limits: Option<StreamLimits>, at: Option<Instant>) -> Option<Self> {
        match (limits, at) {
            (Some(l), upstream) => Some(StreamLimits { upstream, ..l }),
            (None, Some(at)) => Some(StreamLimits {
                idle: None,
                deadline: None,
                upstream: Some(at),
            }),
            (None, None) => None,
        }
    }

    /// Whether the stream has an idle timeout.
    pub fn idles(&self) -> bool {
        self.idle.is_some()
    }

    /// When the wait for the response head must end, and the limit that fires first then,
    /// under the route timeout `global` (which starts now): an idle timeout not shorter than
    /// it cannot fire first, so it arms no timer.
    pub fn head_deadline(&self, global: Option<Duration>) -> Option<(Instant, Limit)> {
        let idle_at = self
            .idle
            .filter(|i| global.is_none_or(|g| *i < g))
            .map(|i| Instant::now() + i);
        match (idle_at, self.deadline) {
            (Some(i), Some(d)) if d <= i => Some((d, Limit::Duration)),
            (Some(i), _) => Some((i, Limit::Idle)),
            (None, Some(d)) => Some((d, Limit::Duration)),
            (None, None) => None,
        }
    }

    /// Wraps a response body so that it fails when idle too long or past a deadline
    /// (counted in `hcm`'s stats, the upstream's limit in its cluster's `cluster`). The
    /// request body's frames (`request`, when it was still arriving) keep the stream from
    /// being idle too.
    pub fn wrap(
        &self,
        body: Body,
        (hcm, cluster): (&Arc<Hcm>, &Arc<ClusterStats>),
        request: Option<BodyActivity>,
    ) -> Body {
        // One timer for both deadlines: the earlier.
        let deadline = match (self.deadline, self.upstream) {
            (Some(d), Some(u)) if u < d => Some((u, Limit::Upstream)),
            (None, Some(u)) => Some((u, Limit::Upstream)),
            (d, _) => d.map(|d| (d, Limit::Duration)),
        };
        crate::body::boxed(Limited {
            inner: body,
            hcm: Arc::clone(hcm),
            cluster: self.upstream.map(|_| Arc::clone(cluster)),
            idle: self.idle,
            deadline_at: deadline,
            request,
            moved: false,
            armed: false,
            idle_timer: None,
            deadline: None,
        })
    }
}

impl StreamLimits {
    /// Runs `wait` (the exchange up to the response head) until the limit `first` fires at
    /// `at`: an idle timeout is pushed back by the request body's activity (`body`, when it
    /// was watched), up to the stream's time limit. `Err` names the limit that fired.
    pub async fn head_wait<F: Future>(
        &self,
        wait: F,
        (mut at, mut first): (Instant, Limit),
        body: Option<&BodyActivity>,
    ) -> Result<F::Output, Limit> {
        let mut wait = std::pin::pin!(wait);
        loop {
            tokio::select! {
                biased;
                done = &mut wait => return Ok(done),
                () = sleep_until(at) => {}
            }
            let (Limit::Idle, Some(idle), Some(body)) = (first, self.idle, body) else {
                return Err(first);
            };
            let idle_at = body.last() + idle;
            if idle_at <= Instant::now() {
                return Err(Limit::Idle);
            }
            (at, first) = match self.deadline {
                Some(d) if d <= idle_at => (d, Limit::Duration),
                _ => (idle_at, Limit::Idle),
            };
        }
    }
}

/// A body cut off by an idle timer (reset on every frame) and an absolute deadline.
///
/// The timers are made the first time the body has to wait (a body whose frames are all at
/// hand never arms one), and the idle timer is restarted when the body waits again after a
/// frame. When it fires, the request body's last frame is looked at: one since pushes it
/// back (Envoy restarts it on request frames too).
struct Limited {
    inner: Body,
    hcm: Arc<Hcm>,
    /// The upstream's cluster stats, when its `max_stream_duration` limits the body.
    cluster: Option<Arc<ClusterStats>>,
    idle: Option<Duration>,
    /// The earlier deadline and its limit.
    deadline_at: Option<(Instant, Limit)>,
    /// The request body's activity, when it had not ended by the response head.
    request: Option<BodyActivity>,
    /// A frame went by since the idle timer was last (re)started.
    moved: bool,
    /// The timers were made.
    armed: bool,
    idle_timer: Option<Pin<Box<Sleep>>>,
    deadline: Option<Pin<Box<Sleep>>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{}", .0.text())]
struct LimitReached(Limit);

/// The limit that cut a response body, when `e` is that body's error.
pub fn limit_of(e: &BoxError) -> Option<Limit> {
    e.downcast_ref::<LimitReached>().map(|l| l.0)
}

impl HttpBody for Limited {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.moved = true;
            return Poll::Ready(frame);
        }
        if !this.armed {
            this.armed = true;
            this.idle_timer = this.idle.map(|i| Box::pin(sleep(i)));
            this.deadline = this.deadline_at.map(|(d, _)| Box::pin(sleep_until(d)));
        } else if let (true, Some(timer), Some(idle)) =
            (this.moved, this.idle_timer.as_mut(), this.idle)
        {
            timer.as_mut().reset(Instant::now() + idle);
        }
        this.moved = false;
        if this
            .deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready())
            && let Some((_, limit)) = this.deadline_at
        {
            limit.count(&this.hcm.stats, this.cluster.as_deref());
            return Poll::Ready(Some(Err(LimitReached(limit).into())));
        }
        while let (Some(timer), Some(idle)) = (this.idle_timer.as_mut(), this.idle) {
            if timer.as_mut().poll(cx).is_pending() {
                break;
            }
            let since_request = this.request.as_ref().map(|r| r.last() + idle);
            match since_request {
                Some(at) if at > Instant::now() => timer.as_mut().reset(at),
                _ => {
                    Limit::Idle.count(&this.hcm.stats, None);
                    return Poll::Ready(Some(Err(LimitReached(Limit::Idle).into())));
                }
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
