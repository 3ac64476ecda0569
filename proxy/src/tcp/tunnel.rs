//! tcp_proxy's `tunneling_config`: the connection's bytes carried inside an HTTP/1.1 CONNECT
//! (or POST) to the upstream, which must answer 2xx before any byte is relayed.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::tcp_proxy::Tunneling;
use crate::route::FormatContext;
use crate::route::format::Direction;

/// The most a tunnel's response head may take.
const MAX_HEAD: usize = 64 * 1024;

/// Why a tunnel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The upstream connection failed while the tunnel was being set up.
    #[error("tunnel request failed: {0}")]
    Io(#[from] std::io::Error),
    /// The upstream closed before answering.
    #[error("upstream closed before answering the tunnel request")]
    Closed,
    /// The upstream answered something that is not an HTTP/1.1 response head.
    #[error("malformed response to the tunnel request")]
    Malformed,
    /// The upstream refused the tunnel.
    #[error("upstream answered the tunnel request with {0}")]
    Refused(u16),
}

/// The facts a tunnel's hostname and headers may name.
pub struct Endpoints {
    /// The downstream peer.
    pub remote: Option<SocketAddr>,
    /// The address the downstream connected to.
    pub local: Option<SocketAddr>,
}

/// Sends the tunnel request on `up` and reads the answer: the bytes the upstream sent after
/// its 2xx head (the tunnel's first bytes towards the downstream).
pub async fn open<U>(up: &mut U, t: &Tunneling, at: &Endpoints) -> Result<Bytes, TunnelError>
where
    U: AsyncRead + AsyncWrite + Unpin,
{
    let fmt = FormatContext {
        downstream_remote: at.remote,
        downstream_direct_remote: at.remote,
        downstream_local: at.local,
        ..Default::default()
    };
    let authority = t
        .hostname
        .render(&HeaderMap::new(), &fmt, Direction::Request);
    let mut headers = HeaderMap::new();
    t.headers.apply_request(&mut headers, &fmt);
    let mut head = if t.use_post {
        format!("POST {} HTTP/1.1\r\nhost: {authority}\r\n", t.post_path)
    } else {
        format!("CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n")
    };
    for (name, value) in &headers {
        head.push_str(name.as_str());
        head.push_str(": ");
        head.push_str(&String::from_utf8_lossy(value.as_bytes()));
        head.push_str("\r\n");
    }
    if t.use_post {
        head.push_str("transfer-encoding: chunked\r\n");
    }
    head.push_str("\r\n");
    up.write_all(head.as_bytes()).await?;
    up.flush().await?;
    read_answer(up).await
}

/// Reads the upstream's response head; `Ok` with what followed it when it is a 2xx.
async fn read_answer<U: AsyncRead + Unpin>(up: &mut U) -> Result<Bytes, TunnelError> {
    let mut buf = Vec::with_capacity(1024);
    loop {
        if up.read_buf(&mut buf).await? == 0 {
            return Err(TunnelError::Closed);
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let code = response.code.ok_or(TunnelError::Malformed)?;
                if !(200..300).contains(&code) {
                    return Err(TunnelError::Refused(code));
                }
                return Ok(Bytes::from(buf.split_off(len)));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {}
            _ => return Err(TunnelError::Malformed),
        }
    }
}

/// The upstream side of a POST tunnel: what is written goes out as HTTP/1.1 chunks, and a
/// shutdown ends the body (`0\r\n\r\n`) before the write side closes.
pub struct Chunked<W> {
    inner: W,
    framed: Vec<u8>,
    written: usize,
    accepted: usize,
    ended: bool,
}

impl<W> Chunked<W> {
    /// Frames what is written to `inner`.
    pub fn new(inner: W) -> Self {
        Chunked {
            inner,
            framed: Vec::new(),
            written: 0,
            accepted: 0,
            ended: false,
        }
    }
}

impl<W: AsyncWrite + Unpin> Chunked<W> {
    /// Writes out what is framed and not yet written.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.written < self.framed.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.framed[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.framed.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Chunked<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        // A write that returned Pending is polled again with the same bytes: they are framed
        // once.
        if this.framed.is_empty() {
            if buf.is_empty() {
                return Poll::Ready(Ok(0));
            }
            this.framed
                .extend_from_slice(format!("{:x}\r\n", buf.len()).as_bytes());
            this.framed.extend_from_slice(buf);
            this.framed.extend_from_slice(b"\r\n");
            this.accepted = buf.len();
        }
        ready!(this.drain(cx))?;
        Poll::Ready(Ok(this.accepted))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.ended {
            ready!(this.drain(cx))?;
            this.framed.extend_from_slice(b"0\r\n\r\n");
            this.ended = true;
        }
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}
