//! The HTTP connection manager: serves downstream HTTP/1.1 (common requests on its own fast
//! path, `h1`) and HTTP/2 (with hyper) and runs each request through the router.

mod access_log;
mod attempts;
mod body_activity;
pub(crate) mod buffered_body;
mod conn_limits;
mod connect;
mod envoy_errors;
pub mod filters;
pub mod forwarding;
mod framing;
#[cfg(fuzzing)]
pub(crate) mod fuzzing;
mod grpc_timeout;
mod h1;
mod h2_head;
mod head_scan;
mod head_timeout;
mod int_value;
pub mod local_reply;
mod mirror;
mod path;
mod reason;
mod request_timeout;
mod retry;
mod router;
mod stats;
mod stream_limits;
mod timeouts;
mod trace;
mod upgrade;
mod upgrade_wire;
pub mod wire_meter;
mod xfcc;

pub use conn_limits::ConnLimits;
pub use stats::{CodecCounted, HcmStats, ResponseClasses};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::either::Either;

use crate::config::hcm::{Codec, HcmConfig};
use crate::shared::Shared;
use forwarding::Downstream;

/// A connection manager ready to serve: its config plus resolved stats handles.
#[derive(Debug)]
pub struct Hcm {
    /// The compiled configuration.
    pub config: Arc<HcmConfig>,
    /// Its stats (`http.<stat_prefix>.*`).
    pub stats: HcmStats,
    /// Its HTTP filters before the router.
    pub filters: filters::Chain,
    /// Set when a listener update changed or removed its filter chain: its connections start
    /// their drain at a response (per `--drain-strategy`), and close when the drain time ends.
    pub retirement: crate::drain::Retirement,
    /// `http.<stat_prefix>.tracing.*` (client_enabled, health_check, not_traceable,
    /// random_sampling, service_forced), when it traces.
    tracing_stats: Option<[crate::stats::Counter; 4]>,
    /// Its tracer, found on the first traced request.
    tracer: std::sync::OnceLock<Option<Arc<crate::trace::Exporter>>>,
}

impl Hcm {
    /// Whether its requests keep an access-log record while they are served: for access
    /// logs, tracing, `local_reply_config` (whose mappers read it) or `istio.stats` (which
    /// reads its flags and wire bytes).
    pub fn keeps_records(&self) -> bool {
        !self.config.access_logs.is_empty()
            || self.config.tracing.is_some()
            || self.config.local_reply.is_some()
            || self.filters.has_istio_stats()
    }

    /// Resolves the stats handles of `config`, on the listener whose stats are under
    /// `listener` (its `listener.<address>`).
    pub fn new(config: Arc<HcmConfig>, store: &crate::stats::Store, listener: &str) -> Self {
        let stats = HcmStats::new(store, &config.stat_prefix, listener);
        let filters = filters::Chain::new(&config.filters, store, &config.stat_prefix);
        let tracing_stats = config.tracing.as_ref().map(|_| {
            let p = &config.stat_prefix;
            // Envoy registers health_check too; revoy has no health-check filter to count.
            let _ = store.counter(&format!("http.{p}.tracing.health_check"));
            [
                "client_enabled",
                "not_traceable",
                "random_sampling",
                "service_forced",
            ]
            .map(|s| store.counter(&format!("http.{p}.tracing.{s}")))
        });
        Hcm {
            config,
            stats,
            filters,
            retirement: crate::drain::Retirement::default(),
            tracing_stats,
            tracer: std::sync::OnceLock::new(),
        }
    }

    /// Counts a trace decision.
    pub fn tracing_stats(&self, reason: crate::trace::request_id::Reason) {
        use crate::trace::request_id::Reason;
        if let Some([client, not_traceable, random, forced]) = &self.tracing_stats {
            match reason {
                Reason::ClientForced => client.inc(),
                Reason::NotTraceable => not_traceable.inc(),
                Reason::Sampling => random.inc(),
                Reason::ServiceForced => forced.inc(),
            }
        }
    }

    /// The tracer spans go to (started on first use); `None` without a provider.
    pub fn exporter(&self, shared: &Shared) -> Option<Arc<crate::trace::Exporter>> {
        self.tracer
            .get_or_init(|| {
                let provider = self.config.tracing.as_ref()?.provider.as_ref();
                shared.tracers.exporter(provider)
            })
            .clone()
    }
}

/// Everything a request on one downstream connection needs.
pub struct ConnContext {
    /// The connection manager serving the connection.
    pub hcm: Arc<Hcm>,
    /// Process-wide state (clusters, RDS tables, stats).
    pub shared: Arc<Shared>,
    /// Peer and TLS facts.
    pub down: Downstream,
    /// Local address (after `original_dst`).
    pub local: SocketAddr,
    /// Original destination, when the connection was redirected.
    pub original_dst: Option<SocketAddr>,
    /// Which drains concern the listener (`traffic_direction`, `drain_type`).
    pub drain_scope: crate::drain::Scope,
    /// The connection's own local rate limit buckets
    /// (`local_rate_limit_per_downstream_connection`), made on first use.
    pub rate_limiter: std::sync::OnceLock<Box<crate::limits::LocalLimiter>>,
    /// The connection's notes for its streams' wire bytes (an HTTP/1 message in flight, an
    /// HTTP/2 connection's HPACK tables); set when the connection manager keeps records
    /// ([`Hcm::keeps_records`]).
    pub wire: Option<Arc<wire_meter::ConnWire>>,
    /// Where the connection stands against its limits (idle timeout, duration, requests).
    pub limits: ConnLimits,
    /// The codec it was counted under, active while the context lives.
    pub codec: stats::CodecCounted,
}

impl ConnContext {
    /// Envoy's check on each response: when the server drains (a failed health check, a
    /// draining listener or filter chain, see [`crate::drain`]) and the connection does not
    /// drain yet, the connection's drain starts (the one its limits start, see
    /// [`conn_limits`]), counted in `downstream_cx_drain_close`; whether it started now.
    fn server_drain(&self) -> bool {
        let drain = self.shared.drain();
        let told =
            drain.close_retired(&self.hcm.retirement) || drain.close_connection(self.drain_scope);
        if !told || !self.limits.start_drain(tokio::time::Instant::now()) {
            return false;
        }
        self.hcm.stats.cx_drain_close.inc();
        true
    }
}

/// A request Envoy's codecs refuse before routing.
enum Rejection {
    /// Answer with this local reply and close the connection.
    Reply(http::Response<crate::body::Body>, RefusedBy),
    /// Reset the HTTP/2 stream without a response.
    ResetStream,
}

/// What refused a request before routing.
#[derive(Debug, Clone, Copy)]
enum RefusedBy {
    /// Envoy's codec, with its error's response details (its access logs show them on
    /// HTTP/1): a protocol error.
    Codec(&'static str),
    /// The connection manager (an HTTP/1 `QUERY`): not a protocol error.
    Manager,
}

/// The stream was reset because the request broke a codec limit.
#[derive(Debug, thiserror::Error)]
#[error("request rejected by the codec: headers over the configured limits")]
struct StreamReset;

/// Envoy's codec-level rejections that hyper lets through:
/// - 400: a method with lowercase letters, an HTTP/1 method Envoy's codec does not know, or an
///   authority-form target on anything but CONNECT;
/// - headers over `max_request_headers_kb` or `max_headers_count`: 431 on HTTP/1, a stream
///   reset on HTTP/2;
/// - 426: an HTTP/1.0 request without `accept_http_10`;
/// - 501: an HTTP/1 request with a `transfer-encoding` other than one `chunked` and no
///   `content-length`.
fn reject_early<B>(req: &http::Request<B>, cfg: &HcmConfig) -> Option<Rejection> {
    let authority_form = req.uri().scheme().is_none()
        && req.uri().authority().is_some()
        && req.method() != http::Method::CONNECT;
    let lowercase_method = req
        .method()
        .as_str()
        .bytes()
        .any(|b| b.is_ascii_lowercase());
    let mut header_bytes = 0;
    let (mut length, mut codings, mut chunked_only) = (false, 0, true);
    for (n, v) in req.headers() {
        header_bytes += n.as_str().len() + v.len();
        if n == http::header::CONTENT_LENGTH {
            length = true;
        } else if n == http::header::TRANSFER_ENCODING {
            codings += 1;
            chunked_only &= v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked");
        }
    }
    let http1 = req.version() < http::Version::HTTP_2;
    let unsupported_coding = http1 && !length && codings > 0 && (codings > 1 || !chunked_only);
    let too_many = req.headers().len() > cfg.max_headers_count as usize;
    let too_large = header_bytes > cfg.max_request_headers_kb as usize * 1024 || too_many;
    let unknown_method = http1 && !known_http1_method(req.method().as_str());
    let (status, text, refused) = if unknown_method && req.method().as_str() == "QUERY" {
        // Envoy's codec knows QUERY but the connection manager refuses it, without a body.
        (http::StatusCode::BAD_REQUEST, "", RefusedBy::Manager)
    } else if lowercase_method || unknown_method || authority_form {
        (
            http::StatusCode::BAD_REQUEST,
            "Bad Request",
            RefusedBy::Codec("http1.codec_error"),
        )
    } else if too_large && req.version() == http::Version::HTTP_2 {
        return Some(Rejection::ResetStream);
    } else if too_large {
        // Envoy's codec counts the headers as it reads them, before it judges the version
        // and the codings at the head's end.
        (
            http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "Request Header Fields Too Large",
            RefusedBy::Codec(if too_many {
                "http1.too_many_headers"
            } else {
                "http1.headers_too_large"
            }),
        )
    } else if req.version() < http::Version::HTTP_11 && !cfg.accept_http_10 {
        (
            http::StatusCode::UPGRADE_REQUIRED,
            "Upgrade Required",
            RefusedBy::Codec("low_version"),
        )
    } else if unsupported_coding {
        (
            http::StatusCode::NOT_IMPLEMENTED,
            "Not Implemented",
            RefusedBy::Codec("http1.invalid_transfer_encoding"),
        )
    } else {
        return None;
    };
    let mut resp = local_reply::local_reply(status, text);
    // Set here (hyper would add it as it writes) so that the access log sees it.
    let now = httpdate::fmt_http_date(std::time::SystemTime::now());
    if let Ok(date) = http::HeaderValue::from_str(&now) {
        resp.headers_mut().insert(http::header::DATE, date);
    }
    forwarding::set_server(cfg, resp.headers_mut());
    resp.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    Some(Rejection::Reply(resp, refused))
}

/// Whether Envoy 1.40's HTTP/1 codec accepts `method`: the methods of the http-parser table,
/// except `M-SEARCH`, which it refuses (each probed through Envoy; `QUERY`, `LABEL` or any
/// other extension method gets 400).
fn known_http1_method(method: &str) -> bool {
    matches!(
        method,
        "GET"
            | "POST"
            | "PUT"
            | "DELETE"
            | "HEAD"
            | "OPTIONS"
            | "PATCH"
            | "TRACE"
            | "CONNECT"
            | "COPY"
            | "LOCK"
            | "MKCOL"
            | "MOVE"
            | "PROPFIND"
            | "PROPPATCH"
            | "SEARCH"
            | "UNLOCK"
            | "BIND"
            | "REBIND"
            | "UNBIND"
            | "ACL"
            | "REPORT"
            | "MKACTIVITY"
            | "CHECKOUT"
            | "MERGE"
            | "NOTIFY"
            | "SUBSCRIBE"
            | "UNSUBSCRIBE"
            | "PURGE"
            | "MKCALENDAR"
            | "LINK"
            | "UNLINK"
            | "SOURCE"
    )
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Envoy's reaction to a connection that speaks the wrong protocol for the codec: an HTTP/2
/// preface on an HTTP/1-only connection gets a 400, anything but the preface on an
/// HTTP/2-only connection is closed silently (after reading what arrived, so the close is
/// clean); one that sends nothing is closed by its limits. Returns whether the connection may
/// be served.
async fn codec_accepts(stream: &mut TcpStream, codec: Codec, ctx: &ConnContext) -> bool {
    let stats = &ctx.hcm.stats;
    if codec == Codec::Auto {
        return true;
    }
    let mut buf = [0u8; 24];
    let n = tokio::select! {
        n = stream.peek(&mut buf) => n.unwrap_or(0),
        // The idle timeout or the duration closes a connection that sends nothing.
        () = conn_limits::silent_until_closed(ctx) => return false,
    };
    let head = &buf[..n];
    // Envoy makes the connection's codec, and counts it, when the first bytes arrive, even
    // when the codec then refuses them; HTTP/1 connections it serves count in `h1`.
    if n > 0 && codec == Codec::Http2 {
        stats.codec(true, &ctx.codec);
    }
    match codec {
        Codec::Http2 if H2_PREFACE.starts_with(head) => true,
        Codec::Http2 => {
            // Envoy's codec has read what arrived when it gives up, so its close is a clean
            // FIN; closing with those bytes unread would reset the connection instead.
            // At most 64 KiB, so a client that keeps sending cannot hold the worker.
            let mut sink = [0u8; 4096];
            for _ in 0..16 {
                if !matches!(stream.try_read(&mut sink), Ok(n) if n > 0) {
                    break;
                }
            }
            false
        }
        Codec::Http1 if n >= 14 && head.starts_with(&H2_PREFACE[..14]) => {
            stats.codec(false, &ctx.codec);
            stats.refused_by_http1_codec(400);
            if let Some(w) = &ctx.wire {
                w.read_head(n, 0, 0);
            }
            let reply = envoy_errors::codec_reply(
                Some(ctx),
                http::StatusCode::BAD_REQUEST,
                "http1.codec_error",
                None,
            );
            let _ = stream.write_all(&reply).await;
            false
        }
        _ => true,
    }
}

/// Serves one plaintext downstream connection until it closes: HTTP/1 on the fast path
/// (`h1`), which hands unusual requests and HTTP/2 to hyper's server.
pub async fn serve(mut stream: TcpStream, ctx: Arc<ConnContext>) {
    let codec = ctx.hcm.config.codec;
    if !codec_accepts(&mut stream, codec, &ctx).await {
        return;
    }
    // A guard rather than a wrapper future: an async wrapper would hold the connection's
    // future twice (as its argument and as what it awaits), doubling every connection's task.
    let hcm = ctx.hcm.clone();
    let _open = hcm.stats.open();
    match codec {
        // Boxed (once per connection): hyper's server is kilobytes that an HTTP/1 connection's
        // task would otherwise carry.
        Codec::Http2 => {
            crate::spawn::boxed(|| {
                let io = envoy_errors::EnvoyErrors::new(stream).with_context(ctx.clone());
                serve_io(io, ctx, codec, true)
            })
            .await
        }
        Codec::Http1 | Codec::Auto => h1::serve(stream, ctx, codec).await,
    }
}

/// Serves one TLS downstream connection until it closes; ALPN (`h2`, `http/1.1`) picks the
/// codec, and HTTP/1 takes the fast path as over plaintext. The caller counts the connection
/// open (`hcm.stats.open()`) while it awaits: an `async fn` would keep its arguments beside the
/// future it awaits, which holds them too.
pub fn serve_tls(
    stream: crate::tls::ServerStream,
    ctx: Arc<ConnContext>,
) -> impl Future<Output = ()> + Send {
    let codec = match stream.get_ref().1.alpn_protocol() {
        Some(b"h2") => Codec::Http2,
        Some(b"http/1.1") => Codec::Http1,
        _ => ctx.hcm.config.codec,
    };
    if codec == Codec::Http2 {
        ctx.hcm.stats.codec(true, &ctx.codec);
    }
    match codec {
        Codec::Http2 => Either::Left(crate::spawn::boxed(|| async move {
            // The idle timeout or the duration closes a connection that sends nothing.
            let first_bytes = std::future::poll_fn(|cx| h1::Downstream::poll_readable(&stream, cx));
            tokio::select! {
                _ = first_bytes => {}
                () = conn_limits::silent_until_closed(&ctx) => return,
            }
            let io = envoy_errors::EnvoyErrors::new(stream).with_context(ctx.clone());
            serve_io(io, ctx, codec, true).await
        })),
        Codec::Http1 | Codec::Auto => Either::Right(h1::serve(stream, ctx, codec)),
    }
}

/// Serves a connection with hyper's server (`http2`: it speaks HTTP/2), and runs its limits
/// (see [`conn_limits`]).
async fn serve_io<I>(io: I, ctx: Arc<ConnContext>, codec: Codec, http2: bool)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(crate::spawn::Executor);
    builder
        .http1()
        .timer(TokioTimer::new())
        // Envoy has no request-headers timeout unless `request_headers_timeout` is set; hyper's
        // default would arm a timer for every request.
        .header_read_timeout(None)
        .preserve_header_case(false);
    builder.http2().timer(TokioTimer::new());
    if ctx.hcm.config.allow_connect {
        builder.http2().enable_connect_protocol();
    }
    let builder = match codec {
        Codec::Http1 => builder.http1_only(),
        Codec::Http2 => builder.http2_only(),
        Codec::Auto => builder,
    };
    let svc_ctx = ctx.clone();
    // An HTTP/2 stream that reaches the request limit, or is answered while the server
    // drains, starts the connection's drain: its first GOAWAY goes out.
    let drain = Arc::new(tokio::sync::Notify::new());
    let svc_drain = drain.clone();
    let service = service_fn(move |req| {
        let ctx = svc_ctx.clone();
        let drain = svc_drain.clone();
        // Boxed: hyper's HTTP/2 server moves the service future into a task per stream (twice,
        // see `spawn`), and the whole request's future is kilobytes; a box moves as a pointer.
        crate::spawn::boxed(|| async move {
            match reject_early(&req, &ctx.hcm.config) {
                None => {}
                Some(Rejection::Reply(mut resp, refused)) => {
                    let http1 = req.version() < http::Version::HTTP_2;
                    let details = match refused {
                        RefusedBy::Codec(details) if http1 => Some(details),
                        _ => None,
                    };
                    // As on every response: an HTTP/1.0 client's connection then closes
                    // without hyper adding `keep-alive` to the `close`.
                    *resp.version_mut() = req.version();
                    // Envoy's codec and connection manager refuse through local replies,
                    // which `local_reply_config` rewrites like any other.
                    if let Some(config) = &ctx.hcm.config.local_reply {
                        let mut rec = access_log::codec_record(
                            access_log::downstream_of(&ctx),
                            resp.status(),
                            details.unwrap_or_default(),
                        );
                        resp = local_reply::map(config, resp, &mut rec);
                    }
                    match refused {
                        _ if !http1 => {
                            ctx.hcm.stats.rq_total.inc();
                            ctx.hcm.stats.rq_http2_total.inc();
                            ctx.hcm.stats.response(resp.status().as_u16());
                        }
                        RefusedBy::Codec(_) => {
                            ctx.hcm.stats.refused_by_http1_codec(resp.status().as_u16());
                        }
                        RefusedBy::Manager => ctx.hcm.stats.refused_http1(resp.status().as_u16()),
                    }
                    if let Some(details) = details {
                        let len = http_body::Body::size_hint(resp.body()).exact();
                        let len = len.unwrap_or_default();
                        // The head hyper writes, for the exchange's wire bytes.
                        let wire = ctx.wire.as_ref().map_or_else(Default::default, |w| {
                            h1::note_head(&mut resp, req.method() == http::Method::HEAD, w);
                            w.answered(len)
                        });
                        access_log::log_head_reply(
                            &ctx,
                            (resp.status(), resp.headers(), len),
                            details,
                            access_log::HeadReply::Codec,
                            wire,
                        );
                    }
                    return Ok(resp);
                }
                Some(Rejection::ResetStream) => return Err(StreamReset),
            }
            let (stream, reached) = conn_limits::StreamEnd::start(ctx.clone());
            if reached {
                if req.version() < http::Version::HTTP_2 {
                    ctx.limits.close_after_response();
                } else if ctx.limits.start_drain(tokio::time::Instant::now()) {
                    drain.notify_one();
                }
            }
            let started = std::time::Instant::now();
            let (mut req, extended_connect) = upgrade::from_extended_connect(req);
            let version = req.version();
            // Envoy's HTTP/1.0 connection: kept when the request asks `keep-alive` (and the
            // response says so), else closed after the response, which says `close`.
            let keep_alive_10 = (version == http::Version::HTTP_10).then(|| {
                req.headers()
                    .get_all(http::header::CONNECTION)
                    .iter()
                    .any(|v| crate::wire::has_token(v.as_bytes(), b"keep-alive"))
            });
            if version == http::Version::HTTP_10
                && !req.headers().contains_key(http::header::HOST)
                && let Some(host) = &ctx.hcm.config.default_host_for_http_10
            {
                req.headers_mut().insert(http::header::HOST, host.clone());
            }
            let head = req.method() == http::Method::HEAD;
            let drop_trailers = version < http::Version::HTTP_2 && !ctx.hcm.config.http1_trailers;
            // Envoy's HTTP/1 codec drops a chunked request's trailers unless `enable_trailers`.
            let drop_request_trailers =
                drop_trailers && req.headers().contains_key(http::header::TRANSFER_ENCODING);
            let mut finished = None;
            let req = req.map(|b| {
                let mut body = crate::body::boxed(b);
                if drop_request_trailers {
                    body = crate::body::without_trailers(body);
                }
                if version < http::Version::HTTP_2 && !http_body::Body::is_end_stream(&body) {
                    let (tracked, flag) = crate::body::tracked(body);
                    finished = Some(flag);
                    body = tracked;
                }
                body
            });
            let mut resp = router::handle(req, &ctx).await;
            if extended_connect {
                upgrade::to_extended_connect(&mut resp);
            }
            // Envoy answers a request whose body is still arriving and closes the connection
            // after the response; its router then has no upstream service time to report
            // (revoy's own HTTP/1.1 path does the same in `h1::response::write`).
            if finished.is_some_and(|f| !f.get()) {
                resp.headers_mut().remove(&router::UPSTREAM_SERVICE_TIME);
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            let upgraded = resp.status() == http::StatusCode::SWITCHING_PROTOCOLS;
            // A draining server starts the connection's drain on this response, as Envoy does
            // (the loop serving the connection then times its end).
            if !upgraded && ctx.server_drain() {
                drain.notify_one();
            }
            // A draining or closing HTTP/1 connection says so: with the header, hyper's server
            // closes after the response; an HTTP/1.1 one that drains, or an HTTP/1.0 one
            // whose request asked `keep-alive` (which its response then says), gets it in
            // the head on its way out and stays open, as Envoy's. Hyper closes an HTTP/1.0
            // one that did not ask once the drain ends (`envoy_errors`), as Envoy closes it.
            let mut notice = false;
            if version < http::Version::HTTP_2 && !upgraded {
                match ctx.limits.http1_close() {
                    conn_limits::Http1Close::Keep => {}
                    conn_limits::Http1Close::Notice
                        if version == http::Version::HTTP_11 || keep_alive_10 == Some(true) =>
                    {
                        ctx.limits.notice_next_head();
                        notice = true;
                    }
                    _ => {
                        resp.headers_mut().insert(
                            http::header::CONNECTION,
                            http::HeaderValue::from_static("close"),
                        );
                    }
                }
            }
            if let Some(keep_alive) = keep_alive_10
                && !resp.headers().contains_key(http::header::CONNECTION)
            {
                let value = if keep_alive { "keep-alive" } else { "close" };
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static(value),
                );
            }
            reason::set_envoy_phrase(&mut resp);
            // Every response carries the request's version, local replies included: for an
            // HTTP/1.0 client hyper then keeps the connection only if the response says
            // keep-alive (with an HTTP/1.1 head it would add `keep-alive` to our `close`).
            *resp.version_mut() = version;
            // hyper's HTTP/1 server writes announced trailers when the request said
            // `te: trailers`; Envoy's codec drops them unless `enable_trailers` (the fast path
            // in `h1` does the same).
            if drop_trailers && resp.headers().contains_key(http::header::TRAILER) {
                resp = resp.map(crate::body::without_trailers);
            }
            // hyper's HTTP/2 server sends the body of an answer to a HEAD, which the client
            // takes for a protocol error; Envoy sends the headers (content-length included)
            // and ends the stream.
            if head && version == http::Version::HTTP_2 {
                resp = resp.map(|_| crate::body::empty());
            }
            // The HTTP/1 head hyper writes, for the stream's wire bytes (with a drain's notice,
            // which goes in on its way out).
            if version < http::Version::HTTP_2
                && let Some(meter) = &ctx.wire
            {
                let close = http::HeaderValue::from_static("close");
                let before = notice
                    .then(|| resp.headers_mut().insert(http::header::CONNECTION, close))
                    .flatten();
                h1::note_head(&mut resp, head, meter);
                if notice {
                    match before {
                        Some(value) => resp.headers_mut().insert(http::header::CONNECTION, value),
                        None => resp.headers_mut().remove(http::header::CONNECTION),
                    };
                }
            }
            Ok(resp.map(|b| ctx.hcm.stats.timed_body(b, started, stream)))
        })
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut shut = false;
    let mut timer = conn_limits::LimitTimer::default();
    // Once the drain ended: when the connection is cut if it has no stream left by then.
    let mut cut_at = None;
    let limits = &ctx.hcm.config.connection_limits;
    let result = loop {
        let now = tokio::time::Instant::now();
        let deadline = match cut_at {
            Some(cut) => Some(cut),
            None => ctx.limits.next_deadline(limits, Some(now)),
        };
        tokio::select! {
            // First, so the GOAWAY goes out before the response that asked for it.
            biased;
            // An HTTP/2 connection's drain starts with its first GOAWAY; either's end is timed.
            () = drain.notified() => {
                if http2 && !shut {
                    shut = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            () = timer.until(deadline) => {
                let now = tokio::time::Instant::now();
                if cut_at.is_some() {
                    // h2 ends the connection itself once the client answered the shutdown
                    // PING and its streams are done; a client that never answers is cut
                    // when it has no stream left, as Envoy closes it.
                    if !ctx.limits.busy() {
                        break Ok(());
                    }
                    cut_at = Some(now + conn_limits::DELAYED_CLOSE);
                    continue;
                }
                let due = ctx.limits.advance(limits, now, &ctx.hcm.stats, true);
                if due.drain_started && http2 && !shut {
                    shut = true;
                    conn.as_mut().graceful_shutdown();
                }
                if due.drain_ended {
                    // HTTP/1: hyper closes the connection now, or after the response in
                    // progress; HTTP/2: the held PING goes out, h2 sends its final GOAWAY.
                    if !shut {
                        shut = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    cut_at = Some(now + 2 * conn_limits::DELAYED_CLOSE);
                }
            }
            result = conn.as_mut() => break result,
        }
    };
    if let Err(e) = result {
        tracing::debug!(peer = %ctx.down.peer, error = %e, "downstream connection ended with an error");
    }
}
