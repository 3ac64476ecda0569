//! `envoy.filters.http.ext_authz`: each request is checked by an authorization service (gRPC
//! `Authorization/Check`, or an HTTP service) before it goes on; the answer allows it (with
//! header changes upstream and on the response), denies it (the service's status, headers
//! and body), or fails (`status_on_error`, unless `failure_mode_allow`).

mod check;
mod grpc;
mod http_service;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::{Encoder, Encoders, FilterRequest};
use crate::access_log::ResponseFlag;
use crate::body::Body;
use crate::config::http_filter::ext_authz::{
    CheckSettings, ExtAuthzConfig, ExtAuthzPerRoute, Service,
};
use crate::http::local_reply::local_reply;
use crate::stats::keyed::Keyed;
use crate::stats::{Block, Counter, Slot, Store};

static FAILURE_MODE_ALLOWED: HeaderName =
    HeaderName::from_static("x-envoy-auth-failure-mode-allowed");

/// The ext_authz filter of one connection manager.
#[derive(Debug)]
pub(super) struct ExtAuthz {
    config: Arc<ExtAuthzConfig>,
    stats: Stats,
}

/// `http.<prefix>.ext_authz.[<stat_prefix>.]*`, and the same under the route's cluster
/// (`cluster.<name>.ext_authz.[<stat_prefix>.]*`).
#[derive(Debug)]
struct Stats {
    /// `disabled`: requests `filter_enabled_metadata` left unchecked.
    disabled: Counter,
    ok: Counter,
    /// `ignored_dynamic_metadata`: answers whose metadata was not written.
    ignored_dynamic_metadata: Counter,
    denied: Counter,
    error: Counter,
    failure_mode_allowed: Counter,
    /// Holds the filter's [`ZEROS`].
    _zeros: Block,
    store: Store,
    /// `ext_authz.[<stat_prefix>.]`, the counters' names under a cluster's prefix.
    own: String,
    /// The route clusters' counters, by cluster name (held: the store frees a metric
    /// nothing holds).
    by_cluster: Keyed<Arc<ClusterCounters>>,
}

/// The filter's stats Envoy 1.40 lists that stay 0 in revoy, which never has their events:
/// `shadow_mode`, header mutation rules and filter state are configuration errors, header
/// limits are not enforced, and an answer Envoy calls invalid is a failed check (`error`).
static ZEROS: [Slot; 7] = [
    Slot::counter("filter_state_name_collision"),
    Slot::counter("invalid"),
    Slot::counter("omitted_response_headers"),
    Slot::counter("request_header_limits_reached"),
    Slot::counter("response_header_limits_reached"),
    Slot::counter("shadow_denied"),
    Slot::counter("shadow_error"),
];

/// `cluster.<name>.ext_authz.[<stat_prefix>.]{ok,denied,error,failure_mode_allowed}`.
#[derive(Debug)]
struct ClusterCounters {
    ok: Counter,
    denied: Counter,
    error: Counter,
    failure_mode_allowed: Counter,
}

/// Where a check's answer writes its dynamic metadata.
const METADATA_NAMESPACE: &str = "envoy.filters.http.ext_authz";

/// A header change the service asks for.
#[derive(Debug, Clone)]
struct Mutation {
    name: HeaderName,
    value: HeaderValue,
    action: Action,
}

/// How a [`Mutation`] applies (Envoy's `HeaderMutationAction`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Action {
    /// A new entry, whatever exists.
    Add,
    /// The value appended to an existing header's with `,`; added when absent.
    Append,
    /// Replaces any existing entries.
    Set,
    /// Added only when absent.
    AddIfAbsent,
    /// Replaces existing entries; nothing when absent.
    OverwriteIfExists,
}

/// What the service decided.
#[derive(Debug)]
enum Decision {
    /// Allowed, with changes to the request and to its response.
    Ok {
        upstream: Vec<Mutation>,
        remove: Vec<String>,
        response: Vec<Mutation>,
    },
    /// Denied: answer with this.
    Denied {
        status: u16,
        headers: Vec<Mutation>,
        body: Bytes,
    },
    /// The check failed.
    Error,
}

/// Headers the service asked to add to the request's response.
#[derive(Debug)]
pub(super) struct ResponseHeaders(Vec<Mutation>);

impl ExtAuthz {
    /// The filter with `config`, its stats under `http.<stat_prefix>.ext_authz.`.
    pub(super) fn new(config: &Arc<ExtAuthzConfig>, store: &Store, stat_prefix: &str) -> ExtAuthz {
        let own = match config.stat_prefix.as_str() {
            "" => "ext_authz.".to_owned(),
            own => format!("ext_authz.{own}."),
        };
        let counter = |n: &str| store.counter(&format!("http.{stat_prefix}.{own}{n}"));
        ExtAuthz {
            config: config.clone(),
            stats: Stats {
                disabled: counter("disabled"),
                ok: counter("ok"),
                ignored_dynamic_metadata: counter("ignored_dynamic_metadata"),
                denied: counter("denied"),
                error: counter("error"),
                failure_mode_allowed: counter("failure_mode_allowed"),
                _zeros: store.block_with_zeros(&format!("http.{stat_prefix}.{own}"), &[], &ZEROS),
                store: store.clone(),
                own,
                by_cluster: Keyed::default(),
            },
        }
    }

    /// Checks `req` (unless the route disables the check) and lets it go on or answers it.
    pub(super) async fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        route_settings: Option<Vec<&ExtAuthzPerRoute>>,
        encoders: &mut Encoders,
    ) -> Option<Response<Body>> {
        let clusters = &req.conn.shared.clusters;
        // Envoy checks only requests that have a route.
        let route = req.route?;
        let levels = route_settings.unwrap_or_default();
        if matches!(levels.first(), Some(ExtAuthzPerRoute::Disabled)) {
            return None;
        }
        if let Some(m) = &self.config.enabled_metadata
            && !m.matches(Some(&*req.metadata))
        {
            self.stats.disabled.inc();
            return None;
        }
        let settings = merged(&levels);
        let buffer = match &settings {
            Some(s) if s.disable_request_body_buffering => None,
            Some(CheckSettings {
                with_request_body: Some(b),
                ..
            }) => Some(*b),
            _ => self.config.with_request_body,
        };
        let body = match buffer {
            Some(b) => match check::read_body(req, b).await {
                Ok(body) => body,
                Err(reply) => return Some(reply),
            },
            None => None,
        };
        let message = check::request(
            req,
            &self.config,
            settings.map(|s| s.context_extensions).unwrap_or_default(),
            body,
        );
        let started = std::time::Instant::now();
        let (decision, metadata) = match &self.config.service {
            Service::Grpc(target) => {
                grpc::check(clusters, target, self.config.timeout, &message).await
            }
            Service::Http(target) => {
                http_service::check(clusters, target, self.config.timeout, &message).await
            }
        };
        if let Some(mut metadata) = metadata.filter(|m| !m.fields.is_empty()) {
            if self.config.ingest_dynamic_metadata {
                // Envoy adds how long an allowing check took.
                if matches!(decision, Decision::Ok { .. }) {
                    let ms = started.elapsed().as_millis() as f64;
                    metadata.fields.insert(
                        "ext_authz_duration".into(),
                        crate::route::metadata::number_value(ms),
                    );
                }
                req.metadata.set(METADATA_NAMESPACE, metadata);
            } else {
                self.stats.ignored_dynamic_metadata.inc();
            }
        }
        let cluster = self.route_cluster(route);
        match decision {
            Decision::Ok {
                upstream,
                remove,
                response,
            } => {
                if self.config.clear_route_cache && !(upstream.is_empty() && remove.is_empty()) {
                    req.clear_route_cache = true;
                }
                for m in &upstream {
                    apply(req.headers, m);
                }
                for name in &remove {
                    if removable(name) {
                        req.headers.remove(name.as_str());
                    }
                }
                if !response.is_empty() {
                    encoders
                        .0
                        .push(Encoder::ExtAuthz(ResponseHeaders(response)));
                }
                self.stats.ok.inc();
                if let Some(c) = cluster {
                    c.ok.inc();
                }
                None
            }
            Decision::Denied {
                status,
                headers,
                body,
            } => {
                self.stats.denied.inc();
                if let Some(c) = &cluster {
                    c.denied.inc();
                }
                if self.config.charge_cluster_response_stats
                    && let Some(c) = self.route_cluster_stats(route, clusters)
                {
                    c.charge_status(status, true);
                }
                req.note(
                    ResponseFlag::UnauthorizedExternalService,
                    Some("ext_authz_denied"),
                );
                let body = match self.config.max_denied_response_body_bytes {
                    0 => body,
                    max => body.slice(..body.len().min(max)),
                };
                Some(denial(status, &headers, &String::from_utf8_lossy(&body)))
            }
            Decision::Error => {
                self.stats.error.inc();
                if let Some(c) = &cluster {
                    c.error.inc();
                }
                if self.config.failure_mode_allow {
                    self.stats.failure_mode_allowed.inc();
                    if let Some(c) = &cluster {
                        c.failure_mode_allowed.inc();
                    }
                    if self.config.failure_mode_allow_header_add {
                        req.headers
                            .insert(&FAILURE_MODE_ALLOWED, HeaderValue::from_static("true"));
                    }
                    return None;
                }
                req.note(
                    ResponseFlag::UnauthorizedExternalService,
                    Some("ext_authz_error"),
                );
                let status = StatusCode::from_u16(self.config.status_on_error)
                    .unwrap_or(StatusCode::FORBIDDEN);
                Some(local_reply(status, ""))
            }
        }
    }

    /// The counters of the cluster the route sends to, if it names one.
    fn route_cluster(&self, route: crate::route::Selected<'_>) -> Option<Arc<ClusterCounters>> {
        let name = cluster_name(route)?;
        Some(self.stats.by_cluster.get(name, || {
            let counter = |n: &str| {
                self.stats
                    .store
                    .counter(&format!("cluster.{name}.{}{n}", self.stats.own))
            };
            Arc::new(ClusterCounters {
                ok: counter("ok"),
                denied: counter("denied"),
                error: counter("error"),
                failure_mode_allowed: counter("failure_mode_allowed"),
            })
        }))
    }

    /// The stats of the cluster the route sends to, if it exists.
    fn route_cluster_stats(
        &self,
        route: crate::route::Selected<'_>,
        clusters: &crate::upstream::ClusterManager,
    ) -> Option<Arc<crate::upstream::ClusterStats>> {
        Some(clusters.get(cluster_name(route)?)?.stats().clone())
    }
}

impl ResponseHeaders {
    /// Adds the headers to the response.
    pub(super) fn encode(&self, resp: &mut Response<Body>) {
        for m in &self.0 {
            apply(resp.headers_mut(), m);
        }
    }
}

/// The cluster a route names (`None` for other actions and cluster specifiers).
fn cluster_name(route: crate::route::Selected<'_>) -> Option<&str> {
    match &route.route.forward()?.cluster {
        crate::route::action::ClusterSpecifier::Name(n) => Some(n.as_str()),
        _ => None,
    }
}

/// The per-route settings in force: the most specific level's flags, with the
/// `context_extensions` of every level merged (more specific levels win per key), as
/// Envoy merges them. `levels` are most specific first.
fn merged(levels: &[&ExtAuthzPerRoute]) -> Option<CheckSettings> {
    let mut out: Option<CheckSettings> = None;
    for level in levels.iter().rev() {
        let ExtAuthzPerRoute::Check(s) = level else {
            continue;
        };
        let merged = match out.take() {
            None => s.clone(),
            Some(mut base) => {
                for (k, v) in &s.context_extensions {
                    match base.context_extensions.iter_mut().find(|(bk, _)| bk == k) {
                        Some(slot) => slot.1 = v.clone(),
                        None => base.context_extensions.push((k.clone(), v.clone())),
                    }
                }
                CheckSettings {
                    context_extensions: base.context_extensions,
                    ..s.clone()
                }
            }
        };
        out = Some(merged);
    }
    out
}

/// Whether the service may remove `name` from the request (not a pseudo-header, nor Host).
fn removable(name: &str) -> bool {
    !name.starts_with(':') && !name.eq_ignore_ascii_case("host")
}

/// Applies one mutation to `headers`.
fn apply(headers: &mut HeaderMap, m: &Mutation) {
    let exists = headers.contains_key(&m.name);
    match m.action {
        Action::Add => {
            headers.append(&m.name, m.value.clone());
        }
        Action::Set => {
            headers.insert(&m.name, m.value.clone());
        }
        Action::AddIfAbsent if !exists => {
            headers.insert(&m.name, m.value.clone());
        }
        Action::OverwriteIfExists if exists => {
            headers.insert(&m.name, m.value.clone());
        }
        Action::Append => match headers.get(&m.name) {
            Some(old) => {
                let mut joined = old.as_bytes().to_vec();
                joined.push(b',');
                joined.extend_from_slice(m.value.as_bytes());
                if let Ok(v) = HeaderValue::from_bytes(&joined) {
                    headers.insert(&m.name, v);
                }
            }
            None => {
                headers.insert(&m.name, m.value.clone());
            }
        },
        Action::AddIfAbsent | Action::OverwriteIfExists => {}
    }
}

/// The local reply of a denial: the service's status, headers (replacing the reply's own)
/// and body.
fn denial(status: u16, headers: &[Mutation], body: &str) -> Response<Body> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
    let mut resp = local_reply(status, body);
    for m in headers {
        resp.headers_mut().remove(&m.name);
    }
    for m in headers {
        apply(resp.headers_mut(), m);
    }
    resp
}
