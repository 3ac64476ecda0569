//! The filters that limit connections: the network filters
//! `envoy.filters.network.local_ratelimit` (`LocalRateLimit`),
//! `envoy.filters.network.connection_limit` (`ConnectionLimit`) and
//! `envoy.filters.network.ratelimit` (`RateLimit`, asking a rate limit service) ->
//! [`NetworkLimit`], and the listener filter `envoy.filters.listener.local_ratelimit` ->
//! [`ListenerRateLimit`].

use std::time::Duration;

use proto::pb::envoy::config::core::v3::RuntimeFeatureFlag;

use super::runtime::RuntimeFlag;
use proto::pb::envoy::extensions::filters::listener::local_ratelimit::v3::LocalRateLimit as ListenerLocalRateLimit;
use proto::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit;
use proto::pb::envoy::extensions::filters::network::local_ratelimit::v3::LocalRateLimit;
use proto::pb::envoy::extensions::filters::network::ratelimit::v3::RateLimit;

use super::Context;
use crate::access_log::format::Template;

use super::ConfigError;
use super::token_bucket::{TokenBucketSpec, compile_token_bucket};

/// Type name of the network `LocalRateLimit` filter's config.
pub const LOCAL_RATE_LIMIT: &str =
    "envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit";
/// Type name of the `ConnectionLimit` filter's config.
pub const CONNECTION_LIMIT: &str =
    "envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit";
/// Type name of the network `RateLimit` filter's config.
pub const RATE_LIMIT_SERVICE: &str = "envoy.extensions.filters.network.ratelimit.v3.RateLimit";
/// Type name of the listener `LocalRateLimit` filter's config.
pub const LISTENER_LOCAL_RATE_LIMIT: &str =
    "envoy.extensions.filters.listener.local_ratelimit.v3.LocalRateLimit";

/// A network filter that may close a new connection before the chain's terminal filter sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum NetworkLimit {
    /// `envoy.filters.network.local_ratelimit`.
    RateLimit(NetworkRateLimit),
    /// `envoy.filters.network.connection_limit`.
    ConnectionLimit(ConnectionLimitConfig),
    /// `envoy.filters.network.ratelimit`.
    Service(NetworkRateLimitService),
}

/// A compiled network `RateLimit`: each new connection is held, unread, until the rate limit
/// service answers; over the limit (or, with `failure_mode_deny`, when the call fails) it is
/// closed.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkRateLimitService {
    /// `stat_prefix`: stats are `ratelimit.<stat_prefix>.*`.
    pub stat_prefix: String,
    /// `domain`.
    pub domain: String,
    /// `descriptors`, sent with every call: each a list of entries, whose values may hold
    /// `%COMMAND%` operators rendered for the connection.
    pub descriptors: Vec<Vec<(String, Template)>>,
    /// `timeout` of each call (default 20 ms).
    pub timeout: Duration,
    /// `failure_mode_deny`: a failed call closes the connection (else it goes on).
    pub failure_mode_deny: bool,
    /// The service's cluster.
    pub cluster: String,
    /// The `:authority` of the calls.
    pub authority: String,
}

/// A compiled listener `LocalRateLimit`: each accepted socket takes a token or is closed
/// before any other listener filter after it, and before any filter chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerRateLimit {
    /// `stat_prefix`: stats are `listener_local_ratelimit.<stat_prefix>.rate_limited`.
    pub stat_prefix: String,
    /// `token_bucket`.
    pub bucket: TokenBucketSpec,
    /// `runtime_enabled` (on when unset).
    pub enabled: RuntimeFlag,
}

/// A compiled network `LocalRateLimit`: each new connection takes a token or is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkRateLimit {
    /// `stat_prefix`: stats are `local_rate_limit.<stat_prefix>.rate_limited`.
    pub stat_prefix: String,
    /// `token_bucket`.
    pub bucket: TokenBucketSpec,
    /// `share_key`: filters with the same key and bucket share one bucket (empty: never shared).
    pub share_key: String,
    /// `runtime_enabled` (on when unset).
    pub enabled: RuntimeFlag,
}

/// A compiled `ConnectionLimit`: at most `max_connections` open connections through the filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimitConfig {
    /// `stat_prefix`: stats are `connection_limit.<stat_prefix>.limited_connections` and
    /// `.active_connections`.
    pub stat_prefix: String,
    /// `max_connections`.
    pub max_connections: u64,
    /// `delay`: how long a connection over the limit is held (unread) before it is closed.
    pub delay: Option<Duration>,
    /// `runtime_enabled` (on when unset).
    pub enabled: RuntimeFlag,
}

/// Compiles a network `LocalRateLimit`; errors name fields relative to the message.
pub fn compile_rate_limit(p: &LocalRateLimit) -> Result<NetworkRateLimit, ConfigError> {
    Ok(NetworkRateLimit {
        stat_prefix: stat_prefix(&p.stat_prefix)?,
        bucket: compile_token_bucket(p.token_bucket.as_ref(), "token_bucket")?,
        share_key: p.share_key.clone(),
        enabled: feature_flag(p.runtime_enabled.as_ref(), "runtime_enabled")?,
    })
}

/// Compiles a `ConnectionLimit`; errors name fields relative to the message.
pub fn compile_connection_limit(p: &ConnectionLimit) -> Result<ConnectionLimitConfig, ConfigError> {
    let max_connections = match p.max_connections {
        None => return Err(ConfigError::new("max_connections", "value is required")),
        Some(m) if m.value == 0 => {
            return Err(ConfigError::new(
                "max_connections",
                "value must be greater than or equal to 1",
            ));
        }
        Some(m) => m.value,
    };
    let delay = p
        .delay
        .as_ref()
        .map(|d| super::cluster::duration(d, "delay"))
        .transpose()?
        .map(|d| Duration::from_millis(d.as_millis().try_into().unwrap_or(u64::MAX)))
        .filter(|d| !d.is_zero());
    Ok(ConnectionLimitConfig {
        stat_prefix: stat_prefix(&p.stat_prefix)?,
        max_connections,
        delay,
        enabled: feature_flag(p.runtime_enabled.as_ref(), "runtime_enabled")?,
    })
}

/// Compiles a network `RateLimit`; errors name fields relative to the message.
pub fn compile_rate_limit_service(
    ctx: &Context<'_>,
    p: &RateLimit,
) -> Result<NetworkRateLimitService, ConfigError> {
    let stat_prefix = stat_prefix(&p.stat_prefix)?;
    if p.domain.is_empty() {
        return Err(ConfigError::new(
            "domain",
            "value length must be at least 1 characters",
        ));
    }
    if p.descriptors.is_empty() {
        return Err(ConfigError::new(
            "descriptors",
            "value must contain at least 1 item(s)",
        ));
    }
    let descriptors = p
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| descriptor(ctx, d).map_err(|e| e.within(&format!("descriptors[{i}]"))))
        .collect::<Result<_, _>>()?;
    let (cluster, authority) =
        super::http_filter::ratelimit::service_cluster(p.rate_limit_service.as_ref())?;
    let timeout = match &p.timeout {
        Some(d) => super::cluster::duration(d, "timeout")?,
        None => Duration::from_millis(20),
    };
    Ok(NetworkRateLimitService {
        stat_prefix,
        domain: p.domain.clone(),
        descriptors,
        timeout,
        failure_mode_deny: p.failure_mode_deny,
        cluster,
        authority,
    })
}

/// One of a network `RateLimit`'s descriptors: its entries, values compiled as access-log
/// format strings (as Envoy's substitution formatter reads them).
fn descriptor(
    ctx: &Context<'_>,
    d: &proto::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor,
) -> Result<Vec<(String, Template)>, ConfigError> {
    if d.entries.is_empty() {
        return Err(ConfigError::new(
            "entries",
            "value must contain at least 1 item(s)",
        ));
    }
    for (set, field) in [
        (d.limit.is_some(), "limit"),
        (d.hits_addend.is_some(), "hits_addend"),
        (d.is_negative_hits, "is_negative_hits"),
    ] {
        if set {
            return Err(ConfigError::unimplemented(field, field));
        }
    }
    d.entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let at = format!("entries[{i}]");
            if e.key.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.key"),
                    "value length must be at least 1 characters",
                ));
            }
            if e.value.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.value"),
                    "value length must be at least 1 characters",
                ));
            }
            let value = Template::parse(&e.value, ctx)
                .map_err(|m| ConfigError::new(format!("{at}.value"), m))?;
            Ok((e.key.clone(), value))
        })
        .collect()
}

/// Compiles a listener `LocalRateLimit`; errors name fields relative to the message.
pub fn compile_listener_rate_limit(
    p: &ListenerLocalRateLimit,
) -> Result<ListenerRateLimit, ConfigError> {
    Ok(ListenerRateLimit {
        stat_prefix: stat_prefix(&p.stat_prefix)?,
        bucket: compile_token_bucket(p.token_bucket.as_ref(), "token_bucket")?,
        enabled: feature_flag(p.runtime_enabled.as_ref(), "runtime_enabled")?,
    })
}

fn stat_prefix(s: &str) -> Result<String, ConfigError> {
    if s.is_empty() {
        return Err(ConfigError::new(
            "stat_prefix",
            "value length must be at least 1 characters",
        ));
    }
    Ok(s.to_owned())
}

/// A `RuntimeFeatureFlag` (on when unset, as in Envoy); its key and default are required.
fn feature_flag(flag: Option<&RuntimeFeatureFlag>, path: &str) -> Result<RuntimeFlag, ConfigError> {
    let Some(flag) = flag else {
        return Ok(RuntimeFlag::on());
    };
    if flag.runtime_key.is_empty() {
        return Err(ConfigError::new(
            format!("{path}.runtime_key"),
            "value length must be at least 1 characters",
        ));
    }
    let default = flag
        .default_value
        .map(|b| b.value)
        .ok_or_else(|| ConfigError::new(format!("{path}.default_value"), "value is required"))?;
    Ok(RuntimeFlag {
        key: flag.runtime_key.clone(),
        default,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode<T: prost::Message + prost::Name + Default>(yaml: &str) -> T {
        let codec = proto::Codec::new();
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        codec.decode::<T>(value, false).unwrap().message
    }

    #[test]
    fn rate_limit_compiles_with_its_flag_and_share_key() {
        let p: LocalRateLimit = decode(
            "{stat_prefix: s, share_key: k, token_bucket: {max_tokens: 2, fill_interval: 3600s}, \
             runtime_enabled: {runtime_key: rk, default_value: false}}",
        );
        let c = compile_rate_limit(&p).unwrap();
        assert_eq!(c.bucket.max_tokens, 2);
        assert_eq!(c.share_key, "k");
        assert_eq!(
            c.enabled,
            RuntimeFlag {
                key: "rk".into(),
                default: false
            }
        );
        let p: LocalRateLimit = decode("{stat_prefix: s}");
        assert_eq!(compile_rate_limit(&p).unwrap_err().path, "token_bucket");
        let p: LocalRateLimit = decode("{token_bucket: {max_tokens: 2, fill_interval: 1s}}");
        assert_eq!(compile_rate_limit(&p).unwrap_err().path, "stat_prefix");
    }

    #[test]
    fn rate_limit_service_reads_its_descriptors_and_service() {
        let io = crate::config::FakeIo::new();
        let ctx = Context::new(&io);
        let service = "rate_limit_service: {transport_api_version: V3, \
                       grpc_service: {envoy_grpc: {cluster_name: rls}}}";
        let p: RateLimit = decode(&format!(
            "{{stat_prefix: 'n', domain: d, descriptors: [{{entries: [{{key: k, value: v}}, \
             {{key: k2, value: v2}}]}}], failure_mode_deny: true, {service}}}"
        ));
        let c = compile_rate_limit_service(&ctx, &p).unwrap();
        let keys: Vec<&str> = c.descriptors[0].iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["k", "k2"]);
        assert_eq!(c.timeout, Duration::from_millis(20));
        assert_eq!((c.cluster.as_str(), c.authority.as_str()), ("rls", "rls"));
        assert!(c.failure_mode_deny);
        for (yaml, path) in [
            (
                format!(
                    "{{domain: d, descriptors: [{{entries: [{{key: k, value: v}}]}}], {service}}}"
                ),
                "stat_prefix",
            ),
            (
                format!("{{stat_prefix: 'n', domain: d, {service}}}"),
                "descriptors",
            ),
            (
                format!(
                    "{{stat_prefix: 'n', domain: d, descriptors: [{{entries: []}}], {service}}}"
                ),
                "descriptors[0].entries",
            ),
            (
                format!(
                    "{{stat_prefix: 'n', domain: d, descriptors: [{{entries: [{{key: k, value: \"%NO_SUCH_COMMAND%\"}}]}}], {service}}}"
                ),
                "descriptors[0].entries[0].value",
            ),
            (
                format!(
                    "{{stat_prefix: 'n', domain: d, descriptors: [{{entries: [{{key: k, value: v}}], limit: {{requests_per_unit: 1, unit: SECOND}}}}], {service}}}"
                ),
                "descriptors[0].limit",
            ),
            (
                "{stat_prefix: 'n', domain: d, descriptors: [{entries: [{key: k, value: v}]}]}"
                    .to_owned(),
                "rate_limit_service",
            ),
            (
                format!(
                    "{{stat_prefix: 'n', descriptors: [{{entries: [{{key: k, value: v}}]}}], {service}}}"
                ),
                "domain",
            ),
        ] {
            let p: RateLimit = decode(&yaml);
            assert_eq!(
                compile_rate_limit_service(&ctx, &p).unwrap_err().path,
                path,
                "{yaml}"
            );
        }
    }

    #[test]
    fn listener_rate_limit_needs_a_prefix_and_a_bucket() {
        let p: ListenerLocalRateLimit =
            decode("{stat_prefix: l, token_bucket: {max_tokens: 3, fill_interval: 60s}}");
        let c = compile_listener_rate_limit(&p).unwrap();
        assert_eq!(
            (c.stat_prefix.as_str(), c.bucket.max_tokens, c.enabled),
            ("l", 3, RuntimeFlag::on())
        );
        let p: ListenerLocalRateLimit = decode("{stat_prefix: l}");
        assert_eq!(
            compile_listener_rate_limit(&p).unwrap_err().path,
            "token_bucket"
        );
        let p: ListenerLocalRateLimit =
            decode("{token_bucket: {max_tokens: 3, fill_interval: 60s}}");
        assert_eq!(
            compile_listener_rate_limit(&p).unwrap_err().path,
            "stat_prefix"
        );
    }

    #[test]
    fn connection_limit_requires_a_limit_and_reads_its_delay() {
        let p: ConnectionLimit = decode("{stat_prefix: c, max_connections: 2, delay: 0.25s}");
        let c = compile_connection_limit(&p).unwrap();
        assert_eq!(c.max_connections, 2);
        assert_eq!(c.delay, Some(Duration::from_millis(250)));
        assert_eq!(c.enabled, RuntimeFlag::on());
        let p: ConnectionLimit = decode("{stat_prefix: c, max_connections: 2, delay: 0s}");
        assert_eq!(compile_connection_limit(&p).unwrap().delay, None);
        let p: ConnectionLimit = decode("{stat_prefix: c}");
        assert_eq!(
            compile_connection_limit(&p).unwrap_err().path,
            "max_connections"
        );
        let p: ConnectionLimit =
            decode("{stat_prefix: c, max_connections: 1, runtime_enabled: {runtime_key: k}}");
        assert_eq!(
            compile_connection_limit(&p).unwrap_err().path,
            "runtime_enabled.default_value"
        );
    }
}
