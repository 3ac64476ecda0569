//! The router filter: picks a route, answers locally (direct response, redirect, errors) or
//! forwards to the route's cluster and streams the response back.

use std::time::{Duration, Instant};

use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};

use super::ConnContext;
use super::access_log::Pending;
use super::attempts::{Exchange, LocalFailure, Outcome, RequestBody};
use super::body_activity::BodyActivity;
use super::buffered_body::{self, Buffered};
use super::filters::{Encoders, FilterRequest};
use super::forwarding;
use super::local_reply::local_reply;
use super::mirror;
use super::path::PathVerdict;
use super::request_timeout::RequestTimeout;
use super::retry::{self, RetryState};
use super::stream_limits::StreamLimits;
use super::timeouts::Timeouts;
use super::trace::{AttemptEnd, Seen};
use crate::access_log::{Record, ResponseFlag};
use crate::body::{self, Body};
use crate::config::cluster::{ClusterConfig, EndpointAddress};
use crate::config::hcm::{Routes, StripPort, Underscores};
use crate::route::action::{HostRewrite, upgrade_allowed};
use crate::route::metadata::DynamicMetadata;
use crate::route::policy::compute_hash;
use crate::route::{Action, FormatContext, RouteRequest, RouteTable, Selected};
use crate::upstream::{AttemptTarget, LbContext, UpstreamHost};

/// The header the router sets on responses from upstream: the upstream's time in ms.
pub(super) static UPSTREAM_SERVICE_TIME: HeaderName =
    HeaderName::from_static("x-envoy-upstream-service-time");
static ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-envoy-attempt-count");
static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static ORIGINAL_PATH: HeaderName = HeaderName::from_static("x-envoy-original-path");
static ORIGINAL_HOST: HeaderName = HeaderName::from_static("x-envoy-original-host");
static OVERLOADED: HeaderName = HeaderName::from_static("x-envoy-overloaded");

/// Envoy's answer to an upgrade the connection manager or route does not allow (answered at
/// routing time, so the connection closes; see [`handle`]).
fn upgrade_refused() -> Response<Body> {
    local_reply(StatusCode::FORBIDDEN, "")
}

/// Handles one request end to end; never fails (errors become local replies). The caller
/// records its `downstream_rq_time` once the response has been sent.
pub async fn handle(mut req: Request<Body>, ctx: &ConnContext) -> Response<Body> {
    let stats = &ctx.hcm.stats;
    stats.rq_total.inc();
    stats.rq_active.inc();
    if req.version() == http::Version::HTTP_2 {
        stats.rq_http2_total.inc();
    } else {
        stats.rq_http1_total.inc();
    }
    let request_id = {
        // The stream's meter reads the request as it came.
        let wire = ctx
            .wire
            .as_ref()
            .map(|w| super::wire_meter::StreamWire::start(&req, w, ctx.hcm.config.http1_trailers));
        let facts = forwarding::mutate_request(
            &ctx.hcm.config,
            &ctx.down,
            &ctx.shared.tracers.local,
            req.headers_mut(),
        );
        // A clone of a header value parsed from the request allocates: only when needed. A
        // forced trace (the header survives only on internal requests) echoes the id too.
        let id = if ctx.hcm.config.always_set_request_id_in_response
            || req
                .headers()
                .contains_key(&crate::trace::decision::X_ENVOY_FORCE_TRACE)
        {
            req.headers().get(&X_REQUEST_ID).cloned()
        } else {
            None
        };
        let grpc = super::local_reply::is_grpc(req.headers());
        let head = req.method() == http::Method::HEAD;
        // Declared before the record, so dropped after it: a request cut short publishes
        // its flags (`DC`) before istio.stats's encoder records them.
        let mut encoders = Encoders::default();
        let mut pending = Pending::start(ctx, &mut req, wire);
        let tunnel_log = match pending.as_mut() {
            Some(p) if facts.upgrade.is_some() => Some(p.hand_to_tunnel()),
            _ => None,
        };
        // Envoy's router answers at routing time from the head alone, before its codec hands
        // it the body: an HTTP/1 request with a body is unfinished then, and so is one whose
        // stream goes on after its head (an upgrade, CONNECT); Envoy closes the connection
        // after such an answer.
        let closes_unread = req.version() <= http::Version::HTTP_11
            && (!http_body::Body::is_end_stream(req.body())
                || facts.upgrade.is_some()
                || req.method() == http::Method::CONNECT);
        let mut forwarded = false;
        let mut metadata = DynamicMetadata::default();
        let request_timeout = RequestTimeout::arm(
            ctx.hcm.config.request_timeout,
            &mut req,
            !ctx.hcm.filters.is_empty(),
        );
        let activity = request_timeout.as_ref().map(RequestTimeout::activity);
        // A closure, so that each arm builds the (large) future in place.
        let routed = || {
            route_and_forward(
                req,
                ctx,
                facts,
                &mut forwarded,
                pending.as_mut(),
                tunnel_log,
                (&mut encoders, &mut metadata, activity),
            )
        };
        let routed = match &request_timeout {
            Some(t) => tokio::select! {
                biased;
                resp = routed() => Ok(resp),
                ended = t.fired() => Err(ended),
            },
            None => Ok(routed().await),
        };
        let mut resp = match routed {
            Ok(resp) => resp,
            Err(ended) => {
                stats.rq_timeout.inc();
                RequestTimeout::reply(ended, pending.as_mut().map(Pending::record))
            }
        };
        if closes_unread && !forwarded {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        // From here the request's metadata lives in its record, when it has one.
        if let Some(p) = pending.as_mut() {
            p.record().metadata = std::mem::take(&mut metadata);
        }
        if let (Some(config), Some(p)) = (&ctx.hcm.config.local_reply, pending.as_mut()) {
            resp = super::local_reply::map(config, resp, p.record());
        }
        if grpc {
            resp = super::local_reply::grpc_local_reply(resp);
        }
        let health_check = encoders.health_check();
        let mut resp = match pending.as_mut() {
            Some(p) => encoders.encode(resp, &mut p.record().metadata).await,
            None => encoders.encode(resp, &mut metadata).await,
        };
        forwarding::set_server(&ctx.hcm.config, resp.headers_mut());
        if !health_check {
            stats.response(resp.status().as_u16());
        }
        let id = match pending.as_ref().and_then(Pending::traced_request_id) {
            Some(packed) if id.is_some() => Some(packed.clone()),
            _ => id,
        };
        if let Some(id) = id {
            resp.headers_mut().insert(&X_REQUEST_ID, id);
        }
        match pending {
            Some(p) => p.finish(resp, head),
            None => resp,
        }
    };
    stats.rq_active.dec();
    request_id
}

/// The request's authority: `:authority` for HTTP/2, else the Host header.
/// Several `Host` headers are joined with `,`, as Envoy's codec does.
fn authority(req: &Request<Body>) -> String {
    if let Some(a) = req.uri().authority() {
        return a.as_str().to_owned();
    }
    let mut hosts = req
        .headers()
        .get_all(header::HOST)
        .iter()
        .filter_map(|h| h.to_str().ok());
    let first = hosts.next().unwrap_or_default().to_owned();
    hosts.fold(first, |acc, h| acc + "," + h)
}

/// Removes the trailing dot of `host`'s name, keeping its port (Envoy's
/// `strip_trailing_host_dot`).
fn strip_trailing_dot(host: &mut String) {
    let name_end = match host.rsplit_once(':') {
        Some((name, port)) if !port.contains(']') && !name.is_empty() => name.len(),
        _ => host.len(),
    };
    if host[..name_end].ends_with('.') {
        host.remove(name_end - 1);
    }
}

fn strip_port(host: &str, mode: StripPort, listener_port: u16) -> &str {
    if mode == StripPort::None {
        return host;
    }
    let Some((name, port)) = host
        .rsplit_once(':')
        .filter(|(n, p)| !p.contains(']') && !n.is_empty())
    else {
        return host;
    };
    match mode {
        StripPort::Any => name,
        StripPort::Matching if port.parse() == Ok(listener_port) => name,
        _ => host,
    }
}

/// Replaces `req`'s path and query with `path` (left as it was when `path` is not one).
fn set_path(req: &mut Request<Body>, path: &str) {
    if let Ok(pq) = http::uri::PathAndQuery::try_from(path) {
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query = Some(pq);
        if let Ok(uri) = Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
}

/// Routes and forwards `req`; `forwarded` turns true once it goes upstream (its body to be
/// buffered or sent), so an answer made before that was made at routing time. It turns back
/// when the first attempt (or an upgrade's connection) could not start, which Envoy also
/// decides at routing time (see [`crate::upstream::UpstreamError::not_started`]).
async fn route_and_forward(
    mut req: Request<Body>,
    ctx: &ConnContext,
    facts: forwarding::RequestFacts,
    forwarded: &mut bool,
    mut pending: Option<&mut Pending>,
    tunnel_log: Option<tokio::sync::oneshot::Receiver<super::access_log::Handover>>,
    (encoders, metadata, activity): (&mut Encoders, &mut DynamicMetadata, Option<&BodyActivity>),
) -> Response<Body> {
    // Notes what access logs and spans read (nothing when the connection manager has
    // neither).
    macro_rules! note {
        (|$r:ident| $body:expr) => {
            if let Some(p) = pending.as_deref_mut() {
                let $r = p.record();
                $body;
            }
        };
    }
    let stream_start = Instant::now();
    let cfg = &ctx.hcm.config;
    let connect = req.method() == http::Method::CONNECT;
    // An HTTP/1.1 CONNECT names its authority in the request line, which Envoy's codec takes
    // as `:authority`; it needs no Host header. An HTTP/1.0 request without one was given
    // `default_host_for_http_10` when there is one.
    if req.version() < http::Version::HTTP_2
        && !connect
        && !req.headers().contains_key(header::HOST)
    {
        note!(|r| r.details = Some("missing_host_header".into()));
        let mut resp = local_reply(StatusCode::BAD_REQUEST, "");
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    if connect && !super::connect::well_formed(&req) {
        return body_failed();
    }
    // Envoy's codec refuses such a head before any filter runs.
    if cfg.underscores == Underscores::Reject
        && req.headers().keys().any(|n| n.as_str().contains('_'))
    {
        let mut resp = local_reply(StatusCode::BAD_REQUEST, "Bad Request");
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    // The upgrade the request asks for, `CONNECT` for a CONNECT: allowed or refused once its
    // route is known.
    let upgrade_type = if connect {
        Some("CONNECT")
    } else {
        facts.upgrade.as_ref().map(|u| u.to_str().unwrap_or(""))
    };
    // An RDS table is held through this worker's handle on it; a static one is borrowed
    // from the connection manager's config, which the connection holds.
    let rds_table;
    let table: Option<&RouteTable> = match &cfg.routes {
        Routes::Static(t) => Some(t),
        Routes::Rds(name) => {
            rds_table = ctx.shared.snapshot.route_table(name);
            rds_table.as_deref().map(|t| -> &RouteTable { t })
        }
    };
    let protocol = super::trace::protocol_name(req.version());
    let Some(table) = table else {
        let router = &ctx.hcm.stats.router;
        router.total.inc();
        router.no_route.inc();
        if let Some(p) = pending.as_deref_mut() {
            let host = authority(&req);
            let seen = Seen {
                host: &host,
                path: req.uri().path_and_query().map_or("/", |p| p.as_str()),
                method: req.method().as_str(),
                protocol,
                scheme: if ctx.down.tls.is_some() {
                    "https"
                } else {
                    "http"
                },
            };
            p.begin_trace(ctx, None, req.headers(), &seen);
            let r = p.record();
            r.flags.set(ResponseFlag::NoRouteFound);
            r.details = Some("route_not_found".into());
        }
        return local_reply(StatusCode::NOT_FOUND, "");
    };
    let mut host_full = authority(&req);
    if cfg.strip_trailing_host_dot {
        strip_trailing_dot(&mut host_full);
    }
    let kept = strip_port(&host_full, cfg.strip_port, ctx.local.port()).len();
    host_full.truncate(kept);
    // A CONNECT has no path: only `connect_matcher` routes match it.
    let mut path = if connect {
        String::new()
    } else {
        req.uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into())
    };
    let verdict = if connect {
        PathVerdict::Continue(None)
    } else {
        super::path::normalize(cfg, &path)
    };
    match verdict {
        PathVerdict::Continue(None) => {}
        PathVerdict::Continue(Some(p)) => {
            set_path(&mut req, &p);
            path = p;
        }
        // Envoy answers these before the request has its id: its trace decision counts them
        // not traceable, and no span is made.
        PathVerdict::Reject => {
            ctx.hcm
                .tracing_stats(crate::trace::request_id::Reason::NotTraceable);
            return local_reply(StatusCode::BAD_REQUEST, "");
        }
        PathVerdict::Redirect(p) => {
            ctx.hcm
                .tracing_stats(crate::trace::request_id::Reason::NotTraceable);
            let mut resp = local_reply(StatusCode::TEMPORARY_REDIRECT, "");
            if let Ok(v) = HeaderValue::from_str(&p) {
                resp.headers_mut().insert(header::LOCATION, v);
            }
            return resp;
        }
    }
    if !facts.internal {
        for h in table.internal_only_headers() {
            req.headers_mut().remove(h);
        }
    }
    let https = req
        .headers()
        .get(&forwarding::X_FORWARDED_PROTO)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let random_value: u64 = rand::random();
    // Route `runtime_fraction`s read the runtime as it is when the request is routed.
    let runtime = Some(&*ctx.shared.runtime as &dyn crate::route::matcher::Runtime);
    let method = req.method().clone();
    // Routing reads the request headers while the forward path rewrites them: they are moved
    // out for routing and put back before the rewrite (no copy unless a mirror or response
    // formatter needs the request as routed).
    let mut route_headers = std::mem::take(req.headers_mut());
    let route_req = routing(
        &method,
        &host_full,
        &path,
        &route_headers,
        https,
        random_value,
        runtime,
    );
    let scheme = if https { "https" } else { "http" };
    let seen = Seen {
        host: &host_full,
        path: &path,
        method: method.as_str(),
        protocol,
        scheme,
    };
    let mut selected = table.select(&route_req);
    if let Some(p) = pending.as_deref_mut() {
        p.begin_trace(
            ctx,
            selected.as_ref().map(|s| s.route),
            &route_headers,
            &seen,
        );
    }
    let mut reselect = false;
    let mut upstream_alpn = None;
    let mut attempt_target = None;
    if !ctx.hcm.filters.is_empty() {
        // Envoy's stream info has the route's cluster from the moment the route is chosen, so
        // a filter's reply is logged with it, and so is a request the request timeout ends
        // while a filter holds it.
        let note_cluster = |r: &mut Record, headers: &http::HeaderMap| {
            let req = routing(
                &method,
                &host_full,
                &path,
                headers,
                https,
                random_value,
                runtime,
            );
            note_route_cluster(r, selected, &req, ctx);
        };
        if activity.is_some()
            && let Some(p) = pending.as_deref_mut()
        {
            note_cluster(p.record(), &route_headers);
        }
        let version = req.version();
        let mut filtered = FilterRequest {
            headers: &mut route_headers,
            method: &method,
            authority: &host_full,
            path: &path,
            body: req.body_mut(),
            conn: ctx,
            remote: facts.client.unwrap_or(ctx.down.peer.ip()),
            route: selected,
            record: pending.as_deref_mut().map(Pending::record),
            version,
            clear_route_cache: false,
            metadata,
            upstream_alpn: None,
            peers: None,
            attempt_target: None,
            grpc_messages: None,
            new_path: None,
            tunnel: tunnel_log.is_some(),
        };
        if let Some(reply) = ctx.hcm.filters.decode(&mut filtered, encoders).await {
            // Envoy adds a forwarding route's response headers to a filter's local reply
            // once the route is chosen (not a direct response's or redirect's; not to a
            // reply that is no local reply, as CORS's preflight answer).
            let local = reply
                .extensions()
                .get::<super::local_reply::LocalReply>()
                .is_some();
            if let Some(p) = pending.as_deref_mut() {
                note_cluster(p.record(), &route_headers);
            }
            return match selected {
                Some(s) if local && matches!(s.route.action, Action::Forward(_)) => {
                    let fmt = FormatContext {
                        downstream_remote: Some(ctx.down.peer),
                        downstream_direct_remote: Some(ctx.down.peer),
                        downstream_local: Some(ctx.local),
                        request_method: Some(method.as_str()),
                        request_authority: Some(&host_full),
                        request_path: Some(&path),
                        request_headers: Some(&route_headers),
                        ..Default::default()
                    };
                    with_route_headers(s, reply, &fmt)
                }
                _ => reply,
            };
        }
        reselect = filtered.clear_route_cache;
        upstream_alpn = filtered.upstream_alpn;
        attempt_target = filtered.attempt_target;
        if let Some(p) = filtered.new_path.take() {
            set_path(&mut req, &p);
            path = p;
        }
    }
    if let Some(a) = activity {
        a.filtered();
    }
    // The filters may have changed the headers the route's actions read, and written
    // metadata a route chosen again matches on.
    let mut route_req = routing(
        &method,
        &host_full,
        &path,
        &route_headers,
        https,
        random_value,
        runtime,
    );
    route_req.metadata = Some(&*metadata);
    if reselect {
        selected = table.select(&route_req);
    }
    let router = &ctx.hcm.stats.router;
    router.total.inc();
    let Some(selected) = selected else {
        router.no_route.inc();
        note!(|r| {
            r.flags.set(ResponseFlag::NoRouteFound);
            r.details = Some("route_not_found".into())
        });
        return local_reply(StatusCode::NOT_FOUND, "");
    };
    note!(|r| {
        r.route_name =
            (!selected.route.name.is_empty()).then(|| selected.route.name.as_str().into())
    });
    if let Some(upgrade_type) = upgrade_type {
        let route_upgrades = match &selected.route.action {
            Action::Forward(fwd) => fwd.upgrades(),
            _ => &[],
        };
        if !upgrade_allowed(route_upgrades, &cfg.upgrades, upgrade_type) {
            ctx.hcm.stats.upgrades_refused.inc();
            note!(|r| r.details = Some("upgrade_failed".into()));
            return upgrade_refused();
        }
    }
    // Held until the request ends, or moved into its tunnel.
    let active_upgrade = upgrade_type.map(|_| ctx.hcm.stats.upgrade());
    let fmt = FormatContext {
        downstream_remote: Some(ctx.down.peer),
        downstream_direct_remote: Some(ctx.down.peer),
        downstream_local: Some(ctx.local),
        protocol: Some(protocol),
        request_method: Some(method.as_str()),
        request_scheme: Some(scheme),
        request_authority: Some(&host_full),
        request_path: Some(&path),
        start_time: Some(std::time::SystemTime::now()),
        dynamic_metadata: Some(&*metadata),
        ..Default::default()
    };
    match &selected.route.action {
        Action::DirectResponse(dr) => {
            router.direct_response.inc();
            note!(|r| r.details = Some("direct_response".into()));
            let mut resp = Response::new(if dr.body.is_empty() {
                body::empty()
            } else {
                body::full(dr.body.clone())
            });
            *resp.status_mut() = dr.status;
            let fmt = FormatContext {
                request_headers: Some(&route_headers),
                response_status: Some(dr.status.as_u16()),
                ..fmt
            };
            // Envoy applies the response header rules before it adds the body's headers.
            selected.apply_response_headers(None, resp.headers_mut(), &fmt);
            if let Some(ct) = dr.content_type()
                && !resp.headers().contains_key(header::CONTENT_TYPE)
            {
                resp.headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
            }
            // Without a body, no content-length (see `local_reply`).
            if !dr.body.is_empty() {
                resp.headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(dr.body.len()));
            }
            // Envoy's router adds the request's URL as `location` to a 201 or 3xx (RFC 7231
            // 7.1.2).
            if (dr.status.is_redirection() || dr.status == StatusCode::CREATED)
                && let Ok(v) = HeaderValue::from_str(&Selected::request_url(&route_req))
            {
                resp.headers_mut().insert(header::LOCATION, v);
            }
            // Envoy sends a direct response as a local reply: `local_reply_config` maps it and a
            // gRPC request gets it gRPC-shaped.
            resp.extensions_mut()
                .insert(super::local_reply::LocalReply {
                    text: String::from_utf8_lossy(&dr.body).into_owned(),
                    grpc_status: None,
                });
            resp
        }
        Action::NonForwarding => {
            router.no_route.inc();
            note!(|r| {
                r.flags.set(ResponseFlag::NoRouteFound);
                r.details = Some("route_not_found".into())
            });
            local_reply(StatusCode::NOT_FOUND, "")
        }
        Action::Redirect(r) => {
            router.redirect.inc();
            note!(|l| l.details = Some("direct_response".into()));
            let location = selected.redirect_location(&route_req).unwrap_or_default();
            let mut resp = local_reply(r.status, "");
            if let Ok(v) = HeaderValue::from_str(&location) {
                resp.headers_mut().insert(header::LOCATION, v);
            }
            let fmt = FormatContext {
                request_headers: Some(&route_headers),
                response_code: Some(r.status.as_u16()),
                response_status: Some(r.status.as_u16()),
                ..fmt
            };
            selected.apply_response_headers(None, resp.headers_mut(), &fmt);
            resp
        }
        Action::Forward(fwd) => {
            let Some(picked) = fwd.pick_cluster(&route_req) else {
                router.no_cluster.inc();
                note!(|r| {
                    r.flags.set(ResponseFlag::NoClusterFound);
                    r.details = Some("cluster_not_found".into())
                });
                let reply = local_reply(fwd.cluster_not_found_response_code, "");
                let fmt = FormatContext {
                    request_headers: Some(&route_headers),
                    ..fmt
                };
                return with_route_headers(selected, reply, &fmt);
            };
            let cluster_name = picked.name;
            let weighted = picked.weighted;
            let Some(cluster) = ctx.shared.clusters.handle(&cluster_name) else {
                router.no_cluster.inc();
                note!(|r| {
                    r.flags.set(ResponseFlag::NoClusterFound);
                    r.details = Some("cluster_not_found".into())
                });
                let reply = local_reply(fwd.cluster_not_found_response_code, "");
                let fmt = FormatContext {
                    request_headers: Some(&route_headers),
                    ..fmt
                };
                return with_route_headers(selected, reply, &fmt);
            };
            note!(|r| r.upstream_cluster = Some(std::sync::Arc::from(&*cluster_name)));
            if let Some(t) = &attempt_target {
                t.note_cluster(&cluster_name);
            }
            let new_path = selected.rewritten_path(&route_req);
            let new_host = match fwd.host_rewrite.as_deref() {
                Some(HostRewrite::Auto) => auto_host(cluster.config()),
                _ => selected
                    .rewritten_host(&route_req, weighted)
                    .map(|h| h.into_owned()),
            };
            let upgrade = facts.upgrade.clone();
            let request_retriable =
                retry::request_retriable(fwd.retry_policy.as_deref(), &route_req);
            let hash = if fwd.hash_policies().is_empty() {
                None
            } else {
                compute_hash(
                    fwd.hash_policies(),
                    &route_req,
                    facts.client.or(Some(ctx.down.peer.ip())),
                )
            };
            let response_rules = selected
                .header_levels(weighted)
                .iter()
                .flatten()
                .any(|level| !level.response.is_empty());
            let routed_view =
                (response_rules || !fwd.mirror_policies.is_empty()).then(|| route_headers.clone());
            *req.headers_mut() = std::mem::take(&mut route_headers);
            {
                let fmt = FormatContext {
                    upstream_cluster: Some(&cluster_name),
                    ..fmt.clone()
                };
                selected.apply_request_headers(weighted, req.headers_mut(), &fmt);
            }
            if let Some(u) = &upgrade {
                forwarding::set_upgrade(req.headers_mut(), u);
            }
            if let Some(t) = pending.as_deref_mut().and_then(Pending::trace) {
                t.forward(req.headers_mut(), &cluster_name);
            }
            if new_host.is_some()
                && !cfg.suppress_envoy_headers
                && let Ok(v) = HeaderValue::from_str(&host_full)
            {
                req.headers_mut().insert(&ORIGINAL_HOST, v);
            }
            // The upstream Host: the rewritten one, else the request's authority. An HTTP/1.1
            // request usually carries exactly that already, and is left alone.
            let authority = new_host.as_deref().unwrap_or(&host_full);
            if let Some(h) = &new_host {
                note!(|r| if let Some(head) = r.request.as_mut() {
                    head.authority.clone_from(h);
                });
            }
            let present = req.headers().get(header::HOST).map(HeaderValue::as_bytes);
            if present != Some(authority.as_bytes())
                && let Ok(v) = HeaderValue::from_str(authority)
            {
                req.headers_mut().insert(header::HOST, v);
            }
            if let Some(p) = new_path {
                if !cfg.suppress_envoy_headers
                    && let Ok(v) = HeaderValue::from_str(&path)
                {
                    note!(|r| if let Some(head) = r.request.as_mut() {
                        head.headers.insert(&ORIGINAL_PATH, v.clone());
                    });
                    req.headers_mut().insert(&ORIGINAL_PATH, v);
                }
                // Envoy's router rewrites the request its access logs read.
                note!(|r| if let Some(head) = r.request.as_mut() {
                    head.path.clone_from(&p);
                });
                if let Ok(uri) = Uri::builder().path_and_query(p.as_str()).build() {
                    *req.uri_mut() = uri;
                }
            } else if let Some(pq) = req.uri().path_and_query().cloned() {
                *req.uri_mut() = Uri::from(pq);
            }
            let timeouts = Timeouts::resolve(fwd, req.headers_mut(), facts.internal);
            let retry = RetryState::new(
                fwd.retry_policy.as_deref(),
                request_retriable,
                req.headers_mut(),
                facts.internal,
            );
            timeouts.set_headers(
                req.headers_mut(),
                Duration::ZERO,
                !cfg.suppress_envoy_headers,
            );
            let target = attempt_target.or_else(|| {
                (pending.is_some() || response_rules).then(std::sync::Arc::<AttemptTarget>::default)
            });
            note!(|r| r.attempt_target.clone_from(&target));
            // Envoy's access logs read the request as the router leaves it.
            note!(|r| if let Some(head) = r.request.as_mut() {
                head.headers.clone_from(req.headers());
                if selected.virtual_host.include_request_attempt_count {
                    head.headers
                        .insert(&ATTEMPT_COUNT, HeaderValue::from_static("1"));
                }
            });
            let lb = LbContext {
                hash,
                original_dst: ctx.original_dst,
                downstream_h2: req.version() == http::Version::HTTP_2,
                internal: facts.internal,
                avoid: Vec::new(),
                report_host: response_rules || pending.is_some(),
                target,
                alpn: upstream_alpn.map(|overrides| crate::upstream::RequestAlpn {
                    overrides,
                    downstream_http10: req.version() == http::Version::HTTP_10,
                }),
            };
            // From here the request goes upstream, upgraded or not.
            *forwarded = true;
            // An upgrade or CONNECT whose upstream connection fails is answered with nothing
            // sent upstream, and its connection closes: what follows the head is not HTTP.
            if let Some(active) = active_upgrade {
                if let Some(t) = pending.as_deref_mut().and_then(Pending::trace) {
                    t.attempt_started(req.headers_mut(), 1);
                }
                if selected.virtual_host.include_request_attempt_count {
                    req.headers_mut()
                        .insert(&ATTEMPT_COUNT, HeaderValue::from_static("1"));
                }
                // A tunnel runs in a task of its own: it closes when its chain's drain ends.
                let drained = ctx.hcm.retirement.ended_owned();
                let tunnel = if connect && fwd.terminates_connect() {
                    Box::pin(super::connect::terminate(
                        req, &cluster, &lb, active, drained,
                    ))
                    .await
                } else {
                    Box::pin(super::upgrade::forward(
                        req, &cluster, &lb, active, tunnel_log, drained,
                    ))
                    .await
                };
                return match tunnel {
                    Ok(resp) => {
                        note!(|r| {
                            r.attempts = 1;
                            r.first_upstream_rx = Some(Instant::now());
                            r.upstream_host =
                                resp.extensions().get::<UpstreamHost>().map(|h| h.host);
                            r.details = Some("via_upstream".into())
                        });
                        if let Some(t) = pending.and_then(Pending::trace) {
                            t.attempt_ended(AttemptEnd {
                                answer: Some((resp.status().as_u16(), resp.version())),
                                host: resp.extensions().get::<UpstreamHost>().map(|h| h.host),
                                ..AttemptEnd::default()
                            });
                        }
                        resp
                    }
                    Err(e) => {
                        *forwarded = false;
                        let failure = LocalFailure::of(&e, 1);
                        note!(|r| {
                            r.attempts = 1;
                            note_failure(r, &failure)
                        });
                        if let Some(t) = pending.and_then(Pending::trace) {
                            t.attempt_ended(AttemptEnd {
                                host: e.host(),
                                flag: Some(failure.why.flag),
                                ..AttemptEnd::default()
                            });
                        }
                        failure_reply(&failure, cfg.suppress_envoy_headers)
                    }
                };
            }
            let vhost = selected.virtual_host;
            let start = Instant::now();
            let limits = StreamLimits::of(
                fwd,
                cfg.stream_idle_timeout,
                cfg.max_stream_duration,
                req.headers_mut(),
                tokio::time::Instant::from_std(stream_start),
            );
            if http_body::Body::is_end_stream(req.body())
                && !req.headers().contains_key(header::CONTENT_LENGTH)
                && !matches!(*req.method(), http::Method::GET | http::Method::HEAD)
            {
                // Envoy's HTTP/1 codec states an empty body explicitly unless the method is bodiless.
                req.headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
            }
            let (parts, mut downstream_body) = req.into_parts();
            let head_limit = limits
                .as_ref()
                .and_then(|l| l.head_deadline(timeouts.global));
            // A body still to come restarts the idle timer (before and after the response
            // head), and decides the status of the cluster's `max_stream_duration` reply;
            // the request timeout may watch it already.
            let watch = limits.as_ref().is_some_and(StreamLimits::idles)
                || cluster.config().max_stream_duration.is_some();
            let body_activity = match activity {
                _ if http_body::Body::is_end_stream(&downstream_body) => None,
                Some(a) => Some(a.clone()),
                None if watch => {
                    let (watched, activity) = BodyActivity::watch(downstream_body);
                    downstream_body = watched;
                    Some(activity)
                }
                _ => None,
            };
            let needs_copy = retry.is_some() || !fwd.mirror_policies.is_empty();
            let body = if needs_copy {
                let limit = fwd
                    .per_request_buffer_limit_bytes()
                    .map_or(buffered_body::DEFAULT_LIMIT, |l| l as usize);
                match buffered_body::buffer(downstream_body, limit).await {
                    Ok(Buffered::Complete(replay)) => {
                        let how = mirror::Shadowing {
                            clusters: &ctx.shared.clusters,
                            lb: &lb,
                            timeout: timeouts.global,
                            attempt_count: vhost.include_request_attempt_count,
                        };
                        let view = routed_view.as_ref().unwrap_or(&parts.headers);
                        let mut mirror_req = RouteRequest::new(&method, &host_full, &path, view);
                        mirror_req.https = https;
                        mirror_req.random_value = random_value;
                        mirror_req.runtime = runtime;
                        mirror::spawn(&fwd.mirror_policies, &mirror_req, &parts, &replay, &how);
                        RequestBody::Replay(replay)
                    }
                    Ok(Buffered::TooLarge(body)) => {
                        cluster.stats().retry_or_shadow_abandoned().inc();
                        RequestBody::Once(body)
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "downstream request body failed");
                        return body_failed();
                    }
                }
            } else {
                RequestBody::Once(downstream_body)
            };
            // An attempt is under way from here, whether or not it completes.
            note!(|r| r.attempts = 1);
            let mut exchange = Exchange {
                cluster: &cluster,
                lb,
                timeouts,
                retry,
                send_attempt_count: vhost.include_request_attempt_count,
                send_expected_timeout: !cfg.suppress_envoy_headers,
                retries_exhausted: false,
                last_attempt_at: Duration::ZERO,
                pending: pending.as_deref_mut(),
                request_body: body_activity.clone(),
            };
            // The exchange future is built inside each arm: a local moved into the timeout
            // would keep its own slot in this future's state next to the moved copy.
            let (outcome, attempts) = match (limits.as_ref(), head_limit) {
                (Some(l), Some(first)) => {
                    match l
                        .head_wait(exchange.run(parts, body), first, body_activity.as_ref())
                        .await
                    {
                        Ok(done) => done,
                        Err(why) => {
                            why.count(&ctx.hcm.stats, None);
                            note!(|r| why.note(r));
                            let body_ended = body_activity.as_ref().is_none_or(BodyActivity::ended);
                            return why.reply(body_ended);
                        }
                    }
                }
                _ => exchange.run(parts, body).await,
            };
            // Done with the exchange (and its borrow of the request's record).
            let super::attempts::Exchange {
                retries_exhausted: exhausted,
                last_attempt_at,
                timeouts,
                lb,
                ..
            } = exchange;
            note!(|r| {
                r.attempts = attempts;
                if exhausted {
                    r.flags.set(ResponseFlag::UpstreamRetryLimitExceeded);
                }
                // A retry's headers, as Envoy's router sets them again on the request.
                if attempts > 1
                    && let Some(head) = r.request.as_mut()
                {
                    timeouts.set_headers(
                        &mut head.headers,
                        last_attempt_at,
                        !cfg.suppress_envoy_headers,
                    );
                    if vhost.include_request_attempt_count {
                        head.headers.insert(
                            &ATTEMPT_COUNT,
                            super::int_value::int_value(u64::from(attempts)),
                        );
                    }
                }
            });
            // The failed attempt's host, which Envoy's formatters show (and the address of its
            // connection, when it had one).
            let mut failed_host = None;
            let mut resp = match outcome {
                Outcome::Local(failure) => {
                    note!(|r| note_failure(r, &failure));
                    failed_host = failure.why.host;
                    failure_reply(&failure, cfg.suppress_envoy_headers)
                }
                Outcome::NotSent(failure) => {
                    *forwarded = false;
                    note!(|r| note_failure(r, &failure));
                    failed_host = failure.why.host;
                    failure_reply(&failure, cfg.suppress_envoy_headers)
                }
                Outcome::DownstreamBodyFailed => {
                    note!(|r| {
                        r.flags.set(ResponseFlag::DownstreamProtocolError);
                        r.details = Some("downstream_protocol_error".into())
                    });
                    body_failed()
                }
                Outcome::Response(resp) => {
                    note!(|r| {
                        r.first_upstream_rx = Some(Instant::now());
                        r.upstream_host = resp.extensions().get::<UpstreamHost>().map(|h| h.host);
                        r.details = Some("via_upstream".into())
                    });
                    // The cluster's `max_stream_duration` runs from the last attempt's start.
                    let upstream_end = cluster
                        .config()
                        .max_stream_duration
                        .map(|d| tokio::time::Instant::from_std(start) + last_attempt_at + d);
                    let mut resp = match &StreamLimits::with_upstream(limits, upstream_end) {
                        Some(l) => resp.map(|b| {
                            let stats = (&ctx.hcm, cluster.stats());
                            l.wrap(body::boxed(b), stats, body_activity.clone())
                        }),
                        None => resp.map(body::boxed),
                    };
                    forwarding::mutate_response(resp.headers_mut(), false);
                    if !cfg.suppress_envoy_headers {
                        resp.headers_mut().insert(
                            &UPSTREAM_SERVICE_TIME,
                            super::int_value::int_value(elapsed_ms(start)),
                        );
                    }
                    resp
                }
            };
            let status = resp.status().as_u16();
            let reached = resp
                .extensions()
                .get::<UpstreamHost>()
                .copied()
                .or_else(|| {
                    // A failed attempt's connection, if it had one (a timeout names no host).
                    let noted = lb.target.as_deref().and_then(AttemptTarget::get);
                    noted
                        .filter(|(host, ..)| failed_host.is_none_or(|failed| failed == *host))
                        .map(|(host, remote, _)| UpstreamHost { host, remote })
                });
            let fmt = FormatContext {
                upstream_cluster: Some(&cluster_name),
                upstream_host: reached.map(|h| h.host).or(failed_host),
                upstream_remote: reached.map(|h| h.remote),
                request_headers: routed_view.as_ref(),
                response_code: Some(status),
                response_status: Some(status),
                ..fmt
            };
            selected.apply_response_headers(weighted, resp.headers_mut(), &fmt);
            if vhost.include_attempt_count_in_response {
                resp.headers_mut().insert(
                    &ATTEMPT_COUNT,
                    super::int_value::int_value(u64::from(attempts)),
                );
            }
            resp
        }
    }
}

/// `reply`, a local reply on a forwarding route, with the route's response headers (route,
/// virtual host, route configuration) as Envoy adds them to local replies.
fn with_route_headers(
    selected: Selected<'_>,
    mut reply: Response<Body>,
    fmt: &FormatContext<'_>,
) -> Response<Body> {
    let status = reply.status().as_u16();
    let fmt = FormatContext {
        response_code: Some(status),
        response_status: Some(status),
        ..fmt.clone()
    };
    selected.apply_response_headers(None, reply.headers_mut(), &fmt);
    reply
}

/// The request as the route table reads it.
fn routing<'a>(
    method: &'a http::Method,
    host: &'a str,
    path: &'a str,
    headers: &'a http::HeaderMap,
    https: bool,
    random_value: u64,
    runtime: Option<&'a dyn crate::route::matcher::Runtime>,
) -> RouteRequest<'a> {
    let mut r = RouteRequest::new(method, host, path, headers);
    r.https = https;
    r.random_value = random_value;
    r.runtime = runtime;
    r
}

/// `auto_host_rewrite`: the host name of the cluster's endpoint (its `hostname`, or the DNS
/// name of a DNS cluster); `None` for IP endpoints without a hostname.
fn auto_host(cluster: &ClusterConfig) -> Option<String> {
    let ep = cluster.endpoints.first()?;
    if !ep.hostname.is_empty() {
        return Some(ep.hostname.clone());
    }
    match &ep.address {
        EndpointAddress::Dns { host, .. } => Some(host.clone()),
        EndpointAddress::Ip(_) => None,
    }
}

/// Notes in `r` the cluster the forwarding route `selected` picks for `req`, when it exists.
fn note_route_cluster(
    r: &mut Record,
    selected: Option<Selected<'_>>,
    req: &RouteRequest<'_>,
    ctx: &ConnContext,
) {
    if let Some(Action::Forward(fwd)) = selected.as_ref().map(|s| &s.route.action)
        && let Some(picked) = fwd.pick_cluster(req)
        && ctx.shared.clusters.get(&picked.name).is_some()
    {
        r.upstream_cluster = Some(std::sync::Arc::from(&*picked.name));
    }
}

/// Notes a failure answered locally in the request's record.
fn note_failure(r: &mut Record, failure: &LocalFailure) {
    r.flags.set(failure.why.flag);
    r.details = Some(failure.why.details.clone());
    if failure.why.host.is_some() {
        r.upstream_host = failure.why.host;
    }
    r.upstream_transport_failure = failure.why.transport_failure.clone();
}

/// Envoy's answer to a request whose own body broke (its HTTP/1 codec's error): 400
/// `Bad Request`, and the connection closes.
fn body_failed() -> Response<Body> {
    let mut resp = local_reply(StatusCode::BAD_REQUEST, "Bad Request");
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// The router's answer to a failed exchange; an overflow is marked `x-envoy-overloaded: true`
/// unless the router suppresses its `x-envoy-` headers.
fn failure_reply(failure: &LocalFailure, suppress_envoy_headers: bool) -> Response<Body> {
    let mut resp = local_reply(failure.status, &failure.body);
    if failure.overloaded && !suppress_envoy_headers {
        resp.headers_mut()
            .insert(&OVERLOADED, HeaderValue::from_static("true"));
    }
    resp
}

fn elapsed_ms(start: Instant) -> u64 {
    Duration::as_millis(&start.elapsed()) as u64
}
