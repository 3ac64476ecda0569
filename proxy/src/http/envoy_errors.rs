//! The I/O wrapper between a downstream connection and hyper's server.
//!
//! Envoy's answers to HTTP/1 requests hyper rejects before they reach the router: a malformed
//! request gets `400` with the body `Bad Request`, and an HTTP/2 preface on an HTTP/1-only
//! connection gets the same. hyper writes its own bare 400; this wrapper swaps it for Envoy's
//! bytes on the way out, and logs it as Envoy does. hyper answers an HTTP/1.0 request in
//! HTTP/1.0; Envoy refuses one it does not accept (`426`) in HTTP/1.1, so that status line is
//! rewritten. When hyper takes a connection over from the HTTP/1.1 fast path, the wrapper also
//! replays the bytes the fast path had read, and it passes what the client sends through
//! [`Framing`], which applies Envoy's rules for `content-length` with `transfer-encoding` and
//! for versions that hyper lacks.
//!
//! It also times the end of a drain the connection's limits started (see
//! [`super::conn_limits`]) as Envoy does: on HTTP/2, h2's graceful shutdown (a GOAWAY for
//! stream 2^31-1, then a PING whose answer brings its final GOAWAY) has its PING held until
//! the drain ends, and hyper's shutdown of a connection whose drain ended waits for Envoy's
//! delayed close. On HTTP/1.1, a response head written while the connection drains gets the
//! drain's `connection: close` here, on its way out: given to hyper, the header would have it
//! close the connection, which Envoy keeps serving until the drain ends.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use http::{HeaderValue, StatusCode};

use super::ConnContext;
use super::access_log::{HeadReply, codec_record, downstream_of, log_head_reply};
use super::conn_limits::{DELAYED_CLOSE, Http1Close};
use super::framing::Framing;
use super::h2_head::{Inbound, Outbound, reply_frames};
use super::head_timeout::{HeadTimeout, HeadTimer};
use super::local_reply::{LocalReply, local_reply, map};
use super::reason::envoy_phrase;

/// hyper's status lines for requests it rejects, and Envoy's status and response details for
/// each.
const REJECTIONS: [(&[u8], StatusCode, &str); 3] = [
    (
        b"HTTP/1.1 414 URI Too Long\r\n",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "http1.headers_too_large",
    ),
    (
        b"HTTP/1.1 400 Bad Request\r\n",
        StatusCode::BAD_REQUEST,
        "http1.codec_error",
    ),
    (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "http1.headers_too_large",
    ),
];

/// hyper's status line refusing an HTTP/1.0 request (`accept_http_10` off), and Envoy's.
const HTTP10_REFUSED: &[u8] = b"HTTP/1.0 426 ";
const HTTP11_REFUSED: &[u8] = b"HTTP/1.1 426 ";

/// Envoy's answer to a request its HTTP/1 codec refuses with `status` (`details` saying why,
/// as its access logs do): the reason phrase as a `text/plain` body, rewritten by the
/// connection manager's `local_reply_config` when there is one, then `date` (hyper's, else
/// now), `server` and `connection: close`. With the connection's `ctx`, the access logs get
/// the line Envoy writes for it, with the answer as sent.
pub fn codec_reply(
    ctx: Option<&ConnContext>,
    status: StatusCode,
    details: &str,
    date: Option<&[u8]>,
) -> Vec<u8> {
    let reason = envoy_phrase(status.as_u16());
    head_reply(ctx, status, reason, details, HeadReply::Codec, date)
}

/// Envoy's local reply `text` with `status` to a request whose head never came whole (no
/// request headers for the mappers), written and logged (as `kind` says) as [`codec_reply`]
/// writes and logs its.
pub(super) fn head_reply(
    ctx: Option<&ConnContext>,
    status: StatusCode,
    text: &str,
    details: &str,
    kind: HeadReply,
    date: Option<&[u8]>,
) -> Vec<u8> {
    let (status, headers, text) = head_answer(ctx, status, text, details, kind, date);
    let code = status.as_u16();
    let mut out = format!("HTTP/1.1 {code} {}\r\n", envoy_phrase(code)).into_bytes();
    for (name, value) in &headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if let Some(ctx) = ctx {
        let wire = ctx.wire.as_ref().map_or_else(Default::default, |w| {
            w.wrote_head(&out, false);
            w.answered(text.len() as u64)
        });
        log_head_reply(
            ctx,
            (status, &headers, text.len() as u64),
            details,
            kind,
            wire,
        );
    }
    out.extend_from_slice(text.as_bytes());
    out
}

/// The status, headers and body of [`head_reply`]'s answer (not logged: the caller logs
/// it with the bytes it writes): `local_reply_config` applied, then `date` (the given one, else now), `server` and, on HTTP/1, `connection:
/// close`.
fn head_answer(
    ctx: Option<&ConnContext>,
    status: StatusCode,
    text: &str,
    details: &str,
    kind: HeadReply,
    date: Option<&[u8]>,
) -> (StatusCode, http::HeaderMap, String) {
    let mut resp = local_reply(status, text);
    if let Some(ctx) = ctx
        && let Some(config) = &ctx.hcm.config.local_reply
    {
        let mut rec = codec_record(downstream_of(ctx), status, details);
        rec.protocol = Some(kind.protocol());
        resp = map(config, resp, &mut rec);
    }
    let (parts, _) = resp.into_parts();
    let text = parts
        .extensions
        .get::<LocalReply>()
        .map(|l| l.text.clone())
        .unwrap_or_default();
    let mut headers = parts.headers;
    if !headers.contains_key(http::header::CONTENT_LENGTH) {
        headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(0));
    }
    let now = httpdate::fmt_http_date(std::time::SystemTime::now());
    let date = HeaderValue::from_bytes(date.unwrap_or(now.as_bytes()))
        .unwrap_or_else(|_| HeaderValue::from_str(&now).expect("an HTTP date is a header value"));
    headers.insert(http::header::DATE, date);
    headers.insert(http::header::SERVER, HeaderValue::from_static("envoy"));
    if !matches!(kind, HeadReply::StreamTimeout(_)) {
        headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    (parts.status, headers, text)
}

fn header_value<'a>(head: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    head.split(|b| *b == b'\n').find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let (n, v) = line.split_at(line.iter().position(|b| *b == b':')?);
        n.eq_ignore_ascii_case(name).then(|| v[1..].trim_ascii())
    })
}

/// `head` (a response head, and whatever hyper wrote after it) with `connection: close` after
/// its status line, in place of the head's `connection: keep-alive`.
fn with_close(head: &[u8]) -> Vec<u8> {
    let at = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .map_or(head.len(), |i| i + 2);
    let mut rest = head[at..].to_vec();
    // An HTTP/1.0 head says `keep-alive` so that hyper keeps the connection: the drain's
    // `close` replaces it.
    const KEEP_ALIVE: &[u8] = b"connection: keep-alive\r\n";
    let end = rest
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(rest.len(), |i| i + 2);
    let line_start = |i: usize| i == 0 || rest[i - 1] == b'\n';
    let mut end = if rest.starts_with(b"\r\n") { 0 } else { end };
    if let Some(i) = rest[..end]
        .windows(KEEP_ALIVE.len())
        .enumerate()
        .position(|(i, w)| line_start(i) && w.eq_ignore_ascii_case(KEEP_ALIVE))
    {
        rest.drain(i..i + KEEP_ALIVE.len());
        end -= KEEP_ALIVE.len();
    }
    // Last among the headers, where Envoy's codec writes it.
    [
        &head[..at],
        &rest[..end],
        b"connection: close\r\n",
        &rest[end..],
    ]
    .concat()
}

/// Wraps a connection so hyper's own 400 replies become Envoy's.
pub struct EnvoyErrors<I> {
    io: I,
    pending: Vec<u8>,
    /// Bytes already read from `io` by someone else, returned by the first reads.
    replay: BytesMut,
    /// Follows HTTP/1 requests on their way in (off for HTTP/2).
    framing: Framing,
    /// What `framing` let through and hyper has not read yet.
    ready: BytesMut,
    /// The connection, whose `local_reply_config` rewrites the rejections and whose access
    /// logs record them, and whose head timeouts the wrapper enforces.
    ctx: Option<Arc<ConnContext>>,
    /// The head timeouts of the head being read: an HTTP/1 head `framing` holds, or an
    /// HTTP/2 header block `inbound` sees open.
    timer: HeadTimer,
    /// Follows the client's HTTP/2 frames (off at once on HTTP/1).
    inbound: Inbound,
    /// Follows hyper's HTTP/2 frames.
    outbound: Outbound,
    /// A timed-out stream's reply, waiting for a boundary between hyper's frames.
    inject: Vec<u8>,
    /// An HTTP/1 head timed out: its reply goes out and hyper reads the end of the stream.
    closed: bool,
    /// `ready` holds bytes `inbound` rewrote, and so has followed already.
    ready_followed: bool,
    /// A header block began in what `inbound` rewrote.
    began: bool,
    /// A timed-out stream whose late header block hyper refuses: its RST_STREAM is dropped.
    refused: Option<u32>,
    /// h2's shutdown PING, held while the connection's drain lasts (see [`Self::hold_ping`]).
    held_ping: Option<[u8; 17]>,
    /// The delayed close of a connection whose drain ended, once hyper shuts it down.
    closing: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A response to an HTTP/1.0 request that did not ask `keep-alive` went out while the
    /// connection drained: hyper's shutdown after it waits for the drain's end, as Envoy
    /// keeps a draining connection whatever the request asked.
    close_at_drain_end: bool,
}

impl<I> EnvoyErrors<I> {
    /// Wraps an HTTP/2 connection `io`.
    pub fn new(io: I) -> Self {
        let mut wrapped = Self::replaying(BytesMut::new(), io, Framing::off());
        wrapped.inbound = Inbound::new(true);
        wrapped
    }

    /// Wraps `io`, whose next reads return `replay` first, and whose HTTP/1 requests go
    /// through `framing` (or which turns out HTTP/2 with its preface).
    pub fn replaying(replay: BytesMut, io: I, framing: Framing) -> Self {
        EnvoyErrors {
            io,
            pending: Vec::new(),
            replay,
            framing,
            ready: BytesMut::new(),
            ctx: None,
            timer: HeadTimer::default(),
            inbound: Inbound::new(false),
            outbound: Outbound::default(),
            inject: Vec::new(),
            closed: false,
            ready_followed: false,
            began: false,
            refused: None,
            held_ping: None,
            closing: None,
            close_at_drain_end: false,
        }
    }

    /// Rewrites the rejections with `ctx`'s `local_reply_config`, logs them in its access
    /// logs, and enforces its head timeouts.
    pub fn with_context(mut self, ctx: Arc<ConnContext>) -> Self {
        let cfg = &ctx.hcm.config;
        if cfg.request_headers_timeout.is_none() && cfg.request_timeout.is_none() {
            // No head timeout: the client's HTTP/2 frames need no following.
            self.inbound = self.inbound.preface_only();
        }
        self.ctx = Some(ctx);
        self
    }
}

impl<I: AsyncWrite + Unpin> EnvoyErrors<I> {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> EnvoyErrors<I> {
    /// Moves a timed-out stream's reply, or h2's shutdown PING once the drain it was held for
    /// ended, to the bytes to write once hyper's last frame is whole.
    fn settle_inject(&mut self) {
        if self.held_ping.is_some()
            && self.ctx.as_ref().is_some_and(|c| c.limits.drain_ended())
            && let Some(ping) = self.held_ping.take()
        {
            self.inject.extend_from_slice(&ping);
        }
        if !self.inject.is_empty() && self.outbound.room() == 0 {
            self.pending.append(&mut self.inject);
        }
    }

    /// How much of `buf`, which hyper writes on an HTTP/2 connection, to write now so that
    /// h2's shutdown PING is held while the connection drains (`Some(0)`: `buf` begins with
    /// it, and it is taken). h2's graceful shutdown sends a GOAWAY (last stream 2^31-1) and
    /// that PING, and its final GOAWAY once the client answers: Envoy sends its final GOAWAY
    /// when `drain_timeout` ends, so the PING goes out then ([`Self::settle_inject`]).
    fn hold_ping(&mut self, buf: &[u8]) -> Option<usize> {
        let draining = self
            .ctx
            .as_ref()
            .is_some_and(|c| c.limits.draining() && !c.limits.drain_ended());
        if !draining || self.held_ping.is_some() {
            return None;
        }
        let at = self.outbound.shutdown_ping(buf)?;
        if at == 0 {
            let mut ping = [0; 17];
            ping.copy_from_slice(&buf[..17]);
            self.held_ping = Some(ping);
        }
        Some(at)
    }

    /// Envoy's delayed close of a connection whose drain ended: before the connection shuts
    /// down, the client has up to [`DELAYED_CLOSE`] to close first (what it sends meanwhile
    /// is read and dropped). A connection hyper shuts down after an HTTP/1.0 response while
    /// it drains ([`Self::close_at_drain_end`]) waits for the drain's end first (the loop
    /// serving the connection polls it again then), unless the client closes. Ready when the
    /// shutdown may go on.
    fn poll_delayed_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(ctx) = &self.ctx else {
            return Poll::Ready(Ok(()));
        };
        let ended = ctx.limits.drain_ended();
        if !ended && !self.close_at_drain_end {
            return Poll::Ready(Ok(()));
        }
        ready!(Pin::new(&mut self.io).poll_flush(cx))?;
        if ended {
            let timer = self
                .closing
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(DELAYED_CLOSE)));
            if timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
        }
        loop {
            let mut sink = [0u8; 1024];
            let mut read = ReadBuf::new(&mut sink);
            match ready!(Pin::new(&mut self.io).poll_read(cx, &mut read)) {
                Ok(()) if !read.filled().is_empty() => {}
                _ => return Poll::Ready(Ok(())),
            }
        }
    }

    /// Arms the head timer while a head is arriving, disarms it once none is; `began` when a
    /// new HTTP/2 header block began in what was just read.
    fn follow_head(&mut self, began: bool) {
        let Some(ctx) = &self.ctx else {
            return;
        };
        if began {
            self.timer.stop();
        }
        if self.framing.head_in_progress() || self.inbound.open().is_some() {
            self.timer.start(&ctx.hcm.config);
        } else {
            self.timer.stop();
        }
    }

    /// Answers a head that timed out (`which`) as Envoy does: an HTTP/2 stream's reply goes
    /// out between hyper's frames and the connection stays; an HTTP/1 reply goes out and the
    /// connection ends.
    fn time_out(&mut self, which: HeadTimeout) {
        let Some(ctx) = self.ctx.clone() else {
            return;
        };
        let (text, details) = which.fire(&ctx.hcm.stats);
        let status = StatusCode::REQUEST_TIMEOUT;
        if let Some(stream) = self.inbound.open() {
            self.inbound.answered();
            let kind = HeadReply::StreamTimeout(text);
            let (status, headers, body) =
                head_answer(Some(&ctx), status, text, details, kind, None);
            let answered = (status, &headers, body.len() as u64);
            log_head_reply(&ctx, answered, details, kind, Default::default());
            self.inject
                .extend(reply_frames(stream, status, &headers, body.as_bytes()));
            self.settle_inject();
        } else {
            self.framing.stop();
            self.closed = true;
            let kind = HeadReply::Timeout(text);
            let reply = head_reply(Some(&ctx), status, text, details, kind, None);
            self.pending.extend(reply);
        }
    }

    /// Reads what hyper is to read next, through the request follower.
    fn read_on(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self;
        loop {
            if !me.ready.is_empty() {
                let n = me.ready.len().min(buf.remaining());
                buf.put_slice(&me.ready[..n]);
                me.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if !me.replay.is_empty() {
                let replay = std::mem::take(&mut me.replay);
                if me.framing.is_off() {
                    me.ready = replay;
                } else {
                    me.framing.feed(&replay, &mut me.ready);
                }
                continue;
            }
            let rewriting = me.inbound.rewriting();
            if me.framing.is_off() && !rewriting {
                return Pin::new(&mut me.io).poll_read(cx, buf);
            }
            let mut scratch = [0u8; 8192];
            let mut read = ReadBuf::new(&mut scratch);
            ready!(Pin::new(&mut me.io).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                me.framing.end(&mut me.ready);
                if me.ready.is_empty() {
                    return Poll::Ready(Ok(()));
                }
            } else if rewriting {
                let (refused, began) = me.inbound.rewrite(read.filled(), &mut me.ready);
                me.refused = refused.or(me.refused);
                me.began |= began;
                me.ready_followed = true;
            } else {
                me.framing.feed(read.filled(), &mut me.ready);
            }
        }
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncRead for EnvoyErrors<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        me.settle_inject();
        if me.closed {
            // The end of the stream, once the reply is out.
            ready!(me.poll_pending(cx))?;
            return Poll::Ready(Ok(()));
        }
        if !me.pending.is_empty() {
            // A timed-out stream's reply; hyper's next write waits for it too.
            let _ = me.poll_pending(cx)?;
        }
        let before = buf.filled().len();
        let read = me.read_on(cx, buf);
        // Bytes `inbound` rewrote come to hyper only through `ready`.
        let followed = me.ready_followed;
        let began = match read {
            Poll::Ready(Ok(())) if me.inbound.following() && !followed => {
                me.inbound.feed(&buf.filled()[before..])
            }
            _ => false,
        };
        if me.ready.is_empty() {
            me.ready_followed = false;
        }
        let began = began | std::mem::take(&mut me.began);
        me.follow_head(began);
        if read.is_pending()
            && let Poll::Ready(which) = me.timer.poll_fired(cx)
        {
            me.time_out(which);
            // Woken again to write the reply (HTTP/1: then to end the stream).
            cx.waker().wake_by_ref();
        }
        read
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncWrite for EnvoyErrors<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.settle_inject();
        ready!(self.poll_pending(cx))?;
        if self.inbound.is_http2() {
            if self.outbound.room() == 0
                && let Some(stream) = self.refused
                && let Some(n) = super::h2_head::swallowed_reset(buf, stream)
            {
                self.refused = None;
                return Poll::Ready(Ok(n));
            }
            let n = match self.hold_ping(buf) {
                Some(0) => return Poll::Ready(Ok(17)),
                Some(before) => before,
                None => buf.len(),
            };
            // Up to the end of hyper's frame while a reply waits to go between two.
            let n = match self.outbound.room() {
                room if room > 0 && !self.inject.is_empty() => room.min(n),
                _ => n,
            };
            let me = &mut *self;
            let n = ready!(Pin::new(&mut me.io).poll_write(cx, &buf[..n]))?;
            me.outbound.wrote(&buf[..n]);
            return Poll::Ready(Ok(n));
        }
        // A response head (not 1xx): it may get the drain's notice
        // (`ConnLimits::notice_next_head`); an HTTP/1.0 one that does not, while the
        // connection drains, has hyper's shutdown wait for the drain's end.
        let draining_head = self.ctx.as_ref().filter(|_| {
            (buf.starts_with(b"HTTP/1.1 ") || buf.starts_with(b"HTTP/1.0 "))
                && buf.get(9) != Some(&b'1')
        });
        let notice =
            draining_head.map(|ctx| (ctx.limits.take_head_notice(), ctx.limits.http1_close()));
        if let Some((false, Http1Close::Notice)) = notice
            && buf.starts_with(b"HTTP/1.0 ")
        {
            self.close_at_drain_end = true;
        }
        if let Some((true, _)) = notice {
            self.pending = with_close(buf);
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        let hyper_rejection = REJECTIONS.iter().find(|(line, _, _)| buf.starts_with(line));
        if let Some(&(_, status, details)) =
            hyper_rejection.filter(|_| header_value(buf, b"server").is_none())
        {
            // A head the request follower refused reaches hyper as one it answers 400.
            let (status, details) = match self.framing.refusal() {
                Some(refusal) if status == StatusCode::BAD_REQUEST => refusal,
                _ => (status, details),
            };
            let date = header_value(buf, b"date");
            self.pending = codec_reply(self.ctx.as_deref(), status, details, date);
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        if buf.starts_with(HTTP10_REFUSED) {
            let mut head = buf.to_vec();
            head[..HTTP11_REFUSED.len()].copy_from_slice(HTTP11_REFUSED);
            self.pending = head;
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.settle_inject();
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.settle_inject();
        ready!(self.poll_pending(cx))?;
        ready!(self.poll_delayed_close(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn a_drain_notice_is_the_last_header() {
        assert_eq!(
            with_close(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"),
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
        );
        assert_eq!(
            with_close(b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok"),
            b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
        );
        assert_eq!(
            with_close(b"HTTP/1.0 200 OK\r\ncontent-length: 22\r\n\r\nconnection: keep-alive"),
            b"HTTP/1.0 200 OK\r\ncontent-length: 22\r\nconnection: close\r\n\r\nconnection: keep-alive",
            "only the head's"
        );
        assert_eq!(
            with_close(b"HTTP/1.1 204 No Content\r\n\r\n"),
            b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
            "a head without headers"
        );
    }

    #[tokio::test]
    async fn replayed_bytes_come_before_the_connection() {
        let (a, mut b) = tokio::io::duplex(64);
        b.write_all(b" world").await.unwrap();
        drop(b);
        let mut io = EnvoyErrors::replaying(BytesMut::from(&b"hello"[..]), a, Framing::off());
        let mut out = String::new();
        io.read_to_string(&mut out).await.unwrap();
        assert_eq!(out, "hello world");
    }

    #[tokio::test]
    async fn an_http10_refusal_goes_out_in_http11_as_envoys_does() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = EnvoyErrors::replaying(BytesMut::new(), a, Framing::off());
        w.write_all(b"HTTP/1.0 426 Upgrade Required\r\ncontent-length: 16\r\n\r\n")
            .await
            .unwrap();
        w.write_all(b"HTTP/1.0 200 OK\r\n\r\n").await.unwrap();
        w.shutdown().await.unwrap();
        let mut out = String::new();
        b.read_to_string(&mut out).await.unwrap();
        assert_eq!(
            out,
            "HTTP/1.1 426 Upgrade Required\r\ncontent-length: 16\r\n\r\nHTTP/1.0 200 OK\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn hyper_400_becomes_envoys_and_other_writes_pass() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = EnvoyErrors::replaying(BytesMut::new(), a, Framing::off());
        w.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Mon, 30 Nov 2026 12:00:00 GMT\r\n\r\n")
            .await
            .unwrap();
        w.write_all(b"HTTP/1.1 400 Bad Request\r\nserver: envoy\r\n\r\n")
            .await
            .unwrap();
        w.shutdown().await.unwrap();
        let mut out = Vec::new();
        b.read_to_end(&mut out).await.unwrap();
        let expected = [
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 11\r\ncontent-type: text/plain\r\ndate: Mon, 30 Nov 2026 12:00:00 GMT\r\nserver: envoy\r\nconnection: close\r\n\r\nBad Request".to_vec(),
            b"HTTP/1.1 400 Bad Request\r\nserver: envoy\r\n\r\n".to_vec(),
        ]
        .concat();
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected)
        );
    }
}
