//! A stream's limits: the route's `idle_timeout` (Envoy's stream idle timeout for the route)
//! and its time limit: the route's `max_stream_duration` (or, with
//! `grpc_timeout_header_max`, the request's `grpc-timeout`), else the connection manager's.
//! Before the response head they end the request with Envoy's local replies (504 `stream
//! timeout`; 504 `downstream duration timeout`, gRPC DEADLINE_EXCEEDED); afterwards they cut
//! the response body, which resets the downstream stream as Envoy does.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep, sleep, sleep_until};

use http::{HeaderMap, Response, StatusCode};

use super::grpc_timeout::{self, GRPC_TIMEOUT};
use super::local_reply::{
    GRPC_DEADLINE_EXCEEDED, is_grpc, local_reply, local_reply_with_grpc_status,
};
use crate::body::{Body, BoxError};
use crate::route::action::{Forward, StreamTimeouts};

/// Which limit ended a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The route's `idle_timeout`.
    Idle,
    /// The stream's time limit (`max_stream_duration` or `grpc-timeout`).
    Duration,
}

impl Limit {
    /// Envoy's local reply body for it.
    fn text(self) -> &'static str {
        match self {
            Limit::Idle => "stream timeout",
            Limit::Duration => "downstream duration timeout",
        }
    }

    /// The response flag and `%RESPONSE_CODE_DETAILS%` access logs give it.
    pub fn log_facts(self) -> (crate::access_log::ResponseFlag, &'static str) {
        use crate::access_log::ResponseFlag as F;
        match self {
            Limit::Idle => (F::StreamIdleTimeout, "stream_idle_timeout"),
            Limit::Duration => (F::DurationTimeout, "max_duration_timeout"),
        }
    }

    /// Envoy's local reply when it fires before the response head: 504, and for a gRPC
    /// request past its time limit DEADLINE_EXCEEDED (other limits map from the 504).
    pub fn reply(self) -> Response<Body> {
        match self {
            Limit::Idle => local_reply(StatusCode::GATEWAY_TIMEOUT, self.text()),
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
}

impl StreamLimits {
    /// The limits of a stream that started at `start` on route `fwd`, under the connection
    /// manager's `max_stream_duration` `hcm_max`; `None` when it has none. On a route with
    /// `max_stream_duration`, a gRPC request's `grpc-timeout` is set to its time limit, as
    /// Envoy tells the upstream.
    pub fn of(
        fwd: &Forward,
        hcm_max: Option<Duration>,
        headers: &mut HeaderMap,
        start: Instant,
    ) -> Option<StreamLimits> {
        let idle = fwd.idle_timeout();
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
        (idle.is_some() || deadline.is_some()).then_some(StreamLimits { idle, deadline })
    }

    /// When the wait for the response head must end, and the limit that fires first then.
    pub fn head_deadline(&self) -> Option<(Instant, Limit)> {
        let idle_at = self.idle.map(|i| Instant::now() + i);
        match (idle_at, self.deadline) {
            (Some(i), Some(d)) if d <= i => Some((d, Limit::Duration)),
            (Some(i), _) => Some((i, Limit::Idle)),
            (None, Some(d)) => Some((d, Limit::Duration)),
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
#[error("{}", .0.text())]
struct LimitReached(Limit);

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
            return Poll::Ready(Some(Err(LimitReached(Limit::Duration).into())));
        }
        if this
            .idle_timer
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
        {
            return Poll::Ready(Some(Err(LimitReached(Limit::Idle).into())));
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
