//! `revoy xds-server`: serves `examples/xds/resources` to a raw ADS client, and refuses a
//! directory that does not load with the file and field in its message.

#[path = "support/child.rs"]
mod child;
#[path = "support/ports.rs"]
mod ports;

use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use child::Proxy;
use ports::free_port;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;
use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use xds_client::LISTENER_TYPE_URL;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/xds/resources");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_the_example_directory() {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_revoy"));
    command.args([
        "xds-server",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--dir",
        EXAMPLE,
    ]);
    let _server = tokio::task::spawn_blocking(move || {
        Proxy::spawn(command, || TcpStream::connect(("127.0.0.1", port)).is_ok())
    })
    .await
    .unwrap();
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap();
    let request = DiscoveryRequest {
        node: Some(Node {
            id: "cli-test".into(),
            ..Default::default()
        }),
        type_url: LISTENER_TYPE_URL.into(),
        ..Default::default()
    };
    let mut responses = client
        .stream_aggregated_resources(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .expect("an LDS response in time")
        .unwrap()
        .unwrap();
    assert_eq!(response.type_url, LISTENER_TYPE_URL);
    assert!(!response.version_info.is_empty());
    let names: Vec<String> = response
        .resources
        .iter()
        .map(|any| proto::unpack::<Listener>(any).unwrap().name)
        .collect();
    assert_eq!(names, ["http_10000"]);
}

#[test]
fn a_directory_that_does_not_load_is_refused_with_file_and_field() {
    let dir = std::env::temp_dir().join(format!("revoy-xds-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("listeners.yaml"),
        "resources:\n- \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n  name: l\n  per_connection_buffer_limit_bytes: lots\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_revoy"))
        .args(["xds-server", "--listen", "127.0.0.1:0", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("listeners.yaml: resources[0].per_connection_buffer_limit_bytes"),
        "{text}"
    );
}
