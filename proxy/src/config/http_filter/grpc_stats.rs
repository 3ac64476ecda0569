//! `envoy.filters.http.grpc_stats` (`FilterConfig`): which gRPC calls get per-method stats.

use std::collections::HashSet;

use proto::pb::envoy::extensions::filters::http::grpc_stats::v3::{
    FilterConfig, filter_config::PerMethodStatSpecifier,
};

use crate::config::ConfigError;

/// The compiled filter.
#[derive(Debug, Clone)]
pub struct GrpcStatsConfig {
    /// Which calls are counted under their own `<service>.<method>` names.
    pub methods: PerMethod,
    /// `enable_upstream_stats`: record `upstream_rq_time` per call.
    pub upstream_stats: bool,
    /// `replace_dots_in_grpc_service_name` (with every method counted): dots in service names
    /// become underscores.
    pub replace_dots: bool,
    /// `emit_filter_state`: a call's message counts are left for the filters after it (what
    /// Istio's `istio.stats` reads for `istio_request_messages_total` and the response's).
    pub emit_filter_state: bool,
}

/// Which calls get stats named after their service and method; the others are counted under
/// `cluster.<cluster>.grpc.` alone.
#[derive(Debug, Clone)]
pub enum PerMethod {
    /// `stats_for_all_methods: true`.
    All,
    /// `individual_method_stats_allowlist` (empty when neither option is set, or
    /// `stats_for_all_methods` is false): `(service, method)` pairs.
    Allowlist(HashSet<(String, String)>),
}

/// Compiles a `FilterConfig`.
pub fn compile(c: &FilterConfig) -> Result<GrpcStatsConfig, ConfigError> {
    let methods = match &c.per_method_stat_specifier {
        Some(PerMethodStatSpecifier::StatsForAllMethods(all)) if all.value => PerMethod::All,
        Some(PerMethodStatSpecifier::IndividualMethodStatsAllowlist(list)) => PerMethod::Allowlist(
            list.services
                .iter()
                .flat_map(|s| s.method_names.iter().map(|m| (s.name.clone(), m.clone())))
                .collect(),
        ),
        _ => PerMethod::Allowlist(HashSet::new()),
    };
    Ok(GrpcStatsConfig {
        methods,
        upstream_stats: c.enable_upstream_stats,
        replace_dots: c.replace_dots_in_grpc_service_name,
        emit_filter_state: c.emit_filter_state,
    })
}
