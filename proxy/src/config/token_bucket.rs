//! `envoy.type.v3.TokenBucket` -> [`TokenBucketSpec`], with the rules Envoy's local rate
//! limiters add to the proto's own (a fill interval of at least 50 ms).

use std::time::Duration;

use proto::pb::envoy::r#type::v3::TokenBucket;

use super::ConfigError;
pub use crate::limits::TokenBucketSpec;

/// The shortest fill interval Envoy's local rate limiters accept.
const MIN_FILL_INTERVAL: Duration = Duration::from_millis(50);

/// Compiles a required `token_bucket` field (`path` names it); errors name its fields.
pub fn compile_token_bucket(
    bucket: Option<&TokenBucket>,
    path: &str,
) -> Result<TokenBucketSpec, ConfigError> {
    let bucket = bucket.ok_or_else(|| ConfigError::new(path, "value is required"))?;
    if bucket.max_tokens == 0 {
        return Err(ConfigError::new(
            format!("{path}.max_tokens"),
            "value must be greater than 0",
        ));
    }
    let tokens_per_fill = match bucket.tokens_per_fill {
        None => 1,
        Some(w) if w.value == 0 => {
            return Err(ConfigError::new(
                format!("{path}.tokens_per_fill"),
                "value must be greater than 0",
            ));
        }
        Some(w) => w.value,
    };
    let at = format!("{path}.fill_interval");
    let interval = bucket
        .fill_interval
        .as_ref()
        .ok_or_else(|| ConfigError::new(&at, "value is required"))?;
    if interval.seconds < 0 || interval.nanos < 0 || interval.nanos >= 1_000_000_000 {
        return Err(ConfigError::new(at, "invalid duration"));
    }
    let whole = Duration::new(interval.seconds as u64, interval.nanos as u32);
    if whole.is_zero() {
        return Err(ConfigError::new(at, "value must be greater than 0s"));
    }
    let fill_interval = Duration::from_millis(whole.as_millis().try_into().unwrap_or(u64::MAX));
    if fill_interval < MIN_FILL_INTERVAL {
        return Err(ConfigError::new(
            at,
            "local rate limit token bucket fill timer must be >= 50ms",
        ));
    }
    Ok(TokenBucketSpec {
        max_tokens: bucket.max_tokens,
        tokens_per_fill,
        fill_interval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

    fn bucket(max: u32, per_fill: Option<u32>, ms: i64) -> TokenBucket {
        TokenBucket {
            max_tokens: max,
            tokens_per_fill: per_fill.map(|value| UInt32Value { value }),
            fill_interval: Some(PbDuration {
                seconds: ms / 1000,
                nanos: ((ms % 1000) * 1_000_000) as i32,
            }),
        }
    }

    #[test]
    fn defaults_and_bounds() {
        let spec = compile_token_bucket(Some(&bucket(3, None, 60_000)), "tb").unwrap();
        assert_eq!(
            spec,
            TokenBucketSpec {
                max_tokens: 3,
                tokens_per_fill: 1,
                fill_interval: Duration::from_secs(60)
            }
        );
        let error = |b: Option<TokenBucket>| compile_token_bucket(b.as_ref(), "tb").unwrap_err();
        assert_eq!(error(None).path, "tb");
        assert_eq!(error(Some(bucket(0, None, 1000))).path, "tb.max_tokens");
        assert_eq!(
            error(Some(bucket(1, Some(0), 1000))).path,
            "tb.tokens_per_fill"
        );
        let short = error(Some(bucket(1, None, 49)));
        assert_eq!(short.path, "tb.fill_interval");
        assert!(short.message.contains(">= 50ms"), "{short}");
        assert!(compile_token_bucket(Some(&bucket(1, None, 50)), "tb").is_ok());
        let mut unset = bucket(1, None, 1000);
        unset.fill_interval = None;
        assert_eq!(error(Some(unset)).message, "value is required");
    }
}
