//! A request body still arriving on the fast path: the connection's reader moves its bytes into
//! the request as they come, so a client that writes the head and the body separately keeps
//! the fast path, and the body streams upstream as it would through Envoy.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::sync::mpsc;

use crate::body::{Body, BoxError};

/// Chunks of body that may wait between the connection's reader and the request's consumer
/// (each at most one read): the client is not read further until the consumer takes them.
const QUEUED_CHUNKS: usize = 2;

/// The reader's side of the request body in flight: how much is still to come and where it
/// goes. The default is a request whose body has all arrived.
#[derive(Debug, Default)]
pub(super) struct Inbound {
    left: u64,
    /// `None` once the consumer dropped the body (the request was answered or failed): what
    /// still comes is read and dropped, so the connection stays in step with the client.
    to: Option<mpsc::Sender<Bytes>>,
}

impl Inbound {
    /// The reader's side and the request body of a `len`-byte body still arriving.
    pub(super) fn arriving(len: u64) -> (Inbound, Body) {
        let (to, from) = mpsc::channel(QUEUED_CHUNKS);
        let body = Arriving { from, left: len };
        (
            Inbound {
                left: len,
                to: Some(to),
            },
            crate::body::boxed(body),
        )
    }

    /// Whether part of the request body has not arrived yet.
    pub(super) fn incomplete(&self) -> bool {
        self.left > 0
    }

    /// Moves the body bytes at the front of `buf` into the request, waiting until the consumer
    /// takes the previous chunks. Cancel-safe: nothing leaves `buf` before it is handed over.
    pub(super) async fn take_from(&mut self, buf: &mut BytesMut) {
        let n = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if n == 0 {
            return;
        }
        let handed = match &self.to {
            Some(to) => match to.reserve().await {
                Ok(permit) => {
                    permit.send(buf.split_to(n).freeze());
                    true
                }
                Err(_) => false,
            },
            None => false,
        };
        if !handed {
            self.to = None;
            buf.advance(n);
        }
        self.left -= n as u64;
        if self.left == 0 {
            self.to = None;
        }
    }
}

/// The request's side: the body's chunks as the reader hands them over; an error if the
/// client goes away before the last one.
struct Arriving {
    from: mpsc::Receiver<Bytes>,
    left: u64,
}

impl http_body::Body for Arriving {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.left == 0 {
            return Poll::Ready(None);
        }
        Poll::Ready(Some(match ready!(this.from.poll_recv(cx)) {
            Some(chunk) => {
                this.left -= chunk.len() as u64;
                Ok(Frame::data(chunk))
            }
            None => Err("the client left before its request body was complete".into()),
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn the_body_is_exactly_its_length_and_the_rest_stays_in_the_buffer() {
        let (mut inbound, body) = Inbound::arriving(8);
        let mut buf = BytesMut::from(&b"abc"[..]);
        inbound.take_from(&mut buf).await;
        assert!(buf.is_empty() && inbound.incomplete());
        buf.extend_from_slice(b"defghGET / HTTP/1.1\r\n");
        inbound.take_from(&mut buf).await;
        assert!(!inbound.incomplete());
        assert_eq!(buf, &b"GET / HTTP/1.1\r\n"[..]);
        inbound.take_from(&mut buf).await;
        assert_eq!(
            buf,
            &b"GET / HTTP/1.1\r\n"[..],
            "bytes past the body are not taken"
        );
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdefgh");
    }

    #[tokio::test]
    async fn a_client_leaving_early_fails_the_body() {
        let (mut inbound, body) = Inbound::arriving(8);
        let mut buf = BytesMut::from(&b"abc"[..]);
        inbound.take_from(&mut buf).await;
        drop(inbound);
        assert!(body.collect().await.is_err());
    }

    #[tokio::test]
    async fn after_the_body_is_dropped_its_bytes_are_still_consumed() {
        let (mut inbound, body) = Inbound::arriving(6);
        drop(body);
        let mut buf = BytesMut::from(&b"abcdefGET"[..]);
        inbound.take_from(&mut buf).await;
        assert!(!inbound.incomplete());
        assert_eq!(buf, &b"GET"[..]);
    }

    #[tokio::test]
    async fn the_consumer_sets_the_pace() {
        let (mut inbound, mut body) = Inbound::arriving(10);
        for chunk in [&b"ab"[..], b"cd"] {
            let mut buf = BytesMut::from(chunk);
            inbound.take_from(&mut buf).await;
        }
        let mut buf = BytesMut::from(&b"ef"[..]);
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            inbound.take_from(&mut buf),
        )
        .await;
        assert!(blocked.is_err(), "a third chunk waits for the consumer");
        assert_eq!(buf, &b"ef"[..], "and stays in the buffer");
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "ab");
        inbound.take_from(&mut buf).await;
        assert!(buf.is_empty());
    }
}
