//! The network filters that limit connections: `envoy.filters.network.local_ratelimit`
//! (`LocalRateLimit`) and `envoy.filters.network.connection_limit` (`ConnectionLimit`) ->
//! [`NetworkLimit`].

use std::time::Duration;

use proto::pb::envoy::config::core::v3::RuntimeFeatureFlag;
use proto::pb::envoy::extensions::filters::network::connection_limit::v3::ConnectionLimit;
use proto::pb::envoy::extensions::filters::network::local_ratelimit::v3::LocalRateLimit;

use super::ConfigError;
use super::token_bucket::{TokenBucketSpec, compile_token_bucket};

/// Type name of the network `LocalRateLimit` filter's config.
pub const LOCAL_RATE_LIMIT: &str =
    "envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit";
/// Type name of the `ConnectionLimit` filter's config.
pub const CONNECTION_LIMIT: &str =
    "envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit";

/// A network filter that may close a new connection before the chain's terminal filter sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkLimit {
    /// `envoy.filters.network.local_ratelimit`.
    RateLimit(NetworkRateLimit),
    /// `envoy.filters.network.connection_limit`.
    ConnectionLimit(ConnectionLimitConfig),
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
    /// `runtime_enabled`'s default (revoy has no runtime; true when unset).
    pub enabled: bool,
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
    /// `runtime_enabled`'s default (revoy has no runtime; true when unset).
    pub enabled: bool,
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

fn stat_prefix(s: &str) -> Result<String, ConfigError> {
    if s.is_empty() {
        return Err(ConfigError::new(
            "stat_prefix",
            "value length must be at least 1 characters",
        ));
    }
    Ok(s.to_owned())
}

/// A `RuntimeFeatureFlag`'s default value (true when the flag is unset, as in Envoy).
fn feature_flag(flag: Option<&RuntimeFeatureFlag>, path: &str) -> Result<bool, ConfigError> {
    let Some(flag) = flag else {
        return Ok(true);
    };
    if flag.runtime_key.is_empty() {
        return Err(ConfigError::new(
            format!("{path}.runtime_key"),
            "value length must be at least 1 characters",
        ));
    }
    flag.default_value
        .map(|b| b.value)
        .ok_or_else(|| ConfigError::new(format!("{path}.default_value"), "value is required"))
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
        assert!(!c.enabled);
        let p: LocalRateLimit = decode("{stat_prefix: s}");
        assert_eq!(compile_rate_limit(&p).unwrap_err().path, "token_bucket");
        let p: LocalRateLimit = decode("{token_bucket: {max_tokens: 2, fill_interval: 1s}}");
        assert_eq!(compile_rate_limit(&p).unwrap_err().path, "stat_prefix");
    }

    #[test]
    fn connection_limit_requires_a_limit_and_reads_its_delay() {
        let p: ConnectionLimit = decode("{stat_prefix: c, max_connections: 2, delay: 0.25s}");
        let c = compile_connection_limit(&p).unwrap();
        assert_eq!(c.max_connections, 2);
        assert_eq!(c.delay, Some(Duration::from_millis(250)));
        assert!(c.enabled);
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
