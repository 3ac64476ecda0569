//! Test support: a scripted ADS server (each stream hands its requests to the test, which
//! sends the responses) and a recording handler.

#![allow(dead_code)] // Each test binary uses its own part of the support.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::pb::google::protobuf::Any;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};
use xds_client::client::{self, Backoff, Client, Config, Mode, Transport};
use xds_client::{
    Applied, CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, Event, Handler, LISTENER_TYPE_URL,
    ROUTE_TYPE_URL, Rejected, Update,
};

/// How long a test waits for something that should happen.
pub const PATIENCE: Duration = Duration::from_secs(5);
/// How long a test waits to be sure something does not happen.
pub const QUIET: Duration = Duration::from_millis(200);

/// One ADS stream as the server sees it.
pub struct Stream<Req, Resp> {
    requests: UnboundedReceiver<Req>,
    responses: UnboundedSender<Result<Resp, Status>>,
}

impl<Req: std::fmt::Debug, Resp> Stream<Req, Resp> {
    /// The next request the client sent.
    pub async fn recv(&mut self) -> Req {
        tokio::time::timeout(PATIENCE, self.requests.recv())
            .await
            .expect("no request in time")
            .expect("the client closed the stream")
    }

    /// Asserts no request arrives for a while.
    pub async fn expect_none(&mut self) {
        if let Ok(Some(request)) = tokio::time::timeout(QUIET, self.requests.recv()).await {
            panic!("unexpected request: {request:?}");
        }
    }

    /// Sends a response.
    pub fn send(&self, response: Resp) {
        self.responses.send(Ok(response)).expect("stream gone");
    }

    /// Ends the stream (the server closes it, as istiod does every 30 minutes).
    pub fn close(self) {}
}

/// A SotW stream.
pub type SotwStream = Stream<DiscoveryRequest, DiscoveryResponse>;
/// A Delta stream.
pub type DeltaStream = Stream<DeltaDiscoveryRequest, DeltaDiscoveryResponse>;

struct Service {
    sotw: UnboundedSender<SotwStream>,
    delta: UnboundedSender<DeltaStream>,
}

/// Hands a new stream to the test. Like grpc-go (istiod), the call is answered (response
/// headers) only once the first request arrived.
async fn forward<Req, Resp>(
    mut incoming: Streaming<Req>,
    streams: &UnboundedSender<Stream<Req, Resp>>,
) -> Result<Response<UnboundedReceiverStream<Result<Resp, Status>>>, Status>
where
    Req: Send + 'static,
    Streaming<Req>: tokio_stream::Stream<Item = Result<Req, Status>> + Unpin + Send,
{
    let first = incoming
        .next()
        .await
        .ok_or_else(|| Status::cancelled("no request"))??;
    let (request_tx, requests) = unbounded_channel();
    let (responses, response_rx) = unbounded_channel();
    request_tx.send(first).expect("receiver held below");
    tokio::spawn(async move {
        while let Some(Ok(request)) = incoming.next().await {
            if request_tx.send(request).is_err() {
                break;
            }
        }
    });
    streams
        .send(Stream {
            requests,
            responses,
        })
        .expect("test gone");
    Ok(Response::new(UnboundedReceiverStream::new(response_rx)))
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        forward(request.into_inner(), &self.sotw).await
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        forward(request.into_inner(), &self.delta).await
    }
}

/// The scripted ADS server.
pub struct Server {
    /// Where it listens.
    pub transport: Transport,
    sotw: UnboundedReceiver<SotwStream>,
    delta: UnboundedReceiver<DeltaStream>,
}

impl Server {
    fn service() -> (
        Service,
        UnboundedReceiver<SotwStream>,
        UnboundedReceiver<DeltaStream>,
    ) {
        let (sotw_tx, sotw) = unbounded_channel();
        let (delta_tx, delta) = unbounded_channel();
        let service = Service {
            sotw: sotw_tx,
            delta: delta_tx,
        };
        (service, sotw, delta)
    }

    /// A server on 127.0.0.1, on an ephemeral port.
    pub async fn tcp() -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::tcp_on(listener)
    }

    /// A server on a bound listener.
    pub fn tcp_on(listener: tokio::net::TcpListener) -> Server {
        let address = listener.local_addr().unwrap();
        let (service, sotw, delta) = Self::service();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AggregatedDiscoveryServiceServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Server {
            transport: Transport::Tcp(address),
            sotw,
            delta,
        }
    }

    /// A server on a unix socket at `path`.
    pub async fn unix(path: PathBuf) -> Server {
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (service, sotw, delta) = Self::service();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AggregatedDiscoveryServiceServer::new(service))
                .serve_with_incoming(UnixListenerStream::new(listener)),
        );
        Server {
            transport: Transport::Unix(path),
            sotw,
            delta,
        }
    }

    /// The next SotW stream a client opens.
    pub async fn sotw_stream(&mut self) -> SotwStream {
        tokio::time::timeout(PATIENCE, self.sotw.recv())
            .await
            .expect("no stream in time")
            .unwrap()
    }

    /// The next Delta stream a client opens.
    pub async fn delta_stream(&mut self) -> DeltaStream {
        tokio::time::timeout(PATIENCE, self.delta.recv())
            .await
            .expect("no stream in time")
            .unwrap()
    }
}

/// What the handler saw.
pub struct Probe {
    updates: UnboundedReceiver<Update>,
    events: UnboundedReceiver<Event>,
}

impl Probe {
    /// The next update the handler applied.
    pub async fn update(&mut self) -> Update {
        tokio::time::timeout(PATIENCE, self.updates.recv())
            .await
            .expect("no update in time")
            .unwrap()
    }

    /// Asserts the handler is not called for a while.
    pub async fn expect_no_update(&mut self) {
        if let Ok(Some(update)) = tokio::time::timeout(QUIET, self.updates.recv()).await {
            panic!("unexpected update: {update:?}");
        }
    }

    /// The next event.
    pub async fn event(&mut self) -> Event {
        tokio::time::timeout(PATIENCE, self.events.recv())
            .await
            .expect("no event in time")
            .unwrap()
    }
}

/// What the handler does from inside `apply`.
pub type Reaction = Box<dyn Fn(&Update) + Send + Sync>;

/// A handler that records what it is given and rejects the names it is told to.
pub struct Recorder {
    updates: UnboundedSender<Update>,
    events: UnboundedSender<Event>,
    reject: Mutex<HashMap<String, String>>,
    reaction: Mutex<Option<Reaction>>,
}

impl Recorder {
    /// A recorder and the probe that reads it.
    pub fn new() -> (Arc<Recorder>, Probe) {
        let (updates, update_rx) = unbounded_channel();
        let (events, event_rx) = unbounded_channel();
        let recorder = Recorder {
            updates,
            events,
            reject: Mutex::new(HashMap::new()),
            reaction: Mutex::new(None),
        };
        let probe = Probe {
            updates: update_rx,
            events: event_rx,
        };
        (Arc::new(recorder), probe)
    }

    /// Rejects resource `name` with `reason` from now on.
    pub fn reject(&self, name: &str, reason: &str) {
        self.reject
            .lock()
            .unwrap()
            .insert(name.to_string(), reason.to_string());
    }

    /// Runs `reaction` inside each `apply`.
    pub fn react(&self, reaction: Reaction) {
        *self.reaction.lock().unwrap() = Some(reaction);
    }
}

impl Handler for Recorder {
    fn apply(&self, update: Update) -> Applied {
        if let Some(reaction) = &*self.reaction.lock().unwrap() {
            reaction(&update);
        }
        let reject = self.reject.lock().unwrap();
        let rejected = update
            .resources
            .iter()
            .filter_map(|resource| {
                reject.get(&resource.name).map(|reason| Rejected {
                    name: resource.name.clone(),
                    reason: reason.clone(),
                })
            })
            .collect();
        let _ = self.updates.send(update);
        Applied::rejecting(rejected)
    }

    fn event(&self, event: Event) {
        let _ = self.events.send(event);
    }
}

/// The node tests send.
pub fn node() -> Node {
    Node {
        id: "sidecar~127.0.0.1~pod.ns~ns.svc.cluster.local".into(),
        cluster: "pod.ns".into(),
        ..Default::default()
    }
}

/// A config for `server` with a short back-off.
pub fn config(transport: Transport, mode: Mode) -> Config {
    let mut config = Config::new(transport, mode, node());
    config.backoff = Backoff {
        base: Duration::from_millis(10),
        max: Duration::from_millis(50),
    };
    config
}

/// Starts a client with a recorder.
pub fn start(config: Config) -> (Client, Arc<Recorder>, Probe) {
    let (recorder, probe) = Recorder::new();
    let client = client::start(config, recorder.clone());
    (client, recorder, probe)
}

/// A scripted server on loopback and a client of `mode` started on it with [`config`].
pub async fn serve_and_start(mode: Mode) -> (Server, Client, Arc<Recorder>, Probe) {
    let server = Server::tcp().await;
    let (client, recorder, probe) = start(config(server.transport.clone(), mode));
    (server, client, recorder, probe)
}

fn any(type_url: &str, value: Vec<u8>) -> Any {
    Any {
        type_url: type_url.to_string(),
        value,
    }
}

/// A Listener named `name`.
pub fn listener(name: &str) -> Any {
    let listener = Listener {
        name: name.into(),
        stat_prefix: "stats".into(),
        ..Default::default()
    };
    any(LISTENER_TYPE_URL, listener.encode_to_vec())
}

/// A Cluster named `name`.
pub fn cluster(name: &str) -> Any {
    let cluster = Cluster {
        name: name.into(),
        alt_stat_name: "alt".into(),
        ..Default::default()
    };
    any(CLUSTER_TYPE_URL, cluster.encode_to_vec())
}

/// A RouteConfiguration named `name`.
pub fn route(name: &str) -> Any {
    let route = RouteConfiguration {
        name: name.into(),
        ..Default::default()
    };
    any(ROUTE_TYPE_URL, route.encode_to_vec())
}

/// A ClusterLoadAssignment for cluster `name`.
pub fn endpoints(name: &str) -> Any {
    let assignment = ClusterLoadAssignment {
        cluster_name: name.into(),
        ..Default::default()
    };
    any(ENDPOINT_TYPE_URL, assignment.encode_to_vec())
}

/// A SotW response.
pub fn response(
    type_url: &str,
    version: &str,
    nonce: &str,
    resources: Vec<Any>,
) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.into(),
        resources,
        type_url: type_url.into(),
        nonce: nonce.into(),
        ..Default::default()
    }
}

/// The names of an update's resources.
pub fn names(update: &Update) -> Vec<&str> {
    update.resources.iter().map(|r| r.name.as_str()).collect()
}

/// A list of owned names.
pub fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}
