//! A `application/grpc-web-text` request body, base64-decoded as it streams: each complete
//! group of four characters is decoded as it arrives, the rest waits for more.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame};

use crate::body::{Body, BoxError};

/// Why a text request body was refused (Envoy's response code details).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum BadBase64 {
    /// The body ended with a partial group of four characters.
    #[error("grpc_base_64_decode_failed_bad_size")]
    Size,
    /// The characters are not base64.
    #[error("grpc_base_64_decode_failed")]
    Data,
}

/// The decoding state: the characters of a group not yet complete.
#[derive(Debug, Default)]
struct Decoder {
    carry: BytesMut,
}

impl Decoder {
    /// Decodes what `data` completes; the characters left over wait for the next call.
    fn push(&mut self, data: &[u8]) -> Result<Bytes, BadBase64> {
        self.carry.extend_from_slice(data);
        let whole = self.carry.len() / 4 * 4;
        if whole == 0 {
            return Ok(Bytes::new());
        }
        let group = self.carry.split_to(whole);
        STANDARD
            .decode(&group)
            .map(Bytes::from)
            .map_err(|_| BadBase64::Data)
    }

    /// Checks that the body ended on a whole group.
    fn finish(&self) -> Result<(), BadBase64> {
        if self.carry.is_empty() {
            Ok(())
        } else {
            Err(BadBase64::Size)
        }
    }
}

/// One frame of a body, or its end.
type Item = Option<Result<Frame<Bytes>, BoxError>>;

/// `inner` decoded as it arrives; when it turns out not to be base64 it fails, and `failed`
/// tells the response why.
pub(super) fn decoding(inner: Body, failed: Arc<OnceLock<BadBase64>>) -> Body {
    let ended = inner.is_end_stream();
    crate::body::boxed(Decoding {
        inner,
        decoder: Decoder::default(),
        ended,
        failed,
    })
}

/// See [`decoding`].
struct Decoding {
    inner: Body,
    decoder: Decoder,
    ended: bool,
    failed: Arc<OnceLock<BadBase64>>,
}

impl Decoding {
    /// What the body yields for `item` from the inner body; `None`: nothing yet.
    fn step(&mut self, item: Item) -> Option<Item> {
        let checked = |this: &mut Self, out: Item| match this.decoder.finish() {
            Ok(()) => {
                this.ended = true;
                Some(out)
            }
            Err(bad) => Some(this.fail(bad)),
        };
        match item {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => match self.decoder.push(&data) {
                    Ok(decoded) if decoded.is_empty() => None,
                    Ok(decoded) => Some(Some(Ok(Frame::data(decoded)))),
                    Err(bad) => Some(self.fail(bad)),
                },
                Err(trailers) => checked(self, Some(Ok(trailers))),
            },
            Some(Err(e)) => Some(Some(Err(e))),
            None => checked(self, None),
        }
    }

    /// Fails the body with `bad`.
    fn fail(&mut self, bad: BadBase64) -> Item {
        self.ended = true;
        let _ = self.failed.set(bad);
        Some(Err(Box::new(bad)))
    }
}

impl http_body::Body for Decoding {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Item> {
        let this = self.get_mut();
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            let item = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
            if let Some(out) = this.step(item) {
                return Poll::Ready(out);
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

    #[test]
    fn groups_are_decoded_as_they_complete() {
        let mut d = Decoder::default();
        assert_eq!(d.push(b"aGVs").unwrap(), "hel");
        assert_eq!(d.push(b"bG").unwrap(), "");
        assert_eq!(d.finish(), Err(BadBase64::Size));
        assert_eq!(d.push(b"8=").unwrap(), "lo");
        assert_eq!(d.finish(), Ok(()));
        assert_eq!(d.push(b"a*cd"), Err(BadBase64::Data));
    }
}
