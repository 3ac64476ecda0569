//! The compiled route table: virtual-host lookup, route matching in order, actions, rewrites
//! and header mutations, with Envoy's semantics. Pure and allocation-free on a lookup that
//! needs no rewrite. Built by `config::route::compile_route_config`.

pub mod action;
pub mod domain;
pub mod explain;
pub mod filter_matcher;
pub mod format;
pub mod headers;
pub mod matcher;
pub mod metadata;
pub mod per_filter;
pub mod policy;
pub mod rate_limit;
mod rewrite;
pub mod tracing;

use std::borrow::Cow;

use http::{HeaderMap, Method};

pub use action::{
    Action, ClusterSpecifier, DirectResponse, Forward, HostRewrite, PathRewrite, PickedCluster,
    Redirect, RedirectPath, RouteMatch, WeightedCluster, WeightedClusters,
};
pub use domain::DomainKind;
pub use format::{CertFacts, FormatContext, TlsFacts};
pub use headers::{HeaderMutations, HeaderRules};
pub use matcher::{FractionalPercent, Runtime};
pub use policy::{HashPolicy, MirrorPolicy, RetryPolicy};

use domain::DomainIndex;
use matcher::{HeaderMatcher, header_value};

use per_filter::{PerFilterConfigs, PerRoute};

/// The facts of one request that routing looks at.
///
/// Build it with [`RouteRequest::new`] and set the other fields as needed; new optional fields
/// may be added, always with a default in `new`.
#[derive(Clone, Copy)]
pub struct RouteRequest<'a> {
    /// Request method.
    pub method: &'a Method,
    /// `:authority` / `Host` as received.
    pub authority: &'a str,
    /// `:path` as received (path and query).
    pub path: &'a str,
    /// Request headers (without pseudo-headers).
    pub headers: &'a HeaderMap,
    /// Whether `x-forwarded-proto` is `https` (the scheme used for redirects and `require_tls`).
    pub https: bool,
    /// Random value for weighted clusters and runtime fractions (Envoy uses the stream id).
    pub random_value: u64,
    /// Downstream TLS peer certificate facts `(presented, validated)`; `None` on plaintext.
    pub tls_peer: Option<(bool, bool)>,
    /// Runtime overrides for `runtime_fraction`; `None` uses the configured defaults.
    pub runtime: Option<&'a dyn Runtime>,
    /// The request's dynamic metadata, when the route is chosen again after the filters
    /// (`None`: before them, when Envoy also has none).
    pub metadata: Option<&'a crate::route::metadata::DynamicMetadata>,
}

impl<'a> RouteRequest<'a> {
    /// A plaintext request with random value 0 and no runtime.
    pub fn new(
        method: &'a Method,
        authority: &'a str,
        path: &'a str,
        headers: &'a HeaderMap,
    ) -> Self {
        RouteRequest {
            method,
            authority,
            path,
            headers,
            https: false,
            random_value: 0,
            tls_peer: None,
            runtime: None,
            metadata: None,
        }
    }

    /// Whether the request is internal (`x-envoy-internal: true`).
    pub fn is_internal(&self) -> bool {
        self.headers
            .get("x-envoy-internal")
            .is_some_and(|v| v.as_bytes() == b"true")
    }

    /// The request's scheme per `https`.
    pub fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }
}

/// `require_tls` of a virtual host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TlsRequirement {
    /// No requirement.
    None,
    /// External requests must use TLS.
    ExternalOnly,
    /// All requests must use TLS.
    All,
}

/// A `VirtualCluster`: a named request class for stats.
#[derive(Debug, Clone)]
pub struct VirtualCluster {
    /// Name.
    pub name: String,
    /// Conditions (all must hold).
    pub headers: Vec<HeaderMatcher>,
}

/// A compiled route.
#[derive(Debug, Clone)]
pub struct Route {
    /// Route name (may be empty).
    pub name: String,
    /// Match conditions.
    pub matcher: RouteMatch,
    /// What to do.
    pub action: Action,
    /// Route-level header mutations; `None` when there are none (most routes).
    pub headers: Option<Box<HeaderRules>>,
    /// `metadata.filter_metadata` as JSON (namespace -> struct); `None` when there is none.
    pub metadata: Option<Box<serde_json::Map<String, serde_json::Value>>>,
    /// `decorator` and `tracing`; `None` when the route sets neither.
    pub tracing: Option<Box<tracing::RouteTracing>>,
    /// `typed_per_filter_config`.
    pub per_filter: Option<Box<PerFilterConfigs>>,
}

/// A compiled virtual host.
#[derive(Debug, Clone)]
pub struct VirtualHost {
    /// Name.
    pub name: String,
    /// Domains as configured (lower-cased); shared with the table's domain index.
    pub domains: Vec<std::sync::Arc<str>>,
    /// Routes in match order.
    pub routes: Vec<Route>,
    /// `require_tls`.
    pub require_tls: TlsRequirement,
    /// Virtual clusters in order.
    pub virtual_clusters: Vec<VirtualCluster>,
    /// `rate_limits`.
    pub rate_limits: Vec<rate_limit::RateLimitPolicy>,
    /// Virtual-host-level header mutations; `None` when there are none.
    pub headers: Option<Box<HeaderRules>>,
    /// `include_request_attempt_count`.
    pub include_request_attempt_count: bool,
    /// `include_attempt_count_in_response`.
    pub include_attempt_count_in_response: bool,
    /// `typed_per_filter_config`.
    pub per_filter: Option<Box<PerFilterConfigs>>,
}

impl VirtualHost {
    /// The virtual cluster of a request: the first that matches, `other` when the virtual
    /// host has virtual clusters but none matches, `None` when it has none.
    pub fn virtual_cluster(&self, req: &RouteRequest<'_>) -> Option<&str> {
        if self.virtual_clusters.is_empty() {
            return None;
        }
        Some(
            self.virtual_clusters
                .iter()
                .find(|vc| vc.headers.iter().all(|h| h.matches(req)))
                .map_or("other", |vc| vc.name.as_str()),
        )
    }
}

/// A compiled `RouteConfiguration`.
#[derive(Debug, Clone)]
pub struct RouteTable {
    pub(crate) name: String,
    pub(crate) virtual_hosts: Vec<VirtualHost>,
    pub(crate) domains: DomainIndex,
    pub(crate) vhost_header: Option<String>,
    pub(crate) ignore_port_in_host_matching: bool,
    pub(crate) ignore_path_parameters: bool,
    pub(crate) headers: Option<Box<HeaderRules>>,
    pub(crate) most_specific_header_mutations_wins: bool,
    pub(crate) internal_only_headers: Vec<http::HeaderName>,
    pub(crate) per_filter: Option<Box<PerFilterConfigs>>,
    /// The 301-to-https route returned when a virtual host's `require_tls` rejects a request.
    pub(crate) tls_redirect: Route,
}

/// The outcome of routing one request.
#[derive(Debug, Clone, Copy)]
pub struct Selected<'a> {
    /// The table.
    pub table: &'a RouteTable,
    /// The virtual host.
    pub virtual_host: &'a VirtualHost,
    /// The domain pattern that matched (`*` for the default).
    pub domain: &'a str,
    /// What kind of pattern matched.
    pub domain_kind: DomainKind,
    /// The route (the virtual host's TLS redirect when `require_tls` applied).
    pub route: &'a Route,
    /// The route's index in the virtual host; `None` for the TLS redirect.
    pub route_index: Option<usize>,
}

impl RouteTable {
    /// The route configuration's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Virtual hosts in configuration order.
    pub fn virtual_hosts(&self) -> &[VirtualHost] {
        &self.virtual_hosts
    }

    /// `internal_only_headers`: the caller removes them from external requests.
    pub fn internal_only_headers(&self) -> &[http::HeaderName] {
        &self.internal_only_headers
    }

    /// Route-configuration-level header mutations.
    pub fn headers(&self) -> Option<&HeaderRules> {
        self.headers.as_deref()
    }

    /// The host used for virtual-host selection, lower-cased, port stripped when configured.
    fn host_key<'r>(&self, req: &RouteRequest<'r>) -> Cow<'r, str> {
        let raw = match &self.vhost_header {
            Some(h) => header_value(req, h).unwrap_or(Cow::Borrowed("")),
            None => Cow::Borrowed(req.authority),
        };
        let raw = match raw {
            Cow::Borrowed(s) if self.ignore_port_in_host_matching => {
                Cow::Borrowed(domain::strip_port(s))
            }
            Cow::Owned(s) if self.ignore_port_in_host_matching => {
                Cow::Owned(domain::strip_port(&s).to_owned())
            }
            other => other,
        };
        if raw.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(raw.to_ascii_lowercase())
        } else {
            raw
        }
    }

    /// The virtual host for a request, with the matched domain pattern.
    pub fn find_virtual_host(
        &self,
        req: &RouteRequest<'_>,
    ) -> Option<(&VirtualHost, &str, DomainKind)> {
        let host = self.host_key(req);
        let (v, slot, kind) = self.domains.find(&host)?;
        let vh = &self.virtual_hosts[v];
        Some((vh, &vh.domains[slot], kind))
    }

    /// Routes a request: virtual host by domain, then the first route that matches.
    pub fn select(&self, req: &RouteRequest<'_>) -> Option<Selected<'_>> {
        let (vh, domain, domain_kind) = self.find_virtual_host(req)?;
        let selected = |route, route_index| Selected {
            table: self,
            virtual_host: vh,
            domain,
            domain_kind,
            route,
            route_index,
        };
        let needs_tls = match vh.require_tls {
            TlsRequirement::None => false,
            TlsRequirement::ExternalOnly => !req.https && !req.is_internal(),
            TlsRequirement::All => !req.https,
        };
        if needs_tls {
            return Some(selected(&self.tls_redirect, None));
        }
        let path = self.match_path(req.path);
        vh.routes
            .iter()
            .position(|r| r.matches(req, &path))
            .map(|i| selected(&vh.routes[i], Some(i)))
    }

    /// The path used for matching (`ignore_path_parameters_in_path_matching` strips `;...`).
    pub(crate) fn match_path<'r>(&self, path: &'r str) -> Cow<'r, str> {
        if !self.ignore_path_parameters || !path.contains(';') {
            return Cow::Borrowed(path);
        }
        let (p, q) = match path.find('?') {
            Some(i) => (&path[..i], &path[i..]),
            None => (path, ""),
        };
        let mut out = p
            .split('/')
            .map(|seg| seg.split(';').next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("/");
        out.push_str(q);
        Cow::Owned(out)
    }
}

impl RouteMatch {
    /// Whether the request (whose matching path is `path`) meets every condition.
    pub fn matches(&self, req: &RouteRequest<'_>, path: &str) -> bool {
        self.failure(req, path).is_none()
    }

    /// The first condition the request fails, if any.
    fn failure(&self, req: &RouteRequest<'_>, path: &str) -> Option<Failure<'_>> {
        let m = self;
        let more = m.more.as_deref();
        if let Some(f) = more.and_then(|c| c.runtime_fraction.as_ref())
            && !f.enabled(req)
        {
            return Some(Failure::Runtime(&f.key));
        }
        if !m.path.matches(path, req.method, m.case_sensitive) {
            return Some(Failure::Path(&m.path));
        }
        if let Some(h) = m.headers.iter().find(|h| !h.matches(req)) {
            return Some(Failure::Header(h));
        }
        if let Some(more) = more {
            let query = matcher::query_of(path);
            if let Some(q) = more.query_parameters.iter().find(|q| !q.matches(query)) {
                return Some(Failure::Query(&q.name));
            }
        }
        if m.grpc && !is_grpc(req) {
            return Some(Failure::Grpc);
        }
        let more = more?;
        if let Some((presented, validated)) = more.tls_context {
            let ok = req.tls_peer.is_some_and(|(p, v)| {
                presented.is_none_or(|want| want == p) && validated.is_none_or(|want| want == v)
            });
            if !ok {
                return Some(Failure::Tls);
            }
        }
        for (name, sm, invert) in &more.cookies {
            if policy::cookie(req, name).is_none_or(|v| sm.matches(v) == *invert) {
                return Some(Failure::Cookie(name));
            }
        }
        if let Some(m) = more
            .dynamic_metadata
            .iter()
            .find(|m| !m.matches(req.metadata))
        {
            return Some(Failure::DynamicMetadata(&m.namespace));
        }
        None
    }
}

/// Why a route did not match a request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Mismatch(pub String);

/// The first condition of a route that failed, without allocating.
#[derive(Debug, Clone, Copy)]
enum Failure<'r> {
    Runtime(&'r str),
    Path(&'r matcher::PathMatch),
    Header(&'r HeaderMatcher),
    Query(&'r str),
    Grpc,
    Tls,
    Cookie(&'r str),
    DynamicMetadata(&'r str),
}

impl Route {
    /// Whether the route matches the request (whose matching path is `path`).
    pub fn matches(&self, req: &RouteRequest<'_>, path: &str) -> bool {
        self.failure(req, path).is_none()
    }

    /// `None` when the route matches the request (whose matching path is `path`), otherwise
    /// the first condition that failed, described.
    pub fn mismatch(&self, req: &RouteRequest<'_>, path: &str) -> Option<Mismatch> {
        Some(Mismatch(match self.failure(req, path)? {
            Failure::Runtime(key) => format!("runtime_fraction {key:?} not enabled"),
            Failure::Path(p) => format!("{} does not match", p.describe()),
            Failure::Header(h) => format!("{} does not match", h.describe()),
            Failure::Query(name) => format!("query parameter {name:?} does not match"),
            Failure::Grpc => "not a gRPC request".to_owned(),
            Failure::Tls => "tls_context does not match".to_owned(),
            Failure::Cookie(name) => format!("cookie {name:?} does not match"),
            Failure::DynamicMetadata(ns) => format!("dynamic metadata of {ns:?} does not match"),
        }))
    }

    fn failure(&self, req: &RouteRequest<'_>, path: &str) -> Option<Failure<'_>> {
        self.matcher.failure(req, path)
    }

    /// The `Forward` action, if this route forwards.
    pub fn forward(&self) -> Option<&Forward> {
        match &self.action {
            Action::Forward(f) => Some(f),
            _ => None,
        }
    }
}

fn is_grpc(req: &RouteRequest<'_>) -> bool {
    req.headers
        .get(action::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.strip_prefix("application/grpc").is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('+') || rest.starts_with(';')
            })
        })
}

impl<'a> Selected<'a> {
    /// Whether the filter named `name` is disabled here: what the most specific level (route,
    /// virtual host, route configuration) naming it says; `None` when none does.
    pub fn filter_disabled(&self, name: &str) -> Option<bool> {
        self.per_filter_levels()
            .find_map(|p| p.get(name))
            .map(PerRoute::disabled)
    }

    /// The most specific configuration that replaces the filter `name`'s own here, when it is
    /// a `T` (the filter's per-route type).
    pub fn filter_config<T: per_filter::FilterRouteConfig>(&self, name: &str) -> Option<&'a T> {
        let c = self
            .per_filter_levels()
            .find_map(|p| p.get(name).and_then(PerRoute::config))?;
        (c as &dyn std::any::Any).downcast_ref::<T>()
    }

    /// Every level's configuration replacing the filter `name`'s own, most specific first
    /// (for filters that merge them, as Envoy's `getMergedPerFilterConfig`).
    pub fn filter_configs<T: per_filter::FilterRouteConfig>(
        &self,
        name: &str,
    ) -> impl Iterator<Item = &'a T> {
        self.per_filter_levels()
            .filter_map(move |p| p.get(name).and_then(PerRoute::config))
            .filter_map(|c| (c as &dyn std::any::Any).downcast_ref::<T>())
    }

    /// The deprecated `cors` policies (of type `T`) of the route action and the virtual host,
    /// in that order.
    pub fn legacy_cors<T: per_filter::FilterRouteConfig>(&self) -> impl Iterator<Item = &'a T> {
        [
            self.route.per_filter.as_deref(),
            self.virtual_host.per_filter.as_deref(),
        ]
        .into_iter()
        .flatten()
        .filter_map(PerFilterConfigs::legacy_cors)
        .filter_map(|c| (c as &dyn std::any::Any).downcast_ref::<T>())
    }

    /// The levels' `typed_per_filter_config`, most specific first.
    fn per_filter_levels(&self) -> impl Iterator<Item = &'a PerFilterConfigs> {
        [
            self.route.per_filter.as_deref(),
            self.virtual_host.per_filter.as_deref(),
            self.table.per_filter.as_deref(),
        ]
        .into_iter()
        .flatten()
    }

    /// Header-mutation levels for the request in Envoy's order: weighted cluster first, then
    /// route, virtual host, route configuration (reversed between the last three when
    /// `most_specific_header_mutations_wins`, so the most specific is applied last).
    pub fn header_levels(
        &self,
        weighted: Option<&'a WeightedCluster>,
    ) -> [Option<&'a HeaderRules>; 4] {
        let (route, vhost, table) = (
            self.route.headers.as_deref(),
            self.virtual_host.headers.as_deref(),
            self.table.headers.as_deref(),
        );
        let w = weighted.and_then(|w| w.headers.as_deref());
        if self.table.most_specific_header_mutations_wins {
            [w, table, vhost, route]
        } else {
            [w, route, vhost, table]
        }
    }

    /// Applies `request_headers_to_remove/add` of every level to the upstream request headers.
    pub fn apply_request_headers(
        &self,
        weighted: Option<&'a WeightedCluster>,
        headers: &mut HeaderMap,
        ctx: &FormatContext<'_>,
    ) {
        for level in self.header_levels(weighted).into_iter().flatten() {
            level.request.apply_request(headers, ctx);
        }
    }

    /// Applies `response_headers_to_remove/add` of every level to the downstream response.
    pub fn apply_response_headers(
        &self,
        weighted: Option<&'a WeightedCluster>,
        headers: &mut HeaderMap,
        ctx: &FormatContext<'_>,
    ) {
        for level in self.header_levels(weighted).into_iter().flatten() {
            level.response.apply_response(headers, ctx);
        }
    }

    /// The virtual cluster of the request (see [`VirtualHost::virtual_cluster`]).
    pub fn virtual_cluster(&self, req: &RouteRequest<'_>) -> Option<&'a str> {
        self.virtual_host.virtual_cluster(req)
    }

    /// The rewritten `:path` (query kept), or `None` when the route does not rewrite it.
    pub fn rewritten_path(&self, req: &RouteRequest<'_>) -> Option<String> {
        let f = self.route.forward()?;
        rewrite::path(
            self.route,
            f.path_rewrite.as_deref()?,
            &self.table.match_path(req.path),
            req.path,
        )
    }

    /// The rewritten `:authority`, or `None` when unchanged. `auto_host_rewrite` is left to
    /// the caller (it needs the upstream host).
    pub fn rewritten_host<'r>(
        &self,
        req: &RouteRequest<'r>,
        weighted: Option<&'a WeightedCluster>,
    ) -> Option<Cow<'r, str>>
    where
        'a: 'r,
    {
        if let Some(h) = weighted.and_then(|w| w.host_rewrite_literal.as_deref()) {
            return Some(Cow::Borrowed(h));
        }
        match self.route.forward()?.host_rewrite.as_deref()? {
            HostRewrite::Literal(h) => Some(Cow::Borrowed(h.as_str())),
            HostRewrite::Auto => None,
            HostRewrite::Header(name) => header_value(req, name).filter(|v| !v.is_empty()),
            HostRewrite::PathRegex(re, sub) => Some(Cow::Owned(
                re.replace_all(matcher::strip_query(req.path), sub.as_str())
                    .into_owned(),
            )),
        }
    }

    /// For a redirect route (or the TLS redirect): the `Location` URL.
    pub fn redirect_location(&self, req: &RouteRequest<'_>) -> Option<String> {
        match &self.route.action {
            Action::Redirect(r) => Some(rewrite::redirect_location(self.route, r, req)),
            _ => None,
        }
    }

    /// For direct responses, Envoy's `newUri`: the request's own URL (used as `Location` on a
    /// 3xx direct response).
    pub fn request_url(req: &RouteRequest<'_>) -> String {
        format!("{}://{}{}", req.scheme(), req.authority, req.path)
    }
}

#[cfg(test)]
mod tests;
