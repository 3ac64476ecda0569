//! Upstream TLS: revoy connecting to TLS upstreams with a cluster's `UpstreamTlsContext`.
//! Each upstream here is a rustls server that answers every request with what it saw of the
//! handshake (the SNI, the ALPN protocol, the client certificate's URI SAN), so a test checks
//! what revoy sent, and that revoy refuses every server certificate its validation context
//! does not accept (a 503 naming the TLS failure, and the `ssl.fail_verify_*` counter Envoy
//! keeps for it). Plus `tcp_proxy` to a TLS upstream and `transport_socket_matches` (Istio's
//! `tlsMode: istio` shape). And an upstream that never answers the handshake: the
//! cluster's `connect_timeout` covers TCP connect and handshake together, as in Envoy (compared
//! with Envoy 1.40).

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
#[path = "support/skip.rs"]
mod skip;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use certs::{Ca, CertDir, Issued};
use child::Proxy;
use ports::free_port;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::WebPkiClientVerifier;

/// A TLS upstream presenting `server`; asking for (not requiring) a client certificate from
/// `client_ca` when given. Answers `sni=<..>;alpn=<..>;client=<URI SAN or none>`.
fn tls_upstream(server: &Issued, client_ca: Option<&Ca>, alpn: &[&str]) -> u16 {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_slice(ca.root_pem().as_bytes()).unwrap())
                .unwrap();
            builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .allow_unauthenticated()
                    .build()
                    .unwrap(),
            )
        }
    };
    let chain = CertificateDer::pem_slice_iter(server.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
    let mut config = builder.with_single_cert(chain, key).unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let config = Arc::new(config);
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || serve(config, tcp));
        }
    });
    port
}

/// One TLS connection: requests answered until the peer closes.
fn serve(config: Arc<rustls::ServerConfig>, mut tcp: TcpStream) {
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut conn = rustls::ServerConnection::new(config).unwrap();
    while conn.is_handshaking() {
        if conn.complete_io(&mut tcp).is_err() {
            return;
        }
    }
    let seen = format!(
        "sni={};alpn={};client={}",
        conn.server_name().unwrap_or("none"),
        conn.alpn_protocol()
            .map_or("none".into(), |p| String::from_utf8_lossy(p).into_owned()),
        conn.peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| revoy::tls::x509::parse(c).ok())
            .and_then(|info| info.uri_sans().next().map(str::to_owned))
            .unwrap_or_else(|| "none".into()),
    );
    let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
    http1::answer_heads(&mut stream, |_| http1::ok(&seen));
}

/// A bootstrap with one HTTP listener per cluster (`port` → cluster), each cluster one TLS
/// endpoint with the given transport socket fields.
fn bootstrap(admin: u16, clusters: &[(&str, u16, u16, String)]) -> String {
    let mut listeners = String::new();
    let mut out = String::new();
    for (name, port, upstream, tls) in clusters {
        listeners += &format!(
            r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, route: {{cluster: {name}}}}}]}}]}}"#
        );
        out += &format!(
            r#"
  - name: {name}
    type: STATIC
    connect_timeout: 2s
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
{tls}
    load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]}}"#
        );
    }
    format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\nstatic_resources:\n  listeners:{listeners}\n  clusters:{out}\n"
    )
}

/// The `UpstreamTlsContext` fields (indented for [`bootstrap`]): SNI, trusted CA, extra
/// validation lines, extra common_tls_context lines.
fn context(sni: &str, ca: &Path, validation: &str, common: &str) -> String {
    format!(
        "        sni: {sni}\n        common_tls_context:\n          validation_context:\n            trusted_ca: {{filename: {}}}\n{validation}{common}",
        ca.display()
    )
}

fn get(port: u16) -> (u16, String) {
    http1::get(None, ([127, 0, 0, 1], port).into(), "/").unwrap_or((0, String::new()))
}

fn stat(admin: u16, name: &str) -> u64 {
    let (_, body) = http1::get(None, ([127, 0, 0, 1], admin).into(), "/stats").unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn upstream_tls_sends_sni_alpn_and_client_certificate_and_validates_the_server() {
    let dir = CertDir::new();
    let mesh = Ca::new("cluster.local");
    let other = Ca::new("other.local");
    let ca = mesh.write_root_to(dir.path(), "ca");
    let server = mesh.server(&["backend.test"]).issue();
    let client = mesh
        .workload("front", "web")
        .issue()
        .write_to(dir.path(), "client");
    let good = tls_upstream(
        &server,
        Some(&mesh),
        &["h2", "istio-peer-exchange", "http/1.1"],
    );
    let expired = tls_upstream(&mesh.server(&["backend.test"]).expired().issue(), None, &[]);
    let foreign = tls_upstream(&other.server(&["backend.test"]).issue(), None, &[]);
    let workload = tls_upstream(&mesh.workload("back", "api").issue(), None, &[]);
    let server_der = CertificateDer::from_pem_slice(server.cert_pem.as_bytes()).unwrap();
    let digest = revoy::tls::x509::sha256_hex(&server_der);
    let spki = revoy::tls::x509::spki_sha256_base64(&server_der).unwrap();
    let san = |m: &str| format!("            match_typed_subject_alt_names: [{m}]\n");
    let mtls = format!(
        "          alpn_protocols: [istio-peer-exchange, istio]\n          tls_certificates: [{{certificate_chain: {{filename: {}}}, private_key: {{filename: {}}}}}]\n",
        client.chain.display(),
        client.key.display()
    );
    let p: Vec<u16> = (0..10).map(|_| free_port()).collect();
    let h1_only = tls_upstream(&server, None, &["http/1.1"]);
    let clusters = [
        ("plain_ok", p[0], good, context("backend.test", &ca, "", "")),
        (
            "mtls",
            p[1],
            good,
            context(
                "backend.test",
                &ca,
                &san("{san_type: DNS, matcher: {exact: backend.test}}"),
                &mtls,
            ),
        ),
        (
            "wrong_san",
            p[2],
            good,
            context(
                "backend.test",
                &ca,
                &san("{san_type: DNS, matcher: {exact: other.test}}"),
                "",
            ),
        ),
        (
            "expired",
            p[3],
            expired,
            context("backend.test", &ca, "", ""),
        ),
        (
            "foreign",
            p[4],
            foreign,
            context("backend.test", &ca, "", ""),
        ),
        (
            "spiffe",
            p[5],
            workload,
            context(
                "outbound_.80_._.api.back.svc.cluster.local",
                &ca,
                &san(
                    "{san_type: URI, matcher: {exact: \"spiffe://cluster.local/ns/back/sa/api\"}}",
                ),
                "",
            ),
        ),
        (
            "spiffe_wrong",
            p[6],
            workload,
            context(
                "api",
                &ca,
                &san("{san_type: URI, matcher: {prefix: \"spiffe://cluster.local/ns/other/\"}}"),
                "",
            ),
        ),
        (
            "pinned",
            p[7],
            good,
            context(
                "backend.test",
                &ca,
                &format!(
                    "            verify_certificate_hash: [\"{digest}\"]\n            verify_certificate_spki: [\"{spki}\"]\n"
                ),
                "",
            ),
        ),
        (
            "pin_wrong",
            p[8],
            good,
            context(
                "backend.test",
                &ca,
                &format!(
                    "            verify_certificate_hash: [\"{}\"]\n",
                    "ab".repeat(32)
                ),
                "",
            ),
        ),
        ("auto", p[9], h1_only, context("backend.test", &ca, "", "")),
    ];
    let admin = free_port();
    let yaml = bootstrap(admin, &clusters).replace(
        "  - name: auto\n    type: STATIC\n",
        "  - name: auto\n    type: STATIC\n    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        auto_config: {}\n",
    );
    let _revoy = Proxy::start(&yaml, || {
        http1::get(None, ([127, 0, 0, 1], admin).into(), "/ready").is_ok_and(|(s, _)| s == 200)
    });

    // No ALPN in the context: an HTTP/1.1 cluster offers `http/1.1` (Envoy's fallback).
    assert_eq!(
        get(p[0]),
        (200, "sni=backend.test;alpn=http/1.1;client=none".to_owned())
    );
    assert_eq!(
        get(p[1]),
        (200, "sni=backend.test;alpn=istio-peer-exchange;client=spiffe://cluster.local/ns/front/sa/web".to_owned())
    );
    assert_eq!(get(p[5]).0, 200);
    // auto_config offers h2 and http/1.1; this server only speaks HTTP/1.1, so HTTP/1.1 it is,
    // on this connection and the ones after it.
    for _ in 0..2 {
        assert_eq!(
            get(p[9]),
            (200, "sni=backend.test;alpn=http/1.1;client=none".to_owned())
        );
    }
    assert_eq!(get(p[7]).0, 200);
    for (cluster, port, counter) in [
        ("wrong_san", p[2], "fail_verify_san"),
        ("expired", p[3], "fail_verify_error"),
        ("foreign", p[4], "fail_verify_error"),
        ("spiffe_wrong", p[6], "fail_verify_san"),
        ("pin_wrong", p[8], "fail_verify_cert_hash"),
    ] {
        let (status, body) = get(port);
        assert_eq!(status, 503, "{cluster}: {body}");
        assert!(
            body.starts_with("upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: TLS_error:"),
            "{cluster}: {body}"
        );
        assert_eq!(
            stat(admin, &format!("cluster.{cluster}.ssl.{counter}")),
            1,
            "{cluster}"
        );
        assert_eq!(
            stat(admin, &format!("cluster.{cluster}.ssl.handshake")),
            0,
            "{cluster}"
        );
    }
    assert!(stat(admin, "cluster.plain_ok.ssl.handshake") >= 1);
    // Envoy's default for an upstream context is TLS 1.2 at most.
    assert!(stat(admin, "cluster.plain_ok.ssl.versions.TLSv1.2") >= 1);
}

#[test]
fn tcp_proxy_and_transport_socket_matches_reach_tls_upstreams() {
    let dir = CertDir::new();
    let mesh = Ca::new("cluster.local");
    let ca = mesh.write_root_to(dir.path(), "ca");
    let tls = tls_upstream(&mesh.server(&["backend.test"]).issue(), None, &[]);
    let plain = TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_port = plain.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in plain.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nplaintext");
        }
    });
    let (admin, tcp, http) = (free_port(), free_port(), free_port());
    let yaml = format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: tcp
    address: {{socket_address: {{address: 127.0.0.1, port_value: {tcp}}}}}
    filter_chains:
    - filters:
      - name: tcp
        typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t, cluster: tls}}
  - name: http
    address: {{socket_address: {{address: 127.0.0.1, port_value: {http}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: h
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, route: {{cluster: istio}}}}]}}]}}
  clusters:
  - name: tls
    type: STATIC
    connect_timeout: 2s
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: backend.test
        common_tls_context: {{validation_context: {{trusted_ca: {{filename: {ca}}}}}}}
    load_assignment: {{cluster_name: tls, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {tls}}}}}}}}}]}}]}}
  - name: istio
    type: STATIC
    connect_timeout: 2s
    lb_policy: ROUND_ROBIN
    transport_socket_matches:
    - name: tlsMode-istio
      match: {{tlsMode: istio}}
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: backend.test
          common_tls_context: {{validation_context: {{trusted_ca: {{filename: {ca}}}}}}}
    - name: tlsMode-disabled
      match: {{}}
      transport_socket: {{name: envoy.transport_sockets.raw_buffer, typed_config: {{"@type": type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer}}}}
    load_assignment:
      cluster_name: istio
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {tls}}}}}}}
          metadata: {{filter_metadata: {{envoy.transport_socket_match: {{tlsMode: istio}}}}}}
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {plain_port}}}}}}}
"#,
        ca = ca.display(),
    );
    let _revoy = Proxy::start(&yaml, || {
        http1::get(None, ([127, 0, 0, 1], admin).into(), "/ready").is_ok_and(|(s, _)| s == 200)
    });
    // tcp_proxy: the client's plaintext HTTP reaches the TLS upstream inside revoy's TLS.
    let (status, body) = get(tcp);
    assert_eq!(
        (status, body.as_str()),
        (200, "sni=backend.test;alpn=none;client=none")
    );
    // Round robin over the two endpoints: TLS to the one labelled tlsMode=istio, plaintext to
    // the other.
    let mut bodies: Vec<String> = (0..4).map(|_| get(http).1).collect();
    bodies.sort();
    bodies.dedup();
    assert_eq!(
        bodies,
        ["plaintext", "sni=backend.test;alpn=none;client=none"]
    );
}

/// A TCP server that accepts connections and never says a word (a TLS server that hangs in the
/// handshake); it keeps them open until the test process exits.
fn silent_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for tcp in listener.incoming().flatten() {
            held.push(tcp);
        }
    });
    port
}

/// A handshake that never completes ends at the cluster's `connect_timeout`, which counts it
/// as a connect timeout (a connect failure, no TLS error), and answers 503 as Envoy does.
#[test]
fn a_stalled_handshake_is_a_connect_timeout_like_envoys() {
    let Some(envoy) = oracle::envoy_or_skip("a_stalled_handshake_is_a_connect_timeout_like_envoys")
    else {
        return;
    };
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local").write_root_to(dir.path(), "ca");
    let upstream = silent_upstream();
    let counters = [
        "cluster.stalled.upstream_cx_connect_timeout",
        "cluster.stalled.upstream_cx_connect_fail",
        "cluster.stalled.ssl.connection_error",
        "cluster.stalled.ssl.handshake",
    ];
    let mut seen = Vec::new();
    for envoy in [Some(&envoy), None] {
        let (admin, port) = (free_port(), free_port());
        let yaml = bootstrap(
            admin,
            &[(
                "stalled",
                port,
                upstream,
                context("backend.test", &ca, "", ""),
            )],
        )
        .replace("connect_timeout: 2s", "connect_timeout: 0.5s");
        let ready = || {
            http1::get(None, ([127, 0, 0, 1], admin).into(), "/ready").is_ok_and(|(s, _)| s == 200)
        };
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, admin, ready),
            None => Proxy::start(&yaml, ready),
        };
        let (status, body) = get(port);
        let counted: Vec<u64> = counters.iter().map(|c| stat(admin, c)).collect();
        seen.push((status, body, counted));
    }
    let (envoy, revoy) = (&seen[0], &seen[1]);
    assert_eq!(
        revoy, envoy,
        "revoy (left) and Envoy (right) differ; counters {counters:?}"
    );
    assert_eq!(revoy.0, 503);
    assert_eq!(revoy.2[0], 1, "one connect timeout");
}

/// `auto_sni`: each upstream TLS connection sends the host of its request (after the route's
/// host rewrite) or of the `override_auto_sni_header`, connections are pooled per name (the
/// upstream answers with the SNI of the connection that carried the request), and
/// `auto_san_validation` refuses a certificate without a SAN for that name — as Envoy 1.40
/// on the same config.
#[test]
fn auto_sni_names_each_connection_after_its_request_like_envoy() {
    let Some(envoy) =
        oracle::envoy_or_skip("auto_sni_names_each_connection_after_its_request_like_envoy")
    else {
        return;
    };
    let dir = CertDir::new();
    let mesh = Ca::new("cluster.local");
    let ca = mesh.write_root_to(dir.path(), "ca");
    let upstream = tls_upstream(&mesh.server(&["a.test", "*.wild.test"]).issue(), None, &[]);
    let options = |extra: &str| {
        format!(
            "\n    typed_extension_protocol_options:\
             \n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\
             \n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\
             \n        upstream_http_protocol_options: {{auto_sni: true{extra}}}\
             \n        explicit_http_config: {{http_protocol_options: {{}}}}"
        )
    };
    let requests: [(&str, &str); 6] = [
        ("auto", "x-host: a.test\r\n"),
        ("auto", "x-host: b.wild.test\r\n"),
        ("auto", "x-host: a.test\r\n"),
        ("auto", "x-host: other.test\r\n"),
        ("override", "x-sni: c.wild.test\r\n"),
        ("override", ""),
    ];
    let counters = [
        "cluster.auto.ssl.fail_verify_san",
        "cluster.auto.ssl.handshake",
        "cluster.auto.upstream_cx_total",
        "cluster.override.ssl.handshake",
    ];
    let mut seen = Vec::new();
    for envoy in [Some(&envoy), None] {
        let (admin, auto, over) = (free_port(), free_port(), free_port());
        let yaml = bootstrap(
            admin,
            &[
                ("auto", auto, upstream, context("x", &ca, "", "")),
                ("override", over, upstream, context("x", &ca, "", "")),
            ],
        )
        .replace("        sni: x\n", "")
        .replace(
            "  - name: auto\n    type: STATIC\n",
            &format!(
                "  - name: auto\n    type: STATIC{}\n",
                options(", auto_san_validation: true")
            ),
        )
        .replace(
            "  - name: override\n    type: STATIC\n",
            &format!(
                "  - name: override\n    type: STATIC{}\n",
                options(", override_auto_sni_header: x-sni")
            ),
        )
        .replace(
            "route: {cluster: auto}",
            "route: {cluster: auto, host_rewrite_header: x-host}",
        );
        let ready = || {
            http1::get(None, ([127, 0, 0, 1], admin).into(), "/ready").is_ok_and(|(s, _)| s == 200)
        };
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, admin, ready),
            None => Proxy::start(&yaml, ready),
        };
        let answers: Vec<(u16, String)> = requests
            .iter()
            .map(|(cluster, headers)| {
                let port = if *cluster == "auto" { auto } else { over };
                let (status, body) =
                    http1::get_with(None, ([127, 0, 0, 1], port).into(), "/", headers)
                        .unwrap_or((0, String::new()));
                // Envoy's and revoy's TLS failure reasons are compared elsewhere.
                (
                    status,
                    body.split(", transport failure")
                        .next()
                        .unwrap_or("")
                        .to_owned(),
                )
            })
            .collect();
        let counted: Vec<u64> = counters.iter().map(|c| stat(admin, c)).collect();
        seen.push((answers, counted));
    }
    let (envoy, revoy) = (&seen[0], &seen[1]);
    assert_eq!(
        revoy, envoy,
        "revoy (left) and Envoy (right); counters {counters:?}"
    );
    assert_eq!(
        revoy.0[1],
        (200, "sni=b.wild.test;alpn=none;client=none".to_owned())
    );
}
