//! `envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit` -> [`LocalRateLimitConfig`]
//! (the filter's configuration, or a route's in `typed_per_filter_config`).

use std::sync::Arc;

use http::StatusCode;
use proto::pb::envoy::extensions::common::ratelimit::v3::{
    LocalRateLimitDescriptor, VhRateLimitsOptions, XRateLimitHeadersRfcVersion,
};
use proto::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;

use crate::config::route::matchers::fractional;
use crate::config::token_bucket::{TokenBucketSpec, compile_token_bucket};
use crate::config::{ConfigError, Context};
use crate::limits::LocalLimiter;
use crate::route::headers::HeaderMutations;
use crate::route::matcher::RuntimeFraction;
use crate::route::rate_limit::{Descriptor, RateLimitPolicy, VhRateLimits};

/// Type name of the HTTP `LocalRateLimit` filter's config.
pub const HTTP_LOCAL_RATE_LIMIT: &str =
    "envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit";

/// A compiled HTTP local rate limit.
#[derive(Debug, Clone)]
pub struct LocalRateLimitConfig {
    /// `stat_prefix`: stats are `<stat_prefix>.http_local_rate_limit.*`.
    pub stat_prefix: String,
    /// `status` (429 unless a 4xx or 5xx code is configured).
    pub status: StatusCode,
    /// `token_bucket`: the default bucket (none: only descriptors limit).
    pub bucket: Option<TokenBucketSpec>,
    /// `filter_enabled` (unset: the filter does nothing).
    pub filter_enabled: Option<RuntimeFraction>,
    /// `filter_enforced` (unset: limited requests are only counted).
    pub filter_enforced: Option<RuntimeFraction>,
    /// `request_headers_to_add_when_not_enforced`.
    pub request_headers_when_not_enforced: HeaderMutations,
    /// `response_headers_to_add`: added to the filter's local reply.
    pub response_headers: HeaderMutations,
    /// `descriptors` with their buckets, in order.
    pub descriptors: Vec<(Descriptor, TokenBucketSpec)>,
    /// `stage`: which route policies make descriptors.
    pub stage: u32,
    /// `local_rate_limit_per_downstream_connection`: each connection has buckets of its own
    /// (made from the first configuration a request of the connection uses, as in Envoy).
    pub per_connection: bool,
    /// `enable_x_ratelimit_headers: DRAFT_VERSION_03`.
    pub x_ratelimit_headers: bool,
    /// `vh_rate_limits`.
    pub vh_rate_limits: VhRateLimits,
    /// `always_consume_default_token_bucket` (default true).
    pub always_consume_default: bool,
    /// `rate_limited_as_resource_exhausted`: gRPC status 8 rather than 14 on a gRPC reply.
    pub resource_exhausted: bool,
    /// `rate_limits`: the filter's own policies, used instead of the route's.
    pub rate_limits: Vec<RateLimitPolicy>,
    /// The buckets, full when compiled (a configuration that is compiled again starts
    /// afresh, as Envoy's does when it loads a configuration); shared by every worker.
    pub limiter: Arc<LocalLimiter>,
}

/// Compiles a `LocalRateLimit`; `per_route` for a route's configuration, which must have a
/// token bucket. Errors name fields relative to the message.
pub fn compile_local(
    ctx: &Context<'_>,
    p: &LocalRateLimit,
    per_route: bool,
) -> Result<LocalRateLimitConfig, ConfigError> {
    if p.stat_prefix.is_empty() {
        return Err(ConfigError::new(
            "stat_prefix",
            "value length must be at least 1 characters",
        ));
    }
    if per_route && p.token_bucket.is_none() {
        return Err(ConfigError::new(
            "token_bucket",
            "local rate limit token bucket must be set for per filter configs",
        ));
    }
    if p.local_cluster_rate_limit.is_some() {
        return Err(ConfigError::unimplemented(
            "local_cluster_rate_limit",
            "local_cluster_rate_limit",
        ));
    }
    if p.enable_retry_after_header {
        return Err(ConfigError::unimplemented(
            "enable_retry_after_header",
            "enable_retry_after_header",
        ));
    }
    if p.stage > crate::route::rate_limit::MAX_STAGE {
        return Err(ConfigError::new(
            "stage",
            "value must be less than or equal to 10",
        ));
    }
    let bucket = match &p.token_bucket {
        Some(b) => Some(compile_token_bucket(Some(b), "token_bucket")?),
        None => None,
    };
    let status = p
        .status
        .as_ref()
        .and_then(|s| u16::try_from(s.code).ok())
        .filter(|c| (400..600).contains(c))
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let descriptors = compile_descriptors(&p.descriptors)?;
    let always_consume_default = p
        .always_consume_default_token_bucket
        .is_none_or(|b| b.value);
    let limiter = Arc::new(LocalLimiter::new(
        bucket,
        &descriptors,
        always_consume_default,
    ));
    let header_rules = |add, field: &str| {
        crate::config::route::header_mutations(ctx, add, &[]).map_err(|e| e.within(field))
    };
    Ok(LocalRateLimitConfig {
        stat_prefix: p.stat_prefix.clone(),
        status,
        bucket,
        filter_enabled: p.filter_enabled.as_ref().map(runtime_percent),
        filter_enforced: p.filter_enforced.as_ref().map(runtime_percent),
        request_headers_when_not_enforced: header_rules(
            &p.request_headers_to_add_when_not_enforced,
            "request_headers_to_add_when_not_enforced",
        )?,
        response_headers: header_rules(&p.response_headers_to_add, "response_headers_to_add")?,
        descriptors,
        stage: p.stage,
        per_connection: p.local_rate_limit_per_downstream_connection,
        x_ratelimit_headers: p.enable_x_ratelimit_headers
            == XRateLimitHeadersRfcVersion::DraftVersion03 as i32,
        vh_rate_limits: match VhRateLimitsOptions::try_from(p.vh_rate_limits) {
            Ok(VhRateLimitsOptions::Include) => VhRateLimits::Include,
            Ok(VhRateLimitsOptions::Ignore) => VhRateLimits::Ignore,
            _ => VhRateLimits::Override,
        },
        always_consume_default: p
            .always_consume_default_token_bucket
            .is_none_or(|b| b.value),
        resource_exhausted: p.rate_limited_as_resource_exhausted,
        rate_limits: crate::config::route::rate_limits::compile_rate_limits(ctx, &p.rate_limits)
            .map_err(|e| e.within("rate_limits"))?,
        limiter,
    })
}

/// A `RuntimeFractionalPercent`, read at its default (revoy has no runtime).
fn runtime_percent(
    r: &proto::pb::envoy::config::core::v3::RuntimeFractionalPercent,
) -> RuntimeFraction {
    RuntimeFraction {
        key: r.runtime_key.clone(),
        default: r.default_value.as_ref().map_or(
            crate::route::matcher::FractionalPercent {
                numerator: 0,
                denominator: 100,
            },
            fractional,
        ),
    }
}

fn compile_descriptors(
    descriptors: &[LocalRateLimitDescriptor],
) -> Result<Vec<(Descriptor, TokenBucketSpec)>, ConfigError> {
    let mut out: Vec<(Descriptor, TokenBucketSpec)> = Vec::with_capacity(descriptors.len());
    for (i, d) in descriptors.iter().enumerate() {
        let at = format!("descriptors[{i}]");
        if d.entries.is_empty() {
            return Err(ConfigError::new(
                format!("{at}.entries"),
                "value must contain at least 1 item(s)",
            ));
        }
        if d.shadow_mode {
            return Err(ConfigError::unimplemented(
                format!("{at}.shadow_mode"),
                "shadow_mode",
            ));
        }
        let mut entries = Vec::with_capacity(d.entries.len());
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.entries[{j}].key"),
                    "value length must be at least 1 characters",
                ));
            }
            if e.value.is_empty() {
                return Err(ConfigError::unimplemented(
                    format!("{at}.entries[{j}].value"),
                    "a wildcard (empty) descriptor value",
                ));
            }
            entries.push((e.key.clone(), e.value.clone()));
        }
        let bucket = compile_token_bucket(d.token_bucket.as_ref(), &format!("{at}.token_bucket"))?;
        let descriptor = Descriptor(entries);
        if out.iter().any(|(o, _)| *o == descriptor) {
            return Err(ConfigError::new(
                at,
                "duplicate descriptor in the local rate descriptor",
            ));
        }
        out.push((descriptor, bucket));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(yaml: &str, per_route: bool) -> Result<LocalRateLimitConfig, ConfigError> {
        let codec = proto::Codec::new();
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        let p: LocalRateLimit = codec.decode(value, false).unwrap().message;
        let io = crate::config::FakeIo::new();
        compile_local(&Context::new(&io), &p, per_route)
    }

    #[test]
    fn envoys_defaults() {
        let c = compile("{stat_prefix: s}", false).unwrap();
        assert!(c.bucket.is_none() && c.filter_enabled.is_none() && c.filter_enforced.is_none());
        assert_eq!(c.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(c.always_consume_default && !c.x_ratelimit_headers);
        assert_eq!(c.vh_rate_limits, VhRateLimits::Override);
        let c = compile(
            "{stat_prefix: s, status: {code: 200}, enable_x_ratelimit_headers: DRAFT_VERSION_03, \
             token_bucket: {max_tokens: 1, fill_interval: 60s}, \
             filter_enabled: {runtime_key: e, default_value: {numerator: 100}}}",
            false,
        )
        .unwrap();
        assert_eq!(
            c.status,
            StatusCode::TOO_MANY_REQUESTS,
            "a 2xx status is not taken"
        );
        assert!(c.x_ratelimit_headers);
        assert_eq!(c.filter_enabled.unwrap().default.numerator, 100);
    }

    #[test]
    fn per_route_needs_a_bucket_and_descriptors_are_checked() {
        let e = compile("{stat_prefix: s}", true).unwrap_err();
        assert_eq!(e.path, "token_bucket");
        let d = |entries: &str| {
            format!(
                "{{stat_prefix: s, descriptors: [{{entries: {entries}, token_bucket: {{max_tokens: 1, fill_interval: 60s}}}}, \
                 {{entries: [{{key: k, value: v}}], token_bucket: {{max_tokens: 1, fill_interval: 60s}}}}]}}"
            )
        };
        assert_eq!(
            compile(&d("[{key: k, value: v}]"), false).unwrap_err().path,
            "descriptors[1]"
        );
        let e = compile(&d("[{key: k}]"), false).unwrap_err();
        assert_eq!(e.path, "descriptors[0].entries[0].value");
        assert!(e.message.contains("wildcard"), "{e}");
        let c = compile(&d("[{key: a, value: b}]"), false).unwrap();
        assert_eq!(c.descriptors.len(), 2);
    }
}
