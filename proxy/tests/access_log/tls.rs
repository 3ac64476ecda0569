//! Requests over TLS against Envoy 1.40: `%REQUESTED_SERVER_NAME%` is the SNI the client sent
//! (empty without one), next to the scheme and the `x-forwarded-proto` the connection manager
//! sets.

use super::*;

use std::sync::Arc;

use certs::{Ca, CertDir};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

const TLS_FORMAT: &str = "%REQ(X-CASE)% [%REQUESTED_SERVER_NAME%] %PROTOCOL% %REQ(:SCHEME)% %REQ(X-FORWARDED-PROTO)% %REQ(:AUTHORITY)% %RESPONSE_CODE%\n";

fn tls_bootstrap(admin: u16, https: u16, inspected: u16, dir: &Path) -> String {
    let listener = |name: &str, port: u16, listener_filters: &str| {
        format!(
            r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}{listener_filters}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            tls_certificates: [{{certificate_chain: {{filename: {d}/server.pem}}, private_key: {{filename: {d}/server.key}}}}]
      filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: https
          access_log: [{logger}]
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{{match: {{prefix: /}}, direct_response: {{status: 200}}}}]"#,
            d = dir.display(),
            logger = logger(&dir.join("tls.log"), &text(TLS_FORMAT)),
        )
    };
    format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         static_resources:\n  listeners:{}{}\n",
        listener("https", https, ""),
        listener(
            "inspected",
            inspected,
            "\n    listener_filters: [{name: tls, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}}]"
        ),
    )
}

/// One request over TLS, with `sni` sent as the server name or none at all.
fn tls_request(port: u16, root: &Path, sni: Option<&str>, case: &str) {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(root).expect("root.pem") {
        roots
            .add(c.expect("root.pem parses"))
            .expect("root accepted");
    }
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.enable_sni = sni.is_some();
    let name = ServerName::try_from(sni.unwrap_or("a.test").to_owned()).expect("server name");
    let conn = ClientConnection::new(Arc::new(config), name).expect("client connection");
    let tcp = TcpStream::connect(("127.0.0.1", port)).expect("listener accepts");
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = StreamOwned::new(conn, tcp);
    let req = format!(
        "GET /{case} HTTP/1.1\r\nhost: h.test\r\nx-case: {case}\r\nconnection: close\r\n\r\n"
    );
    tls.write_all(req.as_bytes()).expect("request sent");
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{case}: {out}");
}

fn observe_tls(dir: &Path, start: impl FnOnce(&str, u16) -> Proxy) -> Vec<String> {
    let ca = Ca::new("cluster.local");
    ca.server(&["a.test", "b.test"])
        .issue()
        .write_to(dir, "server");
    let root = ca.write_root_to(dir, "root");
    let (admin, https, inspected) = (free_port(), free_port(), free_port());
    let _proxy = start(&tls_bootstrap(admin, https, inspected, dir), inspected);
    tls_request(https, &root, Some("a.test"), "sni-a");
    tls_request(https, &root, None, "no-sni");
    tls_request(inspected, &root, Some("a.test"), "inspected-sni-a");
    tls_request(inspected, &root, Some("b.test"), "inspected-sni-b");
    tls_request(inspected, &root, None, "inspected-no-sni");
    read_lines(&dir.join("tls.log"), 5)
}

#[test]
fn tls_server_name_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("tls_server_name_matches_envoy") else {
        return;
    };
    let flush = ["--file-flush-interval-msec", "50"];
    let envoy_dir = CertDir::new();
    let theirs = observe_tls(envoy_dir.path(), |yaml, port| {
        let mut c = Command::new(&envoy);
        c.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
            .args(["--base-id", "4714", "--disable-hot-restart"])
            .args(flush);
        Proxy::spawn(c, || wait_port(port))
    });
    let revoy_dir = CertDir::new();
    let ours = observe_tls(revoy_dir.path(), |yaml, port| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_revoy"));
        c.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
            .args(flush);
        Proxy::spawn(c, || wait_port(port))
    });
    assert_eq!(theirs.len(), 5, "Envoy's lines: {theirs:#?}");
    assert_eq!(ours, theirs);
}
