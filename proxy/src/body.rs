//! The one HTTP body type that flows between downstream and upstream connections.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, combinators::UnsyncBoxBody};

/// Any error a body can fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed HTTP body: requests sent upstream and responses sent downstream.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A body holding `data`.
pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Boxes any body whose error converts into [`BoxError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// `body` without its trailers (its data unchanged): for an HTTP/1 client, to which Envoy's
/// codec never writes trailers unless `enable_trailers` is set.
pub fn without_trailers(body: Body) -> Body {
    body.map_frame(|frame| {
        if frame.is_trailers() {
            http_body::Frame::data(Bytes::new())
        } else {
            frame
        }
    })
    .boxed_unsync()
}
