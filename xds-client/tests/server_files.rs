//! Snapshots loaded from a directory, and reloads when it changes.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::service::discovery::v3::DiscoveryResponse;
use xds_client::server::Server;
use xds_client::server::files::{self, LoadError};
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL};

/// A fresh directory under the system's temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("revoy-xds-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.0.join(file), text).unwrap();
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const LISTENER_YAML: &str = r#"
resources:
- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: main
  address: {socket_address: {address: 127.0.0.1, port_value: 10000}}
- "@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
  name: local_route
  virtual_hosts:
  - name: all
    domains: ["*"]
    routes:
    - match: {prefix: "/"}
      direct_response: {status: 200}
"#;

const CLUSTER_JSON: &str = r#"{
  "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
  "name": "backend",
  "connect_timeout": "1s",
  "type": "EDS",
  "eds_cluster_config": {"eds_config": {"ads": {}}}
}"#;

fn cluster_yaml(timeout: &str) -> String {
    format!(
        "resources:\n- \"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: other\n  connect_timeout: {timeout}\n"
    )
}

const ENDPOINTS_YML: &str = r#"
resources:
- "@type": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment
  cluster_name: backend
  endpoints:
  - lb_endpoints:
    - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 8080}}}
      metadata: {filter_metadata: {istio: {workload: a, namespace: b, canonical: c, revision: d, version: e, cluster: f}, envoy.lb: {zone: z, rack: r}}}
"#;

#[test]
fn a_directory_loads_into_one_snapshot_versioned_by_content() {
    let dir = TempDir::new("good");
    dir.write("a.yaml", LISTENER_YAML);
    dir.write("b.json", CLUSTER_JSON);
    dir.write("c.yml", ENDPOINTS_YML);
    dir.write("README.txt", "not a resource");
    let snapshot = files::load_dir(dir.path()).unwrap();
    let names = |t: &str| snapshot.resources(t).keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(LISTENER_TYPE_URL), ["main"]);
    assert_eq!(names(ROUTE_TYPE_URL), ["local_route"]);
    assert_eq!(names(CLUSTER_TYPE_URL), ["backend"]);
    assert_eq!(names(ENDPOINT_TYPE_URL), ["backend"]);
    let any = &snapshot.resources(LISTENER_TYPE_URL)["main"].any;
    let l: Listener = proto::unpack(any).unwrap();
    let addr = format!("{:?}", l.address);
    assert!(addr.contains("PortValue(10000)"), "{addr}");
    assert!(!snapshot.version().is_empty());
    // Loaded again, unchanged files give the same versions, maps (metadata) included.
    for _ in 0..3 {
        let again = files::load_dir(dir.path()).unwrap();
        assert_eq!(again.version(), snapshot.version());
        assert_eq!(
            again.resources(ENDPOINT_TYPE_URL)["backend"].version,
            snapshot.resources(ENDPOINT_TYPE_URL)["backend"].version
        );
    }
    dir.write("d.yaml", &cluster_yaml("2s"));
    assert_ne!(
        files::load_dir(dir.path()).unwrap().version(),
        snapshot.version()
    );
}

#[test]
fn a_bad_field_names_its_file_and_path() {
    let dir = TempDir::new("bad");
    dir.write("a.yaml", LISTENER_YAML);
    dir.write(
        "bad.yaml",
        "resources:\n- \"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\n  name: x\n  connect_timeout: soon\n",
    );
    let err = files::load_dir(dir.path()).unwrap_err();
    let text = err.to_string();
    match &err {
        LoadError::Resource { file, path, .. } => {
            assert!(file.ends_with("bad.yaml"), "{text}");
            assert_eq!(path, "resources[0].connect_timeout", "{text}");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(
        text.contains("bad.yaml: resources[0].connect_timeout"),
        "{text}"
    );
}

#[test]
fn unknown_types_missing_names_and_bad_shapes_are_errors() {
    let dir = TempDir::new("shapes");
    dir.write(
        "a.yaml",
        "resources:\n- {\"@type\": type.googleapis.com/acme.Nothing, name: x}\n",
    );
    let text = files::load_dir(dir.path()).unwrap_err().to_string();
    assert!(
        text.contains("a.yaml: resources[0].@type: unknown type"),
        "{text}"
    );
    dir.write(
        "a.yaml",
        "resources:\n- {\"@type\": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment, name: x}\n",
    );
    let text = files::load_dir(dir.path()).unwrap_err().to_string();
    assert!(
        text.contains("a.yaml: resources[0].cluster_name: missing"),
        "{text}"
    );
    dir.write("a.yaml", "- 1\n- 2\n");
    let err = files::load_dir(dir.path()).unwrap_err();
    assert!(matches!(err, LoadError::Shape { .. }), "{err:?}");
}

#[test]
fn a_name_defined_in_two_files_names_both() {
    let dir = TempDir::new("dup");
    dir.write("one.json", CLUSTER_JSON);
    dir.write("two.yaml", &CLUSTER_JSON.replace("\"EDS\"", "\"STATIC\""));
    let err = files::load_dir(dir.path()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LoadError::Duplicate { .. }), "{err:?}");
    assert!(
        text.contains("one.json") && text.contains("two.yaml"),
        "{text}"
    );
    assert!(text.contains("`backend`"), "{text}");
}

/// A server of `dir` watching it, and a client that asked it for clusters and acknowledged
/// the first answer (returned last).
async fn watched(dir: &TempDir) -> (Server, files::DirWatch, Sotw, DiscoveryResponse) {
    let (server, addr) = start(Some(files::load_dir(dir.path()).unwrap())).await;
    let watch = files::watch(dir.path(), server.clone()).unwrap();
    let mut c = Sotw::connect(addr, "w").await;
    c.request(CLUSTER_TYPE_URL, &[], "", "", None).await;
    let first = c.recv().await;
    c.ack(&first, &[]).await;
    (server, watch, c, first)
}

#[tokio::test]
async fn a_change_is_reloaded_and_a_bad_one_keeps_the_previous_snapshot() {
    let dir = TempDir::new("watch");
    dir.write("c.yaml", &cluster_yaml("1s"));
    let (server, _watch, mut c, r1) = watched(&dir).await;

    dir.write("c.yaml", &cluster_yaml("3s"));
    let r2 = c.recv().await;
    assert_ne!(r2.version_info, r1.version_info);
    assert_eq!(r2.version_info, server.snapshot().unwrap().version());
    c.ack(&r2, &[]).await;

    dir.write("c.yaml", &cluster_yaml("later"));
    tokio::time::sleep(files::DEBOUNCE + Duration::from_millis(500)).await;
    c.nothing().await;
    assert_eq!(server.snapshot().unwrap().version(), r2.version_info);

    dir.write("c.yaml", &cluster_yaml("4s"));
    let r3 = c.recv().await;
    assert_ne!(r3.version_info, r2.version_info);
}

/// A cluster with istiod's `istio` metadata: a `google.protobuf.Struct`, whose map is encoded
/// in no fixed order, so each load of it may get another version.
const CLUSTER_WITH_METADATA: &str = r#"
resources:
- "@type": type.googleapis.com/envoy.config.cluster.v3.Cluster
  name: meta
  connect_timeout: 1s
  metadata:
    filter_metadata:
      istio:
        a: 1
        b: 2
        c: 3
        d: 4
        e: 5
        f: 6
"#;

#[tokio::test]
async fn reading_the_directory_is_no_change() {
    let dir = TempDir::new("reads");
    dir.write("c.yaml", CLUSTER_WITH_METADATA);
    let (server, _watch, mut c, r1) = watched(&dir).await;

    dir.write("c.yaml", &CLUSTER_WITH_METADATA.replace("1s", "2s"));
    let r2 = c.recv().await;
    assert_ne!(r2.version_info, r1.version_info);
    c.ack(&r2, &[]).await;
    // The reload read every file, and so does anyone else reading the directory: no reload
    // follows (each would push the cluster again under a new version).
    std::fs::read_to_string(dir.path().join("c.yaml")).unwrap();
    tokio::time::sleep(files::DEBOUNCE * 3).await;
    c.nothing().await;
    assert_eq!(server.snapshot().unwrap().version(), r2.version_info);
}
