//! More cases against Envoy 1.40: WebSocket upgrades, each logged when its tunnel closes
//! (closed by the client: `DC`; by the upstream: `UC`; and, as Envoy's HTTP/1 codec has no
//! half-close, ended by the first side to close while the other holds on), a retry on `5xx` that succeeds on its
//! second attempt, a rewritten path (`X-ENVOY-ORIGINAL-PATH`), and which requests each
//! access-log filter lets through (status code, duration, response flags, header, and/or,
//! not-health-check, runtime sampling by request id, traceable: a trace a service forced through
//! the request id's mark, with random sampling off). Every logger writes the same text
//! format, led by the case's name, to a file of its own; the files are compared line by line.
//! One more logger writes the request headers the router adds or removes (route and virtual
//! host `request_headers_to_add`/`_remove`, `x-envoy-expected-rq-timeout-ms`,
//! `x-envoy-attempt-count`, set again by a retry), which Envoy's `%REQ(..)%` reads, and
//! another each request's wire bytes, downstream and upstream (a WebSocket's heads and tunnel
//! bytes included).

use super::*;

use std::sync::Mutex;

/// Each line: the case, then what the cases differ in.
const CASE: &str = "%REQ(X-CASE)% %REQ(:AUTHORITY)% %REQ(:PATH)% %REQ(X-ENVOY-ORIGINAL-PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %UPSTREAM_REQUEST_ATTEMPT_COUNT% %BYTES_RECEIVED% %BYTES_SENT% %UPSTREAM_HOST% %UPSTREAM_CLUSTER% %ROUTE_NAME% %PROTOCOL% %UPSTREAM_TRANSPORT_FAILURE_REASON% %RESP(UPGRADE)%\n";

/// The `headers` logger's lines: the request headers as the router leaves them (its
/// `request_headers_to_add`/`_remove` at each level, `x-envoy-expected-rq-timeout-ms`,
/// `x-envoy-attempt-count`), as Envoy's access logs read them.
const HEADERS: &str = "%REQ(X-CASE)% %REQ(X-ROUTE-ADDED)% %REQ(X-VHOST-ADDED)% %REQ(X-DROP)% %REQ(X-ENVOY-EXPECTED-RQ-TIMEOUT-MS)% %REQ(X-ENVOY-ATTEMPT-COUNT)% %REQ(X-FORWARDED-PROTO)% %REQ(:AUTHORITY)% %REQ(HOST)% %REQ(X-ENVOY-ORIGINAL-HOST)%\n";

/// The `wire` logger's lines: each request's bytes on its downstream and upstream
/// connections (an upgrade's: its heads and its tunnel's bytes, counted when it closes).
const WIRE: &str = "%REQ(X-CASE)% %DOWNSTREAM_WIRE_BYTES_RECEIVED% %DOWNSTREAM_WIRE_BYTES_SENT% %DOWNSTREAM_HEADER_BYTES_RECEIVED% %DOWNSTREAM_HEADER_BYTES_SENT% %UPSTREAM_WIRE_BYTES_SENT% %UPSTREAM_WIRE_BYTES_RECEIVED% %UPSTREAM_HEADER_BYTES_SENT% %UPSTREAM_HEADER_BYTES_RECEIVED%\n";

/// The loggers: a name (its file) and its filter (YAML, or empty for none).
const FILTERS: [(&str, &str); 10] = [
    ("all", ""),
    (
        "status",
        "{status_code_filter: {comparison: {op: GE, value: {default_value: 500, runtime_key: none}}}}",
    ),
    (
        "duration",
        "{duration_filter: {comparison: {op: GE, value: {default_value: 1000, runtime_key: none}}}}",
    ),
    ("flags_any", "{response_flag_filter: {}}"),
    ("flags_uf", "{response_flag_filter: {flags: [UF, NR]}}"),
    (
        "header",
        "{header_filter: {header: {name: x-log, string_match: {exact: \"yes\"}}}}",
    ),
    (
        "and_or",
        "{or_filter: {filters: [{header_filter: {header: {name: x-log, present_match: true}}}, {and_filter: {filters: [{status_code_filter: {comparison: {op: GE, value: {default_value: 400, runtime_key: none}}}}, {not_health_check_filter: {}}]}}]}}",
    ),
    ("not_hc", "{not_health_check_filter: {}}"),
    (
        "runtime",
        "{runtime_filter: {runtime_key: none, percent_sampled: {numerator: 50, denominator: HUNDRED}}}",
    ),
    ("traceable", "{traceable_filter: {}}"),
];

/// The upstream: `/flaky` answers 503 to the first request of each `x-run`/`x-case`, then
/// 200; `/ws` accepts a WebSocket upgrade and echoes (`/wsclose`: eight bytes, then it
/// closes; `/wshold`: once the downstream's side ends it holds its connection open for a
/// minute); `/slowok` answers after 1.1 s; anything
/// else is `200 hello world`.
fn case_upstream() -> u16 {
    head_upstream(answer_case)
}

fn header<'a>(head: &'a str, name: &str) -> &'a str {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
        .unwrap_or("")
}

/// The requests whose `x-run`/`x-case` `/flaky` has seen (and answered 503).
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn answer_case(head: &str, s: &mut TcpStream) -> bool {
    let path = head.split(' ').nth(1).unwrap_or("");
    if path.starts_with("/ws") {
        let _ = s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
        );
        let mut chunk = [0u8; 4096];
        if path.starts_with("/wsclose") {
            let mut echo = [0u8; 8];
            if s.read_exact(&mut echo).is_ok() {
                let _ = s.write_all(&echo);
            }
            return false;
        }
        while let Ok(n) = s.read(&mut chunk) {
            if n == 0 && path.starts_with("/wshold") {
                std::thread::sleep(Duration::from_secs(60));
            }
            if n == 0 || s.write_all(&chunk[..n]).is_err() {
                return false;
            }
        }
        return false;
    }
    if path.starts_with("/flaky") {
        let key = format!("{}/{}", header(head, "x-run"), header(head, "x-case"));
        let mut seen = SEEN.lock().unwrap();
        if !seen.contains(&key) {
            seen.push(key);
            return s
                .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nnope")
                .is_ok();
        }
    }
    if path.starts_with("/slowok") {
        std::thread::sleep(Duration::from_millis(1100));
    }
    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello world\n")
        .is_ok()
}

fn case_bootstrap(admin: u16, http: u16, upstream: u16, dead: u16, dir: &Path) -> String {
    let logs: Vec<String> = FILTERS
        .iter()
        .map(|(name, filter)| {
            let filter = if filter.is_empty() {
                String::new()
            } else {
                format!(", filter: {filter}")
            };
            format!(
                "{{name: {name}{filter}, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: {}, log_format: {}}}}}",
                dir.join(format!("{name}.log")).display(),
                text(CASE)
            )
        })
        .chain(std::iter::once(logger(&dir.join("headers.log"), &text(HEADERS))))
        .chain(std::iter::once(logger(&dir.join("wire.log"), &text(WIRE))))
        .collect();
    let cluster = |name: &str, port: u16| {
        format!(
            "\n  - {{name: {name}, connect_timeout: 1s, load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}}}"
        )
    };
    format!(
        r#"{head}          preserve_external_request_id: true
          tracing: {{random_sampling: {{value: 0}}}}
          upgrade_configs: [{{upgrade_type: websocket}}]
          access_log: [{logs}]
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            validate_clusters: false
            virtual_hosts:
            - name: all
              domains: ["*"]
              include_request_attempt_count: true
              request_headers_to_add: [{{header: {{key: x-vhost-added, value: "vh-%REQ(X-CASE)%"}}}}]
              routes:
              - {{name: hdrs, match: {{prefix: /hdrs}}, route: {{cluster: up, timeout: 3s}}, request_headers_to_add: [{{header: {{key: x-route-added, value: route}}}}], request_headers_to_remove: [x-drop]}}
              - {{name: ws, match: {{prefix: /ws}}, route: {{cluster: up}}}}
              - {{name: flaky, match: {{prefix: /flaky}}, route: {{cluster: up, retry_policy: {{retry_on: 5xx, num_retries: 2}}}}}}
              - {{name: hostrw, match: {{prefix: /hostrw}}, route: {{cluster: up, host_rewrite_literal: new.host}}}}
              - {{name: old, match: {{prefix: /old/}}, route: {{cluster: up, prefix_rewrite: /new/}}}}
              - {{name: slowok, match: {{prefix: /slowok}}, route: {{cluster: up}}}}
              - {{name: ok, match: {{prefix: /ok}}, route: {{cluster: up}}}}
              - {{name: dead, match: {{prefix: /dead}}, route: {{cluster: dead}}}}
              - {{name: teapot, match: {{prefix: /teapot}}, direct_response: {{status: 418}}}}
  clusters:{up}{dead_c}
"#,
        head = hcm_bootstrap_head(admin, http, "http"),
        logs = logs.join(", "),
        up = cluster("up", upstream),
        dead_c = cluster("dead", dead),
    )
}

/// A request id whose leading 32 bits are `n` (what runtime sampling reads).
fn request_id(n: u32) -> String {
    format!("x-request-id: {n:08x}-aaaa-4bbb-8ccc-dddddddddddd\r\n")
}

/// One request of case `case` (headers `extra`, whole lines; a request id sampled out at 50%
/// unless `extra` has one), read to its end.
fn case_request(port: u16, run: &str, case: &str, path: &str, extra: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let id = if extra.contains("x-request-id") {
        String::new()
    } else {
        request_id(60 + case.len() as u32)
    };
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: h.test\r\nx-run: {run}\r\nx-case: {case}\r\n{id}{extra}connection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// A WebSocket upgrade to `path` (case `case`, request id `n`): 101, eight bytes each way,
/// then the client closes its side and reads to the end (`/ws`), closes its connection
/// (`/wshold`), or reads until the upstream's close passes and keeps its connection, returned
/// (`/wsclose`).
fn websocket(port: u16, run: &str, case: &str, path: &str, n: u32) -> Option<TcpStream> {
    let id = request_id(n);
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: h.test\r\nx-run: {run}\r\nx-case: {case}\r\n{id}connection: upgrade\r\nupgrade: websocket\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut byte).unwrap(),
            1,
            "the upgrade's head ended early"
        );
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s.write_all(b"ws-hello").unwrap();
    let mut echo = [0u8; 8];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"ws-hello");
    let mut rest = Vec::new();
    match path {
        "/wshold" => None,
        "/wsclose" => {
            let _ = s.read_to_end(&mut rest);
            Some(s)
        }
        _ => {
            s.shutdown(Shutdown::Write).unwrap();
            let _ = s.read_to_end(&mut rest);
            None
        }
    }
}

/// The requests, in order; `run` tells the two proxies apart at the upstream. The connections
/// the client keeps are returned.
fn run_cases(http: u16, run: &str) -> Vec<TcpStream> {
    let ok = |r: String, status: &str| assert!(r.starts_with(status), "{r}");
    ok(case_request(http, run, "ok", "/ok", ""), "HTTP/1.1 200");
    ok(
        case_request(http, run, "logged", "/ok", "x-log: yes\r\n"),
        "HTTP/1.1 200",
    );
    ok(
        case_request(http, run, "logged-no", "/ok", "x-log: no\r\n"),
        "HTTP/1.1 200",
    );
    ok(case_request(http, run, "nr", "/none", ""), "HTTP/1.1 404");
    ok(case_request(http, run, "uf", "/dead", ""), "HTTP/1.1 503");
    ok(
        case_request(http, run, "teapot", "/teapot", ""),
        "HTTP/1.1 418",
    );
    ok(
        case_request(http, run, "retry", "/flaky", ""),
        "HTTP/1.1 200",
    );
    ok(
        case_request(http, run, "rewrite", "/old/page?q=1", ""),
        "HTTP/1.1 200",
    );
    ok(
        case_request(http, run, "host-rewrite", "/hostrw", ""),
        "HTTP/1.1 200",
    );
    ok(
        case_request(http, run, "slow", "/slowok", ""),
        "HTTP/1.1 200",
    );
    for n in [49, 50, 199, 0] {
        ok(
            case_request(http, run, &format!("rid-{n}"), "/ok", &request_id(n)),
            "HTTP/1.1 200",
        );
    }
    ok(
        case_request(http, run, "headers", "/hdrs", "x-drop: gone\r\n"),
        "HTTP/1.1 200",
    );
    // The request id's trace mark (position 14): `a` a service forced the trace, `b` a
    // client did; only the first passes `traceable_filter`.
    for (case, mark) in [("forced", 'a'), ("client-forced", 'b')] {
        let id = format!("x-request-id: 0000002a-aaaa-{mark}bbb-8ccc-dddddddddddd\r\n");
        ok(case_request(http, run, case, "/ok", &id), "HTTP/1.1 200");
    }
    [
        ("websocket", "/ws", 80),
        ("websocket-upstream-closes", "/wsclose", 81),
        ("websocket-client-leaves", "/wshold", 82),
    ]
    .into_iter()
    .filter_map(|(case, path, n)| websocket(http, run, case, path, n))
    .collect()
}

fn observe_cases(
    dir: &Path,
    run: &str,
    upstream: u16,
    dead: u16,
    start: impl FnOnce(&str, u16) -> Proxy,
) -> Vec<Vec<String>> {
    let (admin, http) = (free_port(), free_port());
    let yaml = case_bootstrap(admin, http, upstream, dead, dir);
    let _proxy = start(&yaml, http);
    let _kept = run_cases(http, run);
    let want = [20, 1, 1, 5, 2, 1, 5, 20, 4, 1, 20, 20];
    FILTERS
        .iter()
        .map(|(name, _)| *name)
        .chain(["headers", "wire"])
        .zip(want)
        .map(|(name, n)| read_lines(&dir.join(format!("{name}.log")), n))
        .collect()
}

/// The retry's `x-envoy-expected-rq-timeout-ms` is what was left of the 15 s when the retry
/// started: checked to be at most 15000 and not much under it (whole milliseconds elapsed are
/// taken off: a retry started within 1 ms of the request, its back-off jitter near 0, still
/// has 15000 left), then masked.
fn mask_time_left(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let mut fields: Vec<&str> = l.split(' ').collect();
            if fields[0] != "retry" {
                return l.clone();
            }
            let left: u64 = fields[4].parse().unwrap_or_else(|_| panic!("{l}"));
            assert!((14_000..=15_000).contains(&left), "{l}");
            fields[4] = "LEFT";
            fields.join(" ")
        })
        .collect()
}

/// The wire line of a response whose `x-envoy-upstream-service-time` takes as many digits
/// as the proxy took milliseconds (a retry after its back-off, a slow upstream): its
/// downstream bytes sent and header bytes sent are masked.
fn mask_service_time(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let mut fields: Vec<&str> = l.split(' ').collect();
            if matches!(fields[0], "retry" | "slow") {
                fields[2] = "SENT";
                fields[4] = "HEADERS";
            }
            fields.join(" ")
        })
        .collect()
}

/// The lines carry no times or downstream ports, so each file is compared whole: which
/// requests each filter let through, and what their lines say.
#[test]
fn access_log_cases_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("access_log_cases_match_envoy") else {
        return;
    };
    let (upstream, dead) = (case_upstream(), free_port());
    let envoy_dir = log_dir("cases-envoy");
    let mut theirs = observe_cases(&envoy_dir, "envoy", upstream, dead, |yaml, http| {
        envoy_proxy(&envoy, yaml, "4712", http)
    });
    let revoy_dir = log_dir("cases-revoy");
    let mut ours = observe_cases(&revoy_dir, "revoy", upstream, dead, revoy_proxy);
    for logs in [&mut theirs, &mut ours] {
        let headers = &mut logs[FILTERS.len()];
        *headers = mask_time_left(headers);
        let wire = &mut logs[FILTERS.len() + 1];
        *wire = mask_service_time(wire);
    }
    let mut failures = Vec::new();
    let names = FILTERS
        .iter()
        .map(|(name, _)| *name)
        .chain(["headers", "wire"]);
    for ((name, e), r) in names.zip(&theirs).zip(&ours) {
        if e != r {
            failures.push(format!("{name}:\n  envoy: {e:#?}\n  revoy: {r:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(theirs[0].len(), 20, "Envoy's lines: {:#?}", theirs[0]);
    let traceable = FILTERS.iter().position(|(n, _)| *n == "traceable").unwrap();
    assert_eq!(theirs[traceable].len(), 1, "{:#?}", theirs[traceable]);
    assert!(
        theirs[traceable][0].starts_with("forced "),
        "{:#?}",
        theirs[traceable]
    );
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}
