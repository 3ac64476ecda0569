//! Tracing settings: the connection manager's `tracing` block and `request_id_extension`,
//! a route's `decorator` and `tracing`, the bootstrap's server-wide tracer (the deprecated
//! `tracing.http` Envoy still falls back to) and the runtime keys that tune span flushing.

use std::sync::Arc;
use std::time::Duration;

use proto::pb::envoy::config::core::v3::grpc_service::TargetSpecifier;
use proto::pb::envoy::config::route::v3 as route_pb;
use proto::pb::envoy::config::trace::v3::{
    OpenTelemetryConfig, ZipkinConfig, tracing::Http as HttpTracer, tracing::http::ConfigType,
};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing as HcmTracingProto;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::RequestIdExtension;
use proto::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
use proto::pb::envoy::r#type::tracing::v3::{CustomTag as CustomTagProto, custom_tag};
use proto::pb::envoy::r#type::v3::{FractionalPercent, Percent};

use super::{ConfigError, Context, Warnings};
use crate::route::format::Machine;
use crate::route::tracing::{CustomTag, Fraction, RouteTracing, Sampling, TagValue};

/// `envoy.tracers.opentelemetry`: OTLP over gRPC to a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelProvider {
    /// `grpc_service.envoy_grpc.cluster_name`.
    pub cluster: String,
    /// `grpc_service.envoy_grpc.authority` (the cluster name when empty).
    pub authority: String,
    /// `service_name` (the resource's `service.name`).
    pub service_name: String,
    /// `grpc_service.timeout` of one export call.
    pub timeout: Option<Duration>,
}

/// `envoy.tracers.zipkin`: Zipkin v2 JSON over HTTP to a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipkinProvider {
    /// `collector_cluster`.
    pub cluster: String,
    /// `collector_endpoint`, the path spans are posted to.
    pub endpoint: String,
    /// `collector_hostname` (the cluster name when empty).
    pub hostname: String,
    /// `trace_id_128bit`: new traces get 128-bit ids.
    pub trace_id_128bit: bool,
    /// `shared_span_context` (default true): a server span joining a B3 context keeps the
    /// client's span id.
    pub shared_span_context: bool,
}

/// A tracer (`provider`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// OpenTelemetry.
    OpenTelemetry(OtelProvider),
    /// Zipkin.
    Zipkin(ZipkinProvider),
}

/// A connection manager's compiled `tracing` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcmTracing {
    /// The listener's `traffic_direction` is OUTBOUND: spans are `egress <host>` and CLIENT.
    pub egress: bool,
    /// Sampling rates (a route's `tracing` replaces them).
    pub sampling: Sampling,
    /// `custom_tags`.
    pub custom_tags: Vec<CustomTag>,
    /// `max_path_tag_length` (default 256): `http.url` is cut to this length.
    pub max_path_tag_length: usize,
    /// `spawn_upstream_span`: a CLIENT span per upstream request, child of the request's.
    pub spawn_upstream_span: bool,
    /// `provider`; `None`: the bootstrap's server-wide tracer, if any.
    pub provider: Option<Arc<Provider>>,
}

/// `request_id_extension` (`envoy.request_id.uuid`, the only one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestIdConfig {
    /// `pack_trace_reason` (default true): the trace decision is written into the UUID.
    pub pack_trace_reason: bool,
    /// `use_request_id_for_trace_sampling` (default true): sampling draws from the UUID.
    pub use_for_sampling: bool,
}

impl Default for RequestIdConfig {
    fn default() -> Self {
        RequestIdConfig {
            pack_trace_reason: true,
            use_for_sampling: true,
        }
    }
}

/// How spans are batched (Envoy's runtime keys, from the bootstrap's static layers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flush {
    /// `tracing.<tracer>.min_flush_spans` (default 5): spans that trigger an export.
    pub min_spans: usize,
    /// `tracing.<tracer>.flush_interval_ms` (default 5 s): the export timer.
    pub interval: Duration,
}

/// The flush settings of each tracer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushSettings {
    /// OpenTelemetry's.
    pub opentelemetry: Flush,
    /// Zipkin's.
    pub zipkin: Flush,
}

impl Default for FlushSettings {
    fn default() -> Self {
        let envoy = Flush {
            min_spans: 5,
            interval: Duration::from_secs(5),
        };
        FlushSettings {
            opentelemetry: envoy,
            zipkin: envoy,
        }
    }
}

impl FlushSettings {
    /// Reads the keys from the static layers of `layered_runtime` (a later layer wins).
    pub fn from_runtime(
        runtime: Option<&proto::pb::envoy::config::bootstrap::v3::LayeredRuntime>,
    ) -> FlushSettings {
        use proto::pb::envoy::config::bootstrap::v3::runtime_layer::LayerSpecifier;
        use proto::pb::google::protobuf::value::Kind;
        let mut out = FlushSettings::default();
        let layers = runtime.map(|r| r.layers.as_slice()).unwrap_or_default();
        for layer in layers {
            let Some(LayerSpecifier::StaticLayer(s)) = &layer.layer_specifier else {
                continue;
            };
            for (key, value) in &s.fields {
                let Some(Kind::NumberValue(n)) = value.kind else {
                    continue;
                };
                let n = n.max(0.0) as u64;
                match key.as_str() {
                    "tracing.opentelemetry.min_flush_spans" => {
                        out.opentelemetry.min_spans = n as usize
                    }
                    "tracing.opentelemetry.flush_interval_ms" => {
                        out.opentelemetry.interval = Duration::from_millis(n)
                    }
                    "tracing.zipkin.min_flush_spans" => out.zipkin.min_spans = n as usize,
                    "tracing.zipkin.flush_interval_ms" => {
                        out.zipkin.interval = Duration::from_millis(n)
                    }
                    _ => {}
                }
            }
        }
        out
    }
}

/// A connection manager's `Percent`, kept in ten-thousandths as Envoy rounds it.
fn fraction_of_percent(p: Option<&Percent>, path: &str) -> Result<Fraction, ConfigError> {
    let Some(p) = p else {
        return Ok(Fraction {
            numerator: 10_000,
            denominator: 10_000,
        });
    };
    if !(0.0..=100.0).contains(&p.value) {
        return Err(ConfigError::new(
            format!("{path}.value"),
            "value must be inside range [0, 100]",
        ));
    }
    Ok(Fraction {
        numerator: (p.value * 100.0).round() as u32,
        denominator: 10_000,
    })
}

/// A route's `FractionalPercent` (100 % when unset).
fn fraction_of_fractional(p: Option<&FractionalPercent>) -> Fraction {
    let Some(p) = p else { return Fraction::ALL };
    let denominator = match p.denominator {
        1 => 10_000,
        2 => 1_000_000,
        _ => 100,
    };
    Fraction {
        numerator: p.numerator.min(denominator),
        denominator,
    }
}

/// Warns of each metadata tag in the `custom_tags` at `path`: revoy keeps no metadata to read
/// it from, so [`custom_tags`] leaves it out of spans.
pub fn skip_metadata_tags(tags: &[CustomTagProto], path: &str, warnings: &mut Warnings) {
    for (i, tag) in tags.iter().enumerate() {
        if matches!(tag.r#type, Some(custom_tag::Type::Metadata(_))) {
            warnings.skipped(
                format!("{path}[{i}].metadata"),
                format!(
                    "metadata custom tags are not implemented by revoy; spans carry no '{}' tag",
                    tag.tag
                ),
            );
        }
    }
}

/// `custom_tags`; an `environment` tag is read now, as Envoy reads it when it loads the config.
/// A metadata tag is left out ([`skip_metadata_tags`] warns of it).
pub fn custom_tags(
    ctx: &Context<'_>,
    tags: &[CustomTagProto],
    path: &str,
) -> Result<Vec<CustomTag>, ConfigError> {
    let mut out = Vec::with_capacity(tags.len());
    for (i, t) in tags.iter().enumerate() {
        let at = format!("{path}[{i}]");
        if t.tag.is_empty() {
            return Err(ConfigError::new(
                format!("{at}.tag"),
                "value length must be at least 1 characters",
            ));
        }
        let value = match &t.r#type {
            Some(custom_tag::Type::Literal(l)) => TagValue::Literal(l.value.clone()),
            Some(custom_tag::Type::Environment(e)) => {
                TagValue::Literal(ctx.env(&e.name).unwrap_or_else(|| e.default_value.clone()))
            }
            Some(custom_tag::Type::RequestHeader(h)) => TagValue::RequestHeader {
                name: http::HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| {
                    ConfigError::new(
                        format!("{at}.request_header.name"),
                        format!("invalid header name '{}'", h.name),
                    )
                })?,
                default: h.default_value.clone(),
            },
            // Istio sets such tags on every listener.
            Some(custom_tag::Type::Metadata(_)) => continue,
            Some(_) => {
                return Err(ConfigError::new(
                    format!("{at}.value"),
                    "formatted custom tags are not supported by revoy",
                ));
            }
            None => {
                return Err(ConfigError::new(at, "a custom tag needs a type"));
            }
        };
        out.push(CustomTag {
            tag: t.tag.clone(),
            value,
        });
    }
    Ok(out)
}

/// A connection manager's `tracing` block; `egress` from its listener's direction.
pub fn compile_hcm_tracing(
    ctx: &Context<'_>,
    t: &HcmTracingProto,
    egress: bool,
) -> Result<HcmTracing, ConfigError> {
    if !t.operation.is_empty() {
        return Err(ConfigError::new(
            "operation",
            "formatted span operation names are not supported by revoy",
        ));
    }
    if t.verbose {
        return Err(ConfigError::new(
            "verbose",
            "verbose tracing (timing events on spans) is not supported by revoy",
        ));
    }
    if !t.upstream_operation.is_empty() {
        return Err(ConfigError::new(
            "upstream_operation",
            "formatted span operation names are not supported by revoy",
        ));
    }
    Ok(HcmTracing {
        egress,
        sampling: Sampling {
            client: fraction_of_percent(t.client_sampling.as_ref(), "client_sampling")?,
            random: fraction_of_percent(t.random_sampling.as_ref(), "random_sampling")?,
            overall: fraction_of_percent(t.overall_sampling.as_ref(), "overall_sampling")?,
        },
        custom_tags: custom_tags(ctx, &t.custom_tags, "custom_tags")?,
        max_path_tag_length: t.max_path_tag_length.map_or(256, |v| v.value as usize),
        spawn_upstream_span: t.spawn_upstream_span.is_some_and(|b| b.value),
        provider: t
            .provider
            .as_ref()
            .map(|p| compile_provider(p).map_err(|e| e.within("provider")))
            .transpose()?
            .map(Arc::new),
    })
}

/// `request_id_extension`.
pub fn compile_request_id(
    ext: Option<&RequestIdExtension>,
) -> Result<RequestIdConfig, ConfigError> {
    let Some(any) = ext.and_then(|e| e.typed_config.as_ref()) else {
        return Ok(RequestIdConfig::default());
    };
    let name = proto::type_name_of(&any.type_url);
    if name != "envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig" {
        return Err(ConfigError::new(
            "request_id_extension.typed_config",
            format!("request ID extension '{name}' is not supported by revoy"),
        ));
    }
    let c: UuidRequestIdConfig = proto::unpack(any)
        .map_err(|e| ConfigError::new("request_id_extension.typed_config", e.to_string()))?;
    Ok(RequestIdConfig {
        pack_trace_reason: c.pack_trace_reason.is_none_or(|b| b.value),
        use_for_sampling: c.use_request_id_for_trace_sampling.is_none_or(|b| b.value),
    })
}

/// A route's `decorator` and `tracing`; `None` when it has neither. Its metadata custom
/// tags are left out, each with a warning.
pub fn compile_route_tracing(
    ctx: &Context<'_>,
    decorator: Option<&route_pb::Decorator>,
    tracing: Option<&route_pb::Tracing>,
    warnings: &mut Warnings,
) -> Result<Option<RouteTracing>, ConfigError> {
    if decorator.is_none() && tracing.is_none() {
        return Ok(None);
    }
    if let Some(t) = tracing {
        skip_metadata_tags(&t.custom_tags, "tracing.custom_tags", warnings);
    }
    if let Some(d) = decorator
        && d.operation.is_empty()
    {
        return Err(ConfigError::new(
            "decorator.operation",
            "value length must be at least 1 characters",
        ));
    }
    Ok(Some(RouteTracing {
        operation: decorator.map(|d| d.operation.clone()),
        propagate: decorator.is_none_or(|d| d.propagate.is_none_or(|b| b.value)),
        sampling: tracing.map(|t| Sampling {
            client: fraction_of_fractional(t.client_sampling.as_ref()),
            random: fraction_of_fractional(t.random_sampling.as_ref()),
            overall: fraction_of_fractional(t.overall_sampling.as_ref()),
        }),
        custom_tags: match tracing {
            Some(t) => custom_tags(ctx, &t.custom_tags, "tracing.custom_tags")?,
            None => Vec::new(),
        },
    }))
}

/// The type of the tracer `p` names when revoy does not implement it (it implements
/// OpenTelemetry and Zipkin): such a tracer is skipped with a warning, as tracing has no
/// effect on traffic.
pub fn unimplemented_tracer(p: &HttpTracer) -> Option<&str> {
    let Some(ConfigType::TypedConfig(any)) = &p.config_type else {
        return None;
    };
    match proto::type_name_of(&any.type_url) {
        "envoy.config.trace.v3.OpenTelemetryConfig" | "envoy.config.trace.v3.ZipkinConfig" => None,
        other => Some(other),
    }
}

/// What the warning for a tracer [`unimplemented_tracer`] names says.
pub fn skipped_tracer(type_name: &str) -> String {
    format!(
        "tracer '{type_name}' is not implemented by revoy (OpenTelemetry and Zipkin are); no spans are sent"
    )
}

/// A `provider` (or the bootstrap's `tracing.http`).
pub fn compile_provider(p: &HttpTracer) -> Result<Provider, ConfigError> {
    let Some(ConfigType::TypedConfig(any)) = &p.config_type else {
        return Err(ConfigError::new(
            "typed_config",
            format!("tracer '{}' has no typed_config", p.name),
        ));
    };
    match proto::type_name_of(&any.type_url) {
        "envoy.config.trace.v3.OpenTelemetryConfig" => {
            let c: OpenTelemetryConfig =
                proto::unpack(any).map_err(|e| ConfigError::new("typed_config", e.to_string()))?;
            otel(&c).map_err(|e| e.within("typed_config"))
        }
        "envoy.config.trace.v3.ZipkinConfig" => {
            let c: ZipkinConfig =
                proto::unpack(any).map_err(|e| ConfigError::new("typed_config", e.to_string()))?;
            zipkin(&c).map_err(|e| e.within("typed_config"))
        }
        other => Err(ConfigError::new(
            "typed_config",
            format!("tracer '{other}' is not supported by revoy (OpenTelemetry and Zipkin are)"),
        )),
    }
}

fn otel(c: &OpenTelemetryConfig) -> Result<Provider, ConfigError> {
    let refuse = |field: &str, what: &str| {
        Err(ConfigError::new(
            field,
            format!("{what} is not supported by revoy"),
        ))
    };
    if c.http_service.is_some() {
        return refuse("http_service", "OTLP over HTTP");
    }
    if c.exporter.is_some() {
        return refuse("exporter", "a custom exporter");
    }
    if c.sampler.is_some() {
        return refuse("sampler", "an OpenTelemetry sampler");
    }
    if !c.resource_detectors.is_empty() {
        return refuse("resource_detectors", "resource detectors");
    }
    let Some(grpc) = &c.grpc_service else {
        return Err(ConfigError::new(
            "grpc_service",
            "an OpenTelemetry tracer needs a grpc_service",
        ));
    };
    let envoy_grpc = match &grpc.target_specifier {
        Some(TargetSpecifier::EnvoyGrpc(e)) => e,
        Some(TargetSpecifier::GoogleGrpc(_)) => {
            return refuse("grpc_service.google_grpc", "google_grpc");
        }
        None => {
            return Err(ConfigError::new(
                "grpc_service",
                "one of envoy_grpc, google_grpc is required",
            ));
        }
    };
    if envoy_grpc.cluster_name.is_empty() {
        return Err(ConfigError::new(
            "grpc_service.envoy_grpc.cluster_name",
            "value length must be at least 1 characters",
        ));
    }
    Ok(Provider::OpenTelemetry(OtelProvider {
        cluster: envoy_grpc.cluster_name.clone(),
        authority: if envoy_grpc.authority.is_empty() {
            envoy_grpc.cluster_name.clone()
        } else {
            envoy_grpc.authority.clone()
        },
        service_name: if c.service_name.is_empty() {
            "unknown_service:envoy".to_owned()
        } else {
            c.service_name.clone()
        },
        timeout: grpc
            .timeout
            .as_ref()
            .map(|d| Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
            .filter(|d| !d.is_zero()),
    }))
}

#[allow(deprecated)] // `split_spans_for_request` is refused, so it is read.
fn zipkin(c: &ZipkinConfig) -> Result<Provider, ConfigError> {
    if c.collector_endpoint_version != 1 {
        return Err(ConfigError::new(
            "collector_endpoint_version",
            "only HTTP_JSON is supported by revoy",
        ));
    }
    if c.split_spans_for_request {
        return Err(ConfigError::new(
            "split_spans_for_request",
            "split spans are not supported by revoy",
        ));
    }
    if c.trace_context_option != 0 {
        return Err(ConfigError::new(
            "trace_context_option",
            "W3C propagation for Zipkin is not supported by revoy",
        ));
    }
    if c.collector_cluster.is_empty() {
        return Err(ConfigError::new(
            "collector_cluster",
            "value length must be at least 1 characters",
        ));
    }
    if c.collector_endpoint.is_empty() {
        return Err(ConfigError::new(
            "collector_endpoint",
            "value length must be at least 1 characters",
        ));
    }
    Ok(Provider::Zipkin(ZipkinProvider {
        cluster: c.collector_cluster.clone(),
        endpoint: c.collector_endpoint.clone(),
        hostname: if c.collector_hostname.is_empty() {
            c.collector_cluster.clone()
        } else {
            c.collector_hostname.clone()
        },
        trace_id_128bit: c.trace_id_128bit,
        shared_span_context: c.shared_span_context.is_none_or(|b| b.value),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percents_round_to_ten_thousandths() {
        let p = |v| fraction_of_percent(Some(&Percent { value: v }), "x").unwrap();
        assert_eq!(p(0.005).numerator, 1);
        assert_eq!(p(12.34).numerator, 1234);
        assert_eq!(p(100.0).numerator, 10_000);
        assert!(fraction_of_percent(Some(&Percent { value: 101.0 }), "random_sampling").is_err());
        let f = Fraction {
            numerator: 25,
            denominator: 100,
        };
        assert!(f.enabled(24) && !f.enabled(25) && f.enabled(124));
    }

    #[test]
    fn metadata_custom_tags_are_left_out() {
        let io = super::super::context::FakeIo::new();
        let ctx = Context::new(&io);
        let metadata = CustomTagProto {
            tag: "m".into(),
            r#type: Some(custom_tag::Type::Metadata(Default::default())),
        };
        let literal = CustomTagProto {
            tag: "l".into(),
            r#type: Some(custom_tag::Type::Literal(Default::default())),
        };
        let tags = custom_tags(&ctx, &[metadata, literal], "custom_tags").unwrap();
        assert_eq!(tags.len(), 1);
        assert_eq!(tags[0].tag, "l");
    }

    #[test]
    fn verbose_tracing_is_refused_by_name() {
        let io = super::super::context::FakeIo::new();
        let ctx = Context::new(&io);
        let t = HcmTracingProto {
            verbose: true,
            ..Default::default()
        };
        let err = compile_hcm_tracing(&ctx, &t, false).unwrap_err();
        assert_eq!(err.path, "verbose");
        let quiet = HcmTracingProto::default();
        assert!(compile_hcm_tracing(&ctx, &quiet, false).is_ok());
    }

    #[test]
    fn tracers_revoy_lacks_are_named_for_skipping() {
        let tracer = |type_name: &str| HttpTracer {
            name: "t".into(),
            config_type: Some(ConfigType::TypedConfig(proto::pb::google::protobuf::Any {
                type_url: format!("type.googleapis.com/{type_name}"),
                value: Vec::new(),
            })),
        };
        let datadog = tracer("envoy.config.trace.v3.DatadogConfig");
        assert_eq!(
            unimplemented_tracer(&datadog),
            Some("envoy.config.trace.v3.DatadogConfig")
        );
        assert!(skipped_tracer("x").contains("no spans are sent"));
        for implemented in [
            "envoy.config.trace.v3.OpenTelemetryConfig",
            "envoy.config.trace.v3.ZipkinConfig",
        ] {
            assert_eq!(unimplemented_tracer(&tracer(implemented)), None);
        }
    }
}
