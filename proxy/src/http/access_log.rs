//! The connection manager's access logs and spans: a request's [`Record`] kept while it is
//! served (only when the connection manager has access logs or traces), its request body
//! counted as it arrives, and its response body counted as it leaves; the record is written
//! and the request's span finished from it when the response ends, or when the request is cut
//! short (`DC`). An upgraded stream's record (and span) is handed to its tunnel, which writes
//! it when the tunnel closes (as Envoy logs an upgrade when its stream ends).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::oneshot;

use super::ConnContext;
use super::trace::{RequestTrace, Seen};
use super::wire_meter::StreamWire;
use crate::access_log::record::{Downstream, RequestHead, WireBytes};
use crate::access_log::{AccessLogs, Record, ResponseFlag};
use crate::body::{Body, BoxError};
use crate::route::Route;
use crate::upstream::ResetReason;

/// What the request body has brought so far.
#[derive(Debug, Default)]
struct Received {
    bytes: AtomicU64,
    /// Its data frames.
    frames: AtomicU64,
    done: OnceLock<Instant>,
}

/// What an upgrade's tunnel receives once the `101` has been sent: the record, its logs and
/// the request's span.
pub(super) type Handover = (Box<Record>, AccessLogs, Option<RequestTrace>);

/// Which answer to a request whose head never came whole is logged: a refusal of the HTTP/1
/// codec, or the connection manager's timeout on the head.
#[derive(Debug, Clone, Copy)]
pub(super) enum HeadReply<'a> {
    /// The codec refused the head: the `DPE` flag, no `%LOCAL_REPLY_BODY%`, as in Envoy.
    Codec,
    /// `request_headers_timeout` or `request_timeout` ended it: no flag, the reply's text as
    /// `%LOCAL_REPLY_BODY%`.
    Timeout(&'a str),
    /// As `Timeout`, for an HTTP/2 stream whose header block never came whole.
    StreamTimeout(&'a str),
}

impl HeadReply<'_> {
    /// The protocol the request came in, as the record shows it.
    pub(super) fn protocol(&self) -> &'static str {
        match self {
            HeadReply::StreamTimeout(_) => "HTTP/2",
            HeadReply::Codec | HeadReply::Timeout(_) => "HTTP/1.1",
        }
    }
}

/// Writes the access-log line Envoy writes for a request answered before its head came whole,
/// once its answer (as `local_reply_config` left it: `status`, `headers`, a body of `body_len`
/// bytes) is written
/// and the connection closes: no request headers, `HTTP/1.1` (`HTTP/2` for a stream's header
/// block), and `details` (the codec's
/// `http1.codec_error`, `http1.headers_too_large`, `low_version`, ..., or the timeout's);
/// `wire`: the exchange's bytes on the connection.
pub(super) fn log_head_reply(
    ctx: &ConnContext,
    (status, headers, body_len): (http::StatusCode, &HeaderMap, u64),
    details: &str,
    kind: HeadReply,
    wire: WireBytes,
) {
    let logs = &ctx.hcm.config.access_logs;
    if logs.is_empty() {
        return;
    }
    let mut rec = codec_record(downstream_of(ctx), status, details);
    rec.protocol = Some(kind.protocol());
    match kind {
        HeadReply::Codec => rec.flags.set(ResponseFlag::DownstreamProtocolError),
        HeadReply::Timeout(text) | HeadReply::StreamTimeout(text) => {
            rec.local_reply_body = Some(text.to_owned())
        }
    }
    rec.bytes_sent = body_len;
    rec.downstream_wire = wire;
    rec.response_headers = Some(headers.clone());
    rec.end = Some(Instant::now());
    logs.log(&rec);
}

/// The connection's side as records see it: the peer (no `x-forwarded-for` read yet), the
/// local address and the TLS SNI.
pub(super) fn downstream_of(ctx: &ConnContext) -> Downstream {
    Downstream {
        remote: Some(ctx.down.peer),
        direct_remote: Some(ctx.down.peer),
        local: Some(ctx.local),
        server_name: ctx.down.tls.as_ref().and_then(|t| t.server_name().cloned()),
        filter_state: ctx.down.tls.clone().map(|t| t as _),
    }
}

/// The record of a request Envoy's HTTP/1 codec refused with `status`, before its response:
/// `HTTP/1.1` and the codec's `details`, what `local_reply_config`'s mappers read (Envoy
/// sets the `DPE` flag only after the reply, for the access logs).
pub(super) fn codec_record(down: Downstream, status: http::StatusCode, details: &str) -> Record {
    let mut rec = Record::new(down);
    rec.protocol = Some("HTTP/1.1");
    rec.response_code = Some(status.as_u16());
    rec.details = Some(details.to_owned());
    rec
}

/// A request being served whose record some access log or its span will read. Dropped before
/// [`Pending::finish`] (the client went away), it writes the record with `DC`.
pub(super) struct Pending {
    rec: Option<Box<Record>>,
    logs: AccessLogs,
    received: Arc<Received>,
    tunnel: Option<oneshot::Sender<Handover>>,
    /// The request's trace, once routing decided it.
    trace: Option<RequestTrace>,
    /// The stream's wire bytes so far.
    wire: Option<StreamWire>,
}

impl Pending {
    /// Starts the record of `req` (its headers as the connection manager leaves them, when an
    /// access log reads them) and counts its body; `None` when the connection manager has
    /// neither access logs, tracing, `local_reply_config` (whose mappers read the record) nor
    /// `istio.stats` (which reads its flags). `wire`: the stream's meter, started before the
    /// connection manager changed the request.
    pub(super) fn start(
        ctx: &ConnContext,
        req: &mut Request<Body>,
        wire: Option<StreamWire>,
    ) -> Option<Pending> {
        let logs = &ctx.hcm.config.access_logs;
        let local_reply = ctx.hcm.config.local_reply.is_some();
        if !ctx.hcm.keeps_records() {
            return None;
        }
        let mut rec = Box::new(Record::new(downstream_of(ctx)));
        rec.protocol = Some(super::trace::protocol_name(req.version()));
        rec.request = (!logs.is_empty() || local_reply).then(|| RequestHead {
            method: req.method().as_str().to_owned(),
            path: req
                .uri()
                .path_and_query()
                .map_or_else(String::new, |p| p.as_str().to_owned()),
            authority: req
                .uri()
                .authority()
                .map(|a| a.as_str())
                .or_else(|| {
                    req.headers()
                        .get(http::header::HOST)
                        .and_then(|h| h.to_str().ok())
                })
                .unwrap_or_default()
                .to_owned(),
            scheme: if ctx.down.tls.is_some() {
                "https"
            } else {
                "http"
            },
            headers: req.headers().clone(),
        });
        let received = Arc::new(Received::default());
        if http_body::Body::is_end_stream(req.body()) {
            let _ = received.done.set(rec.start);
        } else {
            let body = std::mem::replace(req.body_mut(), crate::body::empty());
            *req.body_mut() = Counted {
                inner: body,
                received: received.clone(),
            }
            .boxed_unsync();
        }
        Some(Pending {
            rec: Some(rec),
            logs: logs.clone(),
            received,
            tunnel: None,
            trace: None,
            wire,
        })
    }

    /// Where the tunnel of an upgrade learns its record: the record goes there once the
    /// response is sent, unless the receiver is gone by then (no tunnel was made).
    pub(super) fn hand_to_tunnel(&mut self) -> oneshot::Receiver<Handover> {
        let (tx, rx) = oneshot::channel();
        self.tunnel = Some(tx);
        rx
    }

    /// The record, to fill in.
    pub(super) fn record(&mut self) -> &mut Record {
        self.rec.as_mut().expect("a pending record until finished")
    }

    /// Decides the request's trace once it is routed (`route`: `None` when none matched);
    /// nothing when the connection manager does not trace.
    pub(super) fn begin_trace(
        &mut self,
        ctx: &ConnContext,
        route: Option<&Route>,
        headers: &HeaderMap,
        seen: &Seen<'_>,
    ) {
        self.trace = RequestTrace::begin(ctx, route, headers, seen);
        let forced = self.trace.as_ref().is_some_and(|t| t.service_forced);
        self.record().service_forced_trace = forced;
    }

    /// The request's trace, once decided.
    pub(super) fn trace(&mut self) -> Option<&mut RequestTrace> {
        self.trace.as_mut()
    }

    /// The `x-request-id` the trace decision wrote, when it changed the request's.
    pub(super) fn traced_request_id(&self) -> Option<&HeaderValue> {
        self.trace.as_ref()?.request_id.as_ref()
    }

    /// Notes the response about to be sent and hands the record to its body, which writes it
    /// (and finishes the span) when it ends. `details` defaults to `via_upstream` when a
    /// response came from upstream. A record that neither an access log, a reported span nor
    /// `istio.stats` (through [`Record::flags_out`]) reads is dropped here.
    pub(super) fn finish(mut self, mut resp: Response<Body>, head: bool) -> Response<Body> {
        let Some(mut rec) = self.rec.take() else {
            return resp;
        };
        let trace = self.trace.take().map(|mut t| {
            t.respond(&mut resp);
            t
        });
        let trace = trace.filter(RequestTrace::reported);
        if self.logs.is_empty() && trace.is_none() && rec.flags_out.is_none() {
            return resp;
        }
        let status = resp.status().as_u16();
        rec.response_code = Some(status);
        let mut wire = self.wire.take();
        if let Some(w) = wire.as_mut() {
            // An HTTP/1 upstream's response (the version the upstream answered in, still).
            let h1_upstream = rec.details.as_deref() == Some("via_upstream")
                && resp.version() <= http::Version::HTTP_11;
            w.respond(&resp, h1_upstream);
        }
        // A record only istio.stats reads needs no copy of the headers.
        if !self.logs.is_empty() || trace.is_some() {
            rec.response_headers = Some(resp.headers().clone());
        }
        let expected = if head || status == 204 || status == 304 {
            Some(0)
        } else {
            resp.headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok())
        };
        let logs = std::mem::take(&mut self.logs);
        let received = self.received.clone();
        let tunnel = self.tunnel.take();
        resp.map(move |inner| {
            Logged {
                inner,
                rec: Some(rec),
                logs,
                received,
                expected,
                tunnel,
                trace,
                wire,
            }
            .boxed_unsync()
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(mut rec) = self.rec.take() {
            rec.end = Some(Instant::now());
            rec.flags.set(ResponseFlag::DownstreamConnectionTermination);
            if rec.details.is_none() {
                rec.details = Some("downstream_remote_disconnect".to_owned());
            }
            take_received(&mut rec, &self.received, self.wire.as_ref());
            rec.settle();
            if let Some(t) = self.trace.take() {
                t.finish(&rec);
            }
            self.logs.log(&rec);
        }
    }
}

/// Notes in `rec` what the request body brought and, with the stream's meter, its wire bytes
/// (the response body's as counted in the record so far).
fn take_received(rec: &mut Record, received: &Received, wire: Option<&StreamWire>) {
    rec.bytes_received = received.bytes.load(Ordering::Relaxed);
    rec.last_downstream_rx = received.done.get().copied();
    if let Some(w) = wire {
        let frames = received.frames.load(Ordering::Relaxed);
        rec.downstream_wire = w.bytes(rec.bytes_received, frames, rec.bytes_sent);
    }
}

/// A request body counted as it arrives.
struct Counted {
    inner: Body,
    received: Arc<Received>,
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.received
                        .bytes
                        .fetch_add(d.len() as u64, Ordering::Relaxed);
                    this.received.frames.fetch_add(1, Ordering::Relaxed);
                }
                if frame.is_trailers() || http_body::Body::is_end_stream(&this.inner) {
                    let _ = this.received.done.set(Instant::now());
                }
            }
            Poll::Ready(None) => {
                let _ = this.received.done.set(Instant::now());
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A response body counted as it leaves; writes the record when it ends (or is dropped).
struct Logged {
    inner: Body,
    rec: Option<Box<Record>>,
    logs: AccessLogs,
    received: Arc<Received>,
    /// The body length the head announced.
    expected: Option<u64>,
    /// The tunnel of an upgrade, which writes the record when it closes.
    tunnel: Option<oneshot::Sender<Handover>>,
    /// The span to finish with the record.
    trace: Option<RequestTrace>,
    /// The stream's wire bytes so far.
    wire: Option<StreamWire>,
}

impl Logged {
    fn write(&mut self, complete: bool, trailers: Option<HeaderMap>) {
        let Some(mut rec) = self.rec.take() else {
            return;
        };
        rec.end = Some(Instant::now());
        rec.response_trailers = trailers;
        let complete = complete
            || http_body::Body::is_end_stream(&self.inner)
            || self.expected.is_some_and(|n| rec.bytes_sent >= n);
        if !complete {
            rec.flags.set(ResponseFlag::DownstreamConnectionTermination);
        }
        take_received(&mut rec, &self.received, self.wire.as_ref());
        rec.settle();
        let logs = std::mem::take(&mut self.logs);
        let trace = self.trace.take();
        let unsent = match self.tunnel.take() {
            Some(tunnel) => tunnel.send((rec, logs, trace)).err(),
            None => Some((rec, logs, trace)),
        };
        if let Some((rec, logs, trace)) = unsent {
            if let Some(t) = trace {
                t.finish(&rec);
            }
            logs.log(&rec);
        }
    }
}

/// How a tunnel ended: bytes each way, and which side closed first.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TunnelEnd {
    /// Bytes from the downstream.
    pub received: u64,
    /// Bytes to the downstream.
    pub sent: u64,
    /// The side that closed (or failed) first; `None` when the tunnel never formed or its
    /// filter chain's drain ended it.
    pub closed_first: Option<Side>,
}

/// One side of a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// The client's connection.
    Downstream,
    /// The upstream's connection.
    Upstream,
}

/// Writes an upgrade's record handed over by `handover` (if it was) with how its tunnel ended,
/// flagged as Envoy flags the stream then: `DC` when the downstream closed first, `UC` when the
/// upstream did (a reset after the response started); then hands it to what waits for the
/// tunnel's end ([`Record::at_tunnel_end`]).
pub(super) async fn log_tunnel(handover: oneshot::Receiver<Handover>, end: TunnelEnd) {
    let Ok((mut rec, logs, trace)) = handover.await else {
        return;
    };
    rec.end = Some(Instant::now());
    rec.bytes_received = end.received;
    rec.bytes_sent = end.sent;
    // The tunnel's bytes are the stream's, after its heads.
    rec.downstream_wire.received += end.received;
    rec.downstream_wire.sent += end.sent;
    match end.closed_first {
        Some(Side::Downstream) => {
            rec.flags.set(ResponseFlag::DownstreamConnectionTermination);
            rec.details = Some("downstream_remote_disconnect".to_owned());
        }
        Some(Side::Upstream) => {
            rec.flags.set(ResponseFlag::UpstreamConnectionTermination);
            rec.details =
                Some("upstream_reset_after_response_started{connection_termination}".to_owned());
        }
        None => {}
    }
    rec.settle();
    if let Some(t) = trace {
        t.finish(&rec);
    }
    logs.log(&rec);
    if let Some(waiting) = rec.at_tunnel_end.take()
        && let Ok(w) = waiting.await
    {
        w.ended(Some(&rec));
    }
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref()
                    && let Some(rec) = this.rec.as_mut()
                {
                    rec.bytes_sent += d.len() as u64;
                    if let Some(w) = this.wire.as_mut() {
                        w.sent_data(d.len());
                    }
                }
                if let Some(t) = frame.trailers_ref() {
                    if let Some(w) = this.wire.as_mut() {
                        w.sent_end(Some(t), false);
                    }
                    this.write(true, Some(t.clone()));
                } else if http_body::Body::is_end_stream(&this.inner) {
                    if let Some(w) = this.wire.as_mut() {
                        w.sent_end(None, false);
                    }
                    this.write(true, None);
                }
            }
            Poll::Ready(None) => {
                if let Some(w) = this.wire.as_mut() {
                    w.sent_end(None, true);
                }
                this.write(true, None);
            }
            Poll::Ready(Some(Err(e))) => {
                // A stream limit or the upstream's reset ends the stream, which is reset
                // downstream as Envoy resets it: logged without the client's `DC`.
                if let Some(rec) = this.rec.as_mut() {
                    match super::stream_limits::limit_of(e) {
                        Some(limit) => limit.note(rec),
                        None => {
                            let reason = ResetReason::of_body_error(&**e);
                            if let Some(flag) = ResponseFlag::from_short(reason.response_flag()) {
                                rec.flags.set(flag);
                            }
                            rec.details = Some(reason.details_after_response_started());
                        }
                    }
                }
                this.write(true, None);
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.write(false, None);
    }
}
