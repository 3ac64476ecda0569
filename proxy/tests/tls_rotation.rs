//! Certificate rotation by SDS under load, both ends of revoy. The certificates come from the
//! repository's snapshot server over a unix socket (the `sds-grpc` cluster, as Istio's
//! pilot-agent serves them); each rotation is a new certificate from the same CA, and the
//! test goes on once revoy has ACKed it.
//!
//! - Downstream: revoy terminates TLS with the SDS certificate `default` while keep-alive
//!   HTTPS clients (threads; two keep one connection for the whole run, two open a new one
//!   every few requests, all sharing one session cache) send requests, and the certificate is
//!   rotated three times. No request fails; after each rotation a new connection, from the
//!   same session cache, is shown the new certificate (so no session made under the old one is
//!   resumed); the connections opened before the first rotation are still served after the
//!   last.
//! - Upstream: revoy's client certificate for an mTLS upstream (an in-test rustls server that
//!   requires one and answers with its serial number) is rotated three times while clients send
//!   requests through revoy. No request fails, and each new serial reaches the upstream (on the
//!   new connections `max_requests_per_connection` makes revoy open; the upstream resumes
//!   sessions, so a session made under the old certificate must not be offered).
//!
//! Each run is bounded: the load stops once the rotations are done, and every wait has a
//! deadline.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/https.rs"]
mod https;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/sds.rs"]
mod sds;
#[path = "support/xds.rs"]
mod xds;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use certs::{Ca, CertDir, Issued};
use child::Proxy;
use ports::free_port;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use sds::{Sds, sds_cluster, sds_config};

/// The node id revoy's SDS stream sends.
const NODE: &str = "rotation";

/// How many times a certificate is rotated.
const ROTATIONS: usize = 3;

/// How many requests the load serves under each certificate before the next rotation.
const REQUESTS_PER_CERTIFICATE: u64 = 60;

/// The longest any wait of the test lasts.
const WAIT: Duration = Duration::from_secs(30);

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "{name: r, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn chain(issued: &Issued) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(issued.chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("chain parses")
}

fn key(issued: &Issued) -> PrivateKeyDer<'static> {
    PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("key parses")
}

fn roots(ca: &Ca) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.root_pem().as_bytes()).expect("root parses"))
        .expect("root accepted");
    roots
}

/// A certificate's serial number, as x509-parser prints it.
fn serial(der: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("certificate parses");
    cert.tbs_certificate.raw_serial_as_string()
}

/// A listener `name` on `port` whose connection manager sends everything to `cluster`;
/// `transport_socket` (a line of the chain, or empty) makes it terminate TLS.
fn listener(name: &str, port: u16, transport_socket: &str, cluster: &str) -> String {
    format!(
        r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - {transport_socket}
      filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: {name}
          http_filters: [{ROUTER}]
          route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, route: {{cluster: {cluster}}}}}]}}]}}"#
    )
}

/// revoy's bootstrap: admin on `admin`, `listeners` and `clusters` (entries), and `sds-grpc`.
fn bootstrap(admin: u16, listeners: &str, clusters: &str, sds: &Sds) -> String {
    format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
node: {{id: {NODE}, cluster: rotation}}
static_resources:
  listeners:{listeners}
  clusters:{clusters}{sds_cluster}
"#,
        sds_cluster = sds_cluster(sds.socket())
    )
}

/// Starts revoy on `yaml`, ready once `/ready` says LIVE (its secrets have arrived).
fn start_revoy(yaml: &str, admin: u16) -> Proxy {
    let addr = SocketAddr::from(([127, 0, 0, 1], admin));
    Proxy::start(yaml, move || {
        http1::get(None, addr, "/ready").is_ok_and(|(status, _)| status == 200)
    })
}

/// Waits until `f` holds, for at most [`WAIT`]; panics naming `what`.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The load's bookkeeping: requests served, and what went wrong.
#[derive(Default)]
struct Load {
    stop: AtomicBool,
    served: AtomicU64,
    failures: Mutex<Vec<String>>,
}

impl Load {
    fn fail(&self, what: String) {
        self.failures.lock().expect("failures").push(what);
    }

    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Stops the load when dropped, so a failing assertion of the thread running the rotations
    /// does not leave the load running (a scope waits for its threads before it unwinds).
    fn stops_on_drop(&self) -> impl Drop + '_ {
        struct Stop<'a>(&'a Load);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.stop.store(true, Ordering::Relaxed);
            }
        }
        Stop(self)
    }

    /// Waits until `n` more requests than now have been served.
    fn flows(&self, n: u64) {
        let from = self.served.load(Ordering::Relaxed);
        eventually(&format!("{n} more requests"), || {
            self.served.load(Ordering::Relaxed) >= from + n
        });
    }
}

/// A keep-alive HTTPS connection to revoy, with the certificate it was shown.
struct Https {
    reader: BufReader<StreamOwned<ClientConnection, TcpStream>>,
    /// The end-entity certificate presented (DER).
    certificate: Vec<u8>,
}

impl Https {
    /// Connects to 127.0.0.1:`port` as a client for `rotate.test` and completes the handshake.
    fn open(port: u16, config: &Arc<ClientConfig>) -> Result<Https, String> {
        let stream = https::connect(port, config, "rotate.test")?;
        stream
            .sock
            .set_read_timeout(Some(WAIT))
            .map_err(|e| e.to_string())?;
        let certificate = stream
            .conn
            .peer_certificates()
            .and_then(|c| c.first())
            .ok_or("no certificate presented")?
            .to_vec();
        Ok(Https {
            reader: BufReader::new(stream),
            certificate,
        })
    }

    /// A GET on the connection: the body of a 200 answer.
    fn get(&mut self) -> Result<String, String> {
        self.reader
            .get_mut()
            .write_all(b"GET / HTTP/1.1\r\nhost: rotate.test\r\n\r\n")
            .map_err(|e| format!("write: {e}"))?;
        read_response(&mut self.reader)
    }
}

/// Reads one HTTP/1.1 response with a `content-length` body from `reader`: the body of a
/// 200, or what was wrong.
fn read_response(reader: &mut impl BufRead) -> Result<String, String> {
    let mut status = String::new();
    reader
        .read_line(&mut status)
        .map_err(|e| format!("read: {e}"))?;
    let mut length = 0;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => return Err(format!("closed after {status:?}")),
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {}
            Err(e) => return Err(format!("read: {e}")),
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().map_err(|e| format!("length: {e}"))?;
        }
    }
    let mut body = vec![0; length];
    reader
        .read_exact(&mut body)
        .map_err(|e| format!("body: {e}"))?;
    let body = String::from_utf8_lossy(&body).into_owned();
    if status.starts_with("HTTP/1.1 200 ") {
        Ok(body)
    } else {
        Err(format!("{} {body}", status.trim()))
    }
}

#[test]
fn server_certificate_rotation_under_load() {
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    let sds = Sds::start(dir.path(), "sds");
    let first = ca.server(&["rotate.test"]).issue();
    sds.put(&[sds::certificate("default", &first)]);
    let app = xds::upstream("app");
    let (admin, port) = (free_port(), free_port());
    let tls = format!(
        "transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\"@type\": \
         type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext, \
         common_tls_context: {{tls_certificate_sds_secret_configs: [{}]}}}}}}",
        sds_config("default")
    );
    let yaml = bootstrap(
        admin,
        &listener("tls", port, &tls, "app"),
        &cluster("app", app, ""),
        &sds,
    );
    let _revoy = start_revoy(&yaml, admin);

    // One client configuration, so one session cache, for every connection.
    let config = Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots(&ca))
            .with_no_client_auth(),
    );
    let load = Load::default();
    // The connections opened before the first rotation, and the requests each served after
    // the last.
    let kept: Vec<Https> = (0..2)
        .map(|_| Https::open(port, &config).expect("a connection before any rotation"))
        .collect();
    for k in &kept {
        assert_eq!(k.certificate, first.cert_der, "the first certificate");
    }
    let after_last = AtomicU64::new(0);
    let rotated = AtomicBool::new(false);
    std::thread::scope(|s| {
        for mut conn in kept {
            let (load, after_last, rotated) = (&load, &after_last, &rotated);
            s.spawn(move || {
                while load.running() {
                    match conn.get() {
                        Ok(body) if body == "app" => {
                            load.served.fetch_add(1, Ordering::Relaxed);
                            if rotated.load(Ordering::Relaxed) {
                                after_last.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        other => {
                            load.fail(format!("kept connection: {other:?}"));
                            return;
                        }
                    }
                }
            });
        }
        for _ in 0..2 {
            let (load, config) = (&load, &config);
            s.spawn(move || {
                while load.running() {
                    let mut conn = match Https::open(port, config) {
                        Ok(c) => c,
                        Err(e) => {
                            load.fail(format!("new connection: {e}"));
                            continue;
                        }
                    };
                    for _ in 0..5 {
                        match conn.get() {
                            Ok(body) if body == "app" => {
                                load.served.fetch_add(1, Ordering::Relaxed);
                            }
                            other => load.fail(format!("new connection: {other:?}")),
                        }
                    }
                }
            });
        }
        let _stop = load.stops_on_drop();
        load.flows(REQUESTS_PER_CERTIFICATE);
        for n in 1..=ROTATIONS {
            let next = ca.server(&["rotate.test"]).issue();
            let version = sds.put(&[sds::certificate("default", &next)]);
            sds.ack(NODE, &version);
            match Https::open(port, &config) {
                Ok(c) if c.certificate == next.cert_der => {}
                Ok(c) => load.fail(format!(
                    "rotation {n}: a new connection was shown serial {}, not the new {}",
                    serial(&c.certificate),
                    serial(&next.cert_der)
                )),
                Err(e) => load.fail(format!("rotation {n}: {e}")),
            }
            load.flows(REQUESTS_PER_CERTIFICATE);
        }
        rotated.store(true, Ordering::Relaxed);
        load.flows(REQUESTS_PER_CERTIFICATE);
    });
    let failures = load.failures.into_inner().expect("failures");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        after_last.load(Ordering::Relaxed) > 0,
        "the connections opened before the rotations were not served after them"
    );
}

/// A cluster entry `name` with one endpoint on 127.0.0.1:`port`; `extra`: more lines.
fn cluster(name: &str, port: u16, extra: &str) -> String {
    format!(
        r#"
  - name: {name}
    type: STATIC
    connect_timeout: 1s
    load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}{extra}"#
    )
}

/// An HTTP/1.1 upstream over mutual TLS on 127.0.0.1: it requires a client certificate from
/// `ca`, presents `cert`, resumes sessions (rustls' default cache), keeps connections alive,
/// and answers every GET with the serial number of the client certificate of its connection.
/// It runs until the test process exits.
fn mtls_upstream(ca: &Ca, cert: &Issued) -> u16 {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(ca)),
        provider(),
    )
    .build()
    .expect("client verifier");
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain(cert), key(cert))
            .expect("server certificate"),
    );
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the mTLS upstream");
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut reader = BufReader::new(StreamOwned::new(conn, tcp));
                loop {
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    let body = reader
                        .get_ref()
                        .conn
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map_or_else(|| "none".to_owned(), |c| serial(c));
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if reader.get_mut().write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[test]
fn client_certificate_rotation_under_load() {
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    let sds = Sds::start(dir.path(), "sds");
    let first = ca.workload("default", "sleep").issue();
    sds.serve_mesh(&first, &ca);
    let upstream = mtls_upstream(&ca, &ca.server(&["upstream.test"]).issue());
    let (admin, port) = (free_port(), free_port());
    // A few requests per upstream connection, so new ones are made all along.
    let tls = format!(
        "\n    typed_extension_protocol_options:\
         \n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\
         \n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\
         \n        common_http_protocol_options: {{max_requests_per_connection: 5}}\
         \n        explicit_http_config: {{http_protocol_options: {{}}}}\
         \n    transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\"@type\": \
         type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, \
         sni: upstream.test, common_tls_context: {{tls_certificate_sds_secret_configs: [{}], \
         validation_context_sds_secret_config: {}}}}}}}",
        sds_config("default"),
        sds_config("ROOTCA")
    );
    let yaml = bootstrap(
        admin,
        &listener("out", port, "", "mtls"),
        &cluster("mtls", upstream, &tls),
        &sds,
    );
    let _revoy = start_revoy(&yaml, admin);

    let load = Load::default();
    // The serial each response named, latest last.
    let seen: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            let (load, seen) = (&load, &seen);
            s.spawn(move || {
                let mut conn = None;
                while load.running() {
                    let c = match &mut conn {
                        Some(c) => c,
                        None => match xds::Conn::open(port) {
                            Ok(c) => conn.insert(c),
                            Err(e) => {
                                load.fail(format!("connect: {e}"));
                                continue;
                            }
                        },
                    };
                    match c.get("/") {
                        Ok(r) if r.status == 200 => {
                            load.served.fetch_add(1, Ordering::Relaxed);
                            seen.lock().expect("seen").push(r.body);
                        }
                        other => {
                            load.fail(format!("request: {other:?}"));
                            conn = None;
                        }
                    }
                }
            });
        }
        let _stop = load.stops_on_drop();
        let shown = |expected: &str| {
            seen.lock()
                .expect("seen")
                .iter()
                .rev()
                .take(20)
                .any(|s| s == expected)
        };
        eventually("the first client certificate upstream", || {
            shown(&serial(&first.cert_der))
        });
        load.flows(REQUESTS_PER_CERTIFICATE);
        for _ in 0..ROTATIONS {
            let next = ca.workload("default", "sleep").issue();
            let version = sds.put(&[sds::certificate("default", &next)]);
            sds.ack(NODE, &version);
            let expected = serial(&next.cert_der);
            eventually(&format!("client certificate {expected} upstream"), || {
                shown(&expected)
            });
            load.flows(REQUESTS_PER_CERTIFICATE);
        }
    });
    let failures = load.failures.into_inner().expect("failures");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
