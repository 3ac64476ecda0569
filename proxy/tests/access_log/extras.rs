//! More of the access log against Envoy 1.40: `%TRAILER(..)%` (an HTTP/1 upstream's chunked
//! trailers, `enable_trailers` on both sides), the file logger's `typed_json_format`,
//! `grpc_status_filter` (its statuses, and `exclude`) over gRPC statuses in headers, in
//! trailers and mapped from the HTTP status, `%REQ_WITHOUT_QUERY()%` under its formatter
//! extension, and a listener's `access_log` for a connection no
//! filter chain took (`NR`, `filter_chain_not_found`). Each logger writes a file of its own;
//! the files are compared whole.

use super::*;

/// The `trailers` logger's lines.
const TRAILERS: &str = "%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %TRAILER(X-T)% %TRAILER(GRPC-STATUS)% %TRAILER(X-T):3% %TRAILER(X-NONE?X-T)% %RESP(GRPC-STATUS)%\n";

/// The listener logger's lines.
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
        file(
            "noquery",
            "log_format: {text_format_source: {inline_string: \"%REQ_WITHOUT_QUERY(:PATH)% %REQ_WITHOUT_QUERY(X-ENVOY-ORIGINAL-PATH?:PATH):4% %REQ_WITHOUT_QUERY(X-NONE)% %REQ(:PATH)%\\n\"}, formatters: [{name: envoy.formatter.req_without_query, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.formatter.req_without_query.v3.ReqWithoutQuery}}]}",
        ),
        file("grpc_ex", &plain).replace(
            ", typed_config",
            ", filter: {grpc_status_filter: {statuses: [NOT_FOUND], exclude: true}}, typed_config",
        ),
    ]
    .join(", ")
}

fn extras_bootstrap(admin: u16, http: u16, nochain: u16, upstream: u16, dir: &Path) -> String {
    let listener_log = logger(&dir.join("nochain.log"), &text(NO_CHAIN));
    let head = hcm_bootstrap_head(admin, http, "extras");
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
          cluster: up
  clusters:
  - name: up
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http_protocol_options: {{enable_trailers: true}}}}
    load_assignment: {{cluster_name: up, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]}}
"#,
        loggers = extras_loggers(dir),
    )
}

/// The requests: a path and the status line's start.
const PATHS: [(&str, &str); 7] = [
    ("/trailers", "HTTP/1.1 200"),
    ("/grpc/0", "HTTP/1.1 200"),
    ("/grpc/5", "HTTP/1.1 200"),
    ("/grpc/12", "HTTP/1.1 200"),
    ("/ok", "HTTP/1.1 200"),
    ("/ok?x=1&y=2", "HTTP/1.1 200"),
    ("/none", "HTTP/1.1 404"),
];

/// The files, in this order, and how many lines each should end with on Envoy.
const FILES: [(&str, usize); 6] = [
    ("trailers", 7),
    ("typed", 7),
    ("grpc", 5),
    ("grpc_ex", 5),
    ("nochain", 1),
    ("noquery", 7),
];

fn observe_extras(
    dir: &Path,
    upstream: u16,
    start: impl FnOnce(&str, u16) -> Proxy,
) -> Vec<Vec<String>> {
    let (admin, http, nochain) = (free_port(), free_port(), free_port());
    let _proxy = start(&extras_bootstrap(admin, http, nochain, upstream, dir), http);
    for (path, status) in PATHS {
        let raw = format!(
            "GET {path} HTTP/1.1\r\nhost: h.test\r\nte: trailers\r\nconnection: close\r\n\r\n"
        );
        let answer = send_raw(http, raw.as_bytes());
        assert!(answer.starts_with(status), "{path}: {answer}");
    }
    // No filter chain takes a connection from 127.0.0.1: closed at once, logged.
    let answer = send_raw(nochain, b"ping");
    assert_eq!(answer, "");
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
    let upstream = extras_upstream();
    let envoy_dir = log_dir("extras-envoy");
    let theirs = observe_extras(&envoy_dir, upstream, |yaml, http| {
        envoy_proxy(&envoy, yaml, "4714", http)
    });
    let revoy_dir = log_dir("extras-revoy");
    let ours = observe_extras(&revoy_dir, upstream, revoy_proxy);
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
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}
