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
    /// least this share of healthy hosts.
    pub min_healthy: Vec<(String, f64)>,
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
    let mut min_healthy: Vec<(String, f64)> = h
        .cluster_min_healthy_percentages
        .iter()
        .map(|(name, p)| (name.clone(), p.value))
        .collect();
    min_healthy.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(HealthCheckConfig {
        pass_through,
        cache_time: cache_time.filter(|_| pass_through),
        min_healthy,
        headers: header_matchers(ctx, &h.headers)?,
    })
}
