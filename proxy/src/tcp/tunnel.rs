//! tcp_proxy's `tunneling_config`: the connection's bytes carried inside an HTTP CONNECT (or
//! POST) to the upstream, which must answer 2xx before any byte is relayed: over HTTP/1.1
//! ([`open`], [`Chunked`]), or as the one stream of an HTTP/2 connection of its own
//! ([`open_h2`], [`H2Stream`]), as the cluster speaks.

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::tcp_proxy::Tunneling;
use crate::route::FormatContext;
use crate::route::format::Direction;
use crate::upstream::UpstreamConnection;

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
    /// The HTTP/2 connection or stream failed.
    #[error("HTTP/2 tunnel failed: {0}")]
    H2(#[from] h2::Error),
    /// The tunnel's request could not be built (an invalid authority or header).
    #[error("invalid tunnel request: {0}")]
    Request(#[from] http::Error),
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
    let (authority, headers) = request_parts(t, at);
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

/// The tunnel request's authority and the headers it adds.
fn request_parts(t: &Tunneling, at: &Endpoints) -> (String, HeaderMap) {
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
    (authority, headers)
}

/// Opens the tunnel as the one stream of a new HTTP/2 connection over `upstream` (driven by
/// a task of its own, which holds the connection until it closes).
pub async fn open_h2(
    upstream: UpstreamConnection,
    t: &Tunneling,
    at: &Endpoints,
) -> Result<H2Stream, TunnelError> {
    let UpstreamConnection { stream, active, .. } = upstream;
    let (mut sender, connection) = h2::client::handshake(stream).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "tcp_proxy: HTTP/2 tunnel connection ended");
        }
        drop(active);
    });
    let (authority, headers) = request_parts(t, at);
    let builder = if t.use_post {
        http::Request::post(format!("http://{authority}{}", t.post_path))
    } else {
        http::Request::connect(authority)
    };
    let mut request = builder.body(())?;
    request.headers_mut().extend(headers);
    let (response, send) = sender.send_request(request, false)?;
    let response = response.await?;
    let status = response.status().as_u16();
    if !(200..300).contains(&status) {
        return Err(TunnelError::Refused(status));
    }
    Ok(H2Stream {
        send,
        recv: response.into_body(),
        unread: Bytes::new(),
    })
}

/// An HTTP/2 tunnel stream as a byte stream: reads are the response's DATA, writes the
/// request's, a shutdown ends the request stream.
pub struct H2Stream {
    send: h2::SendStream<Bytes>,
    recv: h2::RecvStream,
    unread: Bytes,
}

fn io_error(e: h2::Error) -> std::io::Error {
    std::io::Error::other(e)
}

impl AsyncRead for H2Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        while this.unread.is_empty() {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    this.unread = data;
                }
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = this.unread.len().min(buf.remaining());
        buf.put_slice(&this.unread.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        this.send.reserve_capacity(buf.len());
        match ready!(this.send.poll_capacity(cx)) {
            Some(Ok(n)) => {
                let n = n.min(buf.len());
                this.send
                    .send_data(Bytes::copy_from_slice(&buf[..n]), false)
                    .map_err(io_error)?;
                Poll::Ready(Ok(n))
            }
            Some(Err(e)) => Poll::Ready(Err(io_error(e))),
            None => Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        Poll::Ready(this.send.send_data(Bytes::new(), true).map_err(io_error))
    }
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
