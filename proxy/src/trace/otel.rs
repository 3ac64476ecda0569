//! `envoy.tracers.opentelemetry`: spans encoded as OTLP and exported over gRPC
//! (`TraceService/Export`) through the configured cluster.

use std::time::UNIX_EPOCH;

use super::otlp;
use super::span::{Kind, Span};
use crate::config::tracing::OtelProvider;
use crate::upstream::{ClusterManager, grpc};

/// W3C trace flags bit: sampled.
const SAMPLED: u32 = 0x01;
/// OTLP span flags: whether the parent is known to be remote is recorded.
const HAS_IS_REMOTE: u32 = 0x100;
/// OTLP span flags: the parent is remote.
const IS_REMOTE: u32 = 0x200;

/// What every export says about the proxy.
#[derive(Debug, Clone)]
pub struct Resource {
    /// `service.name` and the SDK attributes.
    pub attributes: Vec<otlp::KeyValue>,
    /// The instrumentation scope's name and version.
    pub scope: otlp::InstrumentationScope,
}

impl Resource {
    /// The resource of `provider`: `service.name`, and Envoy's `telemetry.sdk.*` with revoy's
    /// version.
    pub fn of(provider: &OtelProvider) -> Resource {
        let version = crate::cli::version_line()
            .split("version: ")
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        Resource {
            attributes: vec![
                otlp::string_attribute("telemetry.sdk.version", &version),
                otlp::string_attribute("service.name", &provider.service_name),
                otlp::string_attribute("telemetry.sdk.language", "cpp"),
                otlp::string_attribute("telemetry.sdk.name", "envoy"),
            ],
            scope: otlp::InstrumentationScope {
                name: "envoy".to_owned(),
                version,
                ..Default::default()
            },
        }
    }
}

fn nanos(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One span as OTLP.
pub fn encode_span(s: &Span) -> otlp::Span {
    // An error tag marks the span failed; so does a 5xx, or a 4xx on a CLIENT span (as Envoy's
    // OpenTelemetry spans set their status from the HTTP status code).
    let code: u16 = s
        .tag("http.status_code")
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let error =
        s.tag("error") == Some("true") || code >= 500 || (s.kind == Kind::Client && code >= 400);
    otlp::Span {
        trace_id: s.trace_id.to_be_bytes().to_vec(),
        span_id: s.span_id.to_be_bytes().to_vec(),
        trace_state: s.tracestate.clone(),
        parent_span_id: s
            .parent_id
            .map(|p| p.to_be_bytes().to_vec())
            .unwrap_or_default(),
        name: s.name.clone(),
        kind: match s.kind {
            Kind::Server => otlp::SpanKind::Server,
            Kind::Client => otlp::SpanKind::Client,
        } as i32,
        start_time_unix_nano: nanos(s.start),
        end_time_unix_nano: nanos(s.end),
        attributes: s
            .tags
            .iter()
            .map(|(k, v)| otlp::string_attribute(k, v))
            .collect(),
        status: error.then(|| otlp::Status {
            message: String::new(),
            code: otlp::StatusCode::Error as i32,
        }),
        flags: (if s.sampled { SAMPLED } else { 0 })
            | HAS_IS_REMOTE
            | if s.parent_remote { IS_REMOTE } else { 0 },
        ..Default::default()
    }
}

/// One export call's message.
pub fn encode(resource: &Resource, spans: &[Span]) -> otlp::ExportTraceServiceRequest {
    otlp::ExportTraceServiceRequest {
        resource_spans: vec![otlp::ResourceSpans {
            resource: Some(otlp::Resource {
                attributes: resource.attributes.clone(),
                dropped_attributes_count: 0,
            }),
            scope_spans: vec![otlp::ScopeSpans {
                scope: Some(resource.scope.clone()),
                spans: spans.iter().map(encode_span).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// The OTLP client of one tracer: each export is a gRPC call sent through its cluster like any
/// other request (the cluster's pool, load balancing and stats), as Envoy's gRPC client does.
pub struct Client {
    provider: OtelProvider,
    resource: Resource,
}

impl Client {
    /// A client for `provider`.
    pub fn new(provider: OtelProvider) -> Client {
        Client {
            resource: Resource::of(&provider),
            provider,
        }
    }

    /// Sends `spans` in one call; `Err` says why it failed.
    pub async fn export(
        &mut self,
        clusters: &ClusterManager,
        spans: &[Span],
    ) -> Result<(), String> {
        let call = grpc::Call {
            cluster: &self.provider.cluster,
            path: otlp::EXPORT_PATH,
            authority: &self.provider.authority,
            metadata: &[],
            timeout: self.provider.timeout,
        };
        grpc::unary(clusters, &call, &encode(&self.resource, spans))
            .await
            .map(drop)
            .map_err(|f| f.to_string())
    }
}
