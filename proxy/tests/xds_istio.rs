//! Istio-shaped configuration over ADS: the 127 real sidecar listeners istiod sent in
//! `benches/data/istio-listeners.json` (origin in `benches/data/PROVENANCE.md`), with the
//! clusters and route configurations they name, pushed to revoy over Delta ADS as istiod does
//! (node metadata, `initial_fetch_timeout: 0s`). Every resource must be accepted — Istio's own
//! filters (metadata exchange, stats Wasm, ALPN) are noted, not fatal — and revoy must become
//! LIVE with every listener active.

use std::collections::BTreeSet;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use proto::{Codec, Format};
use serde_json::Value;
use xds_client::server::{Server, Snapshot};
use xds_client::{CLUSTER_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL, Verdict};

#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/ports.rs"]
mod ports;
use child::Proxy;
use ports::free_port;

const NODE: &str = "sidecar~10.244.0.17~productpage-v1.default~default.svc.cluster.local";

/// The listeners istiod sends: the file's named ones (its two nameless ones, on 15090 and
/// 15021, are the bootstrap's static listeners, never sent over LDS).
fn corpus() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../benches/data/istio-listeners.json"
    );
    let text = std::fs::read_to_string(path).expect("the Istio listeners are in the repository");
    match Codec::parse_text(&text, Format::Json).expect("JSON") {
        Value::Array(items) => items
            .into_iter()
            .filter(|l| l.get("name").is_some())
            .collect(),
        _ => panic!("expected an array of listeners"),
    }
}

/// Every string value of `key` anywhere in `v`.
fn strings_of(v: &Value, key: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                if k == key
                    && let Value::String(s) = v
                {
                    out.insert(s.clone());
                }
                strings_of(v, key, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| strings_of(v, key, out)),
        _ => {}
    }
}

/// The listeners, those that bind moved to loopback ports of the suite's own (Istio binds
/// 15001 and 15006 on 0.0.0.0), with the clusters and route configurations they name.
fn istio_snapshot() -> (Snapshot, usize) {
    let mut listeners = corpus();
    let (mut clusters, mut routes) = (BTreeSet::new(), BTreeSet::new());
    for l in &listeners {
        strings_of(l, "cluster", &mut clusters);
        strings_of(l, "routeConfigName", &mut routes);
    }
    for l in &mut listeners {
        if l.get("bindToPort") != Some(&Value::Bool(false)) {
            l["address"] = serde_json::json!({
                "socketAddress": {"address": "127.0.0.1", "portValue": free_port()}
            });
        }
    }
    let codec = Codec::new();
    let count = listeners.len();
    let mut snapshot = Snapshot::new("istio-1");
    for l in listeners {
        let l: Listener = codec.decode(l, false).expect("listener decodes").message;
        snapshot = snapshot.with_message(l.name.clone(), &l);
    }
    for name in clusters {
        let c: Cluster = codec
            .decode(
                serde_json::json!({
                    "name": name, "type": "STATIC", "connectTimeout": "1s",
                    "loadAssignment": {"clusterName": name, "endpoints": [{"lbEndpoints": [
                        {"endpoint": {"address": {"socketAddress": {"address": "127.0.0.1", "portValue": 9}}}}
                    ]}]}
                }),
                false,
            )
            .expect("cluster decodes")
            .message;
        snapshot = snapshot.with_message(name, &c);
    }
    for name in routes {
        let rc = RouteConfiguration {
            name: name.clone(),
            ..Default::default()
        };
        snapshot = snapshot.with_message(name, &rc);
    }
    (snapshot, count)
}

fn admin(port: u16, path: &str) -> Option<(u16, String)> {
    http1::get(None, ([127, 0, 0, 1], port).into(), path).ok()
}

fn stat(port: u16, name: &str) -> Option<u64> {
    let (_, body) = admin(port, &format!("/stats?filter=^{name}$"))?;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn istio_sidecar_listeners_over_delta_ads_are_all_accepted() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let server = Server::new();
    let (addr, _task) = rt.block_on(server.serve_tcp("127.0.0.1:0")).expect("serve");
    let (snapshot, listeners) = istio_snapshot();
    server.set(snapshot);
    let admin_port = free_port();
    let yaml = format!(
        r#"
node:
  id: "{NODE}"
  cluster: productpage.default
  metadata: {{ISTIO_VERSION: "1.24.0", CLUSTER_ID: Kubernetes, NAMESPACE: default}}
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}}}
dynamic_resources:
  lds_config: {{ads: {{}}, initial_fetch_timeout: 0s, resource_api_version: V3}}
  cds_config: {{ads: {{}}, initial_fetch_timeout: 0s, resource_api_version: V3}}
  ads_config:
    api_type: DELTA_GRPC
    set_node_on_first_message_only: true
    transport_api_version: V3
    grpc_services: [{{envoy_grpc: {{cluster_name: xds-grpc}}}}]
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: xds-grpc
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]
"#,
        port = addr.port()
    );
    let _revoy = Proxy::start(&yaml, || {
        TcpStream::connect(("127.0.0.1", admin_port)).is_ok()
    });
    for type_url in [CLUSTER_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL] {
        let verdict = rt.block_on(server.acked(NODE, type_url, "istio-1", Duration::from_secs(30)));
        assert_eq!(verdict, Some(Verdict::Ack), "{type_url}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin(admin_port, "/ready").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "revoy never became LIVE");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        stat(admin_port, "listener_manager.total_listeners_active"),
        Some(listeners as u64)
    );
    assert_eq!(
        stat(admin_port, "listener_manager.lds.update_rejected"),
        Some(0)
    );
    assert_eq!(
        stat(admin_port, "cluster_manager.cds.update_rejected"),
        Some(0)
    );
    let (_, dump) = admin(admin_port, "/config_dump?resource=dynamic_listeners").expect("dump");
    let dump: Value = serde_json::from_str(&dump).expect("JSON");
    let active = dump["configs"]
        .as_array()
        .expect("configs")
        .iter()
        .filter(|l| l.get("active_state").is_some() && l.get("error_state").is_none())
        .count();
    assert_eq!(active, listeners);
}
