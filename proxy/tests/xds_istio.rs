//! Istio-shaped configuration over ADS: the 127 real sidecar listeners istiod sent in
//! `benches/data/istio-listeners.json` (origin in `benches/data/PROVENANCE.md`), with the
//! clusters and route configurations they name, pushed to revoy over Delta ADS as istiod does
//! (node metadata, `initial_fetch_timeout: 0s`). Every resource must be accepted — Istio's own
//! filters (metadata exchange, stats Wasm, ALPN) are noted, not fatal — and revoy must become
//! LIVE with every listener active. The listeners' TLS certificates (`default`, `ROOTCA`) come
//! over SDS from the `sds-grpc` static cluster, as pilot-agent serves them: as in Envoy, a
//! listener is not active (nor the server LIVE) without them.

#[path = "support/istio_listeners.rs"]
mod istio_listeners;
use istio_listeners::corpus;
use std::collections::BTreeSet;

use proto::Codec;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use serde_json::Value;
use xds_client::server::Snapshot;
use xds_client::{CLUSTER_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL, Verdict};

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/sds.rs"]
mod sds;
#[path = "support/xds.rs"]
mod xds;
use ports::free_port;
use xds::*;

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

#[test]
fn istio_sidecar_listeners_over_delta_ads_are_all_accepted() {
    let (admin, xds_port) = (free_port(), free_port());
    let plane = Plane::start(xds_port);
    let (snapshot, listeners) = istio_snapshot();
    plane.set(snapshot);
    let dir = certs::CertDir::new();
    let ca = certs::Ca::new("cluster.local");
    let sds = sds::Sds::start(dir.path(), "sds");
    sds.serve_mesh(&ca.workload("default", "productpage").issue(), &ca);
    // As pilot-agent's bootstrap: Delta ADS, the node once, Istio's node metadata.
    let yaml = ads_bootstrap(admin, xds_port, true)
        .replace(
            &format!("node: {{id: {NODE}, cluster: xds-test}}"),
            &format!(
                "node: {{id: {NODE}, cluster: productpage.default, metadata: {{ISTIO_VERSION: \"1.24.0\", CLUSTER_ID: Kubernetes, NAMESPACE: default}}}}"
            ),
        )
        .replace(
            "    api_type: DELTA_GRPC",
            "    api_type: DELTA_GRPC\n    set_node_on_first_message_only: true",
        );
    let yaml = format!("{yaml}{}", sds::sds_cluster(sds.socket()));
    assert!(yaml.contains("ISTIO_VERSION") && yaml.contains("first_message_only"));
    let _revoy = start_revoy(&yaml, admin);
    for type_url in [CLUSTER_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL] {
        assert_eq!(
            plane.verdict(type_url, "istio-1"),
            Verdict::Ack,
            "{type_url}"
        );
    }
    eventually("LIVE", || (ready(admin).0 == 200).then_some(()));
    assert_eq!(
        stat(admin, "listener_manager.total_listeners_active"),
        Some(listeners as u64)
    );
    assert_eq!(stat(admin, "listener_manager.lds.update_rejected"), Some(0));
    assert_eq!(stat(admin, "cluster_manager.cds.update_rejected"), Some(0));
    let active = dynamic_listeners(admin)
        .iter()
        .filter(|l| l.get("active_state").is_some() && l.get("error_state").is_none())
        .count();
    assert_eq!(active, listeners);
}
