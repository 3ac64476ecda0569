//! Helpers the server tests share: a server on loopback, raw SotW and Delta clients built on
//! envoy-types' generated tonic client, and small typed resources.

#![allow(dead_code)] // each test binary uses a part of these helpers

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LocalityLbEndpoints};
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use proto::pb::google::rpc::Status;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use xds_client::server::{Server, Snapshot};

/// How long a test waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(5);
/// How long a test waits to be sure something does not happen.
pub const QUIET: Duration = Duration::from_millis(300);

/// A server with `snapshot`, serving on an ephemeral loopback port.
pub async fn start(snapshot: Option<Snapshot>) -> (Server, SocketAddr) {
    let server = Server::new();
    if let Some(s) = snapshot {
        server.set(s);
    }
    let (addr, _task) = server.serve_tcp("127.0.0.1:0").await.unwrap();
    (server, addr)
}

pub fn listener(name: &str, tag: &str) -> Listener {
    Listener {
        name: name.into(),
        stat_prefix: tag.into(),
        ..Default::default()
    }
}

pub fn cluster(name: &str, tag: &str) -> Cluster {
    Cluster {
        name: name.into(),
        alt_stat_name: tag.into(),
        ..Default::default()
    }
}

pub fn route(name: &str, tag: &str) -> RouteConfiguration {
    RouteConfiguration {
        name: name.into(),
        internal_only_headers: vec![tag.into()],
        ..Default::default()
    }
}

pub fn endpoints(cluster: &str, priority: u32) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: cluster.into(),
        endpoints: vec![LocalityLbEndpoints {
            priority,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Names of the resources of a SotW response, decoded by type.
pub fn names(resp: &DiscoveryResponse) -> Vec<String> {
    use prost::Message as _;
    resp.resources
        .iter()
        .map(|any| match any.type_url.rsplit('/').next().unwrap() {
            "envoy.config.listener.v3.Listener" => Listener::decode(&any.value[..]).unwrap().name,
            "envoy.config.cluster.v3.Cluster" => Cluster::decode(&any.value[..]).unwrap().name,
            "envoy.config.route.v3.RouteConfiguration" => {
                RouteConfiguration::decode(&any.value[..]).unwrap().name
            }
            "envoy.config.endpoint.v3.ClusterLoadAssignment" => {
                ClusterLoadAssignment::decode(&any.value[..])
                    .unwrap()
                    .cluster_name
            }
            other => panic!("unexpected type {other}"),
        })
        .collect()
}

/// A raw ADS stream: requests of type `Req` out, responses of type `Resp` in.
pub struct Raw<Req, Resp> {
    node: String,
    tx: mpsc::Sender<Req>,
    rx: tonic::Streaming<Resp>,
}

impl<Req, Resp: std::fmt::Debug> Raw<Req, Resp> {
    /// The next response.
    pub async fn recv(&mut self) -> Resp {
        tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("no response in time")
            .unwrap()
            .expect("stream ended")
    }

    /// Asserts that nothing arrives for a while.
    pub async fn nothing(&mut self) {
        if let Ok(r) = tokio::time::timeout(QUIET, self.rx.message()).await {
            panic!("unexpected response: {r:?}");
        }
    }
}

/// A raw SotW ADS stream.
pub type Sotw = Raw<DiscoveryRequest, DiscoveryResponse>;

impl Sotw {
    pub async fn connect(addr: SocketAddr, node: &str) -> Self {
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(16);
        let rx = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Sotw {
            node: node.into(),
            tx,
            rx,
        }
    }

    /// Sends a request; `nack` makes it carry an `error_detail` with that message.
    pub async fn request(
        &self,
        type_url: &str,
        names: &[&str],
        version: &str,
        nonce: &str,
        nack: Option<&str>,
    ) {
        let req = DiscoveryRequest {
            version_info: version.into(),
            node: Some(Node {
                id: self.node.clone(),
                ..Default::default()
            }),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            type_url: type_url.into(),
            response_nonce: nonce.into(),
            error_detail: nack.map(|m| Status {
                code: 3,
                message: m.into(),
                details: vec![],
            }),
            ..Default::default()
        };
        self.tx.send(req).await.unwrap();
    }

    /// ACKs `resp` with the same names.
    pub async fn ack(&self, resp: &DiscoveryResponse, names: &[&str]) {
        self.request(&resp.type_url, names, &resp.version_info, &resp.nonce, None)
            .await;
    }
}

/// A raw Delta ADS stream.
pub type Delta = Raw<DeltaDiscoveryRequest, DeltaDiscoveryResponse>;

/// One Delta request's fields a test sets.
#[derive(Default)]
pub struct DeltaReq<'a> {
    pub type_url: &'a str,
    pub subscribe: &'a [&'a str],
    pub unsubscribe: &'a [&'a str],
    pub initial: &'a [(&'a str, &'a str)],
    pub nonce: &'a str,
    pub nack: Option<&'a str>,
}

impl Delta {
    pub async fn connect(addr: SocketAddr, node: &str) -> Self {
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(16);
        let rx = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Delta {
            node: node.into(),
            tx,
            rx,
        }
    }

    pub async fn request(&self, r: DeltaReq<'_>) {
        let strings = |v: &[&str]| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let req = DeltaDiscoveryRequest {
            node: Some(Node {
                id: self.node.clone(),
                ..Default::default()
            }),
            type_url: r.type_url.into(),
            resource_names_subscribe: strings(r.subscribe),
            resource_names_unsubscribe: strings(r.unsubscribe),
            initial_resource_versions: r
                .initial
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            response_nonce: r.nonce.into(),
            error_detail: r.nack.map(|m| Status {
                code: 3,
                message: m.into(),
                details: vec![],
            }),
            ..Default::default()
        };
        self.tx.send(req).await.unwrap();
    }

    /// ACKs `resp`.
    pub async fn ack(&self, resp: &DeltaDiscoveryResponse) {
        self.request(DeltaReq {
            type_url: &resp.type_url,
            nonce: &resp.nonce,
            ..Default::default()
        })
        .await;
    }
}

/// Names (sorted) and versions of a Delta response's resources.
pub fn delta_names(resp: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut v: Vec<String> = resp.resources.iter().map(|r| r.name.clone()).collect();
    v.sort();
    v
}
