//! The body of an upstream response, whichever protocol carried it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;

use super::h1;
use crate::body::BoxError;

/// An upstream response body: read by revoy's HTTP/1.1 client or streamed by an HTTP/2
/// connection.
pub struct UpstreamBody(Inner);

/// The HTTP/1.1 body is boxed: responses are held across awaits in every request's future,
/// and inline it would make that future (moved on every HTTP/2 stream spawn) larger.
enum Inner {
    Http1(Box<h1::ResponseBody>),
    Http2(Incoming),
}

impl UpstreamBody {
    pub(crate) fn http1(body: h1::ResponseBody) -> Self {
        UpstreamBody(Inner::Http1(Box::new(body)))
    }

    pub(crate) fn http2(body: Incoming) -> Self {
        UpstreamBody(Inner::Http2(body))
    }
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Inner::Http1(_) => "UpstreamBody(http1)",
            Inner::Http2(_) => "UpstreamBody(http2)",
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
            Inner::Http2(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Inner::Http1(b) => b.is_end_stream(),
            Inner::Http2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Inner::Http1(b) => b.size_hint(),
            Inner::Http2(b) => b.size_hint(),
        }
    }
}
