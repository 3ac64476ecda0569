//! A connection with bytes already read from it put back in front, so another server can
//! take it over mid-stream.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `io` whose reads return `prefix` first.
pub(super) struct Prefixed<I> {
    prefix: BytesMut,
    io: I,
}

impl<I> Prefixed<I> {
    /// Wraps `io`; its next reads return `prefix`.
    pub(super) fn new(prefix: BytesMut, io: I) -> Self {
        Prefixed { prefix, io }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Prefixed<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix[..n]);
        self.prefix.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Prefixed<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
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
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reads_the_prefix_then_the_connection() {
        let (a, mut b) = tokio::io::duplex(64);
        b.write_all(b" world").await.unwrap();
        drop(b);
        let mut io = Prefixed::new(BytesMut::from(&b"hello"[..]), a);
        let mut out = String::new();
        io.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }
}
