//! `envoy.extensions.filters.http.ratelimit.v3.RateLimit` -> [`RateLimitServiceConfig`] (the
//! filter calling a rate limit service over gRPC), and its per-route `RateLimitPerRoute` ->
//! [`RateLimitPerRoute`].

use std::time::Duration;

use http::StatusCode;
use proto::pb::envoy::config::core::v3::grpc_service::TargetSpecifier;
use proto::pb::envoy::config::ratelimit::v3::RateLimitServiceConfig as RateLimitServiceProto;
use proto::pb::envoy::extensions::common::ratelimit::v3::XRateLimitHeadersRfcVersion;
use proto::pb::envoy::extensions::filters::http::ratelimit::v3::{
    RateLimit, RateLimitPerRoute as PerRouteProto, rate_limit_per_route,
};

use crate::config::{ConfigError, Context};
use crate::route::headers::HeaderMutations;
use crate::route::rate_limit::{RateLimitPolicy, VhRateLimits};

/// Type name of the HTTP `RateLimit` filter's config.
pub const HTTP_RATE_LIMIT: &str = "envoy.extensions.filters.http.ratelimit.v3.RateLimit";
/// Type name of its per-route config.
pub const HTTP_RATE_LIMIT_PER_ROUTE: &str =
    "envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute";

/// The gRPC method the filter calls.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Which requests the filter applies to (`request_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestType {
    /// `both` (the default).
    Both,
    /// `internal`: only requests with `x-envoy-internal: true`.
    Internal,
    /// `external`: only the others.
    External,
}

/// A compiled HTTP `RateLimit` filter.
#[derive(Debug, Clone)]
pub struct RateLimitServiceConfig {
    /// `domain`.
    pub domain: String,
    /// `stage`.
    pub stage: u32,
    /// `request_type`.
    pub request_type: RequestType,
    /// `timeout` of each call (default 20 ms).
    pub timeout: Duration,
    /// `failure_mode_deny`: a failed call answers 500 (else the request goes on).
    pub failure_mode_deny: bool,
    /// `rate_limited_as_resource_exhausted`.
    pub resource_exhausted: bool,
    /// The service's cluster (`rate_limit_service.grpc_service.envoy_grpc.cluster_name`).
    pub cluster: String,
    /// The `:authority` of the calls (`envoy_grpc.authority`, else the cluster name).
    pub authority: String,
    /// `enable_x_ratelimit_headers: DRAFT_VERSION_03`: the service's descriptor statuses
    /// become `x-ratelimit-*` response headers.
    pub x_ratelimit_headers: bool,
    /// Whether an over-limit reply carries `x-envoy-ratelimited: true`.
    pub x_envoy_ratelimited: bool,
    /// `rate_limited_status` (429 unless a code of at least 400 is configured).
    pub rate_limited_status: StatusCode,
    /// `status_on_error` (500 unless a code of at least 400 is configured).
    pub status_on_error: StatusCode,
    /// `response_headers_to_add`: added to the over-limit reply.
    pub response_headers: HeaderMutations,
    /// `stat_prefix`: stats are `cluster.<cluster>.<stat_prefix>.ratelimit.*` when set.
    pub stat_prefix: String,
    /// `rate_limits`: the filter's own policies, used instead of the route's.
    pub rate_limits: Vec<RateLimitPolicy>,
}

/// A compiled `RateLimitPerRoute`.
#[derive(Debug, Clone)]
pub struct RateLimitPerRoute {
    /// Which virtual host policies apply, with the route's (`override_option`, or
    /// `vh_rate_limits` when it is `DEFAULT`).
    pub vh_rate_limits: VhRateLimits,
    /// `rate_limits`: policies that replace the route's.
    pub rate_limits: Vec<RateLimitPolicy>,
    /// `domain`: replaces the filter's.
    pub domain: Option<String>,
}

/// A configured `HttpStatus` code when it is at least 400, else `default`.
fn status_at_least_400(code: Option<i32>, default: StatusCode) -> StatusCode {
    code.and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(default)
}

/// Compiles the filter's configuration; errors name fields relative to the message.
pub fn compile_service(
    ctx: &Context<'_>,
    p: &RateLimit,
) -> Result<RateLimitServiceConfig, ConfigError> {
    if p.domain.is_empty() {
        return Err(ConfigError::new(
            "domain",
            "value length must be at least 1 characters",
        ));
    }
    if p.stage > crate::route::rate_limit::MAX_STAGE {
        return Err(ConfigError::new(
            "stage",
            "value must be less than or equal to 10",
        ));
    }
    let request_type = match p.request_type.as_str() {
        "" | "both" => RequestType::Both,
        "internal" => RequestType::Internal,
        "external" => RequestType::External,
        other => {
            return Err(ConfigError::new(
                "request_type",
                format!("value must be in list [internal external both ]: {other:?}"),
            ));
        }
    };
    for (set, field) in [
        (p.filter_enabled.is_some(), "filter_enabled"),
        (p.filter_enforced.is_some(), "filter_enforced"),
        (
            p.failure_mode_deny_percent.is_some(),
            "failure_mode_deny_percent",
        ),
        (!p.metadata_namespace.is_empty(), "metadata_namespace"),
        (p.enable_retry_after_header, "enable_retry_after_header"),
    ] {
        if set {
            return Err(ConfigError::unimplemented(field, field));
        }
    }
    let (cluster, authority) = service_cluster(p.rate_limit_service.as_ref())?;
    let timeout = match &p.timeout {
        Some(d) => crate::config::cluster::duration(d, "timeout")?,
        None => Duration::from_millis(20),
    };
    Ok(RateLimitServiceConfig {
        domain: p.domain.clone(),
        stage: p.stage,
        request_type,
        timeout,
        failure_mode_deny: p.failure_mode_deny,
        resource_exhausted: p.rate_limited_as_resource_exhausted,
        cluster,
        authority,
        x_ratelimit_headers: p.enable_x_ratelimit_headers
            == XRateLimitHeadersRfcVersion::DraftVersion03 as i32,
        x_envoy_ratelimited: !p.disable_x_envoy_ratelimited_header,
        rate_limited_status: status_at_least_400(
            p.rate_limited_status.as_ref().map(|s| s.code),
            StatusCode::TOO_MANY_REQUESTS,
        ),
        status_on_error: status_at_least_400(
            p.status_on_error.as_ref().map(|s| s.code),
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        response_headers: crate::config::route::header_mutations(
            ctx,
            &p.response_headers_to_add,
            &[],
        )
        .map_err(|e| e.within("response_headers_to_add"))?,
        stat_prefix: p.stat_prefix.clone(),
        rate_limits: crate::config::route::rate_limits::compile_rate_limits(ctx, &p.rate_limits)
            .map_err(|e| e.within("rate_limits"))?,
    })
}

/// The cluster and `:authority` of a `rate_limit_service` (an `envoy_grpc` service, V3),
/// shared by the HTTP and network rate limit filters; errors name fields relative to the
/// filter's message.
pub fn service_cluster(
    service: Option<&RateLimitServiceProto>,
) -> Result<(String, String), ConfigError> {
    let service =
        service.ok_or_else(|| ConfigError::new("rate_limit_service", "value is required"))?;
    if service.transport_api_version != proto::pb::envoy::config::core::v3::ApiVersion::V3 as i32 {
        return Err(ConfigError::new(
            "rate_limit_service.transport_api_version",
            "V2 (and AUTO) xDS transport protocol versions are deprecated in rate limit service config",
        ));
    }
    let grpc = service
        .grpc_service
        .as_ref()
        .ok_or_else(|| ConfigError::new("rate_limit_service.grpc_service", "value is required"))?;
    let at = "rate_limit_service.grpc_service";
    if !grpc.initial_metadata.is_empty() {
        return Err(ConfigError::unimplemented(
            format!("{at}.initial_metadata"),
            "initial_metadata",
        ));
    }
    if grpc.retry_policy.is_some() {
        return Err(ConfigError::unimplemented(
            format!("{at}.retry_policy"),
            "retry_policy",
        ));
    }
    match &grpc.target_specifier {
        Some(TargetSpecifier::EnvoyGrpc(e)) => {
            if e.cluster_name.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.envoy_grpc.cluster_name"),
                    "value length must be at least 1 characters",
                ));
            }
            if e.retry_policy.is_some() {
                return Err(ConfigError::unimplemented(
                    format!("{at}.envoy_grpc.retry_policy"),
                    "retry_policy",
                ));
            }
            let authority = if e.authority.is_empty() {
                e.cluster_name.clone()
            } else {
                e.authority.clone()
            };
            Ok((e.cluster_name.clone(), authority))
        }
        Some(TargetSpecifier::GoogleGrpc(_)) => Err(ConfigError::unimplemented(
            format!("{at}.google_grpc"),
            "a google_grpc rate limit service",
        )),
        None => Err(ConfigError::new(
            format!("{at}.target_specifier"),
            "value is required",
        )),
    }
}

/// Compiles a route's `RateLimitPerRoute`.
pub fn compile_per_route(
    ctx: &Context<'_>,
    p: &PerRouteProto,
) -> Result<RateLimitPerRoute, ConfigError> {
    use rate_limit_per_route::{OverrideOptions as O, VhRateLimitsOptions as V};
    let vh_rate_limits = match O::try_from(p.override_option).unwrap_or(O::Default) {
        O::OverridePolicy => VhRateLimits::Override,
        O::IncludePolicy => VhRateLimits::Include,
        O::IgnorePolicy => VhRateLimits::Ignore,
        O::Default => match V::try_from(p.vh_rate_limits).unwrap_or(V::Override) {
            V::Override => VhRateLimits::Override,
            V::Include => VhRateLimits::Include,
            V::Ignore => VhRateLimits::Ignore,
        },
    };
    Ok(RateLimitPerRoute {
        vh_rate_limits,
        rate_limits: crate::config::route::rate_limits::compile_rate_limits(ctx, &p.rate_limits)
            .map_err(|e| e.within("rate_limits"))?,
        domain: (!p.domain.is_empty()).then(|| p.domain.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(yaml: &str) -> Result<RateLimitServiceConfig, ConfigError> {
        let codec = proto::Codec::new();
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        let p: RateLimit = codec.decode(value, false).unwrap().message;
        let io = crate::config::FakeIo::new();
        compile_service(&Context::new(&io), &p)
    }

    const SERVICE: &str = "rate_limit_service: {transport_api_version: V3, grpc_service: {envoy_grpc: {cluster_name: rls}}}";

    #[test]
    fn envoys_defaults() {
        let c = compile(&format!("{{domain: d, {SERVICE}}}")).unwrap();
        assert_eq!(c.timeout, Duration::from_millis(20));
        assert_eq!((c.cluster.as_str(), c.authority.as_str()), ("rls", "rls"));
        assert_eq!(c.rate_limited_status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(c.status_on_error, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(c.x_envoy_ratelimited && !c.failure_mode_deny);
        assert_eq!(c.request_type, RequestType::Both);
    }

    #[test]
    fn bad_and_unimplemented_fields_are_named() {
        let e = compile(&format!("{{{SERVICE}}}")).unwrap_err();
        assert_eq!(e.path, "domain");
        let e = compile(
            "{domain: d, rate_limit_service: {grpc_service: {envoy_grpc: {cluster_name: rls}}}}",
        )
        .unwrap_err();
        assert_eq!(e.path, "rate_limit_service.transport_api_version");
        let e = compile(&format!("{{domain: d, request_type: all, {SERVICE}}}")).unwrap_err();
        assert_eq!(e.path, "request_type");
        let e = compile(&format!(
            "{{domain: d, failure_mode_deny_percent: {{default_value: {{numerator: 1}}}}, {SERVICE}}}"
        ))
        .unwrap_err();
        assert!(e.message.contains("not implemented"), "{e}");
    }
}
