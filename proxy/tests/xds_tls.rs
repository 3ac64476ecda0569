//! ADS over TLS: a proxy whose xDS cluster has an `UpstreamTlsContext` (as one reaching
//! istiod's 15012 directly) verifies the control plane's certificate and gets its config over
//! the TLS stream; against a control plane whose certificate its CA did not sign, it never
//! goes LIVE and counts the failure in `cluster.xds-grpc.ssl.fail_verify_error`.
//!
//! The control plane is the repo's snapshot server in plaintext behind a first revoy that
//! terminates TLS in front of tcp_proxy (with `h2` ALPN), so both TLS ends are revoy's.
//!
//! SDS over ADS (`sds_config: {ads: {}}`): a static listener's certificate comes from the ADS
//! server and rotates with it, in revoy as in Envoy 1.40.
//!
//! SDS from files (`path_config_source`): a file renamed over (revoy and Envoy 1.40) and a
//! Kubernetes-style symlink swap (`..data` pointed at a new directory) change the certificate
//! of new handshakes.
//!
//! Also: with `dynamic_resources`, start-up waits for the static listeners' SDS secrets as
//! well as for the initial xDS configuration; and a static listener whose secret outlasts its
//! `initial_fetch_timeout` is not bound until the secret comes (unlike Envoy, #47309).

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/https.rs"]
mod https;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/sds.rs"]
mod sds;
#[path = "support/skip.rs"]
mod skip;
#[path = "support/xds.rs"]
mod xds;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use certs::{Ca, CertDir};
use ports::free_port;
use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::listener::v3::Listener;
use sds::{Sds, sds_cluster, sds_config};
use xds::{
    NODE, Plane, admin_get, ads_bootstrap, body_of, eventually, inline_listener, ready, refused,
    start_revoy, stat,
};
use xds_client::server::Snapshot;
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL};

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "{name: r, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// A revoy terminating TLS on `port` (certificate for `xds.test`, ALPN `h2`) and passing the
/// bytes to the plaintext control plane on `plane`.
fn tls_front(admin: u16, port: u16, plane: u16, dir: &Path, ca: &Ca) -> child::Proxy {
    let files = ca.server(&["xds.test"]).issue().write_to(dir, "xds");
    let yaml = format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: xds-tls
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            alpn_protocols: [h2]
            tls_certificates: [{{certificate_chain: {{filename: {chain}}}, private_key: {{filename: {key}}}}}]
      filters:
      - name: tcp
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: xds
          cluster: plane
  clusters:
  - name: plane
    type: STATIC
    connect_timeout: 1s
    load_assignment: {{cluster_name: plane, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {plane}}}}}}}}}]}}]}}
"#,
        chain = files.chain.display(),
        key = files.key.display(),
    );
    start_revoy(&yaml, admin)
}

/// An ADS bootstrap whose `xds-grpc` cluster speaks TLS to `port`, trusting `ca_file` and
/// requiring the DNS SAN `xds.test`.
fn ads_over_tls(admin: u16, port: u16, ca_file: &Path) -> String {
    format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
node: {{id: {node}, cluster: xds-test}}
dynamic_resources:
  lds_config: {{ads: {{}}, initial_fetch_timeout: 0s, resource_api_version: V3}}
  cds_config: {{ads: {{}}, initial_fetch_timeout: 0s, resource_api_version: V3}}
  ads_config:
    api_type: GRPC
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
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: xds.test
        common_tls_context:
          validation_context:
            trusted_ca: {{filename: {ca}}}
            match_typed_subject_alt_names: [{{san_type: DNS, matcher: {{exact: xds.test}}}}]
    load_assignment: {{cluster_name: xds-grpc, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}
"#,
        node = xds::NODE,
        ca = ca_file.display(),
    )
}

/// Starts revoy without waiting for it to be ready (a proxy that never reaches its control
/// plane answers /ready 503, which is what the failing case looks at).
fn start_unready(yaml: &str, admin: u16) -> child::Proxy {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_revoy"));
    command.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"]);
    child::Proxy::spawn(command, || {
        http1::get(None, ([127, 0, 0, 1], admin).into(), "/server_info").is_ok()
    })
}

#[test]
fn ads_over_tls_verifies_the_control_plane() {
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    let ca_file = ca.write_root_to(dir.path(), "ca");
    let plane = Plane::start(free_port());
    let app = free_port();
    plane.set(Snapshot::new("1").with_message(
        "app",
        &inline_listener(
            "app",
            app,
            "[{match: {prefix: /}, direct_response: {status: 200, body: {inline_string: over-tls}}}]",
        ),
    ));
    let (front_admin, front) = (free_port(), free_port());
    let _front = tls_front(front_admin, front, plane.port, dir.path(), &ca);

    let admin = free_port();
    let _revoy = start_revoy(&ads_over_tls(admin, front, &ca_file), admin);
    let body = eventually("the listener pushed over TLS", || body_of(app));
    assert_eq!(body, "over-tls");
    assert!(stat(admin, "cluster.xds-grpc.ssl.handshake").is_some_and(|n| n >= 1));
    assert_eq!(stat(admin, "control_plane.connected_state"), Some(1));

    // A proxy trusting another CA refuses the control plane's certificate: no config, not LIVE.
    let other = Ca::new("other.local").write_root_to(dir.path(), "other");
    let admin = free_port();
    let _refusing = start_unready(&ads_over_tls(admin, front, &other), admin);
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(admin, "cluster.xds-grpc.ssl.fail_verify_error").unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "no verification failure counted");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = admin_get(admin, "/ready");
    assert_eq!((status, body.trim()), (503, "PRE_INITIALIZING"));
    assert_eq!(stat(admin, "control_plane.connected_state"), Some(0));
}

/// A listener `tls` on `port` whose certificate comes over SDS (`secret`: its
/// `SdsSecretConfig`) and whose route answers `body`, in flow-style YAML.
fn tls_listener(port: u16, secret: &str, body: &str) -> String {
    named_tls_listener("tls", port, secret, body)
}

/// [`tls_listener`] named `name` (its stat prefix too).
fn named_tls_listener(name: &str, port: u16, secret: &str, body: &str) -> String {
    format!(
        "{{name: {name}, address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}, \
         filter_chains: [{{transport_socket: {{name: envoy.transport_sockets.tls, typed_config: \
         {{\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext, \
         common_tls_context: {{tls_certificate_sds_secret_configs: [{secret}]}}}}}}, \
         filters: [{{name: hcm, typed_config: {{\"@type\": {HCM}, stat_prefix: {name}, http_filters: [{ROUTER}], \
         route_config: {{virtual_hosts: [{{name: all, domains: [\"*\"], routes: [{{match: {{prefix: /}}, \
         direct_response: {{status: 200, body: {{inline_string: {body}}}}}}}]}}]}}}}}}]}}]}}"
    )
}

/// [`tls_listener`] as the bootstrap's `static_resources.listeners`.
fn sds_listener(port: u16, secret: &str, body: &str) -> String {
    format!("\n  listeners:\n  - {}\n", tls_listener(port, secret, body))
}

/// Unlike Envoy (#47309: it binds the listener and closes each connection unanswered), a static
/// listener whose SDS certificate has not come when its `initial_fetch_timeout` (1 s) passes
/// is not bound: the server goes LIVE for the rest, and a connection to the listener's port is
/// refused (nothing listens there, so the kernel answers the SYN with a reset: no TLS
/// handshake can begin). Once the secret is served the listener is bound and serves HTTPS
/// with it.
#[test]
fn static_listener_is_not_bound_until_its_late_secret_comes() {
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    ca.write_root_to(dir.path(), "root");
    let sds = Sds::start(dir.path(), "sds");
    let (admin, port) = (free_port(), free_port());
    let secret =
        sds_config("default").replace("initial_fetch_timeout: 0s", "initial_fetch_timeout: 1s");
    let yaml = format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         node: {{id: {NODE}, cluster: xds-test}}\n\
         static_resources:\n  clusters:{sds_cluster}{listener}",
        sds_cluster = sds_cluster(sds.socket()),
        listener = sds_listener(port, &secret, "late"),
    );
    let _revoy = start_unready(&yaml, admin);
    live_but_refused(admin, port);

    let issued = ca.server(&["late.test"]).issue();
    let version = sds.put(&[sds::certificate("default", &issued)]);
    sds.ack(NODE, &version);
    served_with(port, dir.path(), "late.test", "late", &issued);
}

/// Waits until the proxy with admin `admin` is LIVE (its warming timed out), then checks that
/// its listener on `port` is not bound.
fn live_but_refused(admin: u16, port: u16) {
    eventually("LIVE after the initial_fetch_timeout", || {
        (ready(admin).0 == 200).then_some(())
    });
    assert!(
        refused(port),
        "the listener is bound without its certificate"
    );
}

/// Waits until HTTPS to `port` for `sni` (trusting `<dir>/root.pem`) answers 200 with `body`,
/// presenting `issued`.
fn served_with(port: u16, dir: &Path, sni: &str, body: &str, issued: &certs::Issued) {
    let config = Arc::new(certs::client_config(dir, None));
    let answer = eventually("HTTPS with the certificate that came", || {
        https::get(port, &config, sni, "/").ok()
    });
    assert_eq!((answer.status, answer.body.as_str()), (200, body));
    assert_eq!(answer.certificate, issued.cert_der);
}

/// Envoy's init manager: a bootstrap with `dynamic_resources` and a static TLS listener whose
/// certificate comes over SDS is not LIVE once the initial xDS configuration is in while the
/// certificate is not; the listener is bound, and the server LIVE, when it arrives.
#[test]
fn live_waits_for_static_listener_secrets_with_dynamic_resources() {
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    let sds = Sds::start(dir.path(), "sds");
    let plane = Plane::start(free_port());
    plane.set(Snapshot::new("1"));
    let (admin, port) = (free_port(), free_port());
    let yaml = format!(
        "{}{}{}",
        ads_bootstrap(admin, plane.port, false),
        sds_cluster(sds.socket()),
        sds_listener(port, &sds_config("default"), "ok"),
    );
    let _revoy = start_unready(&yaml, admin);
    plane.ack(LISTENER_TYPE_URL, "1");
    // The initial xDS configuration is applied; the static listener still waits.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(ready(admin), (503, "INITIALIZING".to_owned()));
    assert!(
        refused(port),
        "the listener is bound without its certificate"
    );

    let version = sds.put(&[sds::certificate("default", &ca.server(&["a.test"]).issue())]);
    sds.ack(NODE, &version);
    eventually("LIVE", || (ready(admin).0 == 200).then_some(()));
    assert!(
        !refused(port),
        "the listener is not bound with its certificate"
    );
}

/// xDS resources waiting for their SDS secrets (from the `sds-grpc` cluster), as Envoy warms
/// them: a listener from the initial LDS response whose certificate has not come when its SDS
/// `initial_fetch_timeout` (1 s) passes is not bound (refused, unlike Envoy's #47309), while
/// the server goes LIVE and a plain listener routing to cluster `tls-up` serves; `tls-up`, an
/// EDS cluster added later whose validation context (`ROOTCA`) has not come, warms with its
/// endpoints in hand and is not used (the plain listener answers 503 as for no cluster), and
/// takes the assignment that replaces them meanwhile. Once both secrets are served, the TLS
/// listener serves HTTPS and `tls-up` reaches it over TLS at its latest endpoint.
#[test]
fn xds_listener_and_cluster_wait_for_their_secrets() {
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    ca.write_root_to(dir.path(), "root");
    let sds = Sds::start(dir.path(), "sds");
    let plane = Plane::start(free_port());
    let (admin, port, front) = (free_port(), free_port(), free_port());
    let certificate =
        sds_config("default").replace("initial_fetch_timeout: 0s", "initial_fetch_timeout: 1s");
    let listener = xds::decode::<Listener>(&tls_listener(port, &certificate, "warmed"));
    // `validate_clusters: false`: the route names `tls-up` before CDS has it.
    let plain = xds::listener_with(
        "front",
        front,
        &format!(
            "stat_prefix: front\nroute_config: {{validate_clusters: false, virtual_hosts: \
             [{{name: all, domains: [\"*\"], routes: {}}}]}}",
            xds::to_cluster("tls-up")
        ),
    );
    let snapshot = |version: &str| {
        Snapshot::new(version)
            .with_message("front", &plain)
            .with_message("tls", &listener)
    };
    plane.set(snapshot("1"));
    let yaml = format!(
        "{}{}",
        ads_bootstrap(admin, plane.port, false),
        sds_cluster(sds.socket()),
    );
    let _revoy = start_unready(&yaml, admin);
    live_but_refused(admin, port);
    assert_eq!(
        stat(admin, "listener_manager.total_listeners_warming"),
        Some(1)
    );
    assert_eq!(xds::get(front, "/").map(|r| r.status), Ok(503));

    let cluster = xds::decode::<Cluster>(&format!(
        "{{name: tls-up, type: EDS, connect_timeout: 1s, eds_cluster_config: {{eds_config: \
         {{ads: {{}}, resource_api_version: V3}}}}, \
         transport_socket: {{name: envoy.transport_sockets.tls, typed_config: \
         {{\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, \
         sni: warmed.test, common_tls_context: {{validation_context_sds_secret_config: {}}}}}}}}}",
        sds_config("ROOTCA")
    ));
    // First an endpoint where nothing listens, then, while the secret is awaited, the TLS
    // listener.
    let nothing = free_port();
    plane.set(
        snapshot("2")
            .with_message("tls-up", &cluster)
            .with_message("tls-up", &xds::assignment("tls-up", nothing)),
    );
    plane.ack(CLUSTER_TYPE_URL, "2");
    plane.ack(ENDPOINT_TYPE_URL, "2");
    assert_eq!(stat(admin, "cluster_manager.warming_clusters"), Some(1));
    plane.set(
        snapshot("3")
            .with_message("tls-up", &cluster)
            .with_message("tls-up", &xds::assignment("tls-up", port)),
    );
    plane.ack(ENDPOINT_TYPE_URL, "3");
    assert_eq!(stat(admin, "cluster_manager.warming_clusters"), Some(1));
    assert_eq!(xds::get(front, "/").map(|r| r.status), Ok(503));
    assert!(
        refused(port),
        "the listener is active without its certificate"
    );

    let issued = ca.server(&["warmed.test"]).issue();
    let version = sds.put(&[
        sds::certificate("default", &issued),
        sds::trust("ROOTCA", ca.root_pem()),
    ]);
    sds.ack(NODE, &version);
    served_with(port, dir.path(), "warmed.test", "warmed", &issued);
    let body = eventually("tls-up used once its validation context came", || {
        xds::get(front, "/").ok().filter(|r| r.status == 200)
    });
    assert_eq!(body.body, "warmed");
    assert_eq!(stat(admin, "cluster_manager.warming_clusters"), Some(0));
    assert_eq!(
        stat(admin, "listener_manager.total_listeners_warming"),
        Some(0)
    );
}

/// An EDS cluster moving to another service with TLS (plaintext to mTLS, as a mesh
/// migration does): while the new version awaits its validation context, the version serving
/// keeps its own endpoints, as each of Envoy's cluster versions has its own EDS subscription;
/// the new service's endpoints are never reached in plaintext.
#[test]
fn a_cluster_version_awaiting_its_secrets_leaves_the_serving_one_its_endpoints() {
    let dir = CertDir::new();
    let sds = Sds::start(dir.path(), "sds");
    let plane = Plane::start(free_port());
    let (admin, front, nothing) = (free_port(), free_port(), free_port());
    let a = xds::upstream("upstream-a");
    let plain = xds::eds_cluster("svc");
    let tls = xds::decode::<Cluster>(&format!(
        "{{name: svc, type: EDS, connect_timeout: 1s, eds_cluster_config: {{service_name: svc-tls, \
         eds_config: {{ads: {{}}, resource_api_version: V3}}}}, \
         transport_socket: {{name: envoy.transport_sockets.tls, typed_config: \
         {{\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, \
         common_tls_context: {{validation_context_sds_secret_config: {}}}}}}}}}",
        sds_config("ROOTCA")
    ));
    let base = |version: &str| {
        Snapshot::new(version)
            .with_message("svc", &xds::assignment("svc", a))
            .with_message(
                "front",
                &inline_listener("front", front, &xds::to_cluster("svc")),
            )
    };
    plane.set(base("1").with_message("svc", &plain));
    let yaml = format!(
        "{}{}",
        ads_bootstrap(admin, plane.port, false),
        sds_cluster(sds.socket()),
    );
    let _revoy = start_unready(&yaml, admin);
    eventually("LIVE", || (ready(admin).0 == 200).then_some(()));
    assert_eq!(body_of(front).as_deref(), Some("upstream-a"));

    plane.set(
        base("2")
            .with_message("svc", &tls)
            .with_message("svc-tls", &xds::assignment("svc-tls", nothing)),
    );
    plane.ack(CLUSTER_TYPE_URL, "2");
    plane.ack(ENDPOINT_TYPE_URL, "2");
    assert_eq!(stat(admin, "cluster_manager.warming_clusters"), Some(1));
    assert_eq!(body_of(front).as_deref(), Some("upstream-a"));
}

/// `sds_config: {ads: {}}`: a static listener's certificate `edge` comes over the ADS stream;
/// served HTTPS presents it, and once the control plane serves a new one, new handshakes
/// present that. Envoy 1.40 on the same bootstrap and control plane does the same.
#[test]
fn sds_over_ads_serves_and_rotates_the_certificate() {
    envoy_then_revoy(
        "sds_over_ads_serves_and_rotates_the_certificate",
        |who, envoy, dir, ca, _| {
            let secret = "{name: edge, sds_config: {ads: {}, resource_api_version: V3}}";
            let plane = Plane::start(free_port());
            let first = ca.server(&["edge.test"]).issue();
            plane.set(Snapshot::new("1").with_message("edge", &sds::certificate("edge", &first)));
            let bootstrap = |admin, port| {
                format!(
                    "{}{}",
                    ads_h2_bootstrap(admin, plane.port),
                    sds_listener(port, secret, "edge"),
                )
            };
            rotates(who, envoy, dir, bootstrap, &first, || {
                let second = ca.server(&["edge.test"]).issue();
                plane.set(
                    Snapshot::new("2").with_message("edge", &sds::certificate("edge", &second)),
                );
                second
            });
        },
    );
}

/// The `path_config_source` file of secret `name`: a `DiscoveryResponse` with a
/// `tls_certificate` whose chain and key are the files `chain` and `key`.
fn sds_file(name: &str, chain: &Path, key: &Path) -> String {
    format!(
        "version_info: v1\nresources:\n\
         - \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  \
         name: {name}\n  tls_certificate: {{certificate_chain: {{filename: {}}}, private_key: {{filename: {}}}}}\n",
        chain.display(),
        key.display()
    )
}

/// SDS from a file renamed over (the new one written beside it first): new handshakes present
/// the certificate of the new file, in revoy as in Envoy 1.40.
#[test]
fn sds_file_renamed_over_changes_the_certificate() {
    envoy_then_revoy(
        "sds_file_renamed_over_changes_the_certificate",
        |who, envoy, dir, ca, run| {
            let file = dir.join(format!("edge-sds-{run}.yaml"));
            let issue = |round: usize| {
                let issued = ca.server(&["edge.test"]).issue();
                let files = issued.write_to(dir, &format!("edge-{run}-{round}"));
                let staged = dir.join("staged.yaml");
                std::fs::write(&staged, sds_file("edge", &files.chain, &files.key)).expect("write");
                std::fs::rename(&staged, &file).expect("rename over the SDS file");
                issued
            };
            let first = issue(1);
            let secret = format!(
                "{{name: edge, sds_config: {{path_config_source: {{path: {}}}}}}}",
                file.display()
            );
            let bootstrap = |admin, port| sds_bootstrap(admin, port, &secret);
            rotates(who, envoy, dir, bootstrap, &first, || issue(2));
        },
    );
}

/// An SDS file must hold exactly the one secret read from it, as Envoy's SDS requires
/// (`Unexpected SDS secrets length: 2`, `Unexpected SDS secret (expecting edge): other`):
/// while it holds `edge` and another secret, or only another, no handshake gets a
/// certificate from it; once it holds `edge` alone, new handshakes present it — in revoy as in
/// Envoy 1.40.
#[test]
fn sds_file_must_hold_exactly_its_one_secret() {
    envoy_then_revoy(
        "sds_file_must_hold_exactly_its_one_secret",
        |who, envoy, dir, ca, run| {
            let file = dir.join(format!("edge-one-{run}.yaml"));
            let put = |text: &str| {
                let staged = dir.join("staged.yaml");
                std::fs::write(&staged, text).expect("write");
                std::fs::rename(&staged, &file).expect("rename over the SDS file");
            };
            let issued = ca.server(&["edge.test"]).issue();
            let other = inline_sds_file("other", &issued);
            let other_item = other.split_once("resources:\n").expect("an item").1;
            put(&format!("{}{other_item}", inline_sds_file("edge", &issued)));
            let secret = format!(
                "{{name: edge, sds_config: {{path_config_source: {{path: {}}}}}}}",
                file.display()
            );
            let config = Arc::new(certs::client_config(dir, None));
            let (admin, port) = (free_port(), free_port());
            let yaml = sds_bootstrap(admin, port, &secret);
            let _proxy = match envoy {
                Some(envoy) => child::Proxy::envoy_with_admin(envoy, &yaml, admin),
                None => child::Proxy::with_admin(&yaml, admin),
            };
            let refused = |what: &str| {
                let deadline = Instant::now() + Duration::from_millis(1500);
                while Instant::now() < deadline {
                    let answer = https::get(port, &config, "edge.test", "/");
                    assert!(answer.is_err(), "{who}: HTTPS answered while {what}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            };
            refused("the file held two secrets");
            put(&other);
            refused("the file held another secret");
            put(&inline_sds_file("edge", &issued));
            let answer = eventually(&format!("{who}: HTTPS once the file holds edge"), || {
                https::get(port, &config, "edge.test", "/").ok()
            });
            assert_eq!(answer.certificate, issued.cert_der, "{who}");
        },
    );
}

/// [`ads_bootstrap`] (state of the world) whose `xds-grpc` cluster says HTTP/2, as Envoy's gRPC
/// client needs.
fn ads_h2_bootstrap(admin: u16, plane: u16) -> String {
    ads_bootstrap(admin, plane, false).replace(
        "    load_assignment: {cluster_name: xds-grpc",
        "    typed_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: \
         {\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, \
         explicit_http_config: {http2_protocol_options: {}}}}\n    load_assignment: {cluster_name: xds-grpc",
    )
}

/// A directory mounted as Kubernetes mounts a Secret or ConfigMap: each file is a symlink
/// through `..data` to a timestamped directory, and an update writes a new directory and points
/// `..data` at it (a symlink renamed over it), so the files' own directory sees one move.
struct KubeMount {
    dir: std::path::PathBuf,
    versions: usize,
}

impl KubeMount {
    /// The mount `<parent>/<name>`, holding `files` (name, content).
    fn new(parent: &Path, name: &str, files: &[(&str, &str)]) -> KubeMount {
        let dir = parent.join(name);
        std::fs::create_dir(&dir).expect("mount dir");
        let mut mount = KubeMount { dir, versions: 0 };
        mount.update(files);
        for (file, _) in files {
            std::os::unix::fs::symlink(Path::new("..data").join(file), mount.dir.join(file))
                .expect("symlink");
        }
        mount
    }

    /// Swaps in a version holding `files`.
    fn update(&mut self, files: &[(&str, &str)]) {
        self.versions += 1;
        let data = self.dir.join(format!("..2026_12_03_{:02}", self.versions));
        std::fs::create_dir(&data).expect("data dir");
        for (file, content) in files {
            std::fs::write(data.join(file), content).expect("mounted file");
        }
        let link = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(data.file_name().expect("name"), &link).expect("..data_tmp");
        std::fs::rename(&link, self.dir.join("..data")).expect("swap ..data");
    }

    /// The path of the mounted `file`.
    fn path(&self, file: &str) -> std::path::PathBuf {
        self.dir.join(file)
    }
}

/// SDS from a Kubernetes-mounted secret: `sds.yaml`, `cert.pem` and `key.pem` are symlinks
/// through `..data` to a timestamped directory, and an update points `..data` at a new one
/// (a symlink renamed over it). `sds.yaml` reads the same before and after, naming the same
/// paths; new handshakes present the new certificate. Not compared with Envoy (the issue
/// cites envoyproxy/envoy#39498 about such swaps).
#[test]
fn sds_file_kubernetes_symlink_swap_changes_the_certificate() {
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    ca.write_root_to(dir.path(), "root");
    let sds_path = dir.path().join("mount");
    let sds = sds_file(
        "edge",
        &sds_path.join("cert.pem"),
        &sds_path.join("key.pem"),
    );
    let first = ca.server(&["edge.test"]).issue();
    let mut mount = KubeMount::new(
        dir.path(),
        "mount",
        &[
            ("sds.yaml", &sds),
            ("cert.pem", &first.chain_pem),
            ("key.pem", &first.key_pem),
        ],
    );
    let config = Arc::new(certs::client_config(dir.path(), None));
    let (admin, port) = (free_port(), free_port());
    let secret = format!(
        "{{name: edge, sds_config: {{path_config_source: {{path: {}}}}}}}",
        mount.path("sds.yaml").display()
    );
    let yaml = format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         static_resources:{}",
        sds_listener(port, &secret, "edge")
    );
    let _revoy = start_revoy(&yaml, admin);
    let answer = eventually("HTTPS with the mounted certificate", || {
        https::get(port, &config, "edge.test", "/").ok()
    });
    assert_eq!(answer.certificate, first.cert_der);

    let second = ca.server(&["edge.test"]).issue();
    mount.update(&[
        ("sds.yaml", &sds),
        ("cert.pem", &second.chain_pem),
        ("key.pem", &second.key_pem),
    ]);
    eventually("HTTPS with the swapped-in certificate", || {
        https::get(port, &config, "edge.test", "/")
            .ok()
            .filter(|a| a.status == 200 && a.certificate == second.cert_der)
    });
}

/// The `path_config_source` file of secret `name` with the issued chain and key inline.
fn inline_sds_file(name: &str, issued: &certs::Issued) -> String {
    format!(
        "version_info: v1\nresources:\n\
         - \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  \
         name: {name}\n  tls_certificate: {{certificate_chain: {{inline_string: {}}}, private_key: {{inline_string: {}}}}}\n",
        serde_json::to_string(&issued.chain_pem).expect("JSON string"),
        serde_json::to_string(&issued.key_pem).expect("JSON string"),
    )
}

/// A bootstrap with admin on `admin` and a static HTTPS listener on `port` whose certificate
/// is the SDS secret `edge` (`secret`: its `SdsSecretConfig`), answering `edge`.
fn sds_bootstrap(admin: u16, port: u16, secret: &str) -> String {
    format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         node: {{id: {NODE}, cluster: xds-test}}\n\
         static_resources:{}",
        sds_listener(port, secret, "edge")
    )
}

/// Runs revoy or Envoy on `bootstrap(admin, port)`, whose HTTPS listener on `port` answers
/// `edge` with the SDS secret `edge`; checks that it presents `first`, calls `rotate`, and
/// waits until new handshakes present what it returns, while a connection made before still
/// serves.
fn rotates(
    who: &str,
    envoy: Option<&Path>,
    dir: &Path,
    bootstrap: impl FnOnce(u16, u16) -> String,
    first: &certs::Issued,
    rotate: impl FnOnce() -> certs::Issued,
) {
    let config = Arc::new(certs::client_config(dir, None));
    let (admin, port) = (free_port(), free_port());
    let yaml = bootstrap(admin, port);
    let _proxy = child::Proxy::serving(envoy, &yaml, admin, port);
    let answer = eventually(&format!("{who}: HTTPS with the first certificate"), || {
        https::get(port, &config, "edge.test", "/").ok()
    });
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, "edge"),
        "{who}"
    );
    assert_eq!(
        answer.certificate, first.cert_der,
        "{who}: the first certificate"
    );
    let mut held = https::connect(port, &config, "edge.test").expect("a connection held");
    let second = rotate();
    eventually(
        &format!("{who}: HTTPS with the rotated certificate"),
        || {
            https::get(port, &config, "edge.test", "/")
                .ok()
                .filter(|a| a.status == 200 && a.certificate == second.cert_der)
        },
    );
    // The connection made before the rotation still serves.
    use std::io::{Read, Write};
    held.write_all(b"GET / HTTP/1.1\r\nhost: edge.test\r\n\r\n")
        .expect("a request on the held connection");
    let mut raw = Vec::new();
    let mut chunk = [0u8; 1024];
    while !raw.ends_with(b"edge") {
        let n = held.read(&mut chunk).expect("the held connection answers");
        assert!(n > 0, "{who}: the held connection closed");
        raw.extend_from_slice(&chunk[..n]);
    }
    assert!(raw.starts_with(b"HTTP/1.1 200"), "{who}");
}

/// Runs `case` with Envoy 1.40 (when there is one), then with revoy: it gets who runs, the
/// Envoy binary (`None`: revoy), a directory holding the CA's `root.pem`, the CA, and the run's
/// number (for names of its own).
fn envoy_then_revoy(test: &str, mut case: impl FnMut(&str, Option<&Path>, &Path, &Ca, usize)) {
    let envoy = oracle::envoy_or_skip(test);
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    ca.write_root_to(dir.path(), "root");
    if let Some(envoy) = &envoy {
        case("Envoy", Some(envoy), dir.path(), &ca, 1);
    }
    case("revoy", None, dir.path(), &ca, 2);
}

/// `path_config_source.watched_directory` and `poll_interval`: the SDS file is reached through
/// a symlink in a directory of its own (`links/sds.yaml`, relative, to `sds.yaml` in the
/// sibling directory `mount`) and `mount` is a Kubernetes ConfigMap mount; a `..data` swap
/// in `mount` (a new `sds.yaml` with a new certificate inline) changes nothing in `links`,
/// and is seen only through
/// `watched_directory: {path: mount}`, or by reading the file every `poll_interval` (100 ms).
/// New handshakes present the new certificate, in revoy as in Envoy 1.40.
#[test]
fn sds_path_config_source_watched_directory_or_poll_sees_a_configmap_swap() {
    for poll in [false, true] {
        envoy_then_revoy(
            "sds_path_config_source_watched_directory_or_poll_sees_a_configmap_swap",
            |who, envoy, dir, ca, run| {
                let files =
                    |issued: &certs::Issued| vec![("sds.yaml", inline_sds_file("edge", issued))];
                rotates_through_mount(who, envoy, dir, ca, run, files, |links, mount| {
                    let trigger = match poll {
                        true => "poll_interval: 0.1s".to_owned(),
                        false => format!("watched_directory: {{path: {}}}", mount.display()),
                    };
                    format!(
                        "{{name: edge, sds_config: {{path_config_source: {{path: {}, {trigger}}}}}}}",
                        links.join("sds.yaml").display(),
                    )
                });
            },
        );
    }
}

/// `TlsCertificate.watched_directory` in an SDS secret naming files: the secret (a plain SDS
/// file) names `links/cert.pem` and `links/key.pem`, symlinks into `mount`, a Kubernetes Secret
/// mount; a `..data` swap there changes nothing in `links` or in the SDS file's directory, and
/// is seen only through `watched_directory: {path: mount}`. New handshakes present the new
/// certificate, in revoy as in Envoy 1.40.
#[test]
fn tls_certificate_watched_directory_rotates_an_sds_secrets_files() {
    envoy_then_revoy(
        "tls_certificate_watched_directory_rotates_an_sds_secrets_files",
        |who, envoy, dir, ca, run| {
            let files = |issued: &certs::Issued| {
                vec![
                    ("cert.pem", issued.chain_pem.clone()),
                    ("key.pem", issued.key_pem.clone()),
                ]
            };
            rotates_through_mount(who, envoy, dir, ca, run, files, |certs, mount| {
                let sds = dir.join(format!("sds-{run}.yaml"));
                let text = sds_file("edge", &certs.join("cert.pem"), &certs.join("key.pem"))
                    .replace(
                        "tls_certificate: {",
                        &format!(
                            "tls_certificate: {{watched_directory: {{path: {}}}, ",
                            mount.display()
                        ),
                    );
                std::fs::write(&sds, text).expect("sds file");
                format!(
                    "{{name: edge, sds_config: {{path_config_source: {{path: {}}}}}}}",
                    sds.display()
                )
            });
        },
    );
}

/// [`rotates`] through a Kubernetes mount that only a `watched_directory` sees: the `files` of
/// each certificate are mounted in `<dir>/mount-<run>` and reached through symlinks in
/// `<dir>/links-<run>`, where the mount's `..data` swap changes nothing; `secret(links, mount)`
/// is the listener's `SdsSecretConfig`. The rotation mounts the files of a new certificate.
fn rotates_through_mount(
    who: &str,
    envoy: Option<&Path>,
    dir: &Path,
    ca: &Ca,
    run: usize,
    files: impl Fn(&certs::Issued) -> Vec<(&'static str, String)>,
    secret: impl FnOnce(&Path, &Path) -> String,
) {
    let first = ca.server(&["edge.test"]).issue();
    let mounted = files(&first);
    fn as_refs<'a>(files: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
        files.iter().map(|(n, c)| (*n, c.as_str())).collect()
    }
    let mut mount = KubeMount::new(dir, &format!("mount-{run}"), &as_refs(&mounted));
    let links = dir.join(format!("links-{run}"));
    std::fs::create_dir(&links).expect("links dir");
    for (file, _) in &mounted {
        std::os::unix::fs::symlink(mount.path(file), links.join(file)).expect("symlink");
    }
    let secret = secret(&links, &mount.dir);
    let bootstrap = |admin, port| sds_bootstrap(admin, port, &secret);
    rotates(who, envoy, dir, bootstrap, &first, || {
        let second = ca.server(&["edge.test"]).issue();
        mount.update(&as_refs(&files(&second)));
        second
    });
}

/// A TLS upstream presenting `server` and requiring a client certificate from `ca`; answers
/// `client=<its URI SAN>`. Counts (in the answer's second half) the connections closed before
/// sending a byte: a proxy failing closed opens the TCP connection and closes it unspoken.
fn mtls_upstream(server: &certs::Issued, ca: &Ca) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.root_pem().as_bytes()).expect("root"))
        .expect("root added");
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("verifier");
    let chain = CertificateDer::pem_slice_iter(server.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("chain");
    let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).expect("key");
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("certificate"),
    );
    let unspoken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let port = free_port();
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind upstream");
    let counted = unspoken.clone();
    std::thread::spawn(move || {
        for mut tcp in listener.incoming().flatten() {
            let (config, counted) = (config.clone(), counted.clone());
            std::thread::spawn(move || {
                tcp.set_read_timeout(Some(Duration::from_secs(5))).ok();
                if tcp.peek(&mut [0u8; 1]).is_ok_and(|n| n == 0) {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return;
                }
                let mut conn = rustls::ServerConnection::new(config).expect("server connection");
                while conn.is_handshaking() {
                    if conn.complete_io(&mut tcp).is_err() {
                        return;
                    }
                }
                let client = conn
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| revoy::tls::x509::parse(c).ok())
                    .and_then(|info| info.uri_sans().next().map(str::to_owned))
                    .unwrap_or_else(|| "none".into());
                let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
                http1::answer_heads(&mut stream, |_| http1::ok(&format!("client={client}")));
            });
        }
    });
    (port, unspoken)
}

/// The connection manager fields of listener `front`: every request to cluster `tls-up`,
/// logged to `log` as `%RESPONSE_FLAGS% %UPSTREAM_TRANSPORT_FAILURE_REASON%`.
fn front_hcm(log: &Path) -> String {
    format!(
        "stat_prefix: front\n\
         access_log: [{{name: log, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, \
         path: {}, log_format: {{text_format_source: {{inline_string: \"%RESPONSE_FLAGS% %UPSTREAM_TRANSPORT_FAILURE_REASON%\\n\"}}}}}}}}]\n\
         route_config: {{virtual_hosts: [{{name: all, domains: [\"*\"], routes: {}}}]}}",
        log.display(),
        xds::to_cluster("tls-up")
    )
}

/// Cluster `tls-up` (flow-style YAML): the TLS upstream on `port` (`up.test`), presenting the
/// SDS secret `default` and trusting `ROOTCA`, both from `sds-grpc` with an
/// `initial_fetch_timeout` of 1 s.
fn late_secrets_cluster(port: u16) -> String {
    let late = |name: &str| {
        sds_config(name).replace("initial_fetch_timeout: 0s", "initial_fetch_timeout: 1s")
    };
    format!(
        "{{name: tls-up, type: STATIC, connect_timeout: 2s, load_assignment: {{cluster_name: tls-up, \
         endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}, \
         transport_socket: {{name: envoy.transport_sockets.tls, typed_config: \
         {{\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, \
         sni: up.test, common_tls_context: {{tls_certificate_sds_secret_configs: [{}], \
         validation_context_sds_secret_config: {}}}}}}}}}",
        late("default"),
        late("ROOTCA")
    )
}

/// What a proxy did with a request to a cluster whose secrets had not come.
#[derive(Debug, PartialEq)]
struct FailedClosed {
    status: u16,
    body: String,
    /// The access log line: flags and transport failure reason.
    logged: String,
    /// `client_ssl_socket_factory.upstream_context_secrets_not_ready`.
    not_ready: Option<u64>,
    /// `upstream_cx_connect_fail`.
    connect_fail: Option<u64>,
    /// Handshakes counted in `ssl.handshake` and `ssl.connection_error` (0 when absent, as
    /// Envoy has no `ssl.*` stats before the context exists).
    handshakes: (u64, u64),
    /// Connections the upstream saw closed before a byte.
    unspoken: usize,
}

/// Asks `front` once, with cluster `tls-up` lacking its secrets, and what followed.
fn fail_closed(
    admin: u16,
    front: u16,
    log: &Path,
    unspoken: &std::sync::atomic::AtomicUsize,
) -> FailedClosed {
    let (status, body) = http1::get(None, ([127, 0, 0, 1], front).into(), "/").expect("GET");
    let logged = eventually("the access log line", || {
        std::fs::read_to_string(log)
            .ok()
            .and_then(|l| l.lines().next().map(str::to_owned))
    });
    let unspoken = eventually("the upstream to see the connection close", || {
        let n = unspoken.load(std::sync::atomic::Ordering::SeqCst);
        (n > 0).then_some(n)
    });
    let count = |name: &str| stat(admin, &format!("cluster.tls-up.{name}"));
    FailedClosed {
        status,
        body,
        logged,
        not_ready: count("client_ssl_socket_factory.upstream_context_secrets_not_ready"),
        connect_fail: count("upstream_cx_connect_fail"),
        handshakes: (
            count("ssl.handshake").unwrap_or(0),
            count("ssl.connection_error").unwrap_or(0),
        ),
        unspoken,
    }
}

/// A cluster whose SDS secrets (its client certificate and its trust) have not come when
/// their `initial_fetch_timeout` (1 s) passes is used, as in Envoy, but fails closed: each
/// connection is opened and closed before a byte is sent (no plaintext, no handshake without
/// the client certificate), the request is answered 503 `UF` with Envoy's transport failure
/// reason, and `client_ssl_socket_factory.upstream_context_secrets_not_ready` counts it. Once
/// the secrets come, the cluster reaches the upstream over mutual TLS without a restart. For a
/// static bootstrap cluster and for one from CDS (whose `cds_config` waits for ever: the
/// secrets' own timeout ends the cluster's warming), in revoy as in Envoy 1.40.
#[test]
fn a_cluster_whose_secrets_time_out_fails_closed_until_they_come() {
    let envoy =
        oracle::envoy_or_skip("a_cluster_whose_secrets_time_out_fails_closed_until_they_come");
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    let workload = ca.workload("default", "front").issue();
    let (upstream, unspoken) = mtls_upstream(&ca.server(&["up.test"]).issue(), &ca);
    let mut runs = 0;
    let mut run = |who: &str, envoy: Option<&Path>, from_cds: bool| {
        runs += 1;
        unspoken.store(0, std::sync::atomic::Ordering::SeqCst);
        let sds = Sds::start(dir.path(), &format!("sds-{runs}"));
        let log = dir.path().join(format!("access-{runs}.log"));
        let (admin, front) = (free_port(), free_port());
        let plane = from_cds.then(|| Plane::start(free_port()));
        let yaml = if let Some(plane) = &plane {
            let snapshot = Snapshot::new("1")
                .with_message(
                    "front",
                    &xds::listener_with("front", front, &front_hcm(&log)),
                )
                .with_message(
                    "tls-up",
                    &xds::decode::<Cluster>(&late_secrets_cluster(upstream)),
                );
            plane.set(snapshot);
            format!(
                "{}{}",
                ads_h2_bootstrap(admin, plane.port),
                sds_cluster(sds.socket()),
            )
        } else {
            let listener = format!(
                "{{name: front, address: {{socket_address: {{address: 127.0.0.1, port_value: {front}}}}}, \
                 filter_chains: [{{filters: [{{name: hcm, typed_config: {{\"@type\": {HCM}, http_filters: [{ROUTER}], {}}}}}]}}]}}",
                front_hcm(&log).replace('\n', ", ")
            );
            format!(
                "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
                 node: {{id: {NODE}, cluster: xds-test}}\n\
                 static_resources:\n  listeners:\n  - {listener}\n  clusters:\n  - {}{}\n",
                late_secrets_cluster(upstream),
                sds_cluster(sds.socket()),
            )
        };
        let _proxy = child::Proxy::serving(envoy, &yaml, admin, front);
        let failed = fail_closed(admin, front, &log, &unspoken);

        let version = sds.serve_mesh(&workload, &ca);
        sds.ack(NODE, &version);
        let answer = eventually(&format!("{who}: tls-up used once its secrets came"), || {
            xds::get(front, "/").ok().filter(|r| r.status == 200)
        });
        assert_eq!(
            answer.body, "client=spiffe://cluster.local/ns/default/sa/front",
            "{who}"
        );
        failed
    };
    for from_cds in [false, true] {
        let revoy = run("revoy", None, from_cds);
        assert_eq!(
            revoy,
            FailedClosed {
                status: 503,
                body: "upstream connect error or disconnect/reset before headers. reset reason: \
                       remote connection failure"
                    .into(),
                logged: "UF TLS_error:_Secret_is_not_supplied_by_SDS".into(),
                not_ready: Some(1),
                connect_fail: Some(1),
                handshakes: (0, 0),
                unspoken: 1,
            },
            "from CDS: {from_cds}"
        );
        if let Some(envoy) = &envoy {
            assert_eq!(
                run("Envoy", Some(envoy), from_cds),
                revoy,
                "from CDS: {from_cds}"
            );
        }
    }
}
