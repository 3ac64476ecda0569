//! xDS for tests: an in-process ADS control plane (`xds_client::server`) on its own runtime that
//! can be killed and restarted on the same port, revoy bootstraps that use it, resources built
//! from small YAML snippets, tiny HTTP/1.1 upstreams that name themselves, a keep-alive client,
//! and admin helpers.
//!
//! The test crate declares `support/child.rs` as `child`, `support/http1.rs` as `http1` and
//! `support/ports.rs` as `ports` beside this module.
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use xds_client::Verdict;
use xds_client::server::{ClientEvent, Server, Snapshot};

/// The node id every bootstrap here sends.
pub const NODE: &str = "xds-test-node";

/// How long a test waits for something that should happen promptly.
pub const WAIT: Duration = Duration::from_secs(15);

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "{name: r, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// The ADS control plane: a [`Server`] serving on 127.0.0.1:`port` from a runtime of its own,
/// so [`Plane::kill`] ends every stream at once, as a crashed control plane would.
pub struct Plane {
    /// The server (its snapshot and event log survive a kill and restart).
    pub server: Server,
    /// The port it serves on.
    pub port: u16,
    serving: Option<tokio::runtime::Runtime>,
    waiter: tokio::runtime::Runtime,
}

impl Plane {
    /// A plane with no snapshot yet, serving on `port`.
    pub fn start(port: u16) -> Plane {
        let waiter = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("waiter runtime");
        let mut plane = Plane {
            server: Server::new(),
            port,
            serving: None,
            waiter,
        };
        plane.restart();
        plane
    }

    /// Kills the plane: its runtime and every task on it (the listener and the streams) end.
    pub fn kill(&mut self) {
        if let Some(rt) = self.serving.take() {
            rt.shutdown_background();
        }
    }

    /// Serves again on the same port (after [`Plane::kill`]), with the same snapshot.
    pub fn restart(&mut self) {
        self.kill();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("plane runtime");
        let deadline = Instant::now() + WAIT;
        loop {
            match rt.block_on(self.server.serve_tcp(("127.0.0.1", self.port))) {
                Ok(_) => break,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "bind 127.0.0.1:{}: {e}",
                        self.port
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        self.serving = Some(rt);
    }

    /// Replaces the snapshot.
    pub fn set(&self, snapshot: Snapshot) {
        self.server.set(snapshot);
    }

    /// Waits for revoy's answer to version `version` of `type_url`.
    pub fn verdict(&self, type_url: &str, version: &str) -> Verdict {
        self.waiter
            .block_on(self.server.acked(NODE, type_url, version, WAIT))
            .unwrap_or_else(|| {
                panic!(
                    "no answer to {type_url} version {version}: {:#?}",
                    self.server.events()
                )
            })
    }

    /// Waits for revoy to ACK version `version` of `type_url`.
    pub fn ack(&self, type_url: &str, version: &str) {
        match self.verdict(type_url, version) {
            Verdict::Ack => {}
            Verdict::Nack(reason) => panic!("{type_url} {version} NACKed: {reason}"),
        }
    }

    /// Waits until `found` holds for the events so far.
    pub fn wait_events(&self, mut found: impl FnMut(&[ClientEvent]) -> bool) -> bool {
        self.waiter
            .block_on(
                self.server
                    .wait_for(|events| found(events).then_some(()), WAIT),
            )
            .is_some()
    }
}

impl Drop for Plane {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A revoy bootstrap: admin on `admin`, node [`NODE`], LDS and CDS over ADS (`GRPC`, or
/// `DELTA_GRPC` when `delta`) to the static cluster `xds-grpc` at 127.0.0.1:`xds`, with
/// Istio's `initial_fetch_timeout: 0s`.
pub fn ads_bootstrap(admin: u16, xds: u16, delta: bool) -> String {
    let api = if delta { "DELTA_GRPC" } else { "GRPC" };
    format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
node: {{id: {NODE}, cluster: xds-test}}
dynamic_resources:
  lds_config: {{ads: {{}}, initial_fetch_timeout: 0s, resource_api_version: V3}}
  cds_config: {{ads: {{}}, initial_fetch_timeout: 0s, resource_api_version: V3}}
  ads_config:
    api_type: {api}
    transport_api_version: V3
    grpc_services: [{{envoy_grpc: {{cluster_name: xds-grpc}}}}]
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    connect_timeout: 1s
    load_assignment: {{cluster_name: xds-grpc, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {xds}}}}}}}}}]}}]}}
"#
    )
}

/// Starts revoy on `yaml` and waits until its admin on `admin` answers. With `XDS_TEST_LOG`
/// set to a level, revoy logs at that level to `$TMPDIR/revoy-xds-<admin>.log` (a debugging
/// aid).
pub fn start_revoy(yaml: &str, admin: u16) -> crate::child::Proxy {
    start_revoy_with(yaml, admin, &[])
}

/// [`start_revoy`] with the extra command-line arguments `args`.
pub fn start_revoy_with(yaml: &str, admin: u16, args: &[&str]) -> crate::child::Proxy {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_revoy"));
    command.args(["--config-yaml", yaml, "--concurrency", "1"]);
    command.args(args);
    match std::env::var("XDS_TEST_LOG") {
        Ok(level) => {
            let path = std::env::temp_dir().join(format!("revoy-xds-{admin}.log"));
            command.args(["-l", &level, "--log-path"]).arg(path);
        }
        Err(_) => {
            command.args(["-l", "error"]);
        }
    }
    let addr = admin_addr(admin);
    crate::child::Proxy::spawn(command, || crate::http1::get(None, addr, "/ready").is_ok())
}

fn admin_addr(admin: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], admin))
}

/// An admin GET: status and body.
pub fn admin_get(admin: u16, path: &str) -> (u16, String) {
    crate::http1::get(None, admin_addr(admin), path)
        .unwrap_or_else(|e| panic!("admin GET {path}: {e}"))
}

/// The value of stat `name` (`None` when revoy has no such stat).
pub fn stat(admin: u16, name: &str) -> Option<u64> {
    let (_, body) = admin_get(
        admin,
        &format!("/stats?filter=^{}$", name.replace('.', "\\.")),
    );
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
}

/// `/ready`'s status and trimmed body.
pub fn ready(admin: u16) -> (u16, String) {
    let (status, body) = admin_get(admin, "/ready");
    (status, body.trim().to_owned())
}

/// Polls `f` every 20 ms until it answers `Some`, for at most [`WAIT`]; panics naming `what`.
pub fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Decodes a YAML snippet as `T` (its `@type` Anys included).
pub fn decode<T: prost::Message + prost::Name + Default>(yaml: &str) -> T {
    let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).expect("yaml");
    proto::Codec::for_document(&T::full_name(), &value)
        .decode(value, false)
        .unwrap_or_else(|e| panic!("{} decodes: {e}\n{yaml}", T::full_name()))
        .message
}

/// An EDS cluster `name` whose endpoints come over ADS under the service name `name`.
pub fn eds_cluster(name: &str) -> Cluster {
    decode(&format!(
        "{{name: {name}, type: EDS, connect_timeout: 1s, eds_cluster_config: {{service_name: {name}, eds_config: {{ads: {{}}, resource_api_version: V3}}}}}}"
    ))
}

/// A STATIC cluster `name` with one endpoint, 127.0.0.1:`port`.
pub fn static_cluster(name: &str, port: u16) -> Cluster {
    decode(&format!(
        "{{name: {name}, type: STATIC, connect_timeout: 1s, load_assignment: {}}}",
        assignment_yaml(name, port)
    ))
}

fn assignment_yaml(name: &str, port: u16) -> String {
    format!(
        "{{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}"
    )
}

/// The endpoints of service `name`: 127.0.0.1:`port`.
pub fn assignment(name: &str, port: u16) -> ClusterLoadAssignment {
    decode(&assignment_yaml(name, port))
}

/// A listener `name` on 127.0.0.1:`port` whose connection manager (stat prefix `prefix`)
/// takes its routes from RDS `route`.
pub fn rds_listener(name: &str, port: u16, prefix: &str, route: &str) -> Listener {
    listener_with(
        name,
        port,
        &format!(
            "stat_prefix: {prefix}\nrds: {{route_config_name: {route}, config_source: {{ads: {{}}, resource_api_version: V3}}}}"
        ),
    )
}

/// A listener `name` on 127.0.0.1:`port` whose connection manager has one virtual host for
/// every domain with `routes` (a flow-style list) inline.
pub fn inline_listener(name: &str, port: u16, routes: &str) -> Listener {
    listener_with(
        name,
        port,
        &format!(
            "stat_prefix: {name}\nroute_config: {{name: {name}-routes, virtual_hosts: [{{name: all, domains: [\"*\"], routes: {routes}}}]}}"
        ),
    )
}

/// A listener `name` on `port` whose connection manager (with a router) has `hcm_fields`
/// (block-style YAML lines).
pub fn listener_with(name: &str, port: u16, hcm_fields: &str) -> Listener {
    let fields: String = hcm_fields
        .lines()
        .map(|l| format!("\n        {l}"))
        .collect();
    decode(&format!(
        r#"
name: {name}
address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
filter_chains:
- filters:
  - name: hcm
    typed_config:
        "@type": {HCM}{fields}
        http_filters: [{ROUTER}]
"#
    ))
}

/// The listener YAML a `path_config_source` file holds: the same as [`inline_listener`].
pub fn inline_listener_yaml(name: &str, port: u16, routes: &str) -> String {
    format!(
        r#"
  - "@type": type.googleapis.com/envoy.config.listener.v3.Listener
    name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: {name}
          route_config: {{name: {name}-routes, virtual_hosts: [{{name: all, domains: ["*"], routes: {routes}}}]}}
          http_filters: [{ROUTER}]"#
    )
}

/// A route configuration `name`: every domain, `routes` (a flow-style list).
pub fn route_config(name: &str, routes: &str) -> RouteConfiguration {
    decode(&format!(
        "{{name: {name}, virtual_hosts: [{{name: all, domains: [\"*\"], routes: {routes}}}]}}"
    ))
}

/// One route list sending every path to `cluster`.
pub fn to_cluster(cluster: &str) -> String {
    format!("[{{match: {{prefix: \"/\"}}, route: {{cluster: {cluster}}}}}]")
}

/// An HTTP/1.1 upstream on 127.0.0.1 that answers every request with 200 and its name as the
/// body, keeping connections alive. It runs until the test process exits, so it binds a port
/// the kernel picks (no other process can take it between a choice and the bind).
pub fn upstream(name: &str) -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind upstream");
    let port = listener.local_addr().expect("upstream address").port();
    let name = name.to_owned();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let name = name.clone();
            std::thread::spawn(move || serve_named(conn, &name));
        }
    });
    port
}

fn serve_named(conn: TcpStream, name: &str) {
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut conn = conn;
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        let mut first = true;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" && !first {
                break;
            }
            first = false;
            if let Some((n, v)) = line.split_once(':')
                && n.trim().eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{name}",
            name.len()
        );
        if conn.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// A response read by [`Conn`].
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The head's header lines, lower-cased.
    pub head: String,
    /// The body.
    pub body: String,
}

impl Response {
    /// Whether the response says `connection: close`.
    pub fn closes(&self) -> bool {
        self.head
            .lines()
            .any(|l| l.replace(' ', "") == "connection:close")
    }
}

/// A keep-alive HTTP/1.1 client connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    /// Connects to 127.0.0.1:`port`.
    pub fn open(port: u16) -> std::io::Result<Conn> {
        Conn::over(TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], port)),
            WAIT,
        )?)
    }

    /// The client of a connection made elsewhere (in another network namespace, say).
    pub fn over(stream: TcpStream) -> std::io::Result<Conn> {
        stream.set_read_timeout(Some(WAIT))?;
        Ok(Conn {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// A GET of `path` on the connection, keeping it open.
    pub fn get(&mut self, path: &str) -> Result<Response, String> {
        write!(self.writer, "GET {path} HTTP/1.1\r\nhost: xds-test\r\n\r\n")
            .map_err(|e| format!("write: {e}"))?;
        let mut head = String::new();
        loop {
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) => return Err(format!("closed after {head:?}")),
                Ok(_) => {}
                Err(e) => return Err(format!("read: {e}")),
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line.to_ascii_lowercase());
        }
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line: {head}"))?;
        let header = |name: &str| {
            head.lines().find_map(|l| {
                l.split_once(':')
                    .filter(|(n, _)| n.trim() == name)
                    .map(|(_, v)| v.trim().to_owned())
            })
        };
        let body = if let Some(len) = header("content-length") {
            let mut body = vec![0; len.parse().map_err(|e| format!("length: {e}"))?];
            self.reader
                .read_exact(&mut body)
                .map_err(|e| format!("body: {e}"))?;
            body
        } else if header("transfer-encoding").as_deref() == Some("chunked") {
            let mut body = Vec::new();
            loop {
                let mut size = String::new();
                self.reader
                    .read_line(&mut size)
                    .map_err(|e| format!("chunk: {e}"))?;
                let size = usize::from_str_radix(size.trim(), 16)
                    .map_err(|e| format!("chunk size: {e}"))?;
                let mut chunk = vec![0; size + 2];
                self.reader
                    .read_exact(&mut chunk)
                    .map_err(|e| format!("chunk: {e}"))?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
            body
        } else {
            Vec::new()
        };
        Ok(Response {
            status,
            head,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// One GET of `path` on a new connection to 127.0.0.1:`port`.
pub fn get(port: u16, path: &str) -> Result<Response, String> {
    Conn::open(port)
        .map_err(|e| format!("connect: {e}"))?
        .get(path)
}

/// The body of a 200 answer to GET `/` on a new connection, or `None`.
pub fn body_of(port: u16) -> Option<String> {
    get(port, "/")
        .ok()
        .filter(|r| r.status == 200)
        .map(|r| r.body)
}

/// `/config_dump?resource=dynamic_listeners`, parsed.
pub fn dynamic_listeners(admin: u16) -> Vec<serde_json::Value> {
    let (status, body) = admin_get(admin, "/config_dump?resource=dynamic_listeners");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("config_dump is JSON");
    v["configs"].as_array().cloned().unwrap_or_default()
}

/// `/xds`, parsed.
pub fn xds_status(admin: u16) -> serde_json::Value {
    let (status, body) = admin_get(admin, "/xds");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("/xds is JSON")
}

/// Whether a TCP connection to 127.0.0.1:`port` is refused.
pub fn refused(port: u16) -> bool {
    matches!(
        TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), WAIT),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// Reads to the end of `stream` (for closing checks).
pub fn read_to_end(mut stream: TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    out
}
