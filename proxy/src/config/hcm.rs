//! `envoy.filters.network.http_connection_manager` -> [`HcmConfig`].

use std::sync::Arc;
use std::time::Duration;

use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};

use super::filter_chain_match::Cidr;
use super::{ConfigError, Context, Warnings};
use crate::route::RouteTable;

/// Downstream codec (`codec_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// HTTP/1.1 or HTTP/2 (prior knowledge), detected per connection.
    Auto,
    /// HTTP/1.1 only.
    Http1,
    /// HTTP/2 only.
    Http2,
}

/// What happens to the response `server` header (`server_header_transformation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerHeader {
    /// Always set to `server_name`.
    Overwrite,
    /// Set to `server_name` when the upstream sent none.
    AppendIfAbsent,
    /// Leave the upstream's value (or none) alone.
    PassThrough,
}

/// How the port is removed from Host before route matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StripPort {
    /// Host is matched as sent.
    None,
    /// The port is removed when it equals the listener's port.
    Matching,
    /// Any port is removed.
    Any,
}

/// `path_with_escaped_slashes_action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscapedSlashes {
    /// Leave `%2F`/`%5C` alone (the default).
    Keep,
    /// Answer 400.
    Reject,
    /// Redirect to the unescaped path.
    UnescapeAndRedirect,
    /// Unescape and carry on.
    UnescapeAndForward,
}

/// `headers_with_underscores_action`: what becomes of a request header whose name has `_`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Underscores {
    /// Kept (the default).
    Allow,
    /// The request is answered 400 and the connection closes.
    Reject,
    /// The header is removed.
    Drop,
}

/// `forward_client_cert_details`: what becomes of a request's `x-forwarded-client-cert`.
/// Every mode but `ALWAYS_FORWARD_ONLY` removes it unless the client presented a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardClientCert {
    /// `SANITIZE` (the default): removed.
    Sanitize,
    /// `FORWARD_ONLY`: forwarded as it came.
    ForwardOnly,
    /// `APPEND_FORWARD`: this hop's element is appended.
    AppendForward(ClientCertDetails),
    /// `SANITIZE_SET`: replaced by this hop's element.
    SanitizeSet(ClientCertDetails),
    /// `ALWAYS_FORWARD_ONLY`: forwarded as it came, whatever the connection.
    AlwaysForwardOnly,
}

/// `set_current_client_cert_details`: what this hop's element carries besides `By` (the
/// URI SANs of the certificate revoy presented) and `Hash` (of the client's certificate).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCertDetails {
    /// `Cert`: the client's certificate, URL-encoded PEM.
    pub cert: bool,
    /// `Chain`: the chain it presented, URL-encoded PEM.
    pub chain: bool,
    /// `Subject`.
    pub subject: bool,
    /// `URI`: its URI SANs.
    pub uri: bool,
    /// `DNS`: its DNS SANs.
    pub dns: bool,
    /// `Issuer`.
    pub issuer: bool,
    /// `format: JSON`: a header this hop starts is a JSON array (an existing one keeps its
    /// own format).
    pub json: bool,
}

/// A downstream connection's limits (`common_http_protocol_options`), and how long the drain
/// they start lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// `idle_timeout`: a connection without streams for this long starts draining (default
    /// 1 h; `None` when 0).
    pub idle_timeout: Option<Duration>,
    /// `max_connection_duration`: a connection this old starts draining (`None`: unset or 0).
    pub max_connection_duration: Option<Duration>,
    /// `max_requests_per_connection`: the request that reaches it closes an HTTP/1
    /// connection after its response and starts an HTTP/2 connection's drain (`None`: unset
    /// or 0).
    pub max_requests: Option<u32>,
    /// `drain_timeout` (default 5 s): from the start of a drain to its end, when an HTTP/2
    /// connection gets its final GOAWAY and any connection closes once its streams are done.
    pub drain_timeout: Duration,
}

/// Where the route table comes from.
#[derive(Debug, Clone)]
pub enum Routes {
    /// An inline `route_config`.
    Static(Arc<RouteTable>),
    /// `rds`: a named route configuration delivered by xDS.
    Rds(String),
}

/// A compiled HTTP connection manager.
#[derive(Debug, Clone)]
pub struct HcmConfig {
    /// `access_log`: written per request.
    pub access_logs: crate::access_log::AccessLogs,
    /// `forward_client_cert_details` with `set_current_client_cert_details`.
    pub forward_client_cert: ForwardClientCert,
    /// `common_http_protocol_options.headers_with_underscores_action`.
    pub underscores: Underscores,
    /// `http_filters`: the filters before the router.
    pub filters: super::http_filter::FilterChain,
    /// `stat_prefix`: stats are `http.<stat_prefix>.*`.
    pub stat_prefix: String,
    /// Downstream codec.
    pub codec: Codec,
    /// `http2_protocol_options.allow_connect`: HTTP/2 clients may use extended CONNECT (RFC
    /// 8441), which the connection manager serves as an HTTP/1 upgrade.
    pub allow_connect: bool,
    /// The route table.
    pub routes: Routes,
    /// Trust the connection's peer address (edge) instead of `x-forwarded-for`.
    pub use_remote_address: bool,
    /// Trusted hops in `x-forwarded-for`.
    pub xff_num_trusted_hops: u32,
    /// Do not append the peer address to `x-forwarded-for`.
    pub skip_xff_append: bool,
    /// `add_user_agent`: requests name the proxy's cluster in
    /// `x-envoy-downstream-service-cluster` (and in `user-agent` when they have none) and its
    /// node in `x-envoy-downstream-service-node`.
    pub add_user_agent: bool,
    /// Value of the `server` response header.
    pub server_name: http::HeaderValue,
    /// `strip_trailing_host_dot`: a host's trailing dot is removed before routing.
    pub strip_trailing_host_dot: bool,
    /// `via`: appended to the `via` header of every request and response.
    pub via: Option<http::HeaderValue>,
    /// What to do with the upstream's `server` header.
    pub server_header: ServerHeader,
    /// Generate `x-request-id` when missing.
    pub generate_request_id: bool,
    /// Keep an external `x-request-id` on edge requests.
    pub preserve_external_request_id: bool,
    /// Echo `x-request-id` in every response.
    pub always_set_request_id_in_response: bool,
    /// `upgrade_configs`: the upgrade types (`websocket`, `connect`, ...) and whether each is
    /// enabled; a route's own entry for a type overrides these.
    pub upgrades: Vec<crate::route::action::UpgradeSetting>,
    /// Host port stripping.
    pub strip_port: StripPort,
    /// `stream_idle_timeout` (default 5 min; `None` disables).
    pub stream_idle_timeout: Option<Duration>,
    /// `request_timeout`: the whole request must be received within it (`None`: unset or
    /// 0, disabled).
    pub request_timeout: Option<Duration>,
    /// `request_headers_timeout`: a request's head must be received within it once its first
    /// byte came (`None`: unset or 0, disabled; enforced on the HTTP/1.1 fast path).
    pub request_headers_timeout: Option<Duration>,
    /// Router filter `suppress_envoy_headers`.
    pub suppress_envoy_headers: bool,
    /// `internal_address_config.cidr_ranges`: peers whose requests are internal (none by
    /// default, as in Envoy 1.40).
    pub internal_ranges: Vec<Cidr>,
    /// `http_protocol_options.accept_http_10`.
    pub accept_http_10: bool,
    /// `http_protocol_options.default_host_for_http_10`: the `Host` an HTTP/1.0 request
    /// without one is given (without it such a request is refused with 400, as in Envoy).
    pub default_host_for_http_10: Option<http::HeaderValue>,
    /// `http_protocol_options.enable_trailers`: HTTP/1 clients' request trailers are forwarded
    /// and response trailers written to them; without it (Envoy's default) both are dropped.
    pub http1_trailers: bool,
    /// `http_protocol_options.allow_chunked_length`: an HTTP/1 request with both
    /// `content-length` and `transfer-encoding: chunked` is taken as chunked (its
    /// `content-length` removed) instead of refused with 400.
    pub allow_chunked_length: bool,
    /// `normalize_path` (RFC 3986 normalisation before routing; default off).
    pub normalize_path: bool,
    /// `merge_slashes`.
    pub merge_slashes: bool,
    /// `path_with_escaped_slashes_action`.
    pub escaped_slashes: EscapedSlashes,
    /// `common_http_protocol_options.max_headers_count` (default 100).
    pub max_headers_count: u32,
    /// `common_http_protocol_options.max_stream_duration`: each stream's time limit unless
    /// its route sets one; `None` when unset or 0.
    pub max_stream_duration: Option<std::time::Duration>,
    /// `max_request_headers_kb` (default 60).
    pub max_request_headers_kb: u32,
    /// The connection's own limits from `common_http_protocol_options` and `drain_timeout`.
    pub connection_limits: ConnectionLimits,
    /// `tracing`: `None` when the connection manager does not trace.
    pub tracing: Option<Arc<super::tracing::HcmTracing>>,
    /// `request_id_extension`.
    pub request_id: super::tracing::RequestIdConfig,
    /// `local_reply_config`: `None` when unset (local replies keep their bodies, `text/plain`).
    pub local_reply: Option<Arc<super::local_reply::LocalReplyConfig>>,
}

/// Records the connection manager's settings that revoy does not act on, or not everywhere
/// (none of them has a security effect).
fn skipped_features(hcm: &HttpConnectionManager, warnings: &mut Warnings) {
    if let Some(t) = &hcm.tracing {
        super::tracing::skip_metadata_tags(&t.custom_tags, "tracing.custom_tags", warnings);
    }
    if let Some(name) = hcm
        .tracing
        .as_ref()
        .and_then(|t| t.provider.as_ref())
        .and_then(super::tracing::unimplemented_tracer)
    {
        warnings.skipped("tracing.provider", super::tracing::skipped_tracer(name));
    }
    if hcm
        .common_http_protocol_options
        .as_ref()
        .and_then(|o| o.max_headers_count.as_ref())
        .is_some_and(|v| v.value as usize > crate::wire::MAX_HEADERS)
    {
        warnings.skipped(
            "common_http_protocol_options.max_headers_count",
            format!(
                "revoy's HTTP/1 codec takes at most {} header fields: a request with more is refused 431",
                crate::wire::MAX_HEADERS
            ),
        );
    }
    if hcm.forward_client_cert_matcher.is_some() {
        warnings.skipped(
            "forward_client_cert_matcher",
            "per-request x-forwarded-client-cert rules are not implemented by revoy: the header is removed from every request, as SANITIZE does",
        );
    }
    const NO_EFFECT: &str = "not implemented by revoy; it has no effect";
    let skipped = [
        (
            hcm.scheme_header_transformation.is_some(),
            "scheme_header_transformation",
            "the scheme is forwarded as it came",
        ),
        (
            hcm.append_x_forwarded_port,
            "append_x_forwarded_port",
            "no x-forwarded-port is added",
        ),
        (
            hcm.proxy_status_config.is_some(),
            "proxy_status_config",
            "no proxy-status header is added",
        ),
        (
            hcm.stream_flush_timeout.is_some(),
            "stream_flush_timeout",
            NO_EFFECT,
        ),
        (
            hcm.drain_timeout_jitter.is_some(),
            "drain_timeout_jitter",
            NO_EFFECT,
        ),
        (
            hcm.delayed_close_timeout.is_some(),
            "delayed_close_timeout",
            NO_EFFECT,
        ),
        (
            periodic_access_logs(hcm),
            "access_log_options",
            "access logs are written when a request ends, never periodically",
        ),
        (hcm.proxy_100_continue, "proxy_100_continue", NO_EFFECT),
        (
            hcm.represent_ipv4_remote_address_as_ipv4_mapped_ipv6,
            "represent_ipv4_remote_address_as_ipv4_mapped_ipv6",
            NO_EFFECT,
        ),
        (
            hcm.stream_error_on_invalid_http_message.is_some(),
            "stream_error_on_invalid_http_message",
            "invalid messages are answered as by default",
        ),
        (
            hcm.path_normalization_options.is_some(),
            "path_normalization_options",
            NO_EFFECT,
        ),
        (
            hcm.typed_header_validation_config.is_some(),
            "typed_header_validation_config",
            "headers are validated by revoy's own codec rules",
        ),
        (
            hcm.append_local_overload,
            "append_local_overload",
            NO_EFFECT,
        ),
        (
            hcm.add_proxy_protocol_connection_state.is_some(),
            "add_proxy_protocol_connection_state",
            NO_EFFECT,
        ),
        (
            hcm.forward_proto_config.is_some(),
            "forward_proto_config",
            NO_EFFECT,
        ),
        (
            hcm.http1_safe_max_connection_duration,
            "http1_safe_max_connection_duration",
            NO_EFFECT,
        ),
    ];
    for (_, field, what) in skipped.iter().filter(|(set, _, _)| *set) {
        warnings.skipped(*field, *what);
    }
}

/// Whether the (deprecated or current) periodic access-log settings are set.
#[allow(deprecated)]
fn periodic_access_logs(hcm: &HttpConnectionManager) -> bool {
    hcm.access_log_flush_interval.is_some()
        || hcm.flush_access_log_on_new_request
        || hcm.access_log_options.is_some()
}

/// The connection manager fields whose absence would change who a request is taken to come
/// from or how it is routed: configuration errors, as revoy cannot honour them.
fn refuse_unimplemented(hcm: &HttpConnectionManager) -> Result<(), ConfigError> {
    if !hcm.original_ip_detection_extensions.is_empty() {
        return Err(ConfigError::new(
            "original_ip_detection_extensions",
            "not implemented by revoy: the client address would come from x-forwarded-for \
             instead, and RBAC and header rules would see another one",
        ));
    }
    if !hcm.early_header_mutation_extensions.is_empty() {
        return Err(ConfigError::new(
            "early_header_mutation_extensions",
            "not implemented by revoy: requests would be routed on headers these extensions change",
        ));
    }
    Ok(())
}

/// `forward_client_cert_details` with `set_current_client_cert_details`; with a
/// `forward_client_cert_matcher` (not implemented) the header is always removed.
fn forward_client_cert(hcm: &HttpConnectionManager) -> ForwardClientCert {
    if hcm.forward_client_cert_matcher.is_some() {
        return ForwardClientCert::Sanitize;
    }
    let d = hcm.set_current_client_cert_details.unwrap_or_default();
    let details = ClientCertDetails {
        cert: d.cert,
        chain: d.chain,
        subject: d.subject.is_some_and(|b| b.value),
        uri: d.uri,
        dns: d.dns,
        issuer: d.issuer,
        json: d.format == 1,
    };
    match hcm.forward_client_cert_details {
        1 => ForwardClientCert::ForwardOnly,
        2 => ForwardClientCert::AppendForward(details),
        3 => ForwardClientCert::SanitizeSet(details),
        4 => ForwardClientCert::AlwaysForwardOnly,
        _ => ForwardClientCert::Sanitize,
    }
}

/// A Duration checked as Envoy checks every Duration of its config, the error at `path` with
/// Envoy's text.
fn checked_duration(
    d: &proto::pb::google::protobuf::Duration,
    path: &str,
) -> Result<Duration, ConfigError> {
    /// The largest seconds Envoy takes: their nanoseconds fit in an `int64`.
    const MAX_SECONDS: i64 = i64::MAX / 1_000_000_000 - 1;
    let invalid = |why: &str| ConfigError::new(path, format!("Invalid duration: {why}"));
    if d.seconds < 0 || d.nanos < 0 {
        return Err(invalid("Expected positive duration"));
    }
    if d.nanos >= 1_000_000_000 {
        return Err(invalid("Duration out-of-range according to Protobuf"));
    }
    if d.seconds > MAX_SECONDS {
        return Err(invalid("Duration out-of-range"));
    }
    Ok(Duration::new(d.seconds as u64, d.nanos as u32))
}

/// `common_http_protocol_options`' `idle_timeout` (Envoy's default 1 h), `max_connection_duration`
/// and `max_requests_per_connection`, and `drain_timeout` (default 5 s).
fn connection_limits(hcm: &HttpConnectionManager) -> Result<ConnectionLimits, ConfigError> {
    const COMMON: &str = "common_http_protocol_options";
    let common = hcm.common_http_protocol_options.as_ref();
    let optional = |d: Option<&proto::pb::google::protobuf::Duration>, field: &str| {
        d.map(|d| checked_duration(d, &format!("{COMMON}.{field}")))
            .transpose()
    };
    let idle = optional(common.and_then(|o| o.idle_timeout.as_ref()), "idle_timeout")?;
    let max_duration = optional(
        common.and_then(|o| o.max_connection_duration.as_ref()),
        "max_connection_duration",
    )?;
    let drain_timeout = hcm
        .drain_timeout
        .as_ref()
        .map(|d| checked_duration(d, "drain_timeout"))
        .transpose()?;
    Ok(ConnectionLimits {
        idle_timeout: Some(idle.unwrap_or(Duration::from_secs(3600))).filter(|d| !d.is_zero()),
        max_connection_duration: max_duration.filter(|d| !d.is_zero()),
        max_requests: common
            .and_then(|o| o.max_requests_per_connection.as_ref())
            .map(|v| v.value)
            .filter(|&n| n > 0),
        drain_timeout: drain_timeout.unwrap_or(Duration::from_secs(5)),
    })
}

fn duration(d: &proto::pb::google::protobuf::Duration) -> Option<Duration> {
    let d = Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32);
    (!d.is_zero()).then_some(d)
}

/// `upgrade_configs`: one entry per type (case-insensitive), as Envoy requires. An upgrade
/// with its own filter chain is refused: revoy would run it without those filters.
fn upgrades(
    hcm: &HttpConnectionManager,
) -> Result<Vec<crate::route::action::UpgradeSetting>, ConfigError> {
    let mut out: Vec<crate::route::action::UpgradeSetting> = Vec::new();
    for (i, u) in hcm.upgrade_configs.iter().enumerate() {
        let upgrade_type = u.upgrade_type.to_ascii_lowercase();
        if out.iter().any(|o| o.upgrade_type == upgrade_type) {
            return Err(ConfigError::new(
                format!("upgrade_configs[{i}]"),
                format!(
                    "Error: multiple upgrade configs with the same name: '{}'",
                    u.upgrade_type
                ),
            ));
        }
        if !u.filters.is_empty() {
            return Err(ConfigError::new(
                format!("upgrade_configs[{i}].filters"),
                "upgrade-specific filter chains are not supported by revoy",
            ));
        }
        out.push(crate::route::action::UpgradeSetting {
            upgrade_type,
            enabled: u.enabled.is_none_or(|b| b.value),
            terminate_connect: false,
        });
    }
    Ok(out)
}

/// Compiles an HCM (I/O through `ctx`). `clusters` validates static cluster references in an inline route config.
pub fn compile_hcm(
    ctx: &Context<'_>,
    hcm: &HttpConnectionManager,
    clusters: Option<&dyn Fn(&str) -> bool>,
    warnings: &mut Warnings,
) -> Result<HcmConfig, ConfigError> {
    if hcm.stat_prefix.is_empty() {
        return Err(ConfigError::new(
            "stat_prefix",
            "value length must be at least 1 characters",
        ));
    }
    let routes = match &hcm.route_specifier {
        Some(RouteSpecifier::RouteConfig(rc)) => {
            let before = warnings.len();
            let table = super::route::compile_route_config(ctx, rc, clusters, warnings);
            warnings.prefix_since(before, "route_config");
            Routes::Static(Arc::new(table.map_err(|e| e.within("route_config"))?))
        }
        Some(RouteSpecifier::Rds(rds)) => Routes::Rds(rds.route_config_name.clone()),
        Some(RouteSpecifier::ScopedRoutes(_)) => {
            return Err(ConfigError::new(
                "scoped_routes",
                "scoped routes are not supported by revoy",
            ));
        }
        None => {
            return Err(ConfigError::new(
                "route_specifier",
                "one of route_config, rds is required",
            ));
        }
    };
    let filters = super::http_filter::compile_chain(ctx, &hcm.http_filters, warnings)?;
    refuse_unimplemented(hcm)?;
    skipped_features(hcm, warnings);
    let internal_ranges = hcm
        .internal_address_config
        .iter()
        .flat_map(|c| c.cidr_ranges.iter().enumerate())
        .map(|(i, r)| Cidr::compile(r, &format!("internal_address_config.cidr_ranges[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let idle = hcm
        .stream_idle_timeout
        .as_ref()
        .map_or(Some(Duration::from_secs(300)), duration);
    // A connection manager whose own tracer revoy lacks sends no spans (it does not fall back
    // to the bootstrap's); skipped_features names it.
    let own_tracer_missing = hcm
        .tracing
        .as_ref()
        .and_then(|t| t.provider.as_ref())
        .is_some_and(|p| super::tracing::unimplemented_tracer(p).is_some());
    let tracing = hcm
        .tracing
        .as_ref()
        .filter(|_| !own_tracer_missing)
        .map(|t| {
            super::tracing::compile_hcm_tracing(ctx, t, false).map_err(|e| e.within("tracing"))
        })
        .transpose()?
        .map(Arc::new);
    let request_id = super::tracing::compile_request_id(hcm.request_id_extension.as_ref())?;
    let before = warnings.len();
    let access_logs = super::access_log::compile_access_logs(ctx, &hcm.access_log, warnings);
    warnings.prefix_since(before, "access_log");
    let access_logs = access_logs.map_err(|e| e.within("access_log"))?;
    Ok(HcmConfig {
        tracing,
        request_id,
        local_reply: hcm
            .local_reply_config
            .as_ref()
            .map(|c| {
                super::local_reply::compile(ctx, c).map_err(|e| e.within("local_reply_config"))
            })
            .transpose()?
            .map(Arc::new),
        access_logs,
        suppress_envoy_headers: filters.suppress_envoy_headers,
        filters,
        stat_prefix: hcm.stat_prefix.clone(),
        codec: match hcm.codec_type {
            1 => Codec::Http1,
            2 => Codec::Http2,
            _ => Codec::Auto,
        },
        allow_connect: hcm
            .http2_protocol_options
            .as_ref()
            .is_some_and(|o| o.allow_connect),
        routes,
        use_remote_address: hcm.use_remote_address.is_some_and(|b| b.value),
        xff_num_trusted_hops: hcm.xff_num_trusted_hops,
        skip_xff_append: hcm.skip_xff_append,
        add_user_agent: hcm.add_user_agent.is_some_and(|b| b.value),
        server_name: if hcm.server_name.is_empty() {
            http::HeaderValue::from_static("envoy")
        } else {
            http::HeaderValue::from_str(&hcm.server_name).map_err(|_| {
                ConfigError::new(
                    "server_name",
                    format!("invalid header value '{}'", hcm.server_name),
                )
            })?
        },
        strip_trailing_host_dot: hcm.strip_trailing_host_dot,
        via: (!hcm.via.is_empty())
            .then(|| {
                http::HeaderValue::from_str(&hcm.via).map_err(|_| {
                    ConfigError::new("via", format!("invalid header value '{}'", hcm.via))
                })
            })
            .transpose()?,
        server_header: match hcm.server_header_transformation {
            1 => ServerHeader::AppendIfAbsent,
            2 => ServerHeader::PassThrough,
            _ => ServerHeader::Overwrite,
        },
        generate_request_id: hcm.generate_request_id.is_none_or(|b| b.value),
        preserve_external_request_id: hcm.preserve_external_request_id,
        always_set_request_id_in_response: hcm.always_set_request_id_in_response,
        upgrades: upgrades(hcm)?,
        strip_port: {
            use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::StripPortMode;
            match hcm.strip_port_mode {
                Some(StripPortMode::StripAnyHostPort(true)) => StripPort::Any,
                _ if hcm.strip_matching_host_port => StripPort::Matching,
                _ => StripPort::None,
            }
        },
        stream_idle_timeout: idle,
        request_timeout: crate::config::route::nonzero(hcm.request_timeout.as_ref()),
        request_headers_timeout: crate::config::route::nonzero(
            hcm.request_headers_timeout.as_ref(),
        ),
        internal_ranges,
        normalize_path: hcm.normalize_path.is_some_and(|b| b.value),
        merge_slashes: hcm.merge_slashes,
        escaped_slashes: match hcm.path_with_escaped_slashes_action {
            2 => EscapedSlashes::Reject,
            3 => EscapedSlashes::UnescapeAndRedirect,
            4 => EscapedSlashes::UnescapeAndForward,
            _ => EscapedSlashes::Keep,
        },
        max_headers_count: hcm
            .common_http_protocol_options
            .as_ref()
            .and_then(|o| o.max_headers_count.as_ref())
            .map_or(100, |v| v.value),
        max_stream_duration: crate::config::route::nonzero(
            hcm.common_http_protocol_options
                .as_ref()
                .and_then(|o| o.max_stream_duration.as_ref()),
        ),
        max_request_headers_kb: hcm.max_request_headers_kb.as_ref().map_or(60, |v| v.value),
        connection_limits: connection_limits(hcm)?,
        accept_http_10: hcm
            .http_protocol_options
            .as_ref()
            .is_some_and(|o| o.accept_http_10),
        default_host_for_http_10: match hcm
            .http_protocol_options
            .as_ref()
            .map(|o| o.default_host_for_http_10.as_str())
        {
            None | Some("") => None,
            Some(host) => Some(http::HeaderValue::from_str(host).map_err(|_| {
                ConfigError::new(
                    "http_protocol_options.default_host_for_http_10",
                    format!("{host:?} is not a valid Host header value"),
                )
            })?),
        },
        http1_trailers: hcm
            .http_protocol_options
            .as_ref()
            .is_some_and(|o| o.enable_trailers),
        allow_chunked_length: hcm
            .http_protocol_options
            .as_ref()
            .is_some_and(|o| o.allow_chunked_length),
        forward_client_cert: forward_client_cert(hcm),
        underscores: match hcm
            .common_http_protocol_options
            .as_ref()
            .map_or(0, |o| o.headers_with_underscores_action)
        {
            1 => Underscores::Reject,
            2 => Underscores::Drop,
            _ => Underscores::Allow,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(extra: &str) -> (Result<HcmConfig, ConfigError>, Warnings) {
        let yaml = format!(
            "stat_prefix: h\n{extra}\nhttp_filters: [{{name: r, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]\nroute_config: {{virtual_hosts: [{{name: a, domains: ['*'], routes: [{{match: {{prefix: /}}, direct_response: {{status: 200}}}}]}}]}}"
        );
        let value = proto::Codec::parse_text(&yaml, proto::Format::Yaml).unwrap();
        let hcm: HttpConnectionManager = proto::Codec::new().decode(value, false).unwrap().message;
        let io = crate::config::FakeIo::new();
        let mut warnings = Warnings::new();
        let compiled = compile_hcm(&Context::new(&io), &hcm, None, &mut warnings);
        (compiled, warnings)
    }

    #[test]
    fn fields_revoy_does_not_act_on_are_named() {
        let (compiled, warnings) = compile("via: proxy\nrequest_headers_timeout: 5s");
        assert!(
            warnings.is_empty(),
            "via and request_headers_timeout are implemented"
        );
        assert_eq!(
            compiled.unwrap().request_headers_timeout,
            Some(Duration::from_secs(5))
        );
        let (compiled, warnings) = compile("request_timeout: 5s");
        assert!(warnings.is_empty(), "request_timeout is enforced");
        assert_eq!(
            compiled.unwrap().request_timeout,
            Some(Duration::from_secs(5))
        );
        let (compiled, _) = compile("request_timeout: 0s");
        assert_eq!(compiled.unwrap().request_timeout, None, "0 disables it");
        let (compiled, _) = compile(
            "original_ip_detection_extensions: [{name: x, typed_config: {'@type': type.googleapis.com/envoy.extensions.http.original_ip_detection.xff.v3.XffConfig}}]",
        );
        assert_eq!(
            compiled.unwrap_err().path,
            "original_ip_detection_extensions"
        );
        let (compiled, warnings) = compile(
            "common_http_protocol_options: {idle_timeout: 1s, max_connection_duration: 2s, max_requests_per_connection: 3, max_headers_count: 50}\ndrain_timeout: 0.5s",
        );
        let paths: Vec<&str> = warnings.iter().map(|w| w.path.as_str()).collect();
        assert!(
            paths.is_empty(),
            "the connection limits and drain_timeout (every drain's) are implemented: {paths:?}"
        );
        assert_eq!(
            compiled.unwrap().connection_limits,
            ConnectionLimits {
                idle_timeout: Some(Duration::from_secs(1)),
                max_connection_duration: Some(Duration::from_secs(2)),
                max_requests: Some(3),
                drain_timeout: Duration::from_millis(500),
            }
        );
    }

    #[test]
    fn more_header_fields_than_the_codec_takes_are_named() {
        let (_, warnings) = compile("common_http_protocol_options: {max_headers_count: 100}");
        assert!(warnings.is_empty(), "100 is what the codec takes");
        let (_, warnings) = compile("common_http_protocol_options: {max_headers_count: 200}");
        let paths: Vec<&str> = warnings.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(paths, ["common_http_protocol_options.max_headers_count"]);
    }

    #[test]
    fn connection_limits_default_as_envoys() {
        let (compiled, _) = compile("");
        assert_eq!(
            compiled.unwrap().connection_limits,
            ConnectionLimits {
                idle_timeout: Some(Duration::from_secs(3600)),
                max_connection_duration: None,
                max_requests: None,
                drain_timeout: Duration::from_secs(5),
            }
        );
        let (compiled, _) = compile(
            "common_http_protocol_options: {idle_timeout: 0s, max_connection_duration: 0s, max_requests_per_connection: 0}",
        );
        let limits = compiled.unwrap().connection_limits;
        assert_eq!(
            (
                limits.idle_timeout,
                limits.max_connection_duration,
                limits.max_requests
            ),
            (None, None, None),
            "0 turns each off"
        );
    }

    #[test]
    fn invalid_connection_limits_are_refused_as_by_envoy() {
        // Envoy 1.40's texts (`--mode validate`), each at the field's path.
        for (extra, path, message) in [
            (
                "common_http_protocol_options: {idle_timeout: -1s}",
                "common_http_protocol_options.idle_timeout",
                "Invalid duration: Expected positive duration",
            ),
            (
                "common_http_protocol_options: {max_connection_duration: -0.5s}",
                "common_http_protocol_options.max_connection_duration",
                "Invalid duration: Expected positive duration",
            ),
            (
                "common_http_protocol_options: {max_connection_duration: 9223372036s}",
                "common_http_protocol_options.max_connection_duration",
                "Invalid duration: Duration out-of-range",
            ),
            (
                "drain_timeout: -1s",
                "drain_timeout",
                "Invalid duration: Expected positive duration",
            ),
        ] {
            let err = compile(extra).0.unwrap_err();
            assert_eq!((err.path.as_str(), err.message.as_str()), (path, message));
        }
        // Decoding normalises a Duration's nanos; one that is not normal is refused too.
        let unnormal = proto::pb::google::protobuf::Duration {
            seconds: 1,
            nanos: 1_000_000_000,
        };
        assert_eq!(
            checked_duration(&unnormal, "drain_timeout")
                .unwrap_err()
                .message,
            "Invalid duration: Duration out-of-range according to Protobuf"
        );
        let (compiled, _) = compile("common_http_protocol_options: {idle_timeout: 9223372035s}");
        assert!(compiled.is_ok(), "the largest duration Envoy takes");
    }
}
