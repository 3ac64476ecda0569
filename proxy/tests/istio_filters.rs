//! Istio's own proxy filters (istio/proxy), which stock Envoy lacks, so these tests check
//! revoy against Istio's documented behaviour and wire formats rather than against Envoy.
//!
//! `istio.alpn`: a TLS upstream records the ALPN list each ClientHello offers (read before
//! the handshake, so whatever the server then picks), and answers with it: a request's
//! upstream connection offers the override for the protocol it goes upstream in, in place of
//! the cluster's own list, and connections with and without an override are not shared.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/ports.rs"]
mod ports;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use certs::{Ca, CertDir, Issued};
use child::Proxy;
use ports::free_port;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

/// The ALPN lists offered to an upstream, one per connection, comma-joined.
type Offers = Arc<Mutex<Vec<String>>>;

/// A TLS upstream presenting `server` and negotiating no ALPN, which records what each
/// connection offered and answers every HTTP/1 request with it.
fn recording_upstream(server: &Issued) -> (u16, Offers) {
    let chain = CertificateDer::pem_slice_iter(server.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap(),
    );
    let offers = Offers::default();
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let seen = offers.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (config, seen) = (config.clone(), seen.clone());
            std::thread::spawn(move || answer_offer(config, tcp, &seen));
        }
    });
    (port, offers)
}

/// One connection: its ClientHello's ALPN list recorded, then each request answered with it.
fn answer_offer(config: Arc<rustls::ServerConfig>, mut tcp: TcpStream, seen: &Mutex<Vec<String>>) {
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut acceptor = rustls::server::Acceptor::default();
    let accepted = loop {
        if acceptor.read_tls(&mut tcp).is_err() {
            return;
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => break accepted,
            Ok(None) => {}
            Err(_) => return,
        }
    };
    let offered = accepted
        .client_hello()
        .alpn()
        .map(|list| {
            list.map(|p| String::from_utf8_lossy(p).into_owned())
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_else(|| "none".into());
    seen.lock().unwrap().push(offered.clone());
    let Ok(mut conn) = accepted.into_connection(config) else {
        return;
    };
    let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.drain(..end + 4);
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{offered}",
                offered.len()
            );
            if stream.write_all(answer.as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// istiod's `istio.alpn` config for outbound listeners (as in its LDS output).
const ISTIO_ALPN: &str = r#"{name: istio.alpn, typed_config: {"@type": type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig, alpn_override: [{alpn_override: [istio-http/1.0, istio, http/1.0]}, {upstream_protocol: HTTP11, alpn_override: [istio-http/1.1, istio, http/1.1]}, {upstream_protocol: HTTP2, alpn_override: [istio-h2, istio, h2]}]}}"#;

/// Two listeners routing `/h1`, `/h2` and `/down` to clusters of those upstream protocols
/// (HTTP/1.1, HTTP/2, the downstream's), all TLS to `upstream` with Istio's mTLS ALPN list;
/// `istio.alpn` runs on the first only.
fn bootstrap(admin: u16, with: u16, without: u16, upstream: u16, ca: &std::path::Path) -> String {
    let listener = |name: &str, port: u16, filters: &str| {
        format!(
            r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          http_protocol_options: {{accept_http_10: true}}
          http_filters: [{filters}{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /h1}}, route: {{cluster: h1}}}}, {{match: {{prefix: /h2}}, route: {{cluster: h2}}}}, {{match: {{prefix: /down}}, route: {{cluster: down}}}}]}}]}}"#
        )
    };
    let cluster = |name: &str, protocol: &str| {
        format!(
            r#"
  - name: {name}
    type: STATIC
    connect_timeout: 2s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        {protocol}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: backend.test
        common_tls_context:
          alpn_protocols: [istio-peer-exchange, istio]
          validation_context: {{trusted_ca: {{filename: {}}}}}
    load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]}}"#,
            ca.display()
        )
    };
    format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\nstatic_resources:\n  listeners:{}{}\n  clusters:{}{}{}\n",
        listener("with", with, &format!("{ISTIO_ALPN}, ")),
        listener("without", without, ""),
        cluster("h1", "explicit_http_config: {http_protocol_options: {}}"),
        cluster("h2", "explicit_http_config: {http2_protocol_options: {}}"),
        cluster(
            "down",
            "use_downstream_protocol_config: {http_protocol_options: {}, http2_protocol_options: {}}"
        ),
    )
}

/// A request in HTTP/1.0 (no keep-alive): the status and body.
fn get_http10(port: u16, path: &str) -> (u16, String) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\nhost: backend.test\r\n\r\n").unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

#[test]
fn istio_alpn_offers_the_override_for_the_upstream_protocol() {
    let dir = CertDir::new();
    let mesh = Ca::new("cluster.local");
    let ca = mesh.write_root_to(dir.path(), "ca");
    let (upstream, offers) = recording_upstream(&mesh.server(&["backend.test"]).issue());
    let (admin, with, without) = (free_port(), free_port(), free_port());
    let _revoy = Proxy::with_admin(&bootstrap(admin, with, without, upstream, &ca), admin);
    let get = |port: u16, path: &str| {
        http1::get(None, ([127, 0, 0, 1], port).into(), path).unwrap_or_default()
    };

    // HTTP/1.1 upstream: istiod's HTTP11 list, not the cluster's.
    assert_eq!(
        get(with, "/h1"),
        (200, "istio-http/1.1,istio,http/1.1".to_owned())
    );
    // Without the filter the cluster's own list, on a connection of its own.
    assert_eq!(
        get(without, "/h1"),
        (200, "istio-peer-exchange,istio".to_owned())
    );
    // The downstream's protocol, HTTP/1.0 here: the HTTP10 list.
    assert_eq!(
        get_http10(with, "/down"),
        (200, "istio-http/1.0,istio,http/1.0".to_owned())
    );
    assert_eq!(
        get(with, "/down"),
        (200, "istio-http/1.1,istio,http/1.1".to_owned())
    );
    // HTTP/2 upstream: the HTTP2 list is offered (this upstream speaks only HTTP/1, so the
    // request itself fails; what matters is the ClientHello).
    let before = offers.lock().unwrap().len();
    let (status, _) = get(with, "/h2");
    assert_eq!(status, 503);
    let offered = offers.lock().unwrap()[before..].to_vec();
    assert_eq!(
        offered.first().map(String::as_str),
        Some("istio-h2,istio,h2")
    );
    // Each cluster and list had its own connection: the request without the filter reused
    // none of the first's.
    let all = offers.lock().unwrap().clone();
    assert_eq!(
        all[..4],
        [
            "istio-http/1.1,istio,http/1.1",
            "istio-peer-exchange,istio",
            "istio-http/1.0,istio,http/1.0",
            "istio-http/1.1,istio,http/1.1",
        ]
    );
}
