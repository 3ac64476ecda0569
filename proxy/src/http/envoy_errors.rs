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

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use http::{HeaderValue, StatusCode};

use super::ConnContext;
use super::access_log::{HeadReply, codec_record, downstream_of, log_head_reply};
use super::framing::Framing;
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
    let mut resp = local_reply(status, text);
    if let Some(ctx) = ctx
        && let Some(config) = &ctx.hcm.config.local_reply
    {
        let mut rec = codec_record(downstream_of(ctx), status, details);
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
    headers.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    let code = parts.status.as_u16();
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
            (parts.status, &headers, text.len() as u64),
            details,
            kind,
            wire,
        );
    }
    out.extend_from_slice(text.as_bytes());
    out
}

fn header_value<'a>(head: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    head.split(|b| *b == b'\n').find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let (n, v) = line.split_at(line.iter().position(|b| *b == b':')?);
        n.eq_ignore_ascii_case(name).then(|| v[1..].trim_ascii())
    })
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
    /// logs record them (HTTP/1 only).
    ctx: Option<Arc<ConnContext>>,
}

impl<I> EnvoyErrors<I> {
    /// Wraps an HTTP/2 connection `io`.
    pub fn new(io: I) -> Self {
        Self::replaying(BytesMut::new(), io, Framing::off())
    }

    /// Wraps `io`, whose next reads return `replay` first, and whose HTTP/1 requests go
    /// through `framing`.
    pub fn replaying(replay: BytesMut, io: I, framing: Framing) -> Self {
        EnvoyErrors {
            io,
            pending: Vec::new(),
            replay,
            framing,
            ready: BytesMut::new(),
            ctx: None,
        }
    }

    /// Rewrites the rejections with `ctx`'s `local_reply_config` and logs them in its access
    /// logs.
    pub fn with_context(mut self, ctx: Arc<ConnContext>) -> Self {
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

impl<I: AsyncRead + Unpin> AsyncRead for EnvoyErrors<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
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
            if me.framing.is_off() {
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
            } else {
                me.framing.feed(read.filled(), &mut me.ready);
            }
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for EnvoyErrors<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
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
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
        let mut w = EnvoyErrors::new(a);
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
        let mut w = EnvoyErrors::new(a);
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
