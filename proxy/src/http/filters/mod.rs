//! The HTTP filter chain at run time: the connection manager's filters before the router, in
//! order (compiled in [`crate::config::http_filter`]).
//!
//! How a request goes through it (see `router::route_and_forward`): once the route is chosen,
//! [`Chain::decode`] hands each filter the request's head ([`FilterRequest`]): its headers
//! (which it may change), path (which it may replace), body (which it may wrap), route and
//! connection. A filter lets the
//! request go on, or answers it locally, which ends decoding: the filters after it and the
//! router never see the request. A filter that must see the response, or hold something
//! until the request ends, leaves an [`Encoder`] in the request's [`Encoders`]; every
//! response (the upstream's or a local reply, the router's or a filter's) is handed to them
//! in reverse order by [`Encoders::encode`], and they live until the response body ends
//! (Envoy's `onDestroy`).
//!
//! Per route, as in Envoy: the most specific `typed_per_filter_config` entry under a filter's
//! name (route, virtual host, route configuration) says whether it runs (`FilterConfig
//! {disabled}`; any other entry enables a filter the chain marks `disabled`), and the most
//! specific entry with a config replaces the filter's own: a filter reads it with
//! `Selected::filter_config::<T>` (its per-route type, compiled in
//! `config::http_filter::compile_per_filter`).
//!
//! A filter is a module here with its runtime (stats handles, shared state) built once per
//! connection manager by [`Chain::new`], and a variant in [`Kind`] (and [`Encoder`] when it
//! acts on responses).
//!
//! Dynamic metadata: a filter writes the request's [`crate::route::metadata::DynamicMetadata`]
//! through [`FilterRequest::metadata`] while decoding, and an [`Encoder`] through the one
//! [`Encoders::encode`] hands it; later filters, RBAC, the router and the access log read it.

mod basic_auth;
mod buffer;
pub mod codec;
mod coded_body;
mod compressor;
mod cors;
mod csrf;
mod decompressor;
mod descriptors;
mod ext_authz;
mod fault;
mod grpc_http1_bridge;
mod grpc_stats;
mod grpc_web;
mod header_to_metadata;
mod health_check;
mod istio;
mod jwt_authn;
mod local_ratelimit;
mod lua;
mod peer_cache;
mod ratelimit;
mod rbac;
pub mod rls;

use std::sync::Arc;

use http::{HeaderMap, Method, Response, StatusCode};

use super::ConnContext;
use super::local_reply::local_reply;
use crate::access_log::Record;
use crate::body::Body;
use crate::config::http_filter::buffer::BufferPerRouteConfig;
use crate::config::http_filter::header_to_metadata::HeaderToMetadataConfig;
use crate::config::http_filter::{FilterChain, FilterKind};
use crate::config::istio::alpn::AlpnOverrides;
use crate::route::Selected;
use crate::route::metadata::DynamicMetadata;
use crate::stats::{Counter, Store};

/// The filters of one connection manager, ready to run.
#[derive(Debug)]
pub struct Chain {
    filters: Box<[Filter]>,
    /// The index of its `istio.stats` filter, which observes every request from the start.
    istio_stats: Option<usize>,
}

#[derive(Debug)]
struct Filter {
    name: Arc<str>,
    disabled: bool,
    /// An `ExtensionWithMatcher`'s matcher: the filter is skipped where it says so.
    matcher: Option<Arc<crate::route::filter_matcher::Matcher>>,
    kind: Kind,
}

/// A filter's runtime.
#[derive(Debug)]
enum Kind {
    /// A filter revoy lacks that controls access: denies with this reason, counting
    /// `downstream_rq_fail_closed`.
    FailClosed(Arc<str>, Counter),
    /// `envoy.filters.http.fault`.
    Fault(fault::Fault),
    /// `envoy.filters.http.buffer`.
    Buffer(crate::config::http_filter::buffer::BufferConfig),
    /// `envoy.filters.http.compressor`.
    Compressor(Arc<compressor::Compress>),
    /// `envoy.filters.http.decompressor`.
    Decompressor(Arc<decompressor::Decompress>),
    /// `envoy.filters.http.local_ratelimit`.
    LocalRateLimit(local_ratelimit::LocalRateLimit),
    /// `envoy.filters.http.ratelimit`.
    RateLimit(ratelimit::RateLimit),
    /// `envoy.filters.http.health_check`.
    HealthCheck(health_check::HealthCheck),
    /// `envoy.filters.http.ext_authz`.
    ExtAuthz(ext_authz::ExtAuthz),
    /// `envoy.filters.http.basic_auth`.
    BasicAuth(basic_auth::BasicAuth),
    /// `envoy.filters.http.jwt_authn`.
    JwtAuthn(jwt_authn::JwtAuthn),
    /// `envoy.filters.http.rbac`.
    Rbac(rbac::Rbac),
    /// `envoy.filters.http.cors`.
    Cors(cors::Cors),
    /// `envoy.filters.http.csrf`.
    Csrf(csrf::Csrf),
    /// `envoy.filters.http.lua`.
    Lua(Arc<lua::Lua>),
    /// `envoy.filters.http.grpc_web`.
    GrpcWeb,
    /// `envoy.filters.http.grpc_http1_bridge`.
    GrpcHttp1Bridge,
    /// `envoy.filters.http.grpc_stats`.
    GrpcStats(grpc_stats::GrpcStats),
    /// `envoy.filters.http.header_to_metadata`.
    HeaderToMetadata(Arc<HeaderToMetadataConfig>),
    /// `istio.alpn`.
    IstioAlpn(Arc<AlpnOverrides>),
    /// `istio.metadata_exchange`.
    PeerMetadata(istio::PeerMetadata),
    /// `istio.stats`.
    IstioStats(istio::IstioStats),
}

/// One request as the filters see it, before the router.
pub struct FilterRequest<'a> {
    /// The request headers (the router reads them after the filters).
    pub headers: &'a mut HeaderMap,
    /// The method.
    pub method: &'a Method,
    /// The authority the route was chosen by (port stripped as configured).
    pub authority: &'a str,
    /// The path (with query) the route was chosen by.
    pub path: &'a str,
    /// The request body; a filter may replace it with one wrapping it.
    pub body: &'a mut Body,
    /// The connection.
    pub conn: &'a ConnContext,
    /// The downstream's address as the connection manager reckons it (from
    /// `x-forwarded-for` as configured, else the peer's).
    pub remote: std::net::IpAddr,
    /// The chosen route, if any.
    pub route: Option<Selected<'a>>,
    /// The request's access-log record, when something reads it.
    pub record: Option<&'a mut Record>,
    /// The request's HTTP version.
    pub version: http::Version,
    /// Set by a filter that changed what the route was chosen by: the router chooses it again.
    pub clear_route_cache: bool,
    /// The request's dynamic metadata, which filters write and later filters read (see
    /// [`crate::route::metadata`]).
    pub metadata: &'a mut DynamicMetadata,
    /// The ALPN lists upstream TLS connections for this request offer (`istio.alpn`).
    pub upstream_alpn: Option<Arc<AlpnOverrides>>,
    /// What Istio's filters know of the request's peers, once one of them runs.
    pub peers: Option<Arc<istio::Peers>>,
    /// A gRPC call's message counts, once istio.stats (which reads them) or a grpc_stats
    /// filter that emits them (`emit_filter_state`) runs.
    pub grpc_messages: Option<Arc<grpc_stats::MessageCounts>>,
    /// Where the router notes the request's upstream attempts, when a filter reads them
    /// (`istio.stats` on an outbound listener: the upstream connection's identities).
    pub attempt_target: Option<Arc<crate::access_log::AttemptTarget>>,
    /// Set by a filter that rewrote the path (with query): the router sends the request with
    /// it and routes by it.
    pub new_path: Option<String>,
    /// Whether the request asks for an upgrade whose record, if it is upgraded, its tunnel
    /// writes when it closes (see [`Record::at_tunnel_end`]).
    pub tunnel: bool,
}

impl FilterRequest<'_> {
    /// Notes a response flag and the response code details in the access-log record.
    fn note(&mut self, flag: crate::access_log::ResponseFlag, details: Option<&str>) {
        if let Some(r) = self.record.as_deref_mut() {
            r.flags.set(flag);
            if let Some(d) = details {
                r.details = Some(d.into());
            }
        }
    }

    /// Notes the response code details in the access-log record.
    fn note_details(&mut self, details: &str) {
        if let Some(r) = self.record.as_deref_mut() {
            r.details = Some(details.into());
        }
    }

    /// The request's URI as Envoy's `buildOriginalUri` writes it for challenges:
    /// `x-forwarded-proto`, `://`, the authority, and the original path (`x-envoy-original-path`
    /// when set) cut to 256 bytes.
    fn original_uri(&self) -> String {
        const MAX_PATH: usize = 256;
        let scheme = self
            .headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let path = self
            .headers
            .get("x-envoy-original-path")
            .and_then(|v| v.to_str().ok())
            .unwrap_or(self.path);
        let end = (0..=MAX_PATH.min(path.len()))
            .rev()
            .find(|i| path.is_char_boundary(*i))
            .unwrap_or(0);
        format!("{scheme}://{}{}", self.authority, &path[..end])
    }

    /// What an `ExtensionWithMatcher`'s matcher reads of the request and its connection.
    fn matching_data(&self) -> crate::route::filter_matcher::Data<'_> {
        crate::route::filter_matcher::Data {
            request: self.route_request(),
            connection: crate::route::filter_matcher::Connection {
                remote: self.remote,
                direct_remote: self.conn.down.peer.ip(),
                local: self.conn.local,
            },
        }
    }

    /// The request as route matchers read it (with its dynamic metadata so far).
    fn route_request(&self) -> crate::route::RouteRequest<'_> {
        let mut request =
            crate::route::RouteRequest::new(self.method, self.authority, self.path, self.headers);
        request.metadata = Some(&*self.metadata);
        request
    }
}

/// What the request's filters keep after decoding: the per-request state of filters that act
/// on the response or hold something until the request ends, and the compressor filters'
/// shared choice of encoding.
#[derive(Debug, Default)]
pub struct Encoders(Vec<Encoder>, compressor::Registry);

/// One filter's per-request state.
#[derive(Debug)]
enum Encoder {
    /// An injected fault, counted in `fault.active_faults` until the response ends.
    ActiveFault {
        /// Released with the other encoders.
        _guard: fault::ActiveFault,
    },
    /// A compressor filter's request, its response to compress.
    Compress(compressor::Pending),
    /// A decompressor filter's request, its response to decompress.
    Decompress(decompressor::Pending),
    /// The `x-ratelimit-*` headers describing a local rate limit bucket.
    XRateLimit(Arc<crate::limits::TokenBucket>),
    /// Headers the rate limit service asked to add to the response.
    AddHeaders(Vec<(http::HeaderName, http::HeaderValue)>),
    /// The health-check filter's marks on the response.
    HealthCheck(health_check::Answer),
    /// Headers the authorization service asked to add to the response.
    ExtAuthz(ext_authz::ResponseHeaders),
    /// A CORS request's allowed origin, set on its response.
    Cors(cors::CorsResponse),
    /// A gRPC-Web request's response, turned into gRPC-Web.
    GrpcWeb(grpc_web::Answer),
    /// An HTTP/1 gRPC request's response, its trailers moved into headers.
    GrpcHttp1Bridge,
    /// A gRPC call counted by the grpc_stats filter.
    GrpcStats(Arc<grpc_stats::Call>),
    /// The header_to_metadata filter's response rules (the route's config, else the filter's).
    HeaderToMetadata(Arc<HeaderToMetadataConfig>),
    /// `istio.metadata_exchange`'s side of the response.
    PeerMetadata(Box<istio::PeerResponse>),
    /// `istio.stats`'s request, recorded when it ends.
    IstioStats(istio::StatsRequest),
    /// A Lua script's `envoy_on_response`, to run on the response.
    Lua(lua::Pending),
}

impl Chain {
    /// The runtime of `config`'s filters, their stats under `http.<stat_prefix>.`.
    pub fn new(config: &FilterChain, store: &Store, stat_prefix: &str) -> Chain {
        let filters = config
            .filters
            .iter()
            .map(|f| Filter {
                name: f.name.clone(),
                disabled: f.disabled,
                matcher: f.matcher.clone(),
                kind: match &f.kind {
                    FilterKind::FailClosed(why) => Kind::FailClosed(
                        why.clone(),
                        store.counter(&format!("http.{stat_prefix}.downstream_rq_fail_closed")),
                    ),
                    FilterKind::Fault(c) => Kind::Fault(fault::Fault::new(c, store, stat_prefix)),
                    FilterKind::Buffer(c) => Kind::Buffer(*c),
                    FilterKind::Compressor(c) => {
                        Kind::Compressor(Arc::new(compressor::Compress::new(c, store, stat_prefix)))
                    }
                    FilterKind::Decompressor(c) => Kind::Decompressor(Arc::new(
                        decompressor::Decompress::new(c, store, stat_prefix),
                    )),
                    FilterKind::LocalRateLimit(c) => {
                        Kind::LocalRateLimit(local_ratelimit::LocalRateLimit::new(c, store))
                    }
                    FilterKind::RateLimit(c) => {
                        Kind::RateLimit(ratelimit::RateLimit::new(c, store))
                    }
                    FilterKind::HealthCheck(c) => {
                        Kind::HealthCheck(health_check::HealthCheck::new(c, store, stat_prefix))
                    }
                    FilterKind::ExtAuthz(c) => {
                        Kind::ExtAuthz(ext_authz::ExtAuthz::new(c, store, stat_prefix))
                    }
                    FilterKind::BasicAuth(c) => {
                        Kind::BasicAuth(basic_auth::BasicAuth::new(c, store, stat_prefix))
                    }
                    FilterKind::JwtAuthn(c) => {
                        Kind::JwtAuthn(jwt_authn::JwtAuthn::new(c, store, stat_prefix))
                    }
                    FilterKind::Rbac {
                        config,
                        after_skipped,
                    } => Kind::Rbac(rbac::Rbac::new(
                        config,
                        after_skipped.as_deref(),
                        store,
                        stat_prefix,
                    )),
                    FilterKind::Cors => Kind::Cors(cors::Cors::new(store, stat_prefix)),
                    FilterKind::Csrf(c) => Kind::Csrf(csrf::Csrf::new(c, store, stat_prefix)),
                    FilterKind::Lua(c) => Kind::Lua(Arc::new(lua::Lua::new(
                        f.name.clone(),
                        c,
                        store,
                        stat_prefix,
                    ))),
                    FilterKind::GrpcWeb => Kind::GrpcWeb,
                    FilterKind::GrpcHttp1Bridge => Kind::GrpcHttp1Bridge,
                    FilterKind::GrpcStats(c) => {
                        Kind::GrpcStats(grpc_stats::GrpcStats::new(c, store))
                    }
                    FilterKind::HeaderToMetadata(c) => Kind::HeaderToMetadata(c.clone()),
                    FilterKind::IstioAlpn(c) => Kind::IstioAlpn(c.clone()),
                    FilterKind::PeerMetadata(c) => Kind::PeerMetadata(istio::PeerMetadata::new(c)),
                    FilterKind::IstioStats(c) => Kind::IstioStats(istio::IstioStats::new(c, store)),
                },
            })
            .collect::<Box<[Filter]>>();
        let istio_stats = filters
            .iter()
            .position(|f| matches!(f.kind, Kind::IstioStats(_)));
        Chain {
            filters,
            istio_stats,
        }
    }

    /// Whether the chain has no filter before the router.
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Whether the chain has `istio.stats` (whose labels read the request's record).
    pub fn has_istio_stats(&self) -> bool {
        self.istio_stats.is_some()
    }

    /// Runs the filters on `req`; `Some` is the local reply that ends the request.
    pub async fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        encoders: &mut Encoders,
    ) -> Option<Response<Body>> {
        if let Some(f) = self.istio_stats.map(|i| &self.filters[i])
            && let Kind::IstioStats(stats) = &f.kind
            && !req
                .route
                .and_then(|r| r.filter_disabled(&f.name))
                .unwrap_or(f.disabled)
        {
            stats.start(req, encoders);
        }
        for (i, f) in self.filters.iter().enumerate() {
            let disabled = req.route.and_then(|r| r.filter_disabled(&f.name));
            if disabled.unwrap_or(f.disabled) {
                continue;
            }
            if let Some(m) = &f.matcher
                && m.skips(&req.matching_data())
            {
                continue;
            }
            let route = req.route;
            let reply = match &f.kind {
                Kind::FailClosed(why, counter) => {
                    counter.inc();
                    tracing::debug!(reason = %why, "request denied: fail closed");
                    Some(local_reply(StatusCode::FORBIDDEN, why))
                }
                Kind::Fault(fault) => {
                    let settings = route.and_then(|r| r.filter_config(&f.name));
                    fault.decode(req, settings, encoders).await
                }
                Kind::Buffer(own) => match route.and_then(|r| r.filter_config(&f.name)) {
                    Some(BufferPerRouteConfig::Disabled) => None,
                    Some(BufferPerRouteConfig::Buffer(c)) => buffer::decode(*c, req).await,
                    None => buffer::decode(*own, req).await,
                },
                Kind::Compressor(c) => {
                    c.decode(req, route.and_then(|r| r.filter_config(&f.name)), encoders);
                    None
                }
                Kind::Decompressor(d) => {
                    d.decode(req, encoders);
                    None
                }
                Kind::LocalRateLimit(limit) => {
                    let settings = route.and_then(|r| r.filter_config(&f.name));
                    limit.decode(req, settings, encoders)
                }
                Kind::RateLimit(limit) => {
                    let settings = route.and_then(|r| r.filter_config(&f.name));
                    limit.decode(req, settings, encoders).await
                }
                Kind::HealthCheck(h) => h.decode(req, encoders).await,
                Kind::ExtAuthz(authz) => {
                    let levels = route.map(|r| r.filter_configs(&f.name).collect());
                    authz.decode(req, levels, encoders).await
                }
                Kind::BasicAuth(auth) => {
                    let users = route.and_then(|r| r.filter_config(&f.name));
                    auth.decode(&f.name, req, users)
                }
                Kind::JwtAuthn(authn) => {
                    let settings = route.and_then(|r| r.filter_config(&f.name));
                    authn.decode(req, settings).await
                }
                Kind::Rbac(rbac) => rbac.decode(req, route.and_then(|r| r.filter_config(&f.name))),
                Kind::Cors(cors) => cors.decode(&f.name, req, encoders),
                Kind::Csrf(csrf) => csrf.decode(req, route.and_then(|r| r.filter_config(&f.name))),
                Kind::Lua(script) => {
                    let settings = route.and_then(|r| r.filter_config(&f.name));
                    script.decode(req, settings, encoders).await
                }
                Kind::GrpcWeb => {
                    grpc_web::decode(req, encoders);
                    None
                }
                Kind::GrpcHttp1Bridge => {
                    grpc_http1_bridge::decode(req, encoders);
                    None
                }
                Kind::GrpcStats(stats) => {
                    stats.decode(req, encoders);
                    None
                }
                Kind::HeaderToMetadata(own) => {
                    let config = header_to_metadata_config(own, route, &f.name);
                    header_to_metadata::apply(&config.request_rules, req.headers, req.metadata);
                    if !config.response_rules.is_empty() {
                        encoders.0.push(Encoder::HeaderToMetadata(config));
                    }
                    None
                }
                Kind::IstioAlpn(overrides) => {
                    req.upstream_alpn = Some(overrides.clone());
                    None
                }
                Kind::PeerMetadata(mx) => {
                    mx.decode(req, encoders);
                    None
                }
                // Started before the first filter.
                Kind::IstioStats(_) => None,
            };
            if reply.is_some() {
                self.encoders_after_reply(i, req, encoders);
                return reply;
            }
        }
        None
    }

    /// Envoy hands a filter's local reply to every encoder filter of the chain, those after
    /// the one answering included (their decoding never ran): the stateless ones among the
    /// filters after `answered` act on it.
    fn encoders_after_reply(
        &self,
        answered: usize,
        req: &FilterRequest<'_>,
        encoders: &mut Encoders,
    ) {
        let route = req.route;
        for f in &self.filters[answered + 1..] {
            let disabled = route.and_then(|r| r.filter_disabled(&f.name));
            if disabled.unwrap_or(f.disabled)
                || f.matcher
                    .as_ref()
                    .is_some_and(|m| m.skips(&req.matching_data()))
            {
                continue;
            }
            if let Kind::HeaderToMetadata(own) = &f.kind {
                let config = header_to_metadata_config(own, route, &f.name);
                if !config.response_rules.is_empty() {
                    encoders.0.push(Encoder::HeaderToMetadata(config));
                }
            }
        }
    }
}

/// The header_to_metadata config for the route: its own (compiled as an `Arc`, so the
/// response's Encoder can hold it), else the filter's.
fn header_to_metadata_config(
    own: &Arc<HeaderToMetadataConfig>,
    route: Option<Selected<'_>>,
    name: &str,
) -> Arc<HeaderToMetadataConfig> {
    route
        .and_then(|r| r.filter_config::<Arc<HeaderToMetadataConfig>>(name))
        .unwrap_or(own)
        .clone()
}

/// Whether a filter's runtime fraction admits this request, as Envoy's `featureEnabled`
/// decides: the runtime's value for its key, else its default.
fn sampled(
    runtime: &crate::runtime::LiveRuntime,
    f: &crate::route::matcher::RuntimeFraction,
) -> bool {
    use crate::route::matcher::Runtime;
    runtime.feature_enabled(&f.key, f.default, rand::random())
}

impl Encoders {
    /// Whether a health_check filter took the request for a health check: Envoy's connection
    /// manager then leaves its response out of `downstream_rq_<class>` and `_completed`.
    pub fn health_check(&self) -> bool {
        self.0.iter().any(|e| {
            matches!(
                e,
                Encoder::HealthCheck(health_check::Answer::HealthCheck { .. })
            )
        })
    }

    /// Hands `resp` to the filters that act on responses, last filter first (they may write
    /// the request's `metadata`), and keeps what they hold alive until its body ends.
    pub async fn encode(
        mut self,
        mut resp: Response<Body>,
        metadata: &mut DynamicMetadata,
    ) -> Response<Body> {
        if self.0.is_empty() {
            return resp;
        }
        for e in self.0.iter_mut().rev() {
            e.encode(&mut resp, &mut self.1, metadata).await;
        }
        // Every filter's state ends with the response's last frame (or with its body, when
        // that is dropped first), as Envoy destroys a stream's filters when it completes: an
        // injected fault stops counting in `active_faults`, `istio.stats` records.
        resp.map(|b| crate::body::holding_until_end(b, self))
    }
}

impl Encoder {
    /// Acts on the response (its head; a filter that rewrites the body wraps it, one that
    /// must read the body first to write the head reads it here).
    async fn encode(
        &mut self,
        resp: &mut Response<Body>,
        registry: &mut compressor::Registry,
        metadata: &mut DynamicMetadata,
    ) {
        match self {
            Encoder::ActiveFault { .. } => {}
            Encoder::Compress(c) => c.encode(resp, registry),
            Encoder::Decompress(d) => d.encode(resp),
            Encoder::XRateLimit(bucket) => {
                local_ratelimit::add_x_ratelimit_headers(resp.headers_mut(), bucket)
            }
            Encoder::AddHeaders(headers) => {
                for (name, value) in headers.drain(..) {
                    resp.headers_mut().append(name, value);
                }
            }
            Encoder::HealthCheck(a) => a.encode(resp),
            Encoder::ExtAuthz(headers) => headers.encode(resp),
            Encoder::Cors(c) => c.encode(resp),
            Encoder::GrpcWeb(a) => Box::pin(a.encode(resp)).await,
            Encoder::GrpcHttp1Bridge => Box::pin(grpc_http1_bridge::encode(resp)).await,
            Encoder::GrpcStats(call) => call.encode(resp),
            Encoder::HeaderToMetadata(c) => {
                header_to_metadata::apply(&c.response_rules, resp.headers_mut(), metadata)
            }
            Encoder::PeerMetadata(p) => p.encode(resp),
            Encoder::IstioStats(s) => s.encode(resp),
            Encoder::Lua(l) => Box::pin(l.encode(resp, metadata)).await,
        }
    }
}
