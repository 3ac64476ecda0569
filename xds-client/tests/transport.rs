//! Transports (unix socket), connection retries, a refused call, the rate limit, and HTTP/2
//! keep-alive finding a silent server.

#[path = "support/relay.rs"]
mod relay;
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use support::{PATIENCE, QUIET, Server, config, listener, response, start};
use xds_client::client::{KeepAlive, Mode, RateLimit, Transport};
use xds_client::{
    CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, Event, LISTENER_TYPE_URL, ROUTE_TYPE_URL, SECRET_TYPE_URL,
};

#[tokio::test]
async fn unix_socket() {
    let path = std::env::temp_dir().join(format!("xds-client-test-{}.sock", std::process::id()));
    let mut server = Server::unix(path.clone()).await;
    let (client, _recorder, mut probe) = start(config(server.transport.clone(), Mode::Sotw));
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    stream.recv().await;
    stream.send(response(LISTENER_TYPE_URL, "v1", "n1", vec![listener("a")]));
    assert_eq!(probe.update().await.version_info, "v1");
    let ack = stream.recv().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("v1", "n1")
    );
    client.stop();
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn retries_until_the_server_is_up() {
    // Reserve a port, free it, and start the server there a little later.
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (client, _recorder, mut probe) = start(config(
        xds_client::client::Transport::Tcp(address),
        Mode::Sotw,
    ));
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!client.status().connected);
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let mut server = Server::tcp_on(listener);
    let mut stream = server.sotw_stream().await;
    assert_eq!(stream.recv().await.type_url, LISTENER_TYPE_URL);
    assert_eq!(probe.event().await, Event::Connected);
    assert!(client.status().connected);
    client.stop();
    assert!(!client.status().connected);
}

#[tokio::test]
async fn rate_limited_requests_queue_and_say_so() {
    let mut server = Server::tcp().await;
    let mut config = config(server.transport.clone(), Mode::Sotw);
    config.rate_limit = Some(RateLimit {
        max_tokens: 2,
        fill_rate: 5.0,
    });
    let (client, _recorder, mut probe) = start(config);
    for type_url in [LISTENER_TYPE_URL, CLUSTER_TYPE_URL] {
        client.subscribe_wildcard(type_url);
    }
    for type_url in [ROUTE_TYPE_URL, ENDPOINT_TYPE_URL, SECRET_TYPE_URL] {
        client.subscribe(type_url, vec!["x".into()]);
    }
    let mut stream = server.sotw_stream().await;
    let mut types = BTreeSet::new();
    for _ in 0..5 {
        types.insert(stream.recv().await.type_url);
    }
    assert_eq!(types.len(), 5);
    // Two went at once; the others waited in the queue, reported as it grew and emptied.
    let mut events = Vec::new();
    while events.last() != Some(&Event::Queued(0)) {
        events.push(probe.event().await);
    }
    let most = events.iter().filter_map(|event| match event {
        Event::Queued(queued) => Some(*queued),
        _ => None,
    });
    assert!(most.max() >= Some(2), "{events:?}");
    assert!(events.contains(&Event::RateLimited), "{events:?}");
    client.stop();
}

/// An ADS service that refuses every call, as a control plane answers a client it does not
/// authorize (a trailers-only gRPC error), and counts the calls.
struct Refusing(tokio::sync::mpsc::UnboundedSender<()>);

type Responses<T> = tokio_stream::wrappers::UnboundedReceiverStream<Result<T, tonic::Status>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Refusing {
    type StreamAggregatedResourcesStream = Responses<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Responses<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        let _ = self.0.send(());
        Err(tonic::Status::permission_denied("not authorized"))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        let _ = self.0.send(());
        Err(tonic::Status::permission_denied("not authorized"))
    }
}

#[tokio::test]
async fn a_refused_call_is_not_a_stream_and_is_tried_again() {
    for mode in [Mode::Sotw, Mode::Delta] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (calls, mut called) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(AggregatedDiscoveryServiceServer::new(Refusing(calls)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let transport = xds_client::client::Transport::Tcp(address);
        let (client, _recorder, mut probe) = start(config(transport, mode));
        client.subscribe_wildcard(LISTENER_TYPE_URL);
        for _ in 0..2 {
            tokio::time::timeout(PATIENCE, called.recv())
                .await
                .expect("a call in time")
                .expect("the server runs");
        }
        assert!(!client.status().connected, "{mode:?}");
        if let Ok(event) = tokio::time::timeout(QUIET, probe.event()).await {
            panic!("{mode:?}: no stream came up, yet {event:?}");
        }
        client.stop();
        server.abort();
    }
}

#[tokio::test]
async fn keep_alive_pings_find_a_silent_server_and_the_stream_comes_back() {
    let mut server = Server::tcp().await;
    let Transport::Tcp(address) = server.transport.clone() else {
        unreachable!("a TCP server");
    };
    let relay = relay::Relay::start(address).await;
    let mut config = config(Transport::Tcp(relay.address), Mode::Sotw);
    config.keep_alive = Some(KeepAlive {
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(300),
    });
    let (client, _recorder, mut probe) = start(config);
    client.subscribe_wildcard(LISTENER_TYPE_URL);
    let mut stream = server.sotw_stream().await;
    assert_eq!(stream.recv().await.type_url, LISTENER_TYPE_URL);
    assert_eq!(probe.event().await, Event::Connected);
    // PINGs arrive while the stream is idle.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while relay.pings() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no keep-alive PINGs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The server falls silent without closing: an unanswered PING drops the connection, and
    // a new stream resubscribes.
    relay.silence();
    assert_eq!(probe.event().await, Event::Disconnected);
    assert_eq!(probe.event().await, Event::Connected);
    let mut again = server.sotw_stream().await;
    assert_eq!(again.recv().await.type_url, LISTENER_TYPE_URL);
    drop(stream);
    client.stop();
}
