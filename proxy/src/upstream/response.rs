//! The body of an upstream response, whichever protocol carried it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;

use super::h1;
use super::h2_wire::H2Meter;
use super::stats::ClusterStats;
use crate::body::BoxError;

/// An upstream response body: read by revoy's HTTP/1.1 client or streamed by an HTTP/2
/// connection.
pub struct UpstreamBody(Inner);

/// The HTTP/1.1 body is boxed: responses are held across awaits in every request's future,
/// and inline it would make that future (moved on every HTTP/2 stream spawn) larger.
enum Inner {
    Http1(Box<h1::ResponseBody>),
    Http2(Incoming, Option<Box<Timing>>, Option<Box<H2Meter>>),
}

/// What an HTTP/2 body records when it ends: its cluster's `upstream_rq_time` since `since`.
struct Timing {
    stats: Arc<ClusterStats>,
    since: Instant,
    internal: bool,
}

impl Timing {
    fn record(&self) {
        let ms = self.since.elapsed().as_millis() as u64;
        self.stats.record_rq_time(ms, self.internal);
    }
}

impl UpstreamBody {
    pub(crate) fn http1(body: h1::ResponseBody) -> Self {
        UpstreamBody(Inner::Http1(Box::new(body)))
    }

    /// An HTTP/2 response's body, its frames counted in `meter`.
    pub(super) fn http2(body: Incoming, meter: Option<H2Meter>) -> Self {
        UpstreamBody(Inner::Http2(body, None, meter.map(Box::new)))
    }

    /// Records the cluster's `upstream_rq_time` (from `since`; under `internal.` or
    /// `external.` too) when the body has been read to its end, or now if it has: Envoy's
    /// router records it when the upstream response completes. A body cut short records
    /// nothing.
    pub fn time(&mut self, stats: &Arc<ClusterStats>, since: Instant, internal: bool) {
        match &mut self.0 {
            Inner::Http1(b) => b.time(stats, since, internal),
            Inner::Http2(b, timing, _) => {
                let t = Timing {
                    stats: stats.clone(),
                    since,
                    internal,
                };
                if http_body::Body::is_end_stream(&*b) {
                    t.record();
                } else {
                    *timing = Some(Box::new(t));
                }
            }
        }
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Inner::Http1(_) => "UpstreamBody(http1)",
            Inner::Http2(..) => "UpstreamBody(http2)",
        })
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().0 {
            Inner::Http1(b) => Pin::new(&mut **b).poll_frame(cx).map_err(Into::into),
            Inner::Http2(b, timing, meter) => {
                let polled = Pin::new(&mut *b).poll_frame(cx);
                if let (Poll::Ready(Some(Ok(frame))), Some(m)) = (&polled, meter) {
                    m.received(frame);
                }
                let ended = match &polled {
                    Poll::Ready(None) => true,
                    Poll::Ready(Some(Ok(frame))) => frame.is_trailers() || b.is_end_stream(),
                    _ => false,
                };
                if ended && let Some(t) = timing.take() {
                    t.record();
                }
                polled.map_err(Into::into)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Http1(b) => b.is_end_stream(),
            Inner::Http2(b, ..) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Http1(b) => b.size_hint(),
            Inner::Http2(b, ..) => b.size_hint(),
        }
    }
}
