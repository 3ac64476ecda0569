//! `envoy.filters.http.ext_authz` (`ExtAuthz`, `ExtAuthzPerRoute`) -> [`ExtAuthzConfig`],
//! [`ExtAuthzPerRoute`]. Fields revoy does not implement are errors naming them, so an
//! authorization filter never runs with less than its configuration asks.

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use proto::pb::envoy::config::core::v3::{GrpcService, grpc_service};
use proto::pb::envoy::extensions::filters::http::ext_authz::v3 as pb;
use proto::pb::envoy::r#type::matcher::v3::ListStringMatcher;

use crate::config::route::matchers::string_matcher;
use crate::config::{ConfigError, Context, Warnings};
use crate::route::matcher::StringMatcher;
use crate::route::metadata::matcher::MetadataMatcher;

/// Envoy's timeout for a check when the service sets none.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);

/// A compiled `ExtAuthz`.
#[derive(Debug, Clone)]
pub struct ExtAuthzConfig {
    /// Where checks go.
    pub service: Service,
    /// How long a check may take before it counts as an error.
    pub timeout: Duration,
    /// `failure_mode_allow`: a failed check lets the request through.
    pub failure_mode_allow: bool,
    /// `failure_mode_allow_header_add`: such a request gets `x-envoy-auth-failure-mode-allowed`.
    pub failure_mode_allow_header_add: bool,
    /// `with_request_body`.
    pub with_request_body: Option<BufferSettings>,
    /// `clear_route_cache`: the route is chosen again when the check changed request headers.
    pub clear_route_cache: bool,
    /// `status_on_error` (403 unless set).
    pub status_on_error: u16,
    /// `stat_prefix`: stats under `ext_authz.<stat_prefix>.` (empty: `ext_authz.`).
    pub stat_prefix: String,
    /// `include_peer_certificate`.
    pub include_peer_certificate: bool,
    /// `include_tls_session`.
    pub include_tls_session: bool,
    /// `allowed_headers`: only these request headers go to the service (`None`: all).
    pub allowed_headers: Option<Vec<StringMatcher>>,
    /// `disallowed_headers`: these request headers never go to the service.
    pub disallowed_headers: Vec<StringMatcher>,
    /// `charge_cluster_response_stats` (default true): a denial's status is charged to the
    /// route's cluster.
    pub charge_cluster_response_stats: bool,
    /// `max_denied_response_body_bytes` (0: no limit).
    pub max_denied_response_body_bytes: usize,
    /// `enable_dynamic_metadata_ingestion` (default true): a gRPC answer's `dynamic_metadata`
    /// is written to the request's dynamic metadata.
    pub ingest_dynamic_metadata: bool,
    /// `filter_enabled_metadata`: only requests whose dynamic metadata matches are checked
    /// (Istio's CUSTOM authorization: the RBAC filter's shadow policy before it).
    pub enabled_metadata: Option<MetadataMatcher>,
}

/// The authorization service.
#[derive(Debug, Clone)]
pub enum Service {
    /// `grpc_service`: `envoy.service.auth.v3.Authorization/Check`.
    Grpc(GrpcTarget),
    /// `http_service`.
    Http(HttpTarget),
}

/// A gRPC authorization service (`envoy_grpc`).
#[derive(Debug, Clone)]
pub struct GrpcTarget {
    /// `cluster_name`.
    pub cluster: String,
    /// The `:authority` of the calls: `authority`, else the cluster's name.
    pub authority: String,
    /// `initial_metadata`, sent with every call.
    pub initial_metadata: Vec<(HeaderName, HeaderValue)>,
}

/// An HTTP authorization service.
#[derive(Debug, Clone)]
pub struct HttpTarget {
    /// `server_uri.cluster`.
    pub cluster: String,
    /// The authority of `server_uri.uri`.
    pub authority: String,
    /// `path_prefix`, put before the request's path.
    pub path_prefix: String,
    /// `path_override`: the path of every check instead (empty: none).
    pub path_override: String,
    /// `authorization_request.allowed_headers`: request headers copied into the check, besides
    /// the ones Envoy always sends.
    pub allowed_headers: Vec<StringMatcher>,
    /// `authorization_request.headers_to_add`.
    pub headers_to_add: Vec<(HeaderName, HeaderValue)>,
    /// `authorization_response.allowed_upstream_headers`: set on the request when allowed.
    pub allowed_upstream_headers: Vec<StringMatcher>,
    /// `authorization_response.allowed_upstream_headers_to_append`.
    pub allowed_upstream_headers_to_append: Vec<StringMatcher>,
    /// `authorization_response.allowed_client_headers`: passed to the client on denial
    /// (`None`: all).
    pub allowed_client_headers: Option<Vec<StringMatcher>>,
    /// `authorization_response.allowed_client_headers_on_success`: added to the response when
    /// allowed.
    pub allowed_client_headers_on_success: Vec<StringMatcher>,
    /// `authorization_response.dynamic_metadata_from_headers`: the service's response
    /// headers (not a 5xx's) written to the request's dynamic metadata as strings.
    pub dynamic_metadata_from_headers: Vec<StringMatcher>,
}

/// `BufferSettings`: the request body sent with the check.
#[derive(Debug, Clone, Copy)]
pub struct BufferSettings {
    /// `max_request_bytes`.
    pub max_request_bytes: usize,
    /// `allow_partial_message`: a longer body is sent cut at the limit rather than refused.
    pub allow_partial_message: bool,
    /// `pack_as_bytes`: the body goes in `raw_body` instead of `body`.
    pub pack_as_bytes: bool,
}

/// A compiled `ExtAuthzPerRoute`.
#[derive(Debug, Clone)]
pub enum ExtAuthzPerRoute {
    /// `disabled: true`: no check here.
    Disabled,
    /// `check_settings`.
    Check(CheckSettings),
}

/// `CheckSettings`.
#[derive(Debug, Clone, Default)]
pub struct CheckSettings {
    /// `context_extensions`, sorted by key.
    pub context_extensions: Vec<(String, String)>,
    /// `disable_request_body_buffering`.
    pub disable_request_body_buffering: bool,
    /// `with_request_body`, replacing the filter's.
    pub with_request_body: Option<BufferSettings>,
}

/// Compiles an `ExtAuthz`; fields with no effect in revoy are noted in `warnings`.
pub fn compile(
    ctx: &Context<'_>,
    c: &pb::ExtAuthz,
    warnings: &mut Warnings,
) -> Result<ExtAuthzConfig, ConfigError> {
    refuse_unimplemented(c)?;
    for (set, field) in [
        (
            !c.metadata_context_namespaces.is_empty(),
            "metadata_context_namespaces",
        ),
        (
            !c.typed_metadata_context_namespaces.is_empty(),
            "typed_metadata_context_namespaces",
        ),
        (c.filter_metadata.is_some(), "filter_metadata"),
        (c.emit_filter_state_stats, "emit_filter_state_stats"),
        (c.emit_client_span.is_some(), "emit_client_span"),
    ] {
        if set {
            warnings.note(
                field,
                "not implemented by revoy's ext_authz filter (no metadata context in the check, \
                 no filter state or client spans): no effect",
            );
        }
    }
    let (service, timeout) = match &c.services {
        Some(pb::ext_authz::Services::GrpcService(g)) => {
            let (target, timeout) = grpc_target(g).map_err(|e| e.within("grpc_service"))?;
            (Service::Grpc(target), timeout)
        }
        Some(pb::ext_authz::Services::HttpService(h)) => {
            let (target, timeout) = http_target(ctx, h).map_err(|e| e.within("http_service"))?;
            (Service::Http(target), timeout)
        }
        None => {
            return Err(ConfigError::new(
                "services",
                "one of grpc_service, http_service is required",
            ));
        }
    };
    let status_on_error = match c.status_on_error.as_ref().map(|s| s.code) {
        None | Some(0) => 403,
        Some(code) => u16::try_from(code)
            .ok()
            .filter(|c| (100..1000).contains(c))
            .ok_or_else(|| {
                ConfigError::new("status_on_error.code", format!("invalid status {code}"))
            })?,
    };
    Ok(ExtAuthzConfig {
        service,
        timeout,
        failure_mode_allow: c.failure_mode_allow,
        failure_mode_allow_header_add: c.failure_mode_allow_header_add,
        with_request_body: c.with_request_body.as_ref().map(buffer_settings),
        clear_route_cache: c.clear_route_cache,
        status_on_error,
        stat_prefix: c.stat_prefix.clone(),
        include_peer_certificate: c.include_peer_certificate,
        include_tls_session: c.include_tls_session,
        allowed_headers: c
            .allowed_headers
            .as_ref()
            .map(|l| matchers(ctx, l))
            .transpose()
            .map_err(|e| e.within("allowed_headers"))?,
        disallowed_headers: c
            .disallowed_headers
            .as_ref()
            .map(|l| matchers(ctx, l))
            .transpose()
            .map_err(|e| e.within("disallowed_headers"))?
            .unwrap_or_default(),
        charge_cluster_response_stats: c.charge_cluster_response_stats.is_none_or(|b| b.value),
        max_denied_response_body_bytes: c.max_denied_response_body_bytes as usize,
        ingest_dynamic_metadata: c.enable_dynamic_metadata_ingestion.is_none_or(|b| b.value),
        enabled_metadata: c
            .filter_enabled_metadata
            .as_ref()
            .map(|m| crate::config::metadata_matcher::metadata_matcher(ctx, m))
            .transpose()
            .map_err(|e| e.within("filter_enabled_metadata"))?,
    })
}

/// Errors for the fields whose behaviour revoy lacks (an authorization filter must not run
/// with less than it was configured to do).
fn refuse_unimplemented(c: &pb::ExtAuthz) -> Result<(), ConfigError> {
    // transport_api_version: AUTO (0) and V3 (2) mean v3; V2 is gone from Envoy too.
    let refused = [
        (c.transport_api_version == 1, "transport_api_version"),
        (c.filter_enabled.is_some(), "filter_enabled"),
        (c.deny_at_disable.is_some(), "deny_at_disable"),
        (
            !c.route_metadata_context_namespaces.is_empty(),
            "route_metadata_context_namespaces",
        ),
        (
            !c.route_typed_metadata_context_namespaces.is_empty(),
            "route_typed_metadata_context_namespaces",
        ),
        (
            !c.bootstrap_metadata_labels_key.is_empty(),
            "bootstrap_metadata_labels_key",
        ),
        (c.encode_raw_headers, "encode_raw_headers"),
        (c.validate_mutations, "validate_mutations"),
        (
            c.decoder_header_mutation_rules.is_some(),
            "decoder_header_mutation_rules",
        ),
        (
            c.enforce_response_header_limits,
            "enforce_response_header_limits",
        ),
        (c.shadow_mode, "shadow_mode"),
    ];
    match refused.iter().find(|(set, _)| *set) {
        Some((_, field)) => Err(ConfigError::new(
            *field,
            "not implemented by revoy's ext_authz filter",
        )),
        None => Ok(()),
    }
}

fn grpc_target(g: &GrpcService) -> Result<(GrpcTarget, Duration), ConfigError> {
    let envoy = match &g.target_specifier {
        Some(grpc_service::TargetSpecifier::EnvoyGrpc(e)) => e,
        Some(grpc_service::TargetSpecifier::GoogleGrpc(_)) => {
            return Err(ConfigError::new(
                "google_grpc",
                "not implemented by revoy: use envoy_grpc",
            ));
        }
        None => {
            return Err(ConfigError::new(
                "target_specifier",
                "one of envoy_grpc, google_grpc is required",
            ));
        }
    };
    if envoy.cluster_name.is_empty() {
        return Err(ConfigError::new(
            "envoy_grpc.cluster_name",
            "value length must be at least 1 characters",
        ));
    }
    if envoy.retry_policy.is_some() || g.retry_policy.is_some() {
        return Err(ConfigError::new(
            "retry_policy",
            "not implemented by revoy's ext_authz filter",
        ));
    }
    let initial_metadata = g
        .initial_metadata
        .iter()
        .enumerate()
        .map(|(i, h)| {
            header(&h.key, &h.value).map_err(|e| e.within(&format!("initial_metadata[{i}]")))
        })
        .collect::<Result<_, _>>()?;
    let timeout = g
        .timeout
        .as_ref()
        .map_or(DEFAULT_TIMEOUT, crate::config::route::duration);
    Ok((
        GrpcTarget {
            authority: if envoy.authority.is_empty() {
                envoy.cluster_name.clone()
            } else {
                envoy.authority.clone()
            },
            cluster: envoy.cluster_name.clone(),
            initial_metadata,
        },
        timeout,
    ))
}

#[allow(deprecated)] // authorization_request.allowed_headers: still honoured by Envoy
fn http_target(
    ctx: &Context<'_>,
    h: &pb::HttpService,
) -> Result<(HttpTarget, Duration), ConfigError> {
    let uri = h
        .server_uri
        .as_ref()
        .ok_or_else(|| ConfigError::new("server_uri", "value is required"))?;
    let (cluster, timeout) = super::http_uri_target(uri).map_err(|e| e.within("server_uri"))?;
    let authority = uri
        .uri
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.authority().map(|a| a.as_str().to_owned()))
        .ok_or_else(|| ConfigError::new("server_uri.uri", format!("invalid URI '{}'", uri.uri)))?;
    if h.retry_policy.is_some() {
        return Err(ConfigError::new(
            "retry_policy",
            "not implemented by revoy's ext_authz filter",
        ));
    }
    let request = h.authorization_request.clone().unwrap_or_default();
    let response = h.authorization_response.clone().unwrap_or_default();
    let list = |l: &Option<ListStringMatcher>, at: &str| {
        l.as_ref()
            .map(|l| matchers(ctx, l))
            .transpose()
            .map_err(|e| e.within(at))
    };
    let headers_to_add = request
        .headers_to_add
        .iter()
        .enumerate()
        .map(|(i, h)| {
            header(&h.key, &h.value)
                .map_err(|e| e.within(&format!("authorization_request.headers_to_add[{i}]")))
        })
        .collect::<Result<_, _>>()?;
    Ok((
        HttpTarget {
            cluster,
            authority,
            path_prefix: h.path_prefix.clone(),
            path_override: h.path_override.clone(),
            allowed_headers: list(
                &request.allowed_headers,
                "authorization_request.allowed_headers",
            )?
            .unwrap_or_default(),
            headers_to_add,
            allowed_upstream_headers: list(
                &response.allowed_upstream_headers,
                "authorization_response.allowed_upstream_headers",
            )?
            .unwrap_or_default(),
            allowed_upstream_headers_to_append: list(
                &response.allowed_upstream_headers_to_append,
                "authorization_response.allowed_upstream_headers_to_append",
            )?
            .unwrap_or_default(),
            allowed_client_headers: list(
                &response.allowed_client_headers,
                "authorization_response.allowed_client_headers",
            )?,
            allowed_client_headers_on_success: list(
                &response.allowed_client_headers_on_success,
                "authorization_response.allowed_client_headers_on_success",
            )?
            .unwrap_or_default(),
            dynamic_metadata_from_headers: list(
                &response.dynamic_metadata_from_headers,
                "authorization_response.dynamic_metadata_from_headers",
            )?
            .unwrap_or_default(),
        },
        timeout,
    ))
}

/// Compiles an `ExtAuthzPerRoute`.
pub fn compile_per_route(r: &pb::ExtAuthzPerRoute) -> Result<ExtAuthzPerRoute, ConfigError> {
    use pb::ext_authz_per_route::Override;
    match &r.r#override {
        Some(Override::Disabled(true)) => Ok(ExtAuthzPerRoute::Disabled),
        Some(Override::Disabled(false)) => {
            Err(ConfigError::new("disabled", "value must equal true"))
        }
        Some(Override::CheckSettings(s)) => {
            if s.service_override.is_some() {
                return Err(ConfigError::new(
                    "check_settings.service_override",
                    "not implemented by revoy's ext_authz filter",
                ));
            }
            if s.emit_client_span.is_some() {
                return Err(ConfigError::new(
                    "check_settings.emit_client_span",
                    "not implemented by revoy: it makes no client spans for checks",
                ));
            }
            if s.disable_request_body_buffering && s.with_request_body.is_some() {
                return Err(ConfigError::new(
                    "check_settings",
                    "Invalid configuration for check_settings. Only one of disable_request_body_buffering or with_request_body can be set.",
                ));
            }
            let mut context_extensions: Vec<(String, String)> = s
                .context_extensions
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            context_extensions.sort();
            Ok(ExtAuthzPerRoute::Check(CheckSettings {
                context_extensions,
                disable_request_body_buffering: s.disable_request_body_buffering,
                with_request_body: s.with_request_body.as_ref().map(buffer_settings),
            }))
        }
        None => Err(ConfigError::new(
            "override",
            "one of disabled, check_settings is required",
        )),
    }
}

fn buffer_settings(b: &pb::BufferSettings) -> BufferSettings {
    BufferSettings {
        max_request_bytes: b.max_request_bytes as usize,
        allow_partial_message: b.allow_partial_message,
        pack_as_bytes: b.pack_as_bytes,
    }
}

fn matchers(ctx: &Context<'_>, l: &ListStringMatcher) -> Result<Vec<StringMatcher>, ConfigError> {
    l.patterns
        .iter()
        .enumerate()
        .map(|(i, m)| string_matcher(ctx, m).map_err(|e| e.within(&format!("patterns[{i}]"))))
        .collect()
}

fn header(key: &str, value: &str) -> Result<(HeaderName, HeaderValue), ConfigError> {
    let name = HeaderName::try_from(key.to_ascii_lowercase())
        .map_err(|_| ConfigError::new("key", format!("invalid header name '{key}'")))?;
    let value = HeaderValue::try_from(value)
        .map_err(|_| ConfigError::new("value", format!("invalid header value '{value}'")))?;
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::core::v3::grpc_service::EnvoyGrpc;

    fn grpc(cluster: &str) -> pb::ExtAuthz {
        pb::ExtAuthz {
            services: Some(pb::ext_authz::Services::GrpcService(GrpcService {
                target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(EnvoyGrpc {
                    cluster_name: cluster.into(),
                    ..Default::default()
                })),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn compiled(c: &pb::ExtAuthz) -> Result<ExtAuthzConfig, ConfigError> {
        let io = crate::config::context::FakeIo::new();
        compile(&Context::new(&io), c, &mut Warnings::new())
    }

    #[test]
    fn grpc_service_with_envoys_defaults() {
        let c = compiled(&grpc("authz")).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(200));
        assert_eq!(c.status_on_error, 403);
        assert!(!c.failure_mode_allow);
        let Service::Grpc(target) = &c.service else {
            panic!("{:?}", c.service);
        };
        assert_eq!(
            (target.cluster.as_str(), target.authority.as_str()),
            ("authz", "authz")
        );
    }

    #[test]
    fn what_revoy_lacks_is_an_error_never_ignored() {
        let mut shadow = grpc("authz");
        shadow.shadow_mode = true;
        let mut raw = grpc("authz");
        raw.encode_raw_headers = true;
        for (c, field) in [
            (shadow, "shadow_mode"),
            (raw, "encode_raw_headers"),
            (grpc(""), "grpc_service.envoy_grpc.cluster_name"),
            (pb::ExtAuthz::default(), "services"),
        ] {
            let e = compiled(&c).unwrap_err();
            assert_eq!(e.path, field, "{e}");
        }
    }

    #[test]
    fn per_route_settings() {
        use pb::ext_authz_per_route::Override;
        let disabled = pb::ExtAuthzPerRoute {
            r#override: Some(Override::Disabled(true)),
        };
        assert!(matches!(
            compile_per_route(&disabled),
            Ok(ExtAuthzPerRoute::Disabled)
        ));
        let both = pb::ExtAuthzPerRoute {
            r#override: Some(Override::CheckSettings(pb::CheckSettings {
                disable_request_body_buffering: true,
                with_request_body: Some(pb::BufferSettings::default()),
                ..Default::default()
            })),
        };
        assert!(compile_per_route(&both).is_err());
    }
}
