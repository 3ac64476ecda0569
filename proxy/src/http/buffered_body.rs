//! Request bodies kept in memory so retries and mirrors can send them again, up to the
//! route's buffer limit (Envoy's `per_request_buffer_limit_bytes`, else the connection's 1 MiB).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame};

use crate::body::{Body, BoxError};

/// Envoy's default buffer limit (the listener's `per_connection_buffer_limit_bytes`).
pub const DEFAULT_LIMIT: usize = 1024 * 1024;

/// A complete request body that can be replayed any number of times (cheap clones of `Bytes`).
#[derive(Debug, Clone, Default)]
pub struct Replay {
    data: Vec<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Replay {
    /// The body's length in bytes.
    pub fn len(&self) -> usize {
        self.data.iter().map(Bytes::len).sum()
    }

    /// A fresh body with the same frames.
    pub fn body(&self) -> Body {
        if self.data.is_empty() && self.trailers.is_none() {
            return crate::body::empty();
        }
        crate::body::boxed(Frames {
            data: self.data.iter().cloned().collect(),
            trailers: self.trailers.clone(),
            rest: None,
        })
    }
}

/// The result of buffering a request body.
pub enum Buffered {
    /// The whole body fit: it can be replayed.
    Complete(Replay),
    /// The body is larger than the limit: what was read, then the rest, streamed once.
    TooLarge(Body),
}

/// Reads `body` into memory up to `limit` bytes. Fails when the downstream body fails.
pub async fn buffer<B>(mut body: B, limit: usize) -> Result<Buffered, BoxError>
where
    B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let mut replay = Replay::default();
    if body.is_end_stream() {
        return Ok(Buffered::Complete(replay));
    }
    let mut size = 0usize;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(Into::into)?;
        match frame.into_data() {
            Ok(data) => {
                size += data.len();
                replay.data.push(data);
                if size > limit {
                    return Ok(Buffered::TooLarge(crate::body::boxed(Frames {
                        data: replay.data.into(),
                        trailers: None,
                        rest: Some(crate::body::boxed(body)),
                    })));
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    replay.trailers = Some(t);
                }
            }
        }
    }
    Ok(Buffered::Complete(replay))
}

/// A body of `data`, then `trailers`, then `rest`: a body whose first frames were read
/// already, put back together.
pub fn replay_then(data: Vec<Bytes>, trailers: Option<HeaderMap>, rest: Option<Body>) -> Body {
    crate::body::boxed(Frames {
        data: data.into(),
        trailers,
        rest,
    })
}

/// Data frames, then trailers, then (optionally) the rest of a streaming body.
struct Frames {
    data: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    rest: Option<Body>,
}

impl HttpBody for Frames {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(d) = self.data.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        if let Some(t) = self.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};

    async fn collect(body: Body) -> (Bytes, Option<HeaderMap>) {
        let c = body.collect().await.unwrap();
        let trailers = c.trailers().cloned();
        (c.to_bytes(), trailers)
    }

    fn chunks(
        parts: &[&'static str],
        trailers: bool,
    ) -> impl HttpBody<Data = Bytes, Error = BoxError> + Unpin + Send {
        let mut frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        if trailers {
            let mut t = HeaderMap::new();
            t.insert("grpc-status", "0".parse().unwrap());
            frames.push(Ok(Frame::trailers(t)));
        }
        StreamBody::new(tokio_stream::iter(frames))
    }

    #[tokio::test]
    async fn small_body_replays_with_trailers() {
        let Buffered::Complete(r) = buffer(chunks(&["ab", "cd"], true), 10).await.unwrap() else {
            panic!("should fit");
        };
        for _ in 0..2 {
            let (data, trailers) = collect(r.body()).await;
            assert_eq!(data, "abcd");
            assert_eq!(trailers.unwrap()["grpc-status"], "0");
        }
    }

    #[tokio::test]
    async fn large_body_streams_once_in_full() {
        let Buffered::TooLarge(b) = buffer(chunks(&["abc", "def", "gh"], false), 4)
            .await
            .unwrap()
        else {
            panic!("should not fit");
        };
        assert_eq!(collect(b).await.0, "abcdefgh");
    }

    #[tokio::test]
    async fn empty_body_is_complete() {
        let Buffered::Complete(r) = buffer(Full::new(Bytes::new()), 0).await.unwrap() else {
            panic!("empty fits");
        };
        assert!(r.body().is_end_stream());
    }
}
