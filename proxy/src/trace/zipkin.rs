//! `envoy.tracers.zipkin` with `collector_endpoint_version: HTTP_JSON`: spans as Zipkin v2
//! JSON, posted through the collector cluster.

use std::time::UNIX_EPOCH;

use http_body_util::BodyExt;
use serde_json::{Map, Value, json};

use super::context::b3_trace_hex;
use super::exporter::Failure;
use super::span::{Kind, Span};
use crate::config::tracing::ZipkinProvider;
use crate::upstream::{ClusterManager, LbContext};

fn micros(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One span as Zipkin v2 JSON; `local` names the proxy (`localEndpoint`).
pub fn encode_span(s: &Span, local: &Value) -> Value {
    let mut o = Map::new();
    o.insert(
        "traceId".into(),
        json!(b3_trace_hex(s.trace_id, s.trace_id_128)),
    );
    o.insert("id".into(), json!(format!("{:016x}", s.span_id)));
    if let Some(p) = s.parent_id {
        o.insert("parentId".into(), json!(format!("{p:016x}")));
    }
    o.insert(
        "kind".into(),
        json!(match s.kind {
            Kind::Server => "SERVER",
            Kind::Client => "CLIENT",
        }),
    );
    o.insert("name".into(), json!(s.name));
    o.insert("timestamp".into(), json!(micros(s.start)));
    o.insert(
        "duration".into(),
        json!(micros(s.end).saturating_sub(micros(s.start)).max(1)),
    );
    o.insert("localEndpoint".into(), local.clone());
    // The closing annotation Envoy keeps: server send, or client receive.
    let closing = match s.kind {
        Kind::Server => "ss",
        Kind::Client => "cr",
    };
    o.insert(
        "annotations".into(),
        json!([{"timestamp": micros(s.end), "value": closing}]),
    );
    // Zipkin drops tags without a value.
    let tags: Map<String, Value> = s
        .tags
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    if !tags.is_empty() {
        o.insert("tags".into(), Value::Object(tags));
    }
    if s.shared && s.kind == Kind::Server {
        o.insert("shared".into(), json!(true));
    }
    Value::Object(o)
}

/// The Zipkin client of one tracer.
pub struct Client {
    provider: ZipkinProvider,
    local: Value,
}

impl Client {
    /// A client for `provider`, describing the proxy as `local`.
    pub fn new(provider: ZipkinProvider, local: &super::LocalInfo) -> Client {
        let mut endpoint = Map::new();
        endpoint.insert("serviceName".into(), json!(local.cluster));
        if let Some(ip) = local.address {
            let key = if ip.is_ipv4() { "ipv4" } else { "ipv6" };
            endpoint.insert(key.into(), json!(ip.to_string()));
            endpoint.insert("port".into(), json!(0));
        }
        Client {
            provider,
            local: Value::Object(endpoint),
        }
    }

    /// Posts `spans` in one request through the collector cluster (its pool, load
    /// balancing and stats, as Envoy's async client); the collector must answer 202.
    pub async fn export(
        &mut self,
        clusters: &ClusterManager,
        spans: &[Span],
    ) -> Result<(), Failure> {
        let cluster = clusters
            .get(&self.provider.cluster)
            .ok_or(Failure::NoCluster)?;
        let failed = |e: &dyn std::fmt::Display| Failure::Failed(e.to_string());
        let body: Vec<Value> = spans.iter().map(|s| encode_span(s, &self.local)).collect();
        let body = serde_json::to_vec(&body).map_err(|e| failed(&e))?;
        let req = http::Request::post(self.provider.endpoint.as_str())
            .header(http::header::HOST, self.provider.hostname.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(crate::body::full(body))
            .map_err(|e| failed(&e))?;
        let lb = LbContext {
            internal: true,
            ..LbContext::default()
        };
        let exchange = async {
            // Envoy's async client answers a request its router could not send (no
            // connection, no healthy host) with the router's 503, which the reporter counts
            // as a collector that refused the spans; only a stream reset after the answer
            // began is a failure.
            let resp = match cluster.request(req, &lb).await {
                Ok(resp) => resp,
                Err(e) => {
                    tracing::debug!(error = %e, "zipkin collector not reached");
                    return Err(Failure::Rejected(503));
                }
            };
            let status = resp.status();
            resp.into_body().collect().await.map_err(|e| failed(&e))?;
            if status == http::StatusCode::ACCEPTED {
                Ok(())
            } else {
                Err(Failure::Rejected(status.as_u16()))
            }
        };
        // Envoy's `tracing.zipkin.request_timeout` default; the async client answers a
        // timed-out request with the router's 504.
        tokio::time::timeout(std::time::Duration::from_secs(5), exchange)
            .await
            .unwrap_or(Err(Failure::Rejected(504)))
    }
}
