//! Response flags against Envoy 1.40, one request each, logged by a connection manager with
//! `stream_idle_timeout: 1s`: an upstream answering a garbage status line (`UPE`), an
//! upstream holding the request past the idle timeout (`SI`, 504), one stalling its body
//! after the head (`SI`, the stream reset), a route whose `idle_timeout: 0s` turns the idle
//! timeout off, a route's `max_stream_duration` (no flag: Envoy sets `DT` only on
//! tcp_proxy), a circuit breaker with no room for a
//! pending request (`UO`), a cluster without endpoints (`UH`), an HTTP/2 upstream resetting
//! its stream after the response head (`UR`), an HTTP/1 upstream closing its connection
//! in the middle of the body (`UC`), header-controlled fault delay
//! and abort (`DI,FI`), an ext_authz denial (`UAEX`), and request bodies that stall past the
//! idle timeout (408) or trickle in within it (each byte restarts it). The lines and the
//! connection manager's `downstream_rq_idle_timeout` are compared.

use super::*;

/// Each line: the path (the case), then what the cases differ in.
const FLAGS: &str = "%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_FLAGS_LONG% %RESPONSE_CODE_DETAILS% %UPSTREAM_CLUSTER% %UPSTREAM_REQUEST_ATTEMPT_COUNT%\n";

/// The upstream (also the authorization service, under `/check`): `/garbage` answers a
/// status line that is no HTTP, `/h1cut` closes in the middle of its body, `/hold` answers
/// after 2.5 s, `/stall` sends its head and
/// half its body, then the rest after 2.5 s; `/check/deny...` is `403`; anything else `200`.
fn flags_upstream() -> u16 {
    head_upstream(|head, s| {
        let path = head.split(' ').nth(1).unwrap_or("");
        let hold = Duration::from_millis(2500);
        let reply: &[u8] = if path.starts_with("/check/deny") {
            b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n"
        } else if path.starts_with("/garbage") {
            b"HTPT/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
        } else if path.starts_with("/h1cut") {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello ");
            std::thread::sleep(Duration::from_millis(100));
            return false;
        } else if path.starts_with("/stall") {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello ");
            std::thread::sleep(hold);
            b"world\n"
        } else {
            if path.starts_with("/hold") {
                std::thread::sleep(hold);
            }
            b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello world\n"
        };
        s.write_all(reply).is_ok()
    })
}

/// An HTTP/2 upstream that resets every stream (RST_STREAM, CANCEL) once it has sent the
/// response head.
fn resetting_h2_upstream() -> u16 {
    h2_server::serve(|_request, mut respond| async move {
        let head = http::Response::builder().status(200).body(()).unwrap();
        if let Ok(mut body) = respond.send_response(head, false) {
            let _ = body.send_data(bytes::Bytes::from_static(b"part"), false);
            tokio::time::sleep(Duration::from_millis(100)).await;
            body.send_reset(h2::Reason::CANCEL);
        }
    })
}

fn flags_bootstrap(admin: u16, http: u16, upstream: u16, h2: u16, dir: &Path) -> String {
    let log = logger(&dir.join("flags.log"), &text(FLAGS));
    let endpoint = format!(
        "{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}"
    );
    let head = hcm_bootstrap_head(admin, http, "flags");
    format!(
        r#"{head}          stream_idle_timeout: 1s
          access_log: [{log}]
          http_filters:
          - {{name: envoy.filters.http.fault, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault, delay: {{header_delay: {{}}, percentage: {{numerator: 100}}}}, abort: {{header_abort: {{}}, percentage: {{numerator: 100}}}}}}}}
          - {{name: envoy.filters.http.ext_authz, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz, http_service: {{server_uri: {{uri: "http://authz.local", cluster: up, timeout: 1s}}, path_prefix: /check}}}}}}
          - {{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - {{match: {{prefix: /noidle}}, route: {{cluster: up, idle_timeout: 0s, prefix_rewrite: /hold}}}}
              - {{match: {{prefix: /duration}}, route: {{cluster: up, max_stream_duration: {{max_stream_duration: 0.5s}}, prefix_rewrite: /hold}}}}
              - {{match: {{prefix: /overflow}}, route: {{cluster: full}}}}
              - {{match: {{prefix: /empty}}, route: {{cluster: empty}}}}
              - {{match: {{prefix: /h2reset}}, route: {{cluster: h2}}}}
              - {{match: {{prefix: /}}, route: {{cluster: up}}}}
  clusters:
  - {{name: up, connect_timeout: 1s, load_assignment: {{cluster_name: up, endpoints: [{{lb_endpoints: [{endpoint}]}}]}}}}
  - {{name: full, connect_timeout: 1s, circuit_breakers: {{thresholds: [{{max_pending_requests: 0}}]}}, load_assignment: {{cluster_name: full, endpoints: [{{lb_endpoints: [{endpoint}]}}]}}}}
  - {{name: empty, connect_timeout: 1s, load_assignment: {{cluster_name: empty}}}}
  - {{name: h2, connect_timeout: 1s, typed_extension_protocol_options: {{envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {{"@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {{http2_protocol_options: {{}}}}}}}}, load_assignment: {{cluster_name: h2, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {h2}}}}}}}}}]}}]}}}}
"#
    )
}

/// The requests: a path, extra header lines, and the status line's start.
const REQUESTS: [(&str, &str, &str); 12] = [
    ("/ok", "", "HTTP/1.1 200"),
    ("/garbage", "", "HTTP/1.1 502"),
    ("/hold", "", "HTTP/1.1 504"),
    ("/stall", "", "HTTP/1.1 200"),
    ("/noidle", "", "HTTP/1.1 200"),
    ("/duration", "", "HTTP/1.1 504"),
    ("/overflow", "", "HTTP/1.1 503"),
    ("/empty", "", "HTTP/1.1 503"),
    ("/h2reset", "", "HTTP/1.1 200"),
    ("/h1cut", "", "HTTP/1.1 200"),
    (
        "/fault",
        "x-envoy-fault-delay-request: 100\r\nx-envoy-fault-abort-request: 503\r\n",
        "HTTP/1.1 503",
    ),
    ("/deny", "", "HTTP/1.1 403"),
];

/// Runs the requests through the proxy `start` brings up; its lines and its
/// `downstream_rq_idle_timeout`.
fn observe_flags(
    dir: &Path,
    (upstream, h2): (u16, u16),
    start: impl FnOnce(&str, u16) -> Proxy,
) -> (Vec<String>, String) {
    let (admin, http) = (free_port(), free_port());
    let _proxy = start(&flags_bootstrap(admin, http, upstream, h2, dir), http);
    for (path, extra, status) in REQUESTS {
        let raw =
            format!("GET {path} HTTP/1.1\r\nhost: h.test\r\n{extra}connection: close\r\n\r\n");
        let answer = send_raw(http, raw.as_bytes());
        assert!(answer.starts_with(status), "{path}: {answer}");
    }
    // A request body still arriving: a pause past the idle timeout ends the request (408, the
    // request unfinished), pauses shorter than it restart the timer each time.
    for (path, pauses, status) in [
        ("/upload/stalled", &[2000][..], "HTTP/1.1 408"),
        ("/upload/trickle", &[600, 600, 600][..], "HTTP/1.1 200"),
    ] {
        let answer = trickle(http, path, pauses);
        assert!(answer.starts_with(status), "{path}: {answer}");
    }
    let lines = read_lines(&dir.join("flags.log"), REQUESTS.len() + 2);
    let mut s = TcpStream::connect(("127.0.0.1", admin)).expect("admin accepts");
    s.write_all(b"GET /stats?filter=downstream_rq_idle_timeout HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut stats = String::new();
    let _ = s.read_to_string(&mut stats);
    let stat = stats
        .lines()
        .find(|l| l.starts_with("http.flags.downstream_rq_idle_timeout"))
        .unwrap_or("missing")
        .to_owned();
    (lines, stat)
}

/// A POST to `path` whose body comes a byte at a time: one at once, then one after each of
/// `pauses` (milliseconds); the answer, read to its end.
pub(super) fn trickle(http: u16, path: &str, pauses: &[u64]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", http)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: h.test\r\ncontent-length: {}\r\nconnection: close\r\n\r\nx",
        pauses.len() + 1
    );
    s.write_all(head.as_bytes()).unwrap();
    for ms in pauses {
        std::thread::sleep(Duration::from_millis(*ms));
        let _ = s.write_all(b"x");
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn response_flags_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("response_flags_match_envoy") else {
        return;
    };
    let upstream = (flags_upstream(), resetting_h2_upstream());
    let envoy_dir = log_dir("flags-envoy");
    let theirs = observe_flags(&envoy_dir, upstream, |yaml, http| {
        envoy_proxy(&envoy, yaml, "4713", http)
    });
    let revoy_dir = log_dir("flags-revoy");
    let ours = observe_flags(&revoy_dir, upstream, revoy_proxy);
    assert_eq!(
        theirs.0.len(),
        REQUESTS.len() + 2,
        "Envoy's lines: {:#?}",
        theirs.0
    );
    assert_eq!(ours, theirs, "revoy (left) and Envoy (right)");
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}
