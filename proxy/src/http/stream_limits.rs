//! A route's stream-level limits: `idle_timeout` (Envoy's stream idle timeout for the route)
//! and `max_stream_duration`. Before the response head they end the request with Envoy's local
//! replies (504 `stream timeout`, 504 `downstream duration timeout`); afterwards they cut the
//! response body, which resets the downstream stream as Envoy does.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep, sleep, sleep_until};

use crate::body::{Body, BoxError};
use crate::route::action::Forward;

/// Envoy's local reply body when the stream idle timeout fires.
pub const STREAM_TIMEOUT: &str = "stream timeout";
/// Envoy's local reply body when `max_stream_duration` is reached.
pub const DURATION_TIMEOUT: &str = "downstream duration timeout";

/// The limits of one stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    idle: Option<Duration>,
    deadline: Option<Instant>,
}

impl StreamLimits {
    /// The limits of `fwd` for a stream that started at `start`; `None` when it has none.
    pub fn of(fwd: &Forward, start: Instant) -> Option<StreamLimits> {
        let idle = fwd.idle_timeout;
        let deadline = fwd
            .stream_duration
            .as_ref()
            .and_then(|s| s.max)
            .map(|d| start + d);
        (idle.is_some() || deadline.is_some()).then_some(StreamLimits { idle, deadline })
    }

    /// When the wait for the response head must end, and the local reply body of the limit
    /// that fires first then.
    pub fn head_deadline(&self) -> Option<(Instant, &'static str)> {
        let idle_at = self.idle.map(|i| Instant::now() + i);
        match (idle_at, self.deadline) {
            (Some(i), Some(d)) if d <= i => Some((d, DURATION_TIMEOUT)),
            (Some(i), _) => Some((i, STREAM_TIMEOUT)),
            (None, Some(d)) => Some((d, DURATION_TIMEOUT)),
            (None, None) => None,
        }
    }

    /// Wraps a response body so that it fails when idle too long or past the deadline.
    pub fn wrap(&self, body: Body) -> Body {
        crate::body::boxed(Limited {
            inner: body,
            idle: self.idle,
            idle_timer: self.idle.map(|i| Box::pin(sleep(i))),
            deadline: self.deadline.map(|d| Box::pin(sleep_until(d))),
        })
    }
}

/// A body cut off by an idle timer (reset on every frame) and an absolute deadline.
struct Limited {
    inner: Body,
    idle: Option<Duration>,
    idle_timer: Option<Pin<Box<Sleep>>>,
    deadline: Option<Pin<Box<Sleep>>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct LimitReached(&'static str);

impl HttpBody for Limited {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let (Some(timer), Some(idle)) = (this.idle_timer.as_mut(), this.idle) {
                timer.as_mut().reset(Instant::now() + idle);
            }
            return Poll::Ready(frame);
        }
        if this
            .deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready())
        {
            return Poll::Ready(Some(Err(LimitReached(DURATION_TIMEOUT).into())));
        }
        if this
            .idle_timer
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
        {
            return Poll::Ready(Some(Err(LimitReached(STREAM_TIMEOUT).into())));
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
