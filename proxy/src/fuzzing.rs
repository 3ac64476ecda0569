//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz builds with `--cfg fuzzing`; no
//! other build has this module): thin public wrappers over the parsers of untrusted input that
//! are internal to revoy, each reached as the proxy reaches it. Verdicts come back as text
//! where the parser's own type is internal.

use bytes::BytesMut;
use prost::Message;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};

use crate::config::cluster::{BootstrapBind, ClusterConfig};
use crate::config::hcm::{EscapedSlashes, HcmConfig};
use crate::config::{Context, FakeIo, Warnings};

/// The connection manager of a listener with default settings, `flags` choosing the options
/// the parsers read: bit 0 `allow_chunked_length`, bit 1 `normalize_path`, bit 2
/// `merge_slashes`, bits 3-4 `path_with_escaped_slashes_action`.
pub fn hcm(flags: u8) -> HcmConfig {
    let hcm = HttpConnectionManager {
        stat_prefix: "fuzz".into(),
        route_specifier: Some(RouteSpecifier::RouteConfig(Default::default())),
        ..Default::default()
    };
    let mut cfg = crate::config::hcm::compile_hcm(
        &Context::new(&FakeIo::new()),
        &hcm,
        None,
        &mut Warnings::new(),
    )
    .expect("a default connection manager compiles");
    cfg.allow_chunked_length = flags & 1 != 0;
    cfg.normalize_path = flags & 2 != 0;
    cfg.merge_slashes = flags & 4 != 0;
    cfg.escaped_slashes = match (flags >> 3) & 3 {
        0 => EscapedSlashes::Keep,
        1 => EscapedSlashes::Reject,
        2 => EscapedSlashes::UnescapeAndRedirect,
        _ => EscapedSlashes::UnescapeAndForward,
    };
    cfg
}

/// The HTTP/1.1 fast path's verdict (`partial`, `served`, `ambiguous`, `handoff`) on the
/// request head at the start of `buf`; `buf` is left as the connection would keep it.
pub fn http1_request_head(buf: &mut BytesMut, cfg: &HcmConfig) -> &'static str {
    crate::http::fuzzing::request_head(buf, cfg)
}

/// What the request-stream follower in front of hyper's server passes on when a client sends
/// `pieces` (one read each) and closes, and the status it refused a head with.
pub fn http1_framing<'a>(
    allow_chunked_length: bool,
    max_head: usize,
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> (BytesMut, Option<u16>) {
    let (out, refusal) = crate::http::fuzzing::framing(allow_chunked_length, max_head, pieces);
    (out, refusal.map(|(status, _)| status.as_u16()))
}

/// A `grpc-timeout` header value as the router reads it, in milliseconds.
pub fn grpc_timeout(value: &[u8]) -> Option<u128> {
    crate::http::fuzzing::grpc_timeout(value).map(|d| d.as_millis())
}

/// The connection manager's path rules' verdict on a request's `path_and_query`.
pub fn normalize_path(cfg: &HcmConfig, path_and_query: &str) -> String {
    format!(
        "{:?}",
        crate::http::fuzzing::normalize_path(cfg, path_and_query)
    )
}

/// The TLS and HTTP inspectors' verdicts on a connection's first bytes `d` (not empty).
pub fn listener_inspectors(d: &[u8]) -> String {
    crate::listener::inspect_for_fuzzing(d)
}

/// A `Listener` resource from a control plane, decoded and compiled as the xDS handler does
/// (every cluster name known): the NACK reason when it is refused.
pub fn lds_resource(bytes: &[u8]) -> Result<(), String> {
    let l = Listener::decode(bytes).map_err(|e| e.to_string())?;
    let io = FakeIo::new();
    let known = |_: &str| true;
    crate::config::listener::compile_listener(
        &Context::new(&io),
        &l,
        Some(&known),
        &mut Warnings::new(),
    )
    .map(drop)
    .map_err(|e| e.to_string())
}

/// A `Cluster` resource from a control plane, decoded and compiled as the xDS handler does.
pub fn cds_resource(bytes: &[u8]) -> Result<ClusterConfig, String> {
    let c = Cluster::decode(bytes).map_err(|e| e.to_string())?;
    crate::config::cluster::skipped_features(&c, "", &mut Warnings::new());
    let source = BootstrapBind::default()
        .fallback(&c)
        .map_err(|e| e.to_string())?;
    crate::config::cluster::compile_cluster(&Context::new(&FakeIo::new()), &c, source)
        .map_err(|e| e.to_string())
}

/// A `ClusterLoadAssignment` resource from a control plane, decoded and compiled for
/// `cluster` as the xDS handler does.
pub fn eds_resource(bytes: &[u8], cluster: &ClusterConfig) -> Result<(), String> {
    let cla = ClusterLoadAssignment::decode(bytes).map_err(|e| e.to_string())?;
    crate::config::cluster::compile_assignment(&cla, cluster)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A `RouteConfiguration` resource from a control plane, decoded and compiled as the xDS
/// handler does (clusters checked when it asks, every name known).
pub fn rds_resource(bytes: &[u8]) -> Result<(), String> {
    let rc = RouteConfiguration::decode(bytes).map_err(|e| e.to_string())?;
    let known = |_: &str| true;
    let check: Option<&dyn Fn(&str) -> bool> = rc
        .validate_clusters
        .is_some_and(|v| v.value)
        .then_some(&known);
    crate::config::route::compile_route_config(
        &Context::new(&FakeIo::new()),
        &rc,
        check,
        &mut Warnings::new(),
    )
    .map(drop)
    .map_err(|e| e.to_string())
}

/// A bootstrap given as `--config-yaml` (YAML or JSON), loaded and compiled as `revoy` does
/// at start, its files read from an empty file system.
pub fn bootstrap(text: &str) -> Result<(), String> {
    let opts = <crate::cli::Options as clap::Parser>::try_parse_from([
        "revoy".to_owned(),
        format!("--config-yaml={text}"),
    ])
    .map_err(|e| e.to_string())?;
    let loaded = crate::load::load(&opts).map_err(|e| e.to_string())?;
    crate::config::bootstrap::compile_bootstrap(
        &Context::new(&FakeIo::new()),
        &loaded.bootstrap,
        &mut Warnings::new(),
    )
    .map(drop)
    .map_err(|e| e.to_string())
}
