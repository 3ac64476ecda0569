//! An upgrade's upstream connection, counting its bytes into the request's upstream wire
//! meter as Envoy's HTTP/1 codec counts them: every byte each way (the heads, then the
//! tunnel's bytes), and the request head's header bytes (its lines after the request line,
//! without the blank line that ends it).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::upstream::AttemptTarget;

/// An upstream connection whose bytes count into a request's meter, when it has one.
pub(super) struct MeteredIo<S> {
    io: S,
    target: Option<Arc<AttemptTarget>>,
    /// The request head written so far, until its blank line (then `None`).
    head: Option<Vec<u8>>,
}

impl<S> MeteredIo<S> {
    /// `io`, counted into `target`'s meter.
    pub(super) fn new(io: S, target: Option<Arc<AttemptTarget>>) -> MeteredIo<S> {
        let head = target.is_some().then(Vec::new);
        MeteredIo { io, target, head }
    }

    fn wrote(&mut self, bytes: &[u8]) {
        let Some(target) = &self.target else { return };
        let wire = target.wire();
        wire.wrote(bytes.len());
        let Some(head) = &mut self.head else { return };
        head.extend_from_slice(bytes);
        if let Some(blank) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let request_line = head.iter().position(|b| *b == b'\n').map_or(0, |i| i + 1);
            wire.wrote_headers((blank + 2).saturating_sub(request_line));
            self.head = None;
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for MeteredIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if let Some(t) = &self.target {
            t.wire().read(buf.filled().len() - before);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for MeteredIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        self.wrote(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn counts_every_byte_and_the_request_heads_header_lines() {
        let target = Arc::new(AttemptTarget::default());
        let (near, mut far) = tokio::io::duplex(1024);
        let mut io = MeteredIo::new(near, Some(target.clone()));
        // The head in two writes, the blank line split between them, then tunnel bytes.
        let (first, second) = (
            &b"GET /ws HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n\r"[..],
            &b"\nhello"[..],
        );
        io.write_all(first).await.unwrap();
        io.write_all(second).await.unwrap();
        far.write_all(b"HTTP/1.1 101 Switching Protocols\r\n\r\nhi")
            .await
            .unwrap();
        let mut got = [0u8; 64];
        let n = io.read(&mut got).await.unwrap();
        let wire = target.wire().bytes();
        assert_eq!(wire.sent, (first.len() + second.len()) as u64);
        assert_eq!(
            wire.header_sent,
            b"host: x\r\nupgrade: websocket\r\n".len() as u64
        );
        assert_eq!(wire.received, n as u64);
    }
}
