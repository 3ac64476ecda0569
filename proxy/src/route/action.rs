//! What a matched route does: forward to a cluster, redirect, or answer directly.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, StatusCode};
use regex::Regex;

use super::RouteRequest;
use super::headers::HeaderRules;
use super::matcher::{HeaderMatcher, RuntimeFraction, header_value};
use super::policy::{HashPolicy, MirrorPolicy, RetryPolicy};

/// A route's action.
#[derive(Debug, Clone)]
pub enum Action {
    /// Proxy to an upstream cluster.
    Forward(Box<Forward>),
    /// Answer with a redirect (boxed like `Forward`: a route is mostly its action's size).
    Redirect(Box<Redirect>),
    /// Answer with a fixed response.
    DirectResponse(Box<DirectResponse>),
    /// `non_forwarding_action`: matched, but the router filter does nothing.
    NonForwarding,
}

/// How the upstream cluster is chosen.
#[derive(Debug, Clone)]
pub enum ClusterSpecifier {
    /// A fixed cluster.
    Name(String),
    /// The cluster named by a request header.
    Header(String),
    /// One of several clusters, by weight (boxed: rare, and large next to a name).
    Weighted(Box<WeightedClusters>),
}

/// `weighted_clusters`.
#[derive(Debug, Clone)]
pub struct WeightedClusters {
    /// The clusters, in order.
    pub clusters: Vec<WeightedCluster>,
    /// Sum of the weights.
    pub total_weight: u64,
    /// `header_name`: take the random value from this request header when it parses.
    pub random_value_header: Option<String>,
}

/// One entry of `weighted_clusters`.
#[derive(Debug, Clone)]
pub struct WeightedCluster {
    /// Cluster name (empty when `cluster_header` is used).
    pub name: String,
    /// Take the cluster name from this request header.
    pub cluster_header: Option<String>,
    /// Weight.
    pub weight: u32,
    /// Per-cluster header mutations (applied before the route's).
    pub headers: Option<Box<HeaderRules>>,
    /// Per-cluster `host_rewrite_literal`.
    pub host_rewrite_literal: Option<String>,
}

impl WeightedClusters {
    /// Envoy's pick: `random_value % total_weight` against cumulative weights.
    pub fn pick(&self, random_value: u64) -> Option<&WeightedCluster> {
        if self.total_weight == 0 {
            return None;
        }
        let selected = random_value % self.total_weight;
        let mut end = 0u64;
        for c in &self.clusters {
            end += u64::from(c.weight);
            if selected < end {
                return Some(c);
            }
        }
        self.clusters.last()
    }
}

/// The cluster chosen for one request. `'t` is the route table's lifetime: nothing here
/// borrows the request.
#[derive(Debug, Clone)]
pub struct PickedCluster<'t> {
    /// Cluster name: borrowed from the table, or owned when read from a request header.
    pub name: Cow<'t, str>,
    /// The weighted entry, when `weighted_clusters` chose it.
    pub weighted: Option<&'t WeightedCluster>,
}

/// How the path is rewritten before forwarding.
#[derive(Debug, Clone)]
pub enum PathRewrite {
    /// `prefix_rewrite`: replace the matched prefix.
    Prefix(String),
    /// `regex_rewrite`: replace every match in the path (query excluded).
    Regex(Regex, String),
    /// `path_rewrite_policy` (`uri_template_rewriter`): rebuild the path (query excluded)
    /// from the variables of the route's `path_match_policy` template.
    Template(TemplateRewrite),
}

/// One piece of a [`TemplateRewrite`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateRewritePiece {
    /// Copied as is.
    Literal(String),
    /// The text the match template's variable of this name captured.
    Variable(String),
}

/// A compiled `path_template_rewrite` (`/v2/{lang}/{rest}`).
#[derive(Debug, Clone)]
pub struct TemplateRewrite {
    /// The configured template.
    pub template: String,
    /// Literals and variable references, in order.
    pub pieces: Vec<TemplateRewritePiece>,
}

impl TemplateRewrite {
    /// Parses a rewrite template like Envoy's `parseRewritePattern`: it starts with `/`, has
    /// no `//`, literals are RFC 3986 `pchar`s or `/`, variables are `{name}`. `None` when
    /// invalid (Envoy gives no detail).
    pub fn parse(template: &str) -> Option<Self> {
        if !template.starts_with('/') || template.contains("//") {
            return None;
        }
        let mut pieces = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            let (literal, var) = rest.split_once('{').unwrap_or((rest, ""));
            if !literal.is_empty() {
                if !super::matcher::is_template_literal(literal, true) {
                    return None;
                }
                pieces.push(TemplateRewritePiece::Literal(literal.to_owned()));
            }
            if literal.len() == rest.len() {
                break;
            }
            let (name, tail) = var.split_once('}')?;
            if !super::matcher::is_template_variable_name(name) {
                return None;
            }
            pieces.push(TemplateRewritePiece::Variable(name.to_owned()));
            rest = tail;
        }
        Some(TemplateRewrite {
            template: template.to_owned(),
            pieces,
        })
    }

    /// Whether every variable it references is a named group of `matcher` (the compiled
    /// match template).
    pub fn variables_defined_by(&self, matcher: &Regex) -> bool {
        self.pieces.iter().all(|p| match p {
            TemplateRewritePiece::Literal(_) => true,
            TemplateRewritePiece::Variable(v) => matcher.capture_names().any(|n| n == Some(v)),
        })
    }

    /// The new path (without query) from the match template's captures.
    pub fn substitute(&self, captures: &regex::Captures<'_>) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                TemplateRewritePiece::Literal(l) => out.push_str(l),
                TemplateRewritePiece::Variable(v) => {
                    out.push_str(captures.name(v).map_or("", |m| m.as_str()))
                }
            }
        }
        out
    }
}

/// How the `:authority` is rewritten before forwarding.
#[derive(Debug, Clone)]
pub enum HostRewrite {
    /// `host_rewrite_literal`.
    Literal(String),
    /// `auto_host_rewrite`: the upstream host's hostname (done by the caller, which knows it).
    Auto,
    /// `host_rewrite_header`: the value of this request header, when present.
    Header(String),
    /// `host_rewrite_path_regex`: substitute on the path (query excluded).
    PathRegex(Regex, String),
}

/// One `upgrade_configs` entry, of a route or of the connection manager: an `Upgrade:` type
/// (`websocket`, any other token) or `CONNECT`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UpgradeSetting {
    /// Lower-case upgrade type (`websocket`, `connect`).
    pub upgrade_type: String,
    /// Whether it is enabled.
    pub enabled: bool,
    /// A route's `connect_config`: a CONNECT is answered `200` by the proxy itself and its
    /// payload goes to the upstream as raw TCP; without it the CONNECT request is forwarded.
    pub terminate_connect: bool,
}

/// Whether an upgrade of `upgrade_type` (`CONNECT` for a CONNECT request) may go on, as in
/// Envoy: the matched route's setting for that type when it has one, else the connection
/// manager's; refused when neither names it.
pub fn upgrade_allowed(
    route: &[UpgradeSetting],
    hcm: &[UpgradeSetting],
    upgrade_type: &str,
) -> bool {
    route
        .iter()
        .chain(hcm)
        .find(|u| u.upgrade_type.eq_ignore_ascii_case(upgrade_type))
        .is_some_and(|u| u.enabled)
}

/// `max_stream_duration` of a route. Its presence alone switches the route to Envoy's "new
/// timeouts": the route `timeout` no longer applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamDuration {
    /// `max_stream_duration`: `Some(0)` means no limit, `None` leaves the connection
    /// manager's `max_stream_duration` in force.
    pub max: Option<Duration>,
    /// `grpc_timeout_header_max`: when set, a request's `grpc-timeout` is its limit instead,
    /// capped at this (0: no cap).
    pub grpc_timeout_header_max: Option<Duration>,
    /// `grpc_timeout_header_offset`: taken off a `grpc-timeout` limit.
    pub grpc_timeout_header_offset: Option<Duration>,
}

/// How a route bounds a stream besides its `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamTimeouts {
    /// `max_stream_duration` is set.
    Duration(StreamDuration),
    /// The deprecated `max_grpc_timeout` (without `max_stream_duration`): a gRPC request's
    /// `grpc-timeout`, less `offset`, is its route timeout, capped at `max` (0: no cap).
    LegacyGrpc {
        /// `max_grpc_timeout`.
        max: Duration,
        /// `grpc_timeout_offset`.
        offset: Option<Duration>,
    },
}

/// Forwarding settings (`RouteAction`). A route table holds one per forwarding route, so the
/// settings most routes lack take little room (boxed slices, boxed rarities).
#[derive(Debug, Clone)]
pub struct Forward {
    /// Cluster choice.
    pub cluster: ClusterSpecifier,
    /// Status when the chosen cluster does not exist (503, 404 or 500).
    pub cluster_not_found_response_code: StatusCode,
    /// Path rewrite.
    pub path_rewrite: Option<Box<PathRewrite>>,
    /// Host rewrite.
    pub host_rewrite: Option<Box<HostRewrite>>,
    /// `append_x_forwarded_host`.
    pub append_x_forwarded_host: bool,
    /// Upstream timeout: `None` when disabled (configured 0); default 15 s.
    pub timeout: Option<Duration>,
    /// `max_stream_duration` or `max_grpc_timeout`; `None` when neither is set.
    pub stream_timeouts: Option<Box<StreamTimeouts>>,
    /// Effective retry policy (route's, else the virtual host's).
    pub retry_policy: Option<Arc<RetryPolicy>>,
    /// Effective mirror policies (route's, else the virtual host's, else the table's);
    /// inherited lists are shared, not copied.
    pub mirror_policies: Arc<[MirrorPolicy]>,
    /// Idle timeout, hash policies, upgrades and buffer limit; `None` when all are unset.
    pub more: Option<Box<MoreSettings>>,
}

/// The forwarding settings few routes have.
#[derive(Debug, Clone, Default)]
pub struct MoreSettings {
    /// `idle_timeout`: `None` when unset (the connection manager's `stream_idle_timeout`
    /// applies), zero when set to 0 (no idle timeout on this route).
    pub idle_timeout: Option<Duration>,
    /// Hash policies, in order.
    pub hash_policies: Vec<HashPolicy>,
    /// Per-route upgrade settings.
    pub upgrades: Vec<UpgradeSetting>,
    /// Effective `per_request_buffer_limit_bytes` (route's, else the virtual host's).
    pub per_request_buffer_limit_bytes: Option<u32>,
    /// The route's `rate_limits`.
    pub rate_limits: Vec<super::rate_limit::RateLimitPolicy>,
    /// `include_vh_rate_limits`: the virtual host's policies apply too.
    pub include_vh_rate_limits: bool,
}

impl MoreSettings {
    /// `Some` boxed unless every setting is unset.
    pub fn boxed(self) -> Option<Box<MoreSettings>> {
        let empty = self.idle_timeout.is_none()
            && self.hash_policies.is_empty()
            && self.upgrades.is_empty()
            && self.per_request_buffer_limit_bytes.is_none()
            && self.rate_limits.is_empty()
            && !self.include_vh_rate_limits;
        (!empty).then(|| Box::new(self))
    }
}

impl Forward {
    /// The cluster for this request; `None` when a `cluster_header` is absent or empty (the
    /// caller answers with [`Forward::cluster_not_found_response_code`]). The result borrows
    /// only the route table: names taken from a request header are owned.
    pub fn pick_cluster<'t>(&'t self, req: &RouteRequest<'_>) -> Option<PickedCluster<'t>> {
        match &self.cluster {
            ClusterSpecifier::Name(n) => Some(PickedCluster {
                name: Cow::Borrowed(n),
                weighted: None,
            }),
            ClusterSpecifier::Header(h) => owned_header(req, h).map(|name| PickedCluster {
                name,
                weighted: None,
            }),
            ClusterSpecifier::Weighted(w) => {
                let random = w
                    .random_value_header
                    .as_deref()
                    .and_then(|h| header_value(req, h))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(req.random_value);
                let c = w.pick(random)?;
                let name = match &c.cluster_header {
                    Some(h) => owned_header(req, h)?,
                    None => Cow::Borrowed(c.name.as_str()),
                };
                Some(PickedCluster {
                    name,
                    weighted: Some(c),
                })
            }
        }
    }

    /// The route's own `upgrade_configs`.
    pub fn upgrades(&self) -> &[UpgradeSetting] {
        self.more.as_ref().map_or(&[], |m| &m.upgrades)
    }

    /// Whether a CONNECT on this route ends at the proxy (`connect_config`): the proxy answers
    /// `200` and tunnels the payload to the upstream as raw TCP.
    pub fn terminates_connect(&self) -> bool {
        self.upgrades()
            .iter()
            .any(|u| u.terminate_connect && u.upgrade_type == "connect")
    }

    /// `idle_timeout`: `None` when unset, zero when disabled on this route.
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.more.as_ref()?.idle_timeout
    }

    /// Hash policies, in order.
    pub fn hash_policies(&self) -> &[HashPolicy] {
        self.more.as_ref().map_or(&[], |m| &m.hash_policies)
    }

    /// Effective `per_request_buffer_limit_bytes` (route's, else the virtual host's).
    pub fn per_request_buffer_limit_bytes(&self) -> Option<u32> {
        self.more.as_ref()?.per_request_buffer_limit_bytes
    }
}

/// A non-empty request header value as an owned `Cow` (it must not borrow the request).
fn owned_header<'t>(req: &RouteRequest<'_>, name: &str) -> Option<Cow<'t, str>> {
    header_value(req, name)
        .filter(|v| !v.is_empty())
        .map(|v| Cow::Owned(v.into_owned()))
}

/// The path part of a redirect.
#[derive(Debug, Clone)]
pub enum RedirectPath {
    /// Keep the request's path.
    Keep,
    /// `path_redirect` (and whether it carries its own query).
    Path(String, bool),
    /// `prefix_rewrite`: replace the matched prefix.
    Prefix(String),
    /// `regex_rewrite` of the path (query kept).
    Regex(Regex, String),
}

/// `RedirectAction`.
#[derive(Debug, Clone)]
pub struct Redirect {
    /// New scheme (`https_redirect` or `scheme_redirect`).
    pub scheme: Option<String>,
    /// `host_redirect`.
    pub host: Option<String>,
    /// `port_redirect`.
    pub port: Option<u32>,
    /// Path handling.
    pub path: RedirectPath,
    /// `strip_query`.
    pub strip_query: bool,
    /// 301, 302, 303, 307 or 308.
    pub status: StatusCode,
}

/// `DirectResponseAction`.
#[derive(Debug, Clone)]
pub struct DirectResponse {
    /// Status code.
    pub status: StatusCode,
    /// Body (empty when none).
    pub body: Bytes,
}

impl DirectResponse {
    /// The `content-type` Envoy puts on a local reply with this body (`text/plain` when the
    /// body is not empty); route `response_headers_to_add` are applied afterwards.
    pub fn content_type(&self) -> Option<&'static str> {
        (!self.body.is_empty()).then_some("text/plain")
    }
}

/// A compiled `RouteMatch`. A route table holds one per route, so the conditions most routes
/// lack take no room: header conditions in a boxed slice, the rarer ones in one box.
#[derive(Debug, Clone)]
pub struct RouteMatch {
    /// Path condition.
    pub path: super::matcher::PathMatch,
    /// `case_sensitive` (default true).
    pub case_sensitive: bool,
    /// `grpc`: only gRPC requests.
    pub grpc: bool,
    /// Header conditions (all must hold).
    pub headers: Box<[HeaderMatcher]>,
    /// Query-parameter, cookie, TLS and runtime conditions; `None` when there are none.
    pub more: Option<Box<MoreConditions>>,
}

/// The conditions of a `RouteMatch` that few routes have.
#[derive(Debug, Clone, Default)]
pub struct MoreConditions {
    /// Query-parameter conditions (all must hold).
    pub query_parameters: Vec<super::matcher::QueryParameterMatcher>,
    /// `runtime_fraction`.
    pub runtime_fraction: Option<RuntimeFraction>,
    /// `tls_context`: (presented, validated) requirements.
    pub tls_context: Option<(Option<bool>, Option<bool>)>,
    /// Cookie conditions: name, matcher, invert.
    pub cookies: Vec<(String, super::matcher::StringMatcher, bool)>,
    /// `dynamic_metadata` conditions (all must hold).
    pub dynamic_metadata: Vec<crate::route::metadata::matcher::MetadataMatcher>,
}

impl MoreConditions {
    /// Whether there is no condition at all.
    fn is_empty(&self) -> bool {
        self.query_parameters.is_empty()
            && self.runtime_fraction.is_none()
            && self.tls_context.is_none()
            && self.cookies.is_empty()
            && self.dynamic_metadata.is_empty()
    }

    /// `Some` boxed unless empty.
    pub fn boxed(self) -> Option<Box<MoreConditions>> {
        (!self.is_empty()).then(|| Box::new(self))
    }
}

/// Header name of the gRPC content type check.
pub(crate) const CONTENT_TYPE: HeaderName = http::header::CONTENT_TYPE;
