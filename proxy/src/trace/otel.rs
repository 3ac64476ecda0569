//! `envoy.tracers.opentelemetry`: spans encoded as OTLP and exported over gRPC
//! (`TraceService/Export`) to a host of the configured cluster.

use std::net::SocketAddr;
use std::time::{Duration, UNIX_EPOCH};

use tonic::transport::{Channel, Endpoint, Uri};

use super::otlp;
use super::span::{Kind, Span};
use crate::config::tracing::OtelProvider;
use crate::upstream::ClusterManager;

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
    let error = s.tag("error") == Some("true");
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

/// The OTLP client of one tracer: a gRPC channel to a host of its cluster, made again when
/// the host changes.
pub struct Client {
    provider: OtelProvider,
    resource: Resource,
    channel: Option<(SocketAddr, Channel)>,
}

impl Client {
    /// A client for `provider`; connects on first use.
    pub fn new(provider: OtelProvider) -> Client {
        Client {
            resource: Resource::of(&provider),
            provider,
            channel: None,
        }
    }

    /// Sends `spans` in one call; `Err` says why it failed.
    pub async fn export(
        &mut self,
        clusters: &ClusterManager,
        spans: &[Span],
    ) -> Result<(), String> {
        let cluster = clusters
            .get(&self.provider.cluster)
            .ok_or_else(|| format!("unknown cluster '{}'", self.provider.cluster))?;
        let host = cluster
            .host_set()
            .hosts()
            .iter()
            .find(|h| h.is_healthy())
            .map(|h| h.addr)
            .ok_or("no healthy upstream")?;
        let channel = match &self.channel {
            Some((addr, ch)) if *addr == host => ch.clone(),
            _ => {
                let origin: Uri = format!("http://{}", self.provider.authority)
                    .parse()
                    .map_err(|e| format!("authority: {e}"))?;
                let ch = Endpoint::from_shared(format!("http://{host}"))
                    .map_err(|e| e.to_string())?
                    .origin(origin)
                    .connect_timeout(Duration::from_secs(1))
                    .connect_lazy();
                self.channel = Some((host, ch.clone()));
                ch
            }
        };
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| e.to_string())?;
        let mut req = tonic::Request::new(encode(&self.resource, spans));
        if let Some(t) = self.provider.timeout {
            req.set_timeout(t);
        }
        let path = http::uri::PathAndQuery::from_static(otlp::EXPORT_PATH);
        let codec = tonic_prost::ProstCodec::<
            otlp::ExportTraceServiceRequest,
            otlp::ExportTraceServiceResponse,
        >::default();
        grpc.unary(req, path, codec)
            .await
            .map(|_| ())
            .map_err(|status| status.to_string())
    }
}
