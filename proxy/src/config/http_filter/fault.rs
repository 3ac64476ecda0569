//! `envoy.filters.http.fault` (`HTTPFault`) -> [`FaultConfig`], with the names of the runtime
//! keys that override its percentages, statuses, delay and limit (read per request).

use std::time::Duration;

use proto::pb::envoy::extensions::filters::common::fault::v3::fault_delay::FaultDelaySecifier;
use proto::pb::envoy::extensions::filters::http::fault::v3::{HttpFault, fault_abort::ErrorType};

use crate::config::route::matchers::{fractional, header_matchers};
use crate::config::{ConfigError, Context};
use crate::route::matcher::{FractionalPercent, HeaderMatcher};

/// One fault configuration (filter-level, or a route's replacing it).
#[derive(Debug, Clone)]
pub struct FaultConfig {
    /// `delay`.
    pub delay: Option<Delay>,
    /// `abort`.
    pub abort: Option<Abort>,
    /// `upstream_cluster`: faults apply only to requests routed to it (empty: any).
    pub upstream_cluster: String,
    /// `headers`: faults apply only to requests matching all of them.
    pub headers: Vec<HeaderMatcher>,
    /// `downstream_nodes`: faults apply only to requests whose
    /// `x-envoy-downstream-service-node` is one of them (empty: any).
    pub downstream_nodes: Vec<String>,
    /// `max_active_faults` (`None`: unlimited).
    pub max_active_faults: Option<u64>,
    /// `disable_downstream_cluster_stats`: no stats per `x-envoy-downstream-service-cluster`.
    pub disable_downstream_cluster_stats: bool,
    /// The runtime keys that override the values above, read per request.
    pub keys: FaultKeys,
}

/// The runtime keys of a fault configuration (the `*_runtime` fields, else Envoy's defaults).
#[derive(Debug, Clone)]
pub struct FaultKeys {
    /// The delay's percentage (`fault.http.delay.fixed_delay_percent`).
    pub delay_percent: String,
    /// The delay's duration in ms (`fault.http.delay.fixed_duration_ms`).
    pub delay_duration: String,
    /// The abort's percentage (`fault.http.abort.abort_percent`).
    pub abort_percent: String,
    /// The abort's HTTP status (`fault.http.abort.http_status`).
    pub abort_http_status: String,
    /// The abort's gRPC status (`fault.http.abort.grpc_status`).
    pub abort_grpc_status: String,
    /// `max_active_faults` (`fault.http.max_active_faults`).
    pub max_active_faults: String,
}

/// A delay to inject.
#[derive(Debug, Clone)]
pub struct Delay {
    /// How long: fixed, or from the request's `x-envoy-fault-delay-request` header.
    pub duration: DelaySource,
    /// On what share of requests.
    pub percentage: FractionalPercent,
}

/// Where a delay's duration comes from.
#[derive(Debug, Clone, Copy)]
pub enum DelaySource {
    /// `fixed_delay`.
    Fixed(Duration),
    /// `header_delay`: the request's header, in ms.
    Header,
}

/// An abort to inject.
#[derive(Debug, Clone)]
pub struct Abort {
    /// What the abort answers.
    pub error: AbortError,
    /// On what share of requests.
    pub percentage: FractionalPercent,
}

/// What an abort answers.
#[derive(Debug, Clone, Copy)]
pub enum AbortError {
    /// `http_status`.
    Http(u16),
    /// `grpc_status`.
    Grpc(u32),
    /// `header_abort`: the request's `x-envoy-fault-abort-request` (HTTP) or
    /// `x-envoy-fault-abort-grpc-request` (gRPC) header.
    Header,
}

/// `name`, or `default` when it is empty (the `*_runtime` fields name the keys).
fn key(name: &str, default: &str) -> String {
    if name.is_empty() { default } else { name }.to_owned()
}

/// Compiles an `HTTPFault`.
pub fn compile(ctx: &Context<'_>, f: &HttpFault) -> Result<FaultConfig, ConfigError> {
    if f.response_rate_limit.is_some() {
        return Err(ConfigError::new(
            "response_rate_limit",
            "response rate limiting faults are not implemented by revoy",
        ));
    }
    let delay = f
        .delay
        .as_ref()
        .map(|d| {
            let duration = match &d.fault_delay_secifier {
                Some(FaultDelaySecifier::FixedDelay(t)) => {
                    DelaySource::Fixed(crate::config::route::duration(t))
                }
                Some(FaultDelaySecifier::HeaderDelay(_)) => DelaySource::Header,
                None => {
                    return Err(ConfigError::new(
                        "delay.fault_delay_secifier",
                        "one of fixed_delay, header_delay is required",
                    ));
                }
            };
            Ok(Delay {
                duration,
                percentage: d.percentage.as_ref().map_or(NONE, fractional),
            })
        })
        .transpose()?;
    let abort = f
        .abort
        .as_ref()
        .map(|a| {
            let error = match a.error_type {
                Some(ErrorType::HttpStatus(s)) if (200..600).contains(&s) => {
                    AbortError::Http(s as u16)
                }
                Some(ErrorType::HttpStatus(s)) => {
                    return Err(ConfigError::new(
                        "abort.http_status",
                        format!("value must be inside range [200, 600), got {s}"),
                    ));
                }
                Some(ErrorType::GrpcStatus(s)) => AbortError::Grpc(s),
                Some(ErrorType::HeaderAbort(_)) => AbortError::Header,
                None => {
                    return Err(ConfigError::new(
                        "abort.error_type",
                        "one of http_status, grpc_status, header_abort is required",
                    ));
                }
            };
            Ok(Abort {
                error,
                percentage: a.percentage.as_ref().map_or(NONE, fractional),
            })
        })
        .transpose()?;
    Ok(FaultConfig {
        delay,
        abort,
        upstream_cluster: f.upstream_cluster.clone(),
        headers: header_matchers(ctx, &f.headers)?,
        downstream_nodes: f.downstream_nodes.clone(),
        max_active_faults: f.max_active_faults.map(|v| u64::from(v.value)),
        disable_downstream_cluster_stats: f.disable_downstream_cluster_stats,
        keys: FaultKeys {
            delay_percent: key(
                &f.delay_percent_runtime,
                "fault.http.delay.fixed_delay_percent",
            ),
            delay_duration: key(
                &f.delay_duration_runtime,
                "fault.http.delay.fixed_duration_ms",
            ),
            abort_percent: key(&f.abort_percent_runtime, "fault.http.abort.abort_percent"),
            abort_http_status: key(&f.abort_http_status_runtime, "fault.http.abort.http_status"),
            abort_grpc_status: key(&f.abort_grpc_status_runtime, "fault.http.abort.grpc_status"),
            max_active_faults: key(&f.max_active_faults_runtime, "fault.http.max_active_faults"),
        },
    })
}

/// An unset percentage: the fault never applies (the proto's zero numerator).
const NONE: FractionalPercent = FractionalPercent {
    numerator: 0,
    denominator: 100,
};
