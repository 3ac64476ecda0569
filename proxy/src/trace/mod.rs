//! Distributed tracing as Envoy does it: the sampling decision (carried in `x-request-id`),
//! spans with Envoy's names and tags, trace context propagation (W3C for OpenTelemetry, B3
//! for Zipkin), and exporters that batch spans off the request path.

pub mod context;
pub mod decision;
pub mod exporter;
pub mod otel;
pub mod otlp;
pub mod request_id;
pub mod span;
pub mod zipkin;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::config::tracing::{FlushSettings, Provider};
use crate::stats::Store;
use crate::upstream::ClusterManager;
pub use exporter::Exporter;

/// What spans say about the proxy (Envoy's local info).
#[derive(Debug, Clone, Default)]
pub struct LocalInfo {
    /// `node.id` (or `--service-node`): the `node_id` tag.
    pub node_id: String,
    /// `node.cluster` (or `--service-cluster`): Zipkin's service name.
    pub cluster: String,
    /// `node.locality.zone` (or `--service-zone`): the `zone` tag.
    pub zone: String,
    /// The machine's address (Zipkin's `localEndpoint`).
    pub address: Option<IpAddr>,
    /// `cluster` as a header value (`add_user_agent`), when it is a valid one.
    pub cluster_header: Option<http::HeaderValue>,
    /// `node_id` as a header value (`add_user_agent`), when set and a valid one.
    pub node_header: Option<http::HeaderValue>,
}

/// The running tracers, one per distinct provider, started on first use.
#[derive(Debug)]
pub struct Tracers {
    /// The proxy, for spans.
    pub local: LocalInfo,
    /// The bootstrap's server-wide tracer.
    default: Option<Arc<Provider>>,
    flush: FlushSettings,
    store: Store,
    clusters: ClusterManager,
    running: Mutex<Vec<(Arc<Provider>, Arc<Exporter>)>>,
}

impl Tracers {
    /// No tracer running yet.
    pub fn new(
        local: LocalInfo,
        default: Option<Arc<Provider>>,
        flush: FlushSettings,
        store: Store,
        clusters: ClusterManager,
    ) -> Tracers {
        Tracers {
            local,
            default,
            flush,
            store,
            clusters,
            running: Mutex::default(),
        }
    }

    /// The bootstrap's server-wide tracer.
    pub fn default_provider(&self) -> Option<&Provider> {
        self.default.as_deref()
    }

    /// The tracer of `provider` (the server-wide one when `None`), started on the current
    /// runtime if it is not running; `None` when there is no provider at all.
    pub fn exporter(&self, provider: Option<&Arc<Provider>>) -> Option<Arc<Exporter>> {
        let provider = provider.or(self.default.as_ref())?;
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, e)) = running.iter().find(|(p, _)| **p == **provider) {
            return Some(e.clone());
        }
        let flush = match &**provider {
            Provider::OpenTelemetry(_) => self.flush.opentelemetry,
            Provider::Zipkin(_) => self.flush.zipkin,
        };
        let e = Exporter::start(
            provider,
            flush,
            self.clusters.clone(),
            &self.store,
            &self.local,
        );
        running.push((provider.clone(), e.clone()));
        Some(e)
    }
}
