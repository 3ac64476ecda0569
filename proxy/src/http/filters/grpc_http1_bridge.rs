//! `envoy.filters.http.grpc_http1_bridge`: gRPC over HTTP/1.1 for clients that cannot read
//! trailers. The response to such a request is read whole; its `grpc-status` and
//! `grpc-message` trailers become headers (a `grpc-status` other than `0` makes it a 503), with
//! the body's `content-length`.

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body as _, Frame};

use super::{Encoder, Encoders, FilterRequest};
use crate::body::{Body, BoxError};
use crate::http::local_reply::is_grpc;

/// Marks a gRPC request over HTTP/1 for its response to be bridged.
pub(super) fn decode(req: &FilterRequest<'_>, encoders: &mut Encoders) {
    if req.version < http::Version::HTTP_2 && is_grpc(req.headers) {
        encoders.0.push(Encoder::GrpcHttp1Bridge);
    }
}

/// Reads the response whole and moves its gRPC trailers into its headers.
pub(super) async fn encode(resp: &mut Response<Body>) {
    if resp.body().is_end_stream() {
        return;
    }
    let mut body = std::mem::replace(resp.body_mut(), crate::body::empty());
    let mut data = BytesMut::new();
    let mut trailers = None;
    let mut failure: Option<BoxError> = None;
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        match frame.map(Frame::into_data) {
            Ok(Ok(d)) => data.extend_from_slice(&d),
            Ok(Err(frame)) => trailers = frame.into_trailers().ok(),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let data = data.freeze();
    let Some(trailers) = trailers else {
        // No trailers: the response goes on as it came (its framing unchanged).
        *resp.body_mut() = unsized_body(data, failure);
        return;
    };
    if let Some(status) = trailers.get("grpc-status") {
        if status.to_str().ok().and_then(|s| s.parse::<u64>().ok()) != Some(0) {
            *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        }
        resp.headers_mut().insert("grpc-status", status.clone());
    }
    if let Some(message) = trailers.get("grpc-message") {
        resp.headers_mut().insert("grpc-message", message.clone());
    }
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(data.len()));
    *resp.body_mut() = unsized_body(data, failure);
}

/// `data` (then `failure`, if the body broke) as a body that announces neither its length nor
/// its end until read: an empty response without trailers goes on as Envoy's does, its head
/// sent before its end (chunked over HTTP/1.1), not as an empty body's `content-length: 0`.
fn unsized_body(data: Bytes, failure: Option<BoxError>) -> Body {
    crate::body::boxed(Read {
        data: (!data.is_empty()).then_some(data),
        failure,
        ended: false,
    })
}

/// See [`unsized_body`].
struct Read {
    data: Option<Bytes>,
    failure: Option<BoxError>,
    /// Read to its end.
    ended: bool,
}

impl http_body::Body for Read {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let next = match this.data.take() {
            Some(d) => Some(Ok(Frame::data(d))),
            None => this.failure.take().map(Err),
        };
        this.ended = next.is_none();
        std::task::Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}
