//! ADS over TLS: a proxy whose xDS cluster has an `UpstreamTlsContext` (as one reaching
//! istiod's 15012 directly) verifies the control plane's certificate and gets its config over
//! the TLS stream; against a control plane whose certificate its CA did not sign, it never
//! goes LIVE and counts the failure in `cluster.xds-grpc.ssl.fail_verify_error`.
//!
//! The control plane is the repo's snapshot server in plaintext behind a first revoy that
//! terminates TLS in front of tcp_proxy (with `h2` ALPN), so both TLS ends are revoy's.
//!
//! Also: with `dynamic_resources`, start-up waits for the static listeners' SDS secrets as
//! well as for the initial xDS configuration.

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

use std::path::Path;
use std::time::{Duration, Instant};

use certs::{Ca, CertDir};
use ports::free_port;
use sds::{Sds, sds_cluster, sds_config};
use xds::{
    NODE, Plane, admin_get, ads_bootstrap, body_of, eventually, inline_listener, ready, refused,
    start_revoy, stat,
};
use xds_client::LISTENER_TYPE_URL;
use xds_client::server::Snapshot;

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
    assert_eq!((status, body.trim()), (503, "INITIALIZING"));
    assert_eq!(stat(admin, "control_plane.connected_state"), Some(0));
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
        r#"{bootstrap}{sds_cluster}
  listeners:
  - name: tls
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{"@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext, common_tls_context: {{tls_certificate_sds_secret_configs: [{secret}]}}}}}}
      filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: tls
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, direct_response: {{status: 200}}}}]}}]}}
"#,
        bootstrap = ads_bootstrap(admin, plane.port, false),
        sds_cluster = sds_cluster(sds.socket()),
        secret = sds_config("default"),
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
