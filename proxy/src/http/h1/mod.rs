//! The HTTP/1.1 fast path, over plaintext TCP or TLS: revoy's own reading of request heads and
//! writing of responses for the common request (HTTP/1.1, no upgrade, and a body only when
//! framed by a plain `content-length`, streamed in as it arrives), where hyper's server spent
//! about a quarter of a request's instructions. The first request it does not take
//! (see [`request::parse`]) hands the connection, with the bytes read so far, to hyper's server
//! for the rest of its life, so every unusual case keeps hyper's handling and Envoy's replies.

pub(super) mod date;
mod inbound;
mod request;
mod response;

use std::sync::Arc;

use std::io;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::ConnContext;
use super::conn_limits::{DELAYED_CLOSE, Http1Close, LimitTimer};
use super::head_scan::HeadScan;
use super::head_timeout::HeadTimeout;
use super::wire_meter::ConnWire;
use crate::config::hcm::Codec;
use crate::wire::{give_back, has_token, take_buffer, with_room};
use inbound::Inbound;
use request::Head;
pub(super) use response::note_head;

/// What the fast path makes of the request head at the start of `buf` (for the fuzz targets):
/// `partial`, `served`, `ambiguous` or `handoff`.
#[cfg(fuzzing)]
pub(super) fn parse_head_for_fuzzing(
    buf: &mut BytesMut,
    cfg: &crate::config::hcm::HcmConfig,
) -> &'static str {
    match request::parse(buf, cfg, None) {
        Head::Partial => "partial",
        Head::Served { .. } => "served",
        Head::Ambiguous => "ambiguous",
        Head::HandOff => "handoff",
    }
}

/// What a client asked of the response to its request.
pub(super) struct Asked {
    /// The request method (a HEAD response has no body).
    method: http::Method,
    /// `connection: close`: the connection closes after the response.
    close: bool,
    /// The response says `connection: close` though the connection stays open (it drains).
    notice: bool,
}

/// The connection's read side: bytes read and not yet parsed, how many may wait there, and the
/// body of the request in flight still to arrive.
pub(super) struct Reading {
    buf: BytesMut,
    limit: usize,
    /// When the head being read is parsed again.
    scan: HeadScan,
    body: Inbound,
    /// Where the bytes read while a request is in flight are noted, for its wire bytes.
    meter: Option<Arc<ConnWire>>,
}

/// A downstream connection the fast path serves: plaintext TCP, or TLS over it.
pub(super) trait Downstream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Whether written bytes may wait in the stream until it is flushed.
    const HOLDS_WRITES: bool;

    /// Ready when reading may find bytes, without reading them: while it waits, a connection
    /// between requests holds no read buffer.
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Takes as much of `bytes` as the stream can hold without writing to the socket; how
    /// much it took. The connection's shutdown writes what it holds: the last response of a
    /// TLS connection then leaves in one write with its `close_notify`.
    fn hold(&mut self, bytes: &[u8]) -> usize;
}

impl Downstream for TcpStream {
    const HOLDS_WRITES: bool = false;

    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }

    fn hold(&mut self, _: &[u8]) -> usize {
        0
    }
}

impl Downstream for crate::tls::ServerStream {
    /// rustls keeps the records it could not write yet.
    const HOLDS_WRITES: bool = true;

    /// Ready at once while rustls holds decrypted bytes the socket no longer shows (it does not
    /// want more TLS data then); otherwise when the socket is readable.
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let (tcp, tls) = self.get_ref();
        if tls.wants_read() {
            tcp.poll_read_ready(cx)
        } else {
            Poll::Ready(Ok(()))
        }
    }

    /// Encrypts into rustls's buffer of records to send (up to its limit).
    fn hold(&mut self, bytes: &[u8]) -> usize {
        std::io::Write::write(&mut self.get_mut().1.writer(), bytes).unwrap_or(0)
    }
}

/// Serves `stream` until it closes, handing it to hyper's server at the first request the fast
/// path does not take (or at once for what may be an HTTP/2 preface under `Codec::Auto`).
pub(super) async fn serve<S: Downstream>(mut stream: S, ctx: Arc<ConnContext>, codec: Codec) {
    let mut reading = Reading {
        buf: BytesMut::new(),
        limit: ctx.hcm.config.max_request_headers_kb as usize * 1024,
        scan: HeadScan::default(),
        body: Inbound::default(),
        meter: ctx.wire.clone(),
    };
    // The codec is chosen once: after the first request, hyper takes over as HTTP/1 only.
    let mut codec = codec;
    // Counted under its codec once the first bytes tell which it is, as Envoy's codec is made.
    let mut counted = false;
    let mut limit_timer = LimitTimer::default();
    loop {
        // When the head being read must be whole, from its first bytes (see [`HeadTimeout`]).
        let mut head_deadline = None;
        let (request, asked) = loop {
            if !reading.buf.is_empty() {
                if codec == Codec::Auto && starts_with_h2_preface(&reading.buf) {
                    ctx.hcm.stats.codec(true, &ctx.codec);
                    return Box::pin(hand_off(stream, reading.buf, ctx, codec, true)).await;
                }
                if !counted {
                    ctx.hcm.stats.codec(false, &ctx.codec);
                    counted = true;
                }
                // Decided in a statement of its own: the parsed head is not kept in the
                // connection's future while a hand-off below runs.
                let next = if !reading.scan.due(&reading.buf, reading.limit) {
                    NotServed::ReadMore
                } else {
                    match request::parse(&mut reading.buf, &ctx.hcm.config, ctx.wire.as_deref()) {
                        Head::Partial => NotServed::ReadMore,
                        Head::Served {
                            request,
                            asked,
                            inbound,
                        } => {
                            reading.scan.reset();
                            reading.body = inbound;
                            let limits = &ctx.hcm.config.connection_limits;
                            if ctx.limits.stream_started(limits, &ctx.hcm.stats) {
                                ctx.limits.close_after_response();
                            }
                            break (request, asked);
                        }
                        Head::HandOff => NotServed::HandOff,
                        Head::Ambiguous => NotServed::Refuse,
                    }
                };
                match next {
                    NotServed::ReadMore if head_deadline.is_none() => {
                        head_deadline = HeadTimeout::arm(&ctx.hcm.config);
                    }
                    NotServed::ReadMore => {}
                    NotServed::HandOff => {
                        return Box::pin(hand_off(stream, reading.buf, ctx, codec, false)).await;
                    }
                    // Boxed, as a request is: a rare state an idle connection need not keep
                    // room for.
                    NotServed::Refuse => {
                        return crate::spawn::boxed(|| refuse_ambiguous(stream, reading, &ctx))
                            .await;
                    }
                }
            }
            let more = match head_deadline {
                Some((at, timeout)) => tokio::select! {
                    more = read_more(&mut stream, &mut reading) => more,
                    () = tokio::time::sleep_until(at) => {
                        return crate::spawn::boxed(|| head_timed_out(timeout, stream, reading, &ctx)).await;
                    }
                },
                None if reading.buf.is_empty() => {
                    match between_requests(
                        &mut stream,
                        &mut reading,
                        &ctx,
                        &mut limit_timer,
                        counted,
                    )
                    .await
                    {
                        Between::Read(more) => more,
                        Between::Close => return,
                        // Boxed, as a request is: a rare state an idle connection need not
                        // keep room for.
                        Between::DelayedClose => {
                            return crate::spawn::boxed(|| async move {
                                delayed_close(&mut stream, &mut reading.buf).await;
                            })
                            .await;
                        }
                    }
                }
                None => read_more(&mut stream, &mut reading).await,
            };
            if !more {
                return;
            }
        };
        codec = Codec::Http1;
        // Boxed, one allocation per request: an idle connection's task would otherwise keep
        // room for a request's routing and its response's writing (kilobytes).
        let exchanged =
            crate::spawn::boxed(|| exchange(&mut stream, &mut reading, request, asked, &ctx));
        if !exchanged.await {
            return;
        }
    }
}

/// Envoy's answer to a head `which` timed out: 408 with its text, counted and logged (no
/// request headers, no flag), then the connection closes.
async fn head_timed_out<S: Downstream>(
    which: HeadTimeout,
    mut stream: S,
    mut reading: Reading,
    ctx: &ConnContext,
) {
    let (text, details) = which.fire(&ctx.hcm.stats);
    // What came of the head is the exchange's, no header bytes (its headers never ended).
    if let Some(w) = &ctx.wire {
        w.read_head(reading.buf.len(), 0, 0);
    }
    let reply = super::envoy_errors::head_reply(
        Some(ctx),
        http::StatusCode::REQUEST_TIMEOUT,
        text,
        details,
        super::access_log::HeadReply::Timeout(text),
        None,
    );
    if stream.write_all(&reply).await.is_ok() {
        let _ = stream.shutdown().await;
        reading.buf.clear();
        linger(&mut stream, &mut reading.buf).await;
    }
}

/// How a wait for the next request ended.
enum Between {
    /// Bytes came (`true`), or the client closed (`false`).
    Read(bool),
    /// The connection closes now (an idle timeout or the duration before any byte came).
    Close,
    /// The connection's drain ended: it closes after the delayed close.
    DelayedClose,
}

/// Waits for the client's next bytes on a connection with no request in progress, firing its
/// limits' timers meanwhile (see [`super::conn_limits`]); `codec` says whether the client has
/// sent anything yet.
async fn between_requests<S: Downstream>(
    stream: &mut S,
    reading: &mut Reading,
    ctx: &ConnContext,
    timer: &mut LimitTimer,
    codec: bool,
) -> Between {
    let limits = &ctx.hcm.config.connection_limits;
    loop {
        let deadline = ctx.limits.next_deadline(limits, None);
        tokio::select! {
            biased;
            more = read_more(stream, reading) => return Between::Read(more),
            () = timer.until(deadline) => {}
        }
        let now = tokio::time::Instant::now();
        let due = ctx.limits.advance(limits, now, &ctx.hcm.stats, codec);
        if due.close_now {
            return Between::Close;
        }
        if due.drain_ended {
            return Between::DelayedClose;
        }
    }
}

/// Envoy's delayed close of a connection whose drain ended: the client has up to
/// [`DELAYED_CLOSE`] to close first (what it sends meanwhile is read and dropped), then the
/// connection closes.
async fn delayed_close<S: Downstream>(stream: &mut S, buf: &mut BytesMut) {
    // What the last response left held in the stream (TLS) goes out first.
    if stream.flush().await.is_err() {
        return;
    }
    read_until_closed(stream, buf, DELAYED_CLOSE).await;
    let _ = stream.shutdown().await;
}

/// What the fast path does with a head it did not serve.
enum NotServed {
    /// The head is not whole yet.
    ReadMore,
    /// Hyper serves the connection from this head on.
    HandOff,
    /// Envoy's codec refuses the head (ambiguous framing).
    Refuse,
}

/// Routes `request`, writes its response and, when the connection ends with it, closes it;
/// whether the connection stays open for the next request.
async fn exchange<S: Downstream>(
    stream: &mut S,
    reading: &mut Reading,
    request: http::Request<crate::body::Body>,
    asked: Asked,
    ctx: &ConnContext,
) -> bool {
    // Records `downstream_rq_time` when dropped or ended: the response written.
    let timer = ctx.hcm.stats.time_request();
    let response = tokio::select! {
        biased;
        response = super::router::handle(request, ctx) => response,
        () = client_gone(stream, reading) => return false,
    };
    // The connection's own limits: a duration reached, or a drain ended, while the request
    // was in progress counts from when it happened.
    let limits = &ctx.hcm.config.connection_limits;
    if ctx.limits.timed_while_busy(limits) {
        let now = tokio::time::Instant::now();
        ctx.limits.advance(limits, now, &ctx.hcm.stats, true);
    }
    // A draining server starts the connection's drain on this response, as Envoy does.
    ctx.server_drain();
    let limit = ctx.limits.http1_close();
    let client_close = asked.close;
    let asked = Asked {
        close: asked.close || matches!(limit, Http1Close::Now | Http1Close::Delayed),
        notice: limit == Http1Close::Notice,
        ..asked
    };
    let kept = response::write(
        stream,
        reading,
        response,
        &asked,
        (ctx.hcm.config.http1_trailers, ctx.wire.as_deref()),
    )
    .await;
    ctx.limits
        .stream_ended(limits, tokio::time::Instant::from_std(timer.end()));
    if kept {
        return true;
    }
    // A drain that ended closes as Envoy's does, unless the client asked to close.
    if limit == Http1Close::Delayed && !client_close && !reading.body.incomplete() {
        delayed_close(stream, &mut reading.buf).await;
        return false;
    }
    let _ = stream.shutdown().await;
    if reading.body.incomplete() {
        linger(stream, &mut reading.buf).await;
    }
    false
}

/// Answers a request framed by both `content-length` and `transfer-encoding: chunked` with
/// Envoy's 400 and closes the connection.
async fn refuse_ambiguous<S: Downstream>(mut stream: S, mut reading: Reading, ctx: &ConnContext) {
    ctx.hcm.stats.refused_by_http1_codec(400);
    // Everything read is the exchange's; its headers were whole, so they count.
    if let Some(w) = &ctx.wire {
        let mut fields = [httparse::EMPTY_HEADER; crate::wire::MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut fields);
        let _ = parsed.parse(&reading.buf);
        let name_values = parsed.headers.iter().map(|h| h.name.len() + h.value.len());
        w.read_head(reading.buf.len(), parsed.headers.len(), name_values.sum());
    }
    let reply = super::envoy_errors::codec_reply(
        Some(ctx),
        http::StatusCode::BAD_REQUEST,
        "http1.content_length_and_chunked_not_allowed",
        None,
    );
    if stream.write_all(&reply).await.is_ok() {
        let _ = stream.shutdown().await;
        reading.buf.clear();
        linger(&mut stream, &mut reading.buf).await;
    }
}

/// How long a connection closed before its request body ended keeps reading: Envoy's default
/// `delayed_close_timeout`.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads and drops what the client still sends, until it closes or [`LINGER`] passes: closing
/// a socket with unread bytes resets the connection, which can destroy the answer before the
/// client reads it.
async fn linger<S: Downstream>(stream: &mut S, buf: &mut BytesMut) {
    read_until_closed(stream, buf, LINGER).await;
}

/// Reads and drops what the client sends until it closes (or fails) or `limit` passes.
async fn read_until_closed<S: Downstream>(
    stream: &mut S,
    buf: &mut BytesMut,
    limit: std::time::Duration,
) {
    let drain = async {
        loop {
            buf.clear();
            if !matches!(stream.read_buf(with_room(buf)).await, Ok(n) if n > 0) {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(limit, drain).await;
}

/// Reads more of the client's bytes; `false` when it closed (or the read failed). With nothing
/// buffered, a connection that has to wait gives its read buffer to the worker's spare list and
/// takes one when bytes arrive: an idle keep-alive connection holds no buffer.
async fn read_more<S: Downstream>(stream: &mut S, reading: &mut Reading) -> bool {
    if reading.buf.is_empty() {
        let mut held = Some(std::mem::take(&mut reading.buf));
        let ready = std::future::poll_fn(|cx| {
            let ready = stream.poll_readable(cx);
            if ready.is_pending()
                && let Some(buf) = held.take()
            {
                give_back(buf);
            }
            ready
        })
        .await;
        reading.buf = held.unwrap_or_else(take_buffer);
        if ready.is_err() {
            return false;
        }
    }
    matches!(stream.read_buf(with_room(&mut reading.buf)).await, Ok(n) if n > 0)
}

/// Completes when the client closes the connection (or it fails). Meant to race a request in
/// flight: the rest of its body goes into the request as it arrives, a client that goes away
/// cancels it, as in Envoy, and bytes it sends after the body (pipelined requests) wait in
/// the buffer, up to its limit.
async fn client_gone<S: Downstream>(stream: &mut S, reading: &mut Reading) {
    loop {
        if reading.body.incomplete() {
            reading.body.take_from(&mut reading.buf).await;
            if !reading.buf.is_empty() {
                continue;
            }
        } else if reading.buf.len() >= reading.limit {
            std::future::pending::<()>().await;
        }
        match stream.read_buf(with_room(&mut reading.buf)).await {
            // Read while the request is the connection's: its bytes, as Envoy charges them.
            Ok(n) if n > 0 => {
                if let Some(m) = &reading.meter {
                    m.read_body(n as u64);
                }
            }
            _ => return,
        }
    }
}

/// Whether the bytes read so far begin with the whole HTTP/2 connection preface: only the
/// whole preface says HTTP/2, as in Envoy's codec choice: a first read of `P` may be the start
/// of a `POST`.
fn starts_with_h2_preface(buf: &[u8]) -> bool {
    buf.starts_with(super::H2_PREFACE)
}

/// Serves the rest of the connection with hyper, starting with the bytes in `buf` (the HTTP/2
/// preface when `http2`).
async fn hand_off<S: Downstream>(
    stream: S,
    buf: BytesMut,
    ctx: Arc<ConnContext>,
    codec: Codec,
    http2: bool,
) {
    let cfg = &ctx.hcm.config;
    let framing = super::framing::Framing::new(
        cfg.allow_chunked_length,
        cfg.max_request_headers_kb as usize * 1024,
        Some(ctx.hcm.stats.clone()),
    )
    .metered(ctx.wire.clone());
    let io =
        super::envoy_errors::EnvoyErrors::replaying(buf, stream, framing).with_context(ctx.clone());
    super::serve_io(io, ctx, codec, http2).await;
}
