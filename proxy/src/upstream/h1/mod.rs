//! revoy's HTTP/1.1 client for upstream connections. A pooled connection is only its socket:
//! no task, channel or buffer while idle. An exchange writes the request and reads the response
//! head on the caller's task; the response body reads the rest and puts the connection back in
//! its host's pool the moment the response ends, when both sides allow reuse.

mod body;
mod decode;
mod encode;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::buf::Chain;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::access_log::AttemptTarget;
use crate::access_log::record::UpstreamWire;
use crate::body::{Body, BoxError};
use crate::wire::with_room;

use super::error::{ResetReason, UpstreamError};
use super::host::Host;
use super::io::UpstreamIo;
use super::pool::{self, ActiveConnection};

use body::Reader;
pub use body::{BodyError, ResponseBody};
use decode::{DecodeError, Head};
use encode::BodyFraming;

/// Request bodies whose first frame is at most this large go out in the same write as the head.
const COALESCE_LIMIT: usize = 16 * 1024;

/// An open HTTP/1.1 connection to one host.
pub(crate) struct Connection {
    io: UpstreamIo,
    active: ActiveConnection,
    /// When it last went back to the pool.
    pub(crate) since: Instant,
    /// The thread that opened it ([`pool::this_thread`]), whose runtime serves its socket.
    pub(crate) thread: u64,
}

impl Connection {
    /// The socket's local address.
    pub(crate) fn local(&self) -> Option<SocketAddr> {
        self.active.local()
    }

    /// The address the connection reached.
    pub(crate) fn remote(&self) -> SocketAddr {
        self.active.remote()
    }

    /// Over TLS, the two certificates' identities.
    pub(crate) fn sans(&self) -> Option<&std::sync::Arc<crate::access_log::UpstreamSans>> {
        self.active.sans()
    }

    /// A connection over a freshly connected socket.
    pub(crate) fn new(io: UpstreamIo, active: ActiveConnection) -> Self {
        Connection {
            io,
            active,
            since: Instant::now(),
            thread: pool::this_thread(),
        }
    }

    /// How many requests it has carried.
    pub(crate) fn requests(&self) -> u32 {
        self.active.requests()
    }

    /// Whether the idle connection is unusable: the upstream closed it, reset it or sent bytes
    /// nobody asked for. No system call unless the socket turned readable.
    pub(crate) fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(&mut self.io)
            .poll_read(&mut cx, &mut buf)
            .is_ready()
    }
}

/// Where a connection goes when its response ended and it can carry another request.
pub(crate) struct Release {
    /// The host whose pool takes it back.
    pub host: Arc<Host>,
    /// The cluster's `max_requests_per_connection`.
    pub max_requests: Option<u32>,
}

impl Release {
    fn put(self, conn: Connection) {
        pool::release_h1(&self.host, conn, self.max_requests);
    }
}

/// A failed exchange. `unsent` gives the request back when a reused connection turned out to
/// be closed before any of it was delivered: the caller sends it on another connection.
pub(crate) struct Failed {
    pub error: UpstreamError,
    pub unsent: Option<Request<Body>>,
}

impl From<UpstreamError> for Failed {
    fn from(error: UpstreamError) -> Self {
        Failed {
            error,
            unsent: None,
        }
    }
}

/// Sends `req` (origin-form, with its Host header) on `conn` and returns the response head;
/// the body streams from the connection. `reused` says the connection carried requests before;
/// `trailers` keeps the response's trailers (else its body ends without them); `meter`, when
/// access logs read them, counts the request's bytes on the connection.
pub(crate) async fn exchange(
    mut conn: Connection,
    req: Request<Body>,
    reused: bool,
    release: Release,
    trailers: bool,
    meter: Option<Arc<AttemptTarget>>,
) -> Result<Response<ResponseBody>, Failed> {
    let addr = release.host.addr;
    let (mut parts, mut body) = req.into_parts();
    let head_request = parts.method == Method::HEAD;
    let framing = encode::framing(&mut parts.headers, body.is_end_stream(), &body.size_hint());
    let mut out = Vec::with_capacity(256);
    encode::head(&parts, &mut out);
    let head_len = out.len();
    conn.active.count_request();
    let mut buf = BytesMut::new();
    if framing == BodyFraming::None {
        if let Err(e) = conn.io.write_all(&out).await {
            return Err(Failed {
                error: terminated(addr, &e),
                unsent: reused.then(|| Request::from_parts(parts, body)),
            });
        }
        wrote_head(meter.as_deref(), &out, head_len);
    } else {
        let mut sender = BodySender::new(framing, trailers, meter.clone());
        if let Some(frame) = poll_now(body.frame()) {
            sender.queue(frame).map_err(request_body)?;
        }
        if let Some(framed) = sender.pending.take_if(|f| f.remaining() <= COALESCE_LIMIT) {
            out.put(framed);
        }
        conn.io
            .write_all(&out)
            .await
            .map_err(|e| terminated(addr, &e))?;
        wrote_head(meter.as_deref(), &out, head_len);
        // Boxed: most requests have no body, and inline this state would enlarge every
        // request's future (which tokio and hyper move around).
        let streamed = Box::pin(send_body(
            &mut conn.io,
            &mut body,
            &mut sender,
            &mut buf,
            addr,
        ));
        if let Some(head) = streamed.await? {
            let (read, write) = tokio::io::split(conn.io);
            tokio::spawn(sender.rest(write, body));
            let reader = Reader::Half {
                read,
                active: conn.active,
            };
            let body = Delimit {
                head_request,
                trailers,
            };
            return Ok(respond(reader, buf, head, body, None, addr, meter)?);
        }
    }
    let head = read_head(&mut conn.io, &mut buf, addr, wire(meter.as_deref())).await?;
    let body = Delimit {
        head_request,
        trailers,
    };
    Ok(respond(
        Reader::Pooled(conn),
        buf,
        head,
        body,
        Some(release),
        addr,
        meter,
    )?)
}

/// The meter's counts of the request's bytes, when it has one.
fn wire(meter: Option<&AttemptTarget>) -> Option<&UpstreamWire> {
    meter.map(AttemptTarget::wire)
}

/// Counts the written `out`: a request head of `head_len` bytes (its request line and blank
/// line are not header bytes), then the start of its body.
fn wrote_head(meter: Option<&AttemptTarget>, out: &[u8], head_len: usize) {
    let Some(wire) = wire(meter) else { return };
    let request_line = out
        .iter()
        .position(|b| *b == b'\n')
        .map_or(head_len, |i| i + 1);
    wire.wrote_head(head_len, head_len.saturating_sub(request_line + 2));
    wire.wrote(out.len() - head_len);
}

/// Streams the request body until it ends, reading meanwhile: returns the response head
/// when it arrives before the body ended (the upstream answered early, perhaps without
/// reading the body, so a blocked write must not keep the response from being read).
async fn send_body(
    io: &mut UpstreamIo,
    body: &mut Body,
    sender: &mut BodySender,
    buf: &mut BytesMut,
    addr: SocketAddr,
) -> Result<Option<Head>, UpstreamError> {
    let (mut rd, mut wr) = tokio::io::split(io);
    while !sender.finished() {
        tokio::select! {
            written = write_some(&mut wr, &mut sender.pending), if sender.pending.is_some() => {
                sender.wrote(written).map_err(|e| terminated(addr, &e))?;
            }
            frame = body.frame(), if sender.pending.is_none() => {
                sender.queue(frame).map_err(request_body)?;
            }
            read = rd.read_buf(with_room(buf)) => {
                let n = read.map_err(|e| terminated(addr, &e))?;
                if n == 0 {
                    return Err(closed_before_head(addr));
                }
                let wire = wire(sender.meter.as_deref());
                if let Some(w) = wire {
                    w.read(n);
                }
                if let Some(head) = final_head(buf, wire).map_err(|e| protocol(addr, &e))? {
                    return Ok(Some(head));
                }
            }
        }
    }
    Ok(None)
}

/// One write of the pending bytes (never completes when there are none).
async fn write_some<W: AsyncWrite + Unpin>(
    wr: &mut W,
    pending: &mut Option<Framed>,
) -> io::Result<usize> {
    match pending {
        Some(bytes) => wr.write_buf(bytes).await,
        None => std::future::pending().await,
    }
}

/// Reads until a final (non-1xx) response head is complete, counting what it reads in
/// `wire`.
async fn read_head(
    io: &mut UpstreamIo,
    buf: &mut BytesMut,
    addr: SocketAddr,
    wire: Option<&UpstreamWire>,
) -> Result<Head, UpstreamError> {
    loop {
        if !buf.is_empty()
            && let Some(head) = final_head(buf, wire).map_err(|e| protocol(addr, &e))?
        {
            return Ok(head);
        }
        let n = io
            .read_buf(with_room(buf))
            .await
            .map_err(|e| terminated(addr, &e))?;
        if n == 0 {
            return Err(closed_before_head(addr));
        }
        if let Some(w) = wire {
            w.read(n);
        }
    }
}

/// The final response head at the start of `buf`, skipping interim 1xx responses (Envoy
/// does not forward them by default); each head's header bytes are counted in `wire`.
fn final_head(
    buf: &mut BytesMut,
    wire: Option<&UpstreamWire>,
) -> Result<Option<Head>, DecodeError> {
    loop {
        let head = decode::response_head(buf)?;
        if let (Some(head), Some(wire)) = (&head, wire) {
            wire.read_head(head.header_bytes);
        }
        match head {
            Some(head) if head.status() == StatusCode::SWITCHING_PROTOCOLS => {
                return Err(DecodeError::Head(
                    "101 response to a request without upgrade",
                ));
            }
            Some(head) if head.status().is_informational() => continue,
            other => return Ok(other),
        }
    }
}

/// How a response body is read: as the answer to a HEAD request or not, with its trailers or
/// without.
#[derive(Clone, Copy)]
struct Delimit {
    head_request: bool,
    trailers: bool,
}

fn respond(
    reader: Reader,
    buf: BytesMut,
    head: Head,
    body: Delimit,
    release: Option<Release>,
    addr: SocketAddr,
    meter: Option<Arc<AttemptTarget>>,
) -> Result<Response<ResponseBody>, UpstreamError> {
    let framing = head
        .framing(body.head_request)
        .map_err(|e| protocol(addr, &e))?;
    let release = release.filter(|_| head.keeps_alive(framing));
    Ok(head
        .response
        .map(|()| ResponseBody::new(reader, buf, framing, release, body.trailers, meter)))
}

/// Polls `fut` once, without a real waker: its output if it is ready right away.
fn poll_now<F: Future>(fut: F) -> Option<F::Output> {
    let fut = pin!(fut);
    match fut.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

/// A frame of the request body with its chunk framing around it.
type Framed = Chain<Chain<Bytes, Bytes>, Bytes>;

/// Writes a request body in its framing and checks it against a declared length.
struct BodySender {
    framing: BodyFraming,
    /// Write the body's trailers (the cluster's `enable_trailers`); else, as Envoy's codec,
    /// the chunked body ends without them.
    trailers: bool,
    sent: u64,
    /// The last frame was encoded.
    done: bool,
    /// Encoded bytes not written yet.
    pending: Option<Framed>,
    /// Counts the bytes written, for access logs.
    meter: Option<Arc<AttemptTarget>>,
}

impl BodySender {
    fn new(framing: BodyFraming, trailers: bool, meter: Option<Arc<AttemptTarget>>) -> Self {
        BodySender {
            framing,
            trailers,
            sent: 0,
            done: false,
            pending: None,
            meter,
        }
    }

    /// Whether the whole body is written.
    fn finished(&self) -> bool {
        self.done && self.pending.is_none()
    }

    /// Encodes the body's next frame (`None`: the body ended) as the pending bytes.
    fn queue(&mut self, frame: Option<Result<Frame<Bytes>, BoxError>>) -> Result<(), String> {
        let framed = self.encode(frame)?;
        self.pending = framed.has_remaining().then_some(framed);
        Ok(())
    }

    /// Accounts for one write of the pending bytes.
    fn wrote(&mut self, written: io::Result<usize>) -> io::Result<()> {
        let n = written?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        if let Some(w) = wire(self.meter.as_deref()) {
            w.wrote(n);
        }
        self.pending.take_if(|p| !p.has_remaining());
        Ok(())
    }

    /// The bytes for the body's next frame (`None`: the body ended); `Err` when the body
    /// failed or does not match its declared length.
    fn encode(&mut self, frame: Option<Result<Frame<Bytes>, BoxError>>) -> Result<Framed, String> {
        let frame = match frame {
            None => return self.end(None),
            Some(Err(e)) => return Err(format!("request body failed: {e}")),
            Some(Ok(frame)) => frame,
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                let trailers = frame.into_trailers().ok().filter(|_| self.trailers);
                return self.end(trailers.as_ref());
            }
        };
        self.sent += data.len() as u64;
        if let BodyFraming::Length(n) = self.framing
            && self.sent > n
        {
            return Err(format!("request body longer than its content-length {n}"));
        }
        if self.framing == BodyFraming::Chunked && !data.is_empty() {
            let start = Bytes::from(encode::chunk_start(data.len()));
            Ok(start.chain(data).chain(Bytes::from_static(b"\r\n")))
        } else {
            Ok(Bytes::new().chain(data).chain(Bytes::new()))
        }
    }

    /// The bytes that end the body (the last chunk and trailers when chunked).
    fn end(&mut self, trailers: Option<&http::HeaderMap>) -> Result<Framed, String> {
        self.done = true;
        let end = match self.framing {
            BodyFraming::Chunked => Bytes::from(encode::chunked_end(trailers)),
            BodyFraming::Length(n) if self.sent < n => {
                return Err(format!(
                    "request body ended after {} of its content-length {n} bytes",
                    self.sent
                ));
            }
            _ => Bytes::new(),
        };
        Ok(end.chain(Bytes::new()).chain(Bytes::new()))
    }

    /// Sends what is left of the body after the upstream answered early; the connection is
    /// not reused, so a failure only ends the sending.
    async fn rest<W: AsyncWrite + Unpin>(mut self, mut wr: W, mut body: Body) {
        loop {
            if let Some(mut framed) = self.pending.take() {
                let n = framed.remaining();
                if wr.write_all_buf(&mut framed).await.is_err() {
                    return;
                }
                if let Some(w) = wire(self.meter.as_deref()) {
                    w.wrote(n);
                }
            }
            if self.done {
                return;
            }
            if self.queue(body.frame().await).is_err() {
                return;
            }
        }
    }
}

fn terminated(addr: SocketAddr, e: &io::Error) -> UpstreamError {
    UpstreamError::Reset {
        host: addr,
        reason: ResetReason::ConnectionTermination,
        detail: e.to_string(),
    }
}

fn closed_before_head(addr: SocketAddr) -> UpstreamError {
    UpstreamError::Reset {
        host: addr,
        reason: ResetReason::ConnectionTermination,
        detail: "upstream closed the connection before a response".into(),
    }
}

fn protocol(addr: SocketAddr, e: &DecodeError) -> UpstreamError {
    UpstreamError::Reset {
        host: addr,
        reason: ResetReason::ProtocolError,
        detail: e.to_string(),
    }
}

fn request_body(detail: String) -> UpstreamError {
    UpstreamError::RequestBody { detail }
}
