//! One request's trace in the connection manager: the decision and the span made once the
//! route is known, the context sent upstream (and the upstream request's own span with
//! `spawn_upstream_span`), and Envoy's tags set as the stream ends, read from the request's
//! [`Record`] (the one access logs read: its response flags, sizes and upstream host).

use std::sync::Arc;
use std::time::SystemTime;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::ConnContext;
use crate::access_log::{Record, ResponseFlag};
use crate::body::Body;
use crate::config::tracing::{HcmTracing, Provider};
use crate::route::Route;
use crate::route::tracing::{RouteTracing, TagValue};
use crate::trace::decision::{self, Decision};
use crate::trace::request_id::Reason;
use crate::trace::span::{Kind, Span, new_id};
use crate::trace::{Exporter, context};

static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static DECORATOR_OPERATION: HeaderName = HeaderName::from_static("x-envoy-decorator-operation");
static DOWNSTREAM_CLUSTER: HeaderName =
    HeaderName::from_static("x-envoy-downstream-service-cluster");
static X_CLIENT_TRACE_ID: HeaderName = HeaderName::from_static("x-client-trace-id");
static ORIGINAL_PATH: HeaderName = HeaderName::from_static("x-envoy-original-path");

/// What the request looked like when it was routed (for the span's tags).
pub struct Seen<'a> {
    /// `:authority` / Host, port stripped as routed.
    pub host: &'a str,
    /// The path as routed.
    pub path: &'a str,
    /// The method.
    pub method: &'a str,
    /// `HTTP/1.1`, `HTTP/2`, ...
    pub protocol: &'static str,
    /// `http` or `https`.
    pub scheme: &'static str,
}

/// A traced request's state, from routing to the end of its response.
pub struct RequestTrace {
    exporter: Option<Arc<Exporter>>,
    cfg: Arc<HcmTracing>,
    /// Whether a tracer (the connection manager's `provider`, or the bootstrap's) takes the
    /// trace: without one, Envoy's null tracer sends no context upstream.
    has_tracer: bool,
    provider_is_zipkin: bool,
    /// The request's B3 came as the single `b3` header.
    b3_single: bool,
    span: Span,
    /// The current upstream attempt's span (`spawn_upstream_span`).
    upstream: Option<Span>,
    /// How the current attempt ended, once it did.
    upstream_answer: Option<AttemptEnd>,
    /// The cluster upstream spans are named after, once forwarded with upstream spans.
    upstream_cluster: Option<String>,
    /// The decision's `x-request-id`, when it changed (sent upstream and echoed).
    pub request_id: Option<HeaderValue>,
    /// Whether a service forced the trace (`x-envoy-force-trace`, or an `x-request-id` marked
    /// so): what an access log's `traceable_filter` matches, as in Envoy.
    pub service_forced: bool,
    /// The route's decorator operation, sent back on an ingress response.
    decorated: Option<String>,
    /// Remove `x-envoy-decorator-operation` from the request (ingress) / set it (egress).
    operation_header: Option<Option<String>>,
    /// Tags the request decided, set on the span as it finishes.
    request_tags: Vec<(String, String)>,
    /// Custom tags' values.
    custom: Vec<(String, String)>,
}

/// The trace context a provider reads from the request.
fn incoming(provider_is_zipkin: bool, headers: &HeaderMap) -> Option<context::Incoming> {
    if provider_is_zipkin {
        context::b3(headers)
    } else {
        context::w3c(headers)
    }
}

impl RequestTrace {
    /// Decides whether the request is traced and starts its span (the route, `None` when
    /// there was none); `None` when the connection manager does not trace.
    pub fn begin(
        ctx: &ConnContext,
        route: Option<&Route>,
        headers: &HeaderMap,
        seen: &Seen<'_>,
    ) -> Option<RequestTrace> {
        let cfg = ctx.hcm.config.tracing.clone()?;
        let route_tracing: Option<&RouteTracing> = route.and_then(|r| r.tracing.as_deref());
        let sampling = route_tracing
            .and_then(|t| t.sampling)
            .unwrap_or(cfg.sampling);
        let Decision { reason, request_id } = decision::decide(
            &sampling,
            ctx.hcm.config.request_id,
            headers,
            rand::random(),
        );
        ctx.hcm.tracing_stats(reason);
        let exporter = ctx.hcm.exporter(&ctx.shared);
        let provider = cfg
            .provider
            .as_deref()
            .or(ctx.shared.tracers.default_provider());
        let zipkin = matches!(provider, Some(Provider::Zipkin(_)));
        let has_tracer = provider.is_some();
        // An egress span is CLIENT, except on OpenTelemetry with upstream spans (the upstream
        // span is the client then), as in Envoy 1.40.
        let kind = if cfg.egress && (zipkin || !cfg.spawn_upstream_span) {
            Kind::Client
        } else {
            Kind::Server
        };
        let shared_context = matches!(provider, Some(Provider::Zipkin(z)) if z.shared_span_context);
        let mut span = Span::new(String::new(), kind, 0, new_id());
        // An ingress span shares the caller's id (`shared_span_context`) on Zipkin.
        span.shared = shared_context && !cfg.egress;
        let mut b3_single = false;
        match incoming(zipkin, headers) {
            Some(inc) => {
                span.trace_id = inc.trace_id;
                span.trace_id_128 = inc.trace_id_128;
                // Zipkin follows the caller's B3 flag; OpenTelemetry reports a joined span only
                // when both the caller and this proxy's decision sample it.
                span.sampled = if zipkin {
                    inc.sampled.unwrap_or(reason.traced())
                } else {
                    inc.sampled.unwrap_or(true) && reason.traced()
                };
                span.tracestate = inc.tracestate;
                span.parent_remote = true;
                b3_single = inc.single;
                if span.shared {
                    span.span_id = inc.span_id;
                    span.parent_id = inc.parent_id;
                } else {
                    span.parent_id = Some(inc.span_id);
                }
            }
            None => {
                match provider {
                    // A Zipkin root's trace id ends in its span id.
                    Some(Provider::Zipkin(z)) => {
                        let high = if z.trace_id_128bit {
                            u128::from(new_id()) << 64
                        } else {
                            0
                        };
                        span.trace_id = high | u128::from(span.span_id);
                        span.trace_id_128 = z.trace_id_128bit;
                    }
                    _ => span.trace_id = rand::random::<u128>(),
                }
                span.sampled = match zipkin.then(|| context::b3_sampled_only(headers)).flatten() {
                    Some(s) => s,
                    None => reason.traced(),
                };
            }
        }
        // The span is named by the route's decorator, or on ingress by the caller's
        // `x-envoy-decorator-operation`.
        let route_operation = route_tracing.and_then(|t| t.operation.as_deref());
        let mut named = route_operation;
        let mut decorated = route_operation
            .filter(|_| route_tracing.is_some_and(|t| t.propagate))
            .map(str::to_owned);
        let mut operation_header = None;
        if cfg.egress {
            operation_header = decorated.clone().map(Some);
        } else if let Some(v) = headers.get(&DECORATOR_OPERATION) {
            if let Ok(op) = v.to_str()
                && !op.is_empty()
            {
                named = Some(op);
                decorated = None;
            }
            operation_header = Some(None);
        }
        // A name and tags cost allocations: only a span that will be reported gets them.
        let (request_tags, custom) = if span.sampled && exporter.is_some() {
            // Without a decorator, Zipkin names a span after the request's host,
            // OpenTelemetry by its direction.
            span.name = match named {
                Some(op) => op.to_owned(),
                None if zipkin => seen.host.to_owned(),
                None if cfg.egress => format!("egress {}", seen.host),
                None => "ingress".to_owned(),
            };
            let local = &ctx.shared.tracers.local;
            span.set_tag("node_id", local.node_id.clone());
            span.set_tag("zone", local.zone.clone());
            tags(ctx, &cfg, route_tracing, headers, seen, request_id.as_ref())
        } else {
            (Vec::new(), Vec::new())
        };
        Some(RequestTrace {
            exporter,
            cfg,
            has_tracer,
            provider_is_zipkin: zipkin,
            b3_single,
            span,
            upstream: None,
            upstream_answer: None,
            upstream_cluster: None,
            request_id,
            service_forced: reason == Reason::ServiceForced,
            decorated,
            operation_header,
            request_tags,
            custom,
        })
    }

    /// Applies the decision to the request going upstream (its `x-request-id`, the decorator
    /// header) and, without upstream spans, writes the trace context for the upstream;
    /// `cluster` is where it goes.
    pub fn forward(&mut self, headers: &mut HeaderMap, cluster: &str) {
        if let Some(id) = &self.request_id {
            headers.insert(&X_REQUEST_ID, id.clone());
        }
        match self.operation_header.take() {
            Some(Some(op)) => {
                if let Ok(v) = HeaderValue::from_str(&op) {
                    headers.insert(&DECORATOR_OPERATION, v);
                }
            }
            Some(None) => {
                headers.remove(&DECORATOR_OPERATION);
            }
            None => {}
        }
        if self.cfg.spawn_upstream_span {
            self.upstream_cluster = Some(cluster.to_owned());
        } else {
            self.inject(headers, false);
        }
    }

    /// Writes the context of the request's span, or of the current attempt's (`attempt`).
    fn inject(&self, headers: &mut HeaderMap, attempt: bool) {
        if !self.has_tracer {
            return;
        }
        let carrier = match (&self.upstream, attempt) {
            (Some(up), true) => up,
            _ => &self.span,
        };
        if self.provider_is_zipkin {
            context::inject_b3(
                headers,
                carrier.trace_id,
                carrier.trace_id_128,
                carrier.span_id,
                carrier.parent_id,
                carrier.sampled,
                self.b3_single,
            );
        } else {
            context::inject_w3c(
                headers,
                carrier.trace_id,
                carrier.span_id,
                carrier.sampled,
                &carrier.tracestate,
            );
        }
    }

    /// Whether the span will be reported (sampled, with a tracer to take it).
    pub fn reported(&self) -> bool {
        self.span.sampled && self.exporter.is_some()
    }

    /// An upstream attempt (1 for the first) is about to be sent with `headers`: with
    /// `spawn_upstream_span`, its own CLIENT span starts and its context goes upstream.
    pub fn attempt_started(&mut self, headers: &mut HeaderMap, attempt: u32) {
        let Some(cluster) = &self.upstream_cluster else {
            return;
        };
        let mut up = self
            .span
            .child(format!("router {cluster} egress"), Kind::Client);
        if attempt > 1 {
            up.set_tag("retry.count", (attempt - 1).to_string());
        }
        self.upstream = Some(up);
        self.upstream_answer = None;
        self.inject(headers, true);
    }

    /// The current attempt ended: answered (status, HTTP version), or failed with `flag`, from
    /// `host`. A retried attempt's span ends now (`canceled` when its answer is dropped); the
    /// last one's, answered, when the response body ends ([`RequestTrace::finish`]).
    pub fn attempt_ended(&mut self, end: AttemptEnd) {
        if end.not_sent {
            self.upstream = None;
            return;
        }
        let Some(up) = self.upstream.as_mut() else {
            return;
        };
        if end.retried && end.answer.is_some() {
            up.set_tag("canceled", "true");
        }
        self.upstream_answer = Some(end);
        if self
            .upstream_answer
            .as_ref()
            .is_some_and(|e| e.retried || e.answer.is_none())
        {
            self.end_upstream();
        }
    }

    /// Finishes the current attempt's span with what its end said (nothing: no answer).
    fn end_upstream(&mut self) {
        let Some(mut up) = self.upstream.take() else {
            return;
        };
        let end = self.upstream_answer.take().unwrap_or_default();
        if let Some((_, version)) = end.answer {
            up.set_tag("http.protocol", protocol_name(version));
        }
        if let Some(a) = end.host {
            up.set_tag("upstream_address", a.to_string());
            up.set_tag("peer.address", a.to_string());
        }
        up.set_tag("component", "proxy");
        if let Some(c) = &self.upstream_cluster {
            up.set_tag("upstream_cluster", c.clone());
            up.set_tag("upstream_cluster.name", c.clone());
        }
        let status = end.answer.map_or(0, |(s, _)| s);
        up.set_tag("http.status_code", status.to_string());
        up.set_tag("response_flags", end.flag.map_or("-", ResponseFlag::short));
        if status >= 500 || status == 0 {
            up.set_tag("error", "true");
        }
        for (k, v) in &self.custom {
            up.set_tag(k, v.clone());
        }
        up.end = SystemTime::now();
        if let Some(e) = &self.exporter {
            e.submit(up);
        }
    }

    /// Sets the response's decorator header (ingress) or takes the upstream's (egress), and
    /// finishes an upstream span that never got an answer of its own (the request was cut
    /// short by a timeout).
    pub fn respond(&mut self, resp: &mut http::Response<Body>) {
        if self.upstream_answer.is_none() {
            self.end_upstream();
        }
        if self.cfg.egress {
            if let Some(v) = resp.headers_mut().remove(&DECORATOR_OPERATION)
                && let Ok(op) = v.to_str()
                && !op.is_empty()
            {
                self.span.name = op.to_owned();
            }
        } else if let Some(op) = &self.decorated
            && let Ok(v) = HeaderValue::from_str(op)
        {
            resp.headers_mut().insert(&DECORATOR_OPERATION, v);
        }
    }

    /// Finishes the request's span as the stream ends, with the record's sizes, status and
    /// flags.
    pub fn finish(mut self, rec: &Record) {
        self.end_upstream();
        let Some(exporter) = self.exporter.take() else {
            return;
        };
        let mut span = self.span;
        for (k, v) in self.request_tags {
            span.set_tag(&k, v);
        }
        span.set_tag("request_size", rec.bytes_received.to_string());
        span.set_tag("response_size", rec.bytes_sent.to_string());
        common_tags(&mut span, rec, rec.response_code.unwrap_or(0));
        for (k, v) in self.custom {
            span.set_tag(&k, v);
        }
        span.end = SystemTime::now();
        exporter.submit(span);
    }
}

/// Tags in the order they are set.
type Tags = Vec<(String, String)>;

/// A reported span's request tags and custom tags, in Envoy's order.
fn tags(
    ctx: &ConnContext,
    cfg: &HcmTracing,
    route_tracing: Option<&RouteTracing>,
    headers: &HeaderMap,
    seen: &Seen<'_>,
    request_id: Option<&HeaderValue>,
) -> (Tags, Tags) {
    let id = request_id
        .or(headers.get(&X_REQUEST_ID))
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let header = |n: &HeaderName| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    let path = headers
        .get(&ORIGINAL_PATH)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(seen.path);
    // Envoy cuts the path, not the whole URL, to max_path_tag_length.
    let mut cut = path.len().min(cfg.max_path_tag_length);
    while !path.is_char_boundary(cut) {
        cut -= 1;
    }
    let url = format!("{}://{}{}", seen.scheme, seen.host, &path[..cut]);
    let mut request_tags = vec![
        ("guid:x-request-id".to_owned(), id),
        ("http.url".to_owned(), url),
        ("http.method".to_owned(), seen.method.to_owned()),
        ("downstream_cluster".to_owned(), header(&DOWNSTREAM_CLUSTER)),
        ("user_agent".to_owned(), header(&http::header::USER_AGENT)),
        ("http.protocol".to_owned(), seen.protocol.to_owned()),
        ("peer.address".to_owned(), ctx.down.peer.ip().to_string()),
    ];
    if let Some(v) = headers
        .get(&X_CLIENT_TRACE_ID)
        .and_then(|v| v.to_str().ok())
    {
        request_tags.push(("guid:x-client-trace-id".to_owned(), v.to_owned()));
    }
    let custom = cfg
        .custom_tags
        .iter()
        .chain(route_tracing.iter().flat_map(|t| t.custom_tags.iter()))
        .filter_map(|t| {
            let v = match &t.value {
                TagValue::Literal(v) => v.clone(),
                TagValue::RequestHeader { name, default } => headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map_or_else(|| default.clone(), str::to_owned),
            };
            (!v.is_empty()).then(|| (t.tag.clone(), v))
        })
        .collect();
    (request_tags, custom)
}

/// How one upstream attempt ended, for its span.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttemptEnd {
    /// Its response's status and HTTP version; `None` when it failed.
    pub answer: Option<(u16, http::Version)>,
    /// The host it went to.
    pub host: Option<std::net::SocketAddr>,
    /// Its own response flag (`UF`, `UT`...), if it failed.
    pub flag: Option<ResponseFlag>,
    /// Another attempt follows.
    pub retried: bool,
    /// It never left (no healthy host, a full breaker): Envoy makes no upstream request, so
    /// no span.
    pub not_sent: bool,
}

/// Envoy's name of an HTTP version (`http.protocol`).
pub fn protocol_name(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

/// The tags both spans end with: the cluster, the status, the record's response flags and
/// `error` for a 5xx or no response at all.
fn common_tags(span: &mut Span, rec: &Record, status: u16) {
    span.set_tag("component", "proxy");
    if let Some(c) = &rec.upstream_cluster {
        span.set_tag("upstream_cluster", c.to_string());
        span.set_tag("upstream_cluster.name", c.to_string());
    }
    span.set_tag("http.status_code", status.to_string());
    span.set_tag("response_flags", rec.flags.render(false));
    if status >= 500 || status == 0 {
        span.set_tag("error", "true");
    }
}
