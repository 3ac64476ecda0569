//! A gRPC response body as gRPC-Web: the trailers become a last frame (flag `0x80`, length,
//! `name:value\r\n` per trailer), and a `-text` response is base64-encoded one gRPC frame at a
//! time (a partial frame waits for the rest).

use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::HeaderMap;
use http_body::Frame;

use crate::body::{Body, BoxError};

/// The gRPC frame header: a flag byte and a 32-bit big-endian length.
const FRAME_HEADER: usize = 5;
/// The flag of gRPC-Web's trailers frame.
const TRAILERS_FLAG: u8 = 0x80;

/// `inner` as gRPC-Web (`text`: base64, frame by frame).
pub(super) fn grpc_web(inner: Body, text: bool) -> Body {
    crate::body::boxed(Framing {
        inner,
        text,
        pending: BytesMut::new(),
        ended: false,
    })
}

/// See [`grpc_web`].
struct Framing {
    inner: Body,
    text: bool,
    /// In text mode, the start of a gRPC frame not yet whole.
    pending: BytesMut,
    ended: bool,
}

impl Framing {
    /// The whole frames of `pending`, each base64-encoded; `None` when there is none.
    fn encode_frames(&mut self) -> Option<Bytes> {
        let mut out = String::new();
        while self.pending.len() >= FRAME_HEADER {
            let len = u32::from_be_bytes(self.pending[1..FRAME_HEADER].try_into().ok()?) as usize;
            if self.pending.len() < FRAME_HEADER + len {
                break;
            }
            let frame = self.pending.split_to(FRAME_HEADER + len);
            STANDARD.encode_string(&frame, &mut out);
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }

    /// The trailers frame for `trailers`.
    fn trailers_frame(&self, trailers: &HeaderMap) -> Bytes {
        let mut fields = BytesMut::new();
        for (name, value) in trailers {
            fields.put_slice(name.as_str().as_bytes());
            fields.put_u8(b':');
            fields.put_slice(value.as_bytes());
            fields.put_slice(b"\r\n");
        }
        let mut frame = BytesMut::with_capacity(FRAME_HEADER + fields.len());
        frame.put_u8(TRAILERS_FLAG);
        frame.put_u32(fields.len() as u32);
        frame.put(fields);
        if self.text {
            Bytes::from(STANDARD.encode(&frame))
        } else {
            frame.freeze()
        }
    }
}

impl http_body::Body for Framing {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(None) => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
                other => return other,
            };
            match frame.into_data() {
                Ok(data) if !this.text => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(mut data) => {
                    this.pending.put(data.copy_to_bytes(data.remaining()));
                    if let Some(encoded) = this.encode_frames() {
                        return Poll::Ready(Some(Ok(Frame::data(encoded))));
                    }
                }
                Err(frame) => {
                    this.ended = true;
                    let Ok(trailers) = frame.into_trailers() else {
                        continue;
                    };
                    let last = this.trailers_frame(&trailers);
                    return Poll::Ready(Some(Ok(Frame::data(last))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn body(frames: Vec<Frame<Bytes>>) -> Body {
        crate::body::boxed(http_body_util::StreamBody::new(tokio_stream::iter(
            frames.into_iter().map(Ok::<_, BoxError>),
        )))
    }

    fn trailers() -> Frame<Bytes> {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.insert("grpc-message", "ok".parse().unwrap());
        Frame::trailers(trailers)
    }

    #[tokio::test]
    async fn trailers_become_the_last_frame() {
        let frames = vec![
            Frame::data(Bytes::from_static(b"\0\0\0\0\x01a")),
            trailers(),
        ];
        let out = grpc_web(body(frames), false).collect().await.unwrap();
        assert!(out.trailers().is_none());
        assert_eq!(
            out.to_bytes(),
            &b"\0\0\0\0\x01a\x80\0\0\0\x20grpc-status:0\r\ngrpc-message:ok\r\n"[..]
        );
    }

    #[tokio::test]
    async fn text_responses_are_encoded_frame_by_frame() {
        let split = vec![
            Frame::data(Bytes::from_static(b"\0\0\0")),
            Frame::data(Bytes::from_static(b"\0\x01a\0\0\0\0\x02bc")),
            trailers(),
        ];
        let text = grpc_web(body(split), true).collect().await.unwrap();
        let expected = [
            &b"\0\0\0\0\x01a"[..],
            b"\0\0\0\0\x02bc",
            b"\x80\0\0\0\x20grpc-status:0\r\ngrpc-message:ok\r\n",
        ]
        .map(|f| STANDARD.encode(f))
        .concat();
        assert_eq!(text.to_bytes(), expected.as_bytes());
    }
}
