//! CORS policies -> [`CorsPolicy`]: the `envoy.filters.http.cors` filter's per-route
//! `CorsPolicy` (`typed_per_filter_config`) and the deprecated `cors` field of a virtual host
//! or route action (`envoy.config.route.v3.CorsPolicy`), which Envoy 1.40 still reads when no
//! level has a per-route policy.

use proto::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use proto::pb::envoy::config::route::v3 as route_pb;
use proto::pb::envoy::extensions::filters::http::cors::v3 as cors_pb;
use proto::pb::envoy::r#type::matcher::v3::StringMatcher as StringMatcherProto;

use crate::config::route::matchers::{runtime_fraction, string_matcher};
use crate::config::{ConfigError, Context};
use crate::route::matcher::{RuntimeFraction, StringMatcher};

/// One CORS policy. Each attribute left empty (or unset) here is taken from the next, less
/// specific, policy of the request, as Envoy's filter does.
#[derive(Debug, Clone, Default)]
pub struct CorsPolicy {
    /// `allow_origin_string_match`.
    pub allow_origins: Vec<StringMatcher>,
    /// `allow_methods`.
    pub allow_methods: String,
    /// `allow_headers`.
    pub allow_headers: String,
    /// `expose_headers`.
    pub expose_headers: String,
    /// `max_age`.
    pub max_age: String,
    /// `allow_credentials`, when set.
    pub allow_credentials: Option<bool>,
    /// `allow_private_network_access`, when set.
    pub allow_private_network_access: Option<bool>,
    /// `forward_not_matching_preflights`, when set (Envoy's default: true).
    pub forward_not_matching_preflights: Option<bool>,
    /// `filter_enabled` (`None`: enabled for every request).
    pub filter_enabled: Option<RuntimeFraction>,
    /// `shadow_enabled` (`None`: no shadow mode).
    pub shadow_enabled: Option<RuntimeFraction>,
}

/// Compiles the filter's per-route `CorsPolicy`.
pub fn compile(ctx: &Context<'_>, p: &cors_pb::CorsPolicy) -> Result<CorsPolicy, ConfigError> {
    Ok(CorsPolicy {
        allow_origins: origins(ctx, &p.allow_origin_string_match)?,
        allow_methods: p.allow_methods.clone(),
        allow_headers: p.allow_headers.clone(),
        expose_headers: p.expose_headers.clone(),
        max_age: p.max_age.clone(),
        allow_credentials: p.allow_credentials.map(|b| b.value),
        allow_private_network_access: p.allow_private_network_access.map(|b| b.value),
        forward_not_matching_preflights: p.forward_not_matching_preflights.map(|b| b.value),
        filter_enabled: fraction(p.filter_enabled.as_ref(), "filter_enabled")?,
        shadow_enabled: fraction(p.shadow_enabled.as_ref(), "shadow_enabled")?,
    })
}

/// Compiles a virtual host's or route action's deprecated `cors` field (the same fields as
/// the filter's policy, with `filter_enabled` in a oneof).
pub fn compile_legacy(
    ctx: &Context<'_>,
    p: &route_pb::CorsPolicy,
) -> Result<CorsPolicy, ConfigError> {
    use route_pb::cors_policy::EnabledSpecifier;
    let filter_enabled = p
        .enabled_specifier
        .as_ref()
        .map(|EnabledSpecifier::FilterEnabled(f)| f.clone());
    compile(
        ctx,
        &cors_pb::CorsPolicy {
            allow_origin_string_match: p.allow_origin_string_match.clone(),
            allow_methods: p.allow_methods.clone(),
            allow_headers: p.allow_headers.clone(),
            expose_headers: p.expose_headers.clone(),
            max_age: p.max_age.clone(),
            allow_credentials: p.allow_credentials,
            filter_enabled,
            shadow_enabled: p.shadow_enabled.clone(),
            allow_private_network_access: p.allow_private_network_access,
            forward_not_matching_preflights: p.forward_not_matching_preflights,
        },
    )
}

fn origins(
    ctx: &Context<'_>,
    matchers: &[StringMatcherProto],
) -> Result<Vec<StringMatcher>, ConfigError> {
    matchers
        .iter()
        .enumerate()
        .map(|(i, m)| {
            string_matcher(ctx, m).map_err(|e| e.within(&format!("allow_origin_string_match[{i}]")))
        })
        .collect()
}

/// A runtime fraction, its `default_value` required as in Envoy's proto validation.
fn fraction(
    f: Option<&RuntimeFractionalPercent>,
    field: &str,
) -> Result<Option<RuntimeFraction>, ConfigError> {
    match f {
        Some(f) if f.default_value.is_none() => Err(ConfigError::new(
            format!("{field}.default_value"),
            "value is required",
        )),
        f => Ok(f.map(runtime_fraction)),
    }
}
