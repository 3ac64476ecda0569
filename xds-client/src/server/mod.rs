//! A snapshot ADS server (SotW and Delta; also serving `SecretDiscoveryService`, as an SDS
//! server such as pilot-agent's) for edge users and tests: [`Server::set`] replaces
//! the [`Snapshot`] and every connected stream gets what changed for it; the ACKs and NACKs
//! clients send are kept ([`Server::events`]) and logged.

mod delta;
pub mod files;
mod log;
mod peer;
mod snapshot;
mod sotw;
mod stream;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

pub use log::{ClientEvent, Protocol};
pub use snapshot::{Snapshot, SnapshotResource, push_order};

use crate::Verdict;

/// What serving ends with: tonic's transport error, if any.
pub type ServeResult = Result<(), tonic::transport::Error>;

/// State every stream shares.
pub(crate) struct Shared {
    /// The current snapshot (`None` until the first [`Server::set`]).
    pub(crate) snapshot: watch::Sender<Option<Arc<Snapshot>>>,
    /// Clients' ACKs and NACKs.
    pub(crate) log: log::EventLog,
}

/// A handle on the ADS server; clones share the snapshot and the event log.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Default for Server {
    fn default() -> Self {
        Self::new()
    }
}

impl Server {
    /// A server with no snapshot yet: streams that connect now are answered after the first
    /// [`Server::set`].
    pub fn new() -> Self {
        Server {
            shared: Arc::new(Shared {
                snapshot: watch::Sender::new(None),
                log: log::EventLog::new(),
            }),
        }
    }

    /// Replaces the snapshot; every connected stream gets the types whose content changed for
    /// it (CDS, EDS, LDS, RDS first, in that order).
    pub fn set(&self, snapshot: Snapshot) {
        self.shared.snapshot.send_replace(Some(Arc::new(snapshot)));
    }

    /// The snapshot being served.
    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.shared.snapshot.borrow().clone()
    }

    /// Every ACK and NACK received (the last 10 000), oldest first.
    pub fn events(&self) -> Vec<ClientEvent> {
        self.shared.log.snapshot()
    }

    /// Waits until `found` answers `Some` for the events received so far (called again after
    /// each new one), or `timeout` passes (`None`).
    pub async fn wait_for<T>(
        &self,
        found: impl FnMut(&[ClientEvent]) -> Option<T>,
        timeout: Duration,
    ) -> Option<T> {
        self.shared.log.wait_for(found, timeout).await
    }

    /// Waits until client `node_id` answers version `version` of `type_url`; answers its
    /// verdict, or `None` after `timeout`.
    pub async fn acked(
        &self,
        node_id: &str,
        type_url: &str,
        version: &str,
        timeout: Duration,
    ) -> Option<Verdict> {
        let found = |events: &[ClientEvent]| {
            events
                .iter()
                .find(|e| e.node_id == node_id && e.type_url == type_url && e.version == version)
                .map(|e| e.verdict.clone())
        };
        self.wait_for(found, timeout).await
    }

    /// The gRPC service, to add to a tonic router of one's own.
    pub fn service(&self) -> AggregatedDiscoveryServiceServer<Server> {
        AggregatedDiscoveryServiceServer::new(self.clone())
    }

    /// Serves ADS on the connections of `incoming` until it ends.
    pub async fn serve<I, IO, IE>(self, incoming: I) -> ServeResult
    where
        I: tokio_stream::Stream<Item = Result<IO, IE>> + Send + 'static,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // A flow-control window that grows with the bandwidth-delay product, as gRPC-Go's
        // (istiod's, go-control-plane's) does: a SotW request naming thousands of resources
        // is not sent 64 KiB per round trip.
        tonic::transport::Server::builder()
            .http2_adaptive_window(Some(true))
            .add_service(self.service())
            .add_service(SecretDiscoveryServiceServer::new(self.clone()))
            .serve_with_incoming(incoming)
            .await
    }

    /// Binds `addr` and serves ADS on it in a task; answers the address bound (the port, when
    /// `addr` asks for port 0) and the task. Connections get `TCP_NODELAY`: without it a
    /// response of more than one segment waited for the client's delayed ACK (about 40 ms
    /// per push on Linux loopback, measured by `benches/src/bin/xds_push.rs`).
    pub async fn serve_tcp(
        &self,
        addr: impl tokio::net::ToSocketAddrs,
    ) -> std::io::Result<(std::net::SocketAddr, JoinHandle<ServeResult>)> {
        use tokio_stream::StreamExt as _;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
            conn.inspect(|stream| {
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                }
            })
        });
        Ok((local, tokio::spawn(self.clone().serve(incoming))))
    }

    /// Binds the Unix socket `path` (replacing a socket file left there) and serves ADS on it
    /// in a task.
    pub async fn serve_unix(&self, path: &Path) -> std::io::Result<JoinHandle<ServeResult>> {
        use std::os::unix::fs::FileTypeExt as _;
        if let Ok(meta) = std::fs::symlink_metadata(path)
            && meta.file_type().is_socket()
        {
            std::fs::remove_file(path)?;
        }
        let listener = tokio::net::UnixListener::bind(path)?;
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        Ok(tokio::spawn(self.clone().serve(incoming)))
    }
}

/// Responses a stream has queued before it waits for the client to read them.
const STREAM_BUFFER: usize = 16;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Server {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, tonic::Status>>;
    type DeltaAggregatedResourcesStream =
        ReceiverStream<Result<DeltaDiscoveryResponse, tonic::Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        Ok(self.sotw(request))
    }

    async fn delta_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        Ok(self.delta(request))
    }
}

impl Server {
    /// Serves one SotW stream (ADS or SDS: the snapshot answers the types asked for).
    fn sotw(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> tonic::Response<ReceiverStream<Result<DiscoveryResponse, tonic::Status>>> {
        tracing::debug!(peer = ?request.remote_addr(), "SotW stream opened");
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(stream::run::<sotw::SotwStream>(
            self.shared.clone(),
            request.into_inner(),
            tx,
        ));
        tonic::Response::new(ReceiverStream::new(rx))
    }

    /// Serves one Delta stream.
    fn delta(
        &self,
        request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> tonic::Response<ReceiverStream<Result<DeltaDiscoveryResponse, tonic::Status>>> {
        tracing::debug!(peer = ?request.remote_addr(), "Delta stream opened");
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(stream::run::<delta::DeltaStream>(
            self.shared.clone(),
            request.into_inner(),
            tx,
        ));
        tonic::Response::new(ReceiverStream::new(rx))
    }
}

/// SDS on its own service (Envoy's `api_config_source` for secrets, pilot-agent's socket):
/// the same streams, carrying secrets.
#[tonic::async_trait]
impl SecretDiscoveryService for Server {
    type StreamSecretsStream = ReceiverStream<Result<DiscoveryResponse, tonic::Status>>;
    type DeltaSecretsStream = ReceiverStream<Result<DeltaDiscoveryResponse, tonic::Status>>;

    async fn stream_secrets(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamSecretsStream>, tonic::Status> {
        Ok(self.sotw(request))
    }

    async fn delta_secrets(
        &self,
        request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaSecretsStream>, tonic::Status> {
        Ok(self.delta(request))
    }

    async fn fetch_secrets(
        &self,
        _request: tonic::Request<DiscoveryRequest>,
    ) -> Result<tonic::Response<DiscoveryResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "FetchSecrets (REST-style) is not served; use StreamSecrets or DeltaSecrets",
        ))
    }
}
