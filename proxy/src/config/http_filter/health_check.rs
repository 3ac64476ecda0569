//! `envoy.filters.http.health_check` (`HealthCheck`) -> [`HealthCheckConfig`].

use std::time::Duration;

use proto::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;

use crate::config::route::matchers::header_matchers;
use crate::config::{ConfigError, Context};
use crate::route::matcher::HeaderMatcher;

/// How the proxy answers health checks.
#[derive(Debug, Clone)]
pub struct HealthCheckConfig {
    /// `pass_through_mode`: health checks go upstream (unless the proxy fails them or a
    /// cached answer is fresh).
    pub pass_through: bool,
    /// `cache_time` (pass-through only): how long an upstream answer is reused.
    pub cache_time: Option<Duration>,
    /// `cluster_min_healthy_percentages`: the proxy answers 503 unless each cluster has at
    /// least this share of healthy hosts, in whole percents (Envoy truncates 12.5 to 12).
    pub min_healthy: Vec<(String, u64)>,
    /// `headers`: what makes a request a health check.
    pub headers: Vec<HeaderMatcher>,
}

/// Compiles a `HealthCheck`.
pub fn compile(ctx: &Context<'_>, h: &HealthCheck) -> Result<HealthCheckConfig, ConfigError> {
    let pass_through = h
        .pass_through_mode
        .ok_or_else(|| ConfigError::new("pass_through_mode", "value is required"))?
        .value;
    let cache_time = crate::config::route::nonzero(h.cache_time.as_ref());
    if cache_time.is_some() && !pass_through {
        return Err(ConfigError::new(
            "cache_time",
            "must not be set when pass_through_mode is false (as Envoy)",
        ));
    }
    let mut min_healthy: Vec<(String, u64)> = h
        .cluster_min_healthy_percentages
        .iter()
        .map(|(name, p)| (name.clone(), p.value as u64))
        .collect();
    min_healthy.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(HealthCheckConfig {
        pass_through,
        cache_time,
        min_healthy,
        headers: header_matchers(ctx, &h.headers)?,
    })
}

#[cfg(test)]
mod tests {
    use proto::pb::envoy::r#type::v3::Percent;
    use proto::pb::google::protobuf::{BoolValue, Duration as PbDuration};

    use super::*;
    use crate::config::FakeIo;

    #[test]
    fn cache_time_needs_pass_through_and_percentages_truncate() {
        let io = FakeIo::new();
        let ctx = Context::new(&io);
        let mut h = HealthCheck {
            pass_through_mode: Some(BoolValue { value: false }),
            cache_time: Some(PbDuration {
                seconds: 5,
                nanos: 0,
            }),
            ..Default::default()
        };
        let e = compile(&ctx, &h).unwrap_err();
        assert_eq!(e.path, "cache_time");
        h.pass_through_mode = Some(BoolValue { value: true });
        h.cluster_min_healthy_percentages
            .insert("up".into(), Percent { value: 12.5 });
        let c = compile(&ctx, &h).unwrap();
        assert_eq!(c.cache_time, Some(Duration::from_secs(5)));
        assert_eq!(c.min_healthy, [("up".to_owned(), 12)]);
    }
}
