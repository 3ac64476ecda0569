//! Istio's in-band TCP metadata exchange at run time: after this side's frame is written
//! ([`send_frame`]), [`PeerFrame`] reads the stream, taking the peer's frame off its first
//! bytes (the workload it names kept for telemetry) and passing everything after it on. When
//! the first bytes are not a frame (no magic, or the stream ends first), they pass on as
//! they came, as Istio's filter lets them through.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::config::istio::metadata_exchange::TcpExchange;
use crate::config::istio::stats::IstioStatsConfig;
use crate::config::istio::workload::{EXCHANGE_MAGIC, LocalWorkload, Workload, exchange_frame};
use crate::stats::Store;

/// Istio's network filters on a proxied connection: the exchange and `istio.stats`.
#[derive(Debug, Clone)]
pub struct IstioFilters<'a> {
    /// This proxy's workload, sent in its frames.
    pub local: &'a LocalWorkload,
    /// The downstream chain's `istio.metadata_exchange` filter, if it has one.
    pub downstream: Option<&'a TcpExchange>,
    /// The chain's `istio.stats` filter, if it has one.
    pub stats: Option<&'a IstioStatsConfig>,
    /// Where its metrics go.
    pub store: &'a Store,
    /// Whether the listener is inbound (the destination reports).
    pub inbound: bool,
    /// The downstream's certificate's first URI SAN and this side's (TLS chains; empty
    /// when unknown).
    pub sans: (String, String),
}

/// A frame's payload larger than this is not taken for one.
const MAX_PAYLOAD: usize = 1 << 20;

/// Writes this side's exchange frame.
pub async fn send_frame<S: AsyncWrite + Unpin>(
    stream: &mut S,
    local: &LocalWorkload,
) -> io::Result<()> {
    stream.write_all(&exchange_frame(local)).await?;
    stream.flush().await
}

/// A stream whose peer's exchange frame is read off its first bytes.
#[derive(Debug)]
pub struct PeerFrame<S> {
    inner: S,
    /// Bytes read while looking for the frame; once decided, what is left of them to pass on.
    buf: Vec<u8>,
    /// Whether the frame was taken off (or found missing): reads pass on `buf`, then go
    /// straight to the stream.
    decided: bool,
    /// The peer's workload, once read.
    peer: Arc<OnceLock<Workload>>,
}

impl<S> PeerFrame<S> {
    /// Wraps `inner`; the peer's workload lands in `peer`.
    pub fn new(inner: S, peer: Arc<OnceLock<Workload>>) -> Self {
        PeerFrame {
            inner,
            buf: Vec::new(),
            decided: false,
            peer,
        }
    }

    /// Decides on what `buf` holds: `true` once the frame was taken off or ruled out.
    fn decide(&mut self, eof: bool) -> bool {
        if self.buf.len() >= 4 && self.buf[..4] != EXCHANGE_MAGIC.to_be_bytes() {
            return true;
        }
        if self.buf.len() >= 8 {
            let len = u32::from_be_bytes(self.buf[4..8].try_into().expect("4 bytes")) as usize;
            if len > MAX_PAYLOAD {
                return true;
            }
            if self.buf.len() >= 8 + len {
                if let Some(found) =
                    crate::config::istio::workload::exchanged_workload(&self.buf[8..8 + len])
                {
                    if let Some(w) = found {
                        let _ = self.peer.set(w);
                    }
                    self.buf.drain(..8 + len);
                }
                return true;
            }
        }
        eof
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PeerFrame<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while !this.decided {
            let mut chunk = [0u8; 4096];
            let mut rb = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut rb))?;
            let eof = rb.filled().is_empty();
            this.buf.extend_from_slice(rb.filled());
            this.decided = this.decide(eof);
        }
        if !this.buf.is_empty() {
            let n = this.buf.len().min(out.remaining());
            out.put_slice(&this.buf[..n]);
            this.buf.drain(..n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, out)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PeerFrame<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn local() -> LocalWorkload {
        LocalWorkload {
            id: "client".into(),
            id_header: None,
            workload: Workload {
                workload: "productpage-v1".into(),
                ..Default::default()
            },
            header: http::HeaderValue::from_static(""),
        }
    }

    #[tokio::test]
    async fn the_peers_frame_is_taken_off_and_the_rest_passes() {
        let mut bytes = exchange_frame(&local());
        bytes.extend_from_slice(b"hello");
        let peer = Arc::default();
        let mut s = PeerFrame::new(bytes.as_slice(), Arc::clone(&peer));
        let mut rest = String::new();
        s.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "hello");
        assert_eq!(peer.get().unwrap().workload, "productpage-v1");
    }

    #[tokio::test]
    async fn bytes_that_are_no_frame_pass_unchanged() {
        for input in [&b"GET / HTTP/1.1\r\n\r\n"[..], b"ab", b""] {
            let peer = Arc::default();
            let mut s = PeerFrame::new(input, Arc::clone(&peer));
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).await.unwrap();
            assert_eq!(rest, input);
            assert!(peer.get().is_none());
        }
    }
}
