//! More of the access log against Envoy 1.40: `%TRAILER(..)%` (an HTTP/1 upstream's chunked
//! trailers, `enable_trailers` on both sides), the file logger's `typed_json_format`,
//! `grpc_status_filter` (its statuses, and `exclude`) over gRPC statuses in headers, in
//! trailers and mapped from the HTTP status, and a listener's `access_log` for a connection no
//! filter chain took (`NR`, `filter_chain_not_found`), and a tcp_proxy connection's bytes on
//! its downstream and upstream connections (one proxied, one whose upstream refused it).
//! Each logger writes a file of its own; the files are compared whole.

use super::*;

/// The `trailers` logger's lines.
const TRAILERS: &str = "%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %TRAILER(X-T)% %TRAILER(GRPC-STATUS)% %TRAILER(X-T):3% %TRAILER(X-NONE?X-T)% %RESP(GRPC-STATUS)%\n";

/// The listener logger's lines.
/// The tcp_proxy listeners' line: a connection's bytes on both of its connections.
const TCP_WIRE: &str = "%UPSTREAM_CLUSTER% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DOWNSTREAM_WIRE_BYTES_RECEIVED% %DOWNSTREAM_WIRE_BYTES_SENT% %UPSTREAM_WIRE_BYTES_SENT% %UPSTREAM_WIRE_BYTES_RECEIVED% %UPSTREAM_HEADER_BYTES_SENT% %UPSTREAM_HEADER_BYTES_RECEIVED%\n";

const NO_CHAIN: &str = "%RESPONSE_FLAGS% %RESPONSE_FLAGS_LONG% %RESPONSE_CODE% %RESPONSE_CODE_DETAILS% [%CONNECTION_TERMINATION_DETAILS%] %DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT% %BYTES_RECEIVED% %BYTES_SENT% %PROTOCOL% %UPSTREAM_HOST% %UPSTREAM_CLUSTER%\n";

/// The upstream: `/trailers` answers a chunked body with trailers `x-t` and `grpc-status:
/// 5`; `/grpc/N` answers `grpc-status: N` in its head; anything else `200 hello world`.
fn extras_upstream() -> u16 {
    head_upstream(|head, s| {
        let path = head.split(' ').nth(1).unwrap_or("");
        let reply = if path == "/trailers" {
            "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-t: trailer-value\r\ngrpc-status: 5\r\n\r\n".to_owned()
        } else if let Some(code) = path.strip_prefix("/grpc/") {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ngrpc-status: {code}\r\ncontent-length: 0\r\n\r\n"
            )
        } else {
            "HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello world\n".to_owned()
        };
        s.write_all(reply.as_bytes()).is_ok()
    })
}

/// The loggers of the connection manager: a name (its file) and its `typed_config` after
/// the path.
fn extras_loggers(dir: &Path) -> String {
    let file = |name: &str, rest: &str| {
        format!(
            "{{name: {name}, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: {}, {rest}}}}}",
            dir.join(format!("{name}.log")).display()
        )
    };
    let trailers = format!("log_format: {}", text(TRAILERS));
    let plain = format!("log_format: {}", text("%REQ(:PATH)% %RESPONSE_CODE%\n"));
    [
        file("trailers", &trailers),
        file(
            "typed",
            "typed_json_format: {path: \"%REQ(:PATH)%\", code: \"%RESPONSE_CODE%\", trailer: \"%TRAILER(X-T)%\", n: 3, nested: {flags: \"%RESPONSE_FLAGS%\", both: \"%RESPONSE_CODE%-%TRAILER(GRPC-STATUS)%\"}}",
        ),
        file("grpc", &plain).replace(
            ", typed_config",
            ", filter: {grpc_status_filter: {statuses: [NOT_FOUND, UNIMPLEMENTED, OK]}}, typed_config",
        ),
        file("grpc_ex", &plain).replace(
            ", typed_config",
            ", filter: {grpc_status_filter: {statuses: [NOT_FOUND], exclude: true}}, typed_config",
        ),
    ]
    .join(", ")
}

/// The extras' listeners: the connection manager's, one no chain takes, and a tcp_proxy to
/// the upstream and one to a cluster nothing listens on.
struct Ports {
    admin: u16,
    http: u16,
    nochain: u16,
    tcp: u16,
    tcp_dead: u16,
}

fn extras_bootstrap(ports: &Ports, upstream: u16, dead: u16, dir: &Path) -> String {
    let listener_log = logger(&dir.join("nochain.log"), &text(NO_CHAIN));
    let head = hcm_bootstrap_head(ports.admin, ports.http, "extras");
    let tcp_listener = |name: &str, port: u16, cluster: &str| {
        format!(
            r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: tcp
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: {name}
          cluster: {cluster}
          access_log: [{log}]"#,
            log = logger(&dir.join(format!("{name}.log")), &text(TCP_WIRE)),
        )
    };
    format!(
        r#"{head}          http_protocol_options: {{enable_trailers: true}}
          access_log: [{loggers}]
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - {{match: {{prefix: /none}}, direct_response: {{status: 404}}}}
              - {{match: {{prefix: /}}, route: {{cluster: up}}}}
  - name: nochain
    address: {{socket_address: {{address: 127.0.0.1, port_value: {nochain}}}}}
    access_log: [{listener_log}]
    filter_chains:
    - filter_chain_match: {{source_prefix_ranges: [{{address_prefix: 127.0.0.2, prefix_len: 32}}]}}
      filters:
      - name: tcp
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: nochain
          cluster: up{tcp}{tcp_dead}
  clusters:
  - name: up
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http_protocol_options: {{enable_trailers: true}}}}
    load_assignment: {{cluster_name: up, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]}}
  - name: dead
    connect_timeout: 1s
    load_assignment: {{cluster_name: dead, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {dead}}}}}}}}}]}}]}}
"#,
        nochain = ports.nochain,
        loggers = extras_loggers(dir),
        tcp = tcp_listener("tcp", ports.tcp, "up"),
        tcp_dead = tcp_listener("tcpdead", ports.tcp_dead, "dead"),
    )
}

/// The requests: a path and the status line's start.
const PATHS: [(&str, &str); 6] = [
    ("/trailers", "HTTP/1.1 200"),
    ("/grpc/0", "HTTP/1.1 200"),
    ("/grpc/5", "HTTP/1.1 200"),
    ("/grpc/12", "HTTP/1.1 200"),
    ("/ok", "HTTP/1.1 200"),
    ("/none", "HTTP/1.1 404"),
];

/// The files, in this order, and how many lines each should end with on Envoy.
const FILES: [(&str, usize); 7] = [
    ("trailers", 6),
    ("typed", 6),
    ("grpc", 5),
    ("grpc_ex", 4),
    ("nochain", 1),
    ("tcp", 1),
    ("tcpdead", 1),
];

/// A GET through a tcp_proxy listener: its response read, then the client's side closed
/// (the upstream closes then, and so does the proxy) and the rest read.
fn through_tcp(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /ok HTTP/1.1\r\nhost: h.test\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 256];
    while !got.ends_with(b"hello world\n") {
        match s.read(&mut chunk) {
            Ok(n) if n > 0 => got.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    let _ = s.read_to_end(&mut got);
    String::from_utf8_lossy(&got).into_owned()
}

fn observe_extras(
    dir: &Path,
    upstream: u16,
    dead: u16,
    start: impl FnOnce(&str, u16) -> Proxy,
) -> Vec<Vec<String>> {
    let ports = Ports {
        admin: free_port(),
        http: free_port(),
        nochain: free_port(),
        tcp: free_port(),
        tcp_dead: free_port(),
    };
    let _proxy = start(&extras_bootstrap(&ports, upstream, dead, dir), ports.http);
    for (path, status) in PATHS {
        let raw = format!(
            "GET {path} HTTP/1.1\r\nhost: h.test\r\nte: trailers\r\nconnection: close\r\n\r\n"
        );
        let answer = send_raw(ports.http, raw.as_bytes());
        assert!(answer.starts_with(status), "{path}: {answer}");
    }
    // No filter chain takes a connection from 127.0.0.1: closed at once, logged.
    let answer = send_raw(ports.nochain, b"ping");
    assert_eq!(answer, "");
    let answer = through_tcp(ports.tcp);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The client's bytes wait unread while the connection fails, as in Envoy.
    send_raw(ports.tcp_dead, b"ping");
    FILES
        .iter()
        .map(|(name, n)| read_lines(&dir.join(format!("{name}.log")), *n))
        .collect()
}

#[test]
fn access_log_extras_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("access_log_extras_match_envoy") else {
        return;
    };
    let (upstream, dead) = (extras_upstream(), free_port());
    let envoy_dir = log_dir("extras-envoy");
    let theirs = observe_extras(&envoy_dir, upstream, dead, |yaml, http| {
        envoy_proxy(&envoy, yaml, "4714", http)
    });
    let revoy_dir = log_dir("extras-revoy");
    let ours = observe_extras(&revoy_dir, upstream, dead, revoy_proxy);
    let mut failures = Vec::new();
    for (((name, n), e), r) in FILES.iter().zip(&theirs).zip(&ours) {
        if e.len() != *n {
            failures.push(format!("Envoy's {name} has not {n} lines: {e:#?}"));
        }
        let (e, r) = if *name == "typed" {
            let parse = |l: &Vec<String>| -> Vec<serde_json::Value> {
                l.iter()
                    .map(|x| serde_json::from_str(x).unwrap_or_else(|err| panic!("{x}: {err}")))
                    .collect()
            };
            (format!("{:#?}", parse(e)), format!("{:#?}", parse(r)))
        } else {
            (format!("{e:#?}"), format!("{r:#?}"))
        };
        if e != r {
            failures.push(format!("{name}:\n  envoy: {e}\n  revoy: {r}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        theirs[0][0].contains(" trailer-value 5 tra trailer-value "),
        "{:#?}",
        theirs[0]
    );
    assert!(
        theirs[4][0].starts_with("NR NoRouteFound 0 filter_chain_not_found "),
        "{:#?}",
        theirs[4]
    );
    // A 34-byte request and a 51-byte response, counted on both connections.
    assert_eq!(
        theirs[5],
        ["up - 34 51 34 51 34 51 0 0"],
        "{:#?}",
        theirs[5]
    );
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}
