//! An upstream connection's byte stream: plain TCP, or TLS over it (a cluster's
//! `UpstreamTlsContext`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A connected upstream socket, with TLS when its host's transport socket asks for it.
#[derive(Debug)]
pub enum UpstreamIo {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS (boxed: rustls' state is large, and most connections are plaintext).
    Tls(Box<TlsStream<TcpStream>>),
}

impl UpstreamIo {
    /// The first URI SAN of a TLS upstream's certificate (empty for plaintext or none).
    pub fn peer_uri_san(&self) -> String {
        let UpstreamIo::Tls(tls) = self else {
            return String::new();
        };
        tls.get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| crate::tls::x509::parse(c).ok())
            .and_then(|info| info.uri_sans().next().map(str::to_owned))
            .unwrap_or_default()
    }

    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            UpstreamIo::Plain(s) => s,
            UpstreamIo::Tls(s) => s.get_ref().0,
        }
    }

    /// The ALPN protocol negotiated, if any.
    pub fn alpn(&self) -> Option<&[u8]> {
        match self {
            UpstreamIo::Plain(_) => None,
            UpstreamIo::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamIo::Plain(s) => s.is_write_vectored(),
            UpstreamIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
