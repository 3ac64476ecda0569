//! When a request body last moved, and whether the request is through the connection
//! manager's filters: what restarts a stream's idle timer (Envoy restarts it on the
//! request's activity too, before and after the response head) and what disarms the
//! connection manager's `request_timeout` (the request whole and through the filters).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;

use crate::body::{Body, BoxError};

/// A request's activity, shared by its body (which notes each frame) and its timers.
#[derive(Debug, Clone)]
pub struct BodyActivity {
    since: Instant,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Milliseconds after `since` of the body's last frame, with [`ENDED`] set once the body
    /// ended.
    last_ms: AtomicU64,
    /// The request went through the connection manager's filters.
    filtered: AtomicBool,
}

/// The bit of [`Shared::last_ms`] set once the body ended.
const ENDED: u64 = 1 << 63;

impl BodyActivity {
    /// Watches `body`: each of its frames is noted. The watch starts now.
    pub fn watch(body: Body) -> (Body, BodyActivity) {
        let activity = BodyActivity {
            since: Instant::now(),
            shared: Arc::default(),
        };
        let touched = Touched {
            inner: body,
            activity: activity.clone(),
        };
        (crate::body::boxed(touched), activity)
    }

    /// The activity of a request without a body (it ended with its head).
    pub fn headers_only() -> BodyActivity {
        let activity = BodyActivity {
            since: Instant::now(),
            shared: Arc::default(),
        };
        activity.shared.last_ms.store(ENDED, Ordering::Relaxed);
        activity
    }

    /// When the request body last moved (the watch's start if it never did).
    pub fn last(&self) -> Instant {
        let ms = self.shared.last_ms.load(Ordering::Relaxed) & !ENDED;
        self.since + Duration::from_millis(ms)
    }

    /// Whether the request body ended (Envoy's "remote decode complete": its timeouts answer
    /// 408 before it, 504 after).
    pub fn ended(&self) -> bool {
        self.shared.last_ms.load(Ordering::Relaxed) & ENDED != 0
    }

    /// Notes that the request went through the connection manager's filters.
    pub fn filtered(&self) {
        self.shared.filtered.store(true, Ordering::Relaxed);
    }

    /// Whether the whole request went through the filters (Envoy disarms its
    /// `request_timeout` then).
    pub fn decoded(&self) -> bool {
        self.ended() && self.shared.filtered.load(Ordering::Relaxed)
    }
}

/// A request body whose frames are noted in a [`BodyActivity`].
struct Touched {
    inner: Body,
    activity: BodyActivity,
}

impl HttpBody for Touched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if frame.is_ready() {
            let a = &self.activity;
            let ms = a.since.elapsed().as_millis() as u64;
            let ended = match &frame {
                Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
                _ => true,
            };
            a.shared
                .last_ms
                .store(if ended { ms | ENDED } else { ms }, Ordering::Relaxed);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
