//! The connection manager's request timeouts against Envoy 1.40, under `request_timeout:
//! 1.5s`, `request_headers_timeout: 1s` and `stream_idle_timeout: 1s`: a request head that
//! never ends (408 `request_header_timeout`, logged without request headers), a request body trickling in past the request timeout
//! while the upstream waits for all of it (408 `request_overall_timeout`, no flag), a whole
//! request a filter (a fault delay) holds past it (504), a request the upstream answers after
//! it (the timeout was disarmed once the request was whole: 200), and, once the response head
//! has gone out, a request body trickling in slower than the idle timeout allows in total but
//! faster than it between frames (each frame restarts the idle timer: 200, the whole body)
//! and one stalling past it (`SI`, the stream reset). Under `/umsdr`, a cluster whose
//! `max_stream_duration` (0.5 s) ends an upstream stream: before the response head (504,
//! `UMSDR`; 408 while the request body is still arriving) and after it (the response cut).
//! On a second listener, whose `request_timeout` is the shorter, a head still arriving gets
//! the request timeout's 408.
//! The same head timeouts on the connections hyper serves: an HTTP/1 connection after a
//! chunked request (which the fast path hands over), and an HTTP/2 stream (h2c) whose HEADERS
//! frame lacks END_HEADERS and whose CONTINUATION never comes (Envoy answers on the stream:
//! HEADERS, DATA ending it, RST_STREAM, and the connection stays open), on both listeners,
//! and one whose CONTINUATION comes after that answer (Envoy serves nothing more on the
//! stream, and the next stream as usual).
//! The lines, the connection manager's `downstream_rq_timeout`, `downstream_rq_header_timeout`
//! and `downstream_rq_idle_timeout` and the cluster's `upstream_rq_max_duration_reached` are
//! compared.

use super::*;

const FORMAT: &str = "%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %UPSTREAM_CLUSTER% %UPSTREAM_REQUEST_ATTEMPT_COUNT%\n";

/// An upstream answering each request after its whole body (`.../hold`: 2 s later; a
/// chunked one read up to its last chunk), except paths with `/echo`, whose head (with
/// `content-length: 5`) goes out at once and its body `done\n` once the request body is all in.
fn upstream() -> u16 {
    spawn_upstream(serve)
}

fn serve(mut s: TcpStream) {
    let mut buf = Vec::new();
    while let Some((head, length)) = read_head(&mut s, &mut buf) {
        let path = head.split(' ').nth(1).unwrap_or("").to_owned();
        let echo = path.contains("/echo");
        if echo
            && s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
                .is_err()
        {
            return;
        }
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        if !read_body(&mut s, &mut buf, length) || (chunked && !read_chunked(&mut s, &mut buf)) {
            return;
        }
        if path.ends_with("/hold") {
            std::thread::sleep(Duration::from_secs(2));
        }
        let reply: &[u8] = if echo {
            b"done\n"
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n"
        };
        if s.write_all(reply).is_err() {
            return;
        }
    }
}

/// A chunked POST (which the fast path hands to hyper's server), answered, then on the same
/// connection a head that never ends: everything the proxy sent.
fn handed_over_partial_head(http: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", http)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /chunked HTTP/1.1\r\nhost: h.test\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        .unwrap();
    let mut buf = Vec::new();
    let (head, length) = read_head(&mut s, &mut buf).expect("the chunked request's answer");
    assert!(read_body(&mut s, &mut buf, length), "its body");
    s.write_all(b"GET /partial HTTP/1.1\r\nhost: h.test\r\n")
        .unwrap();
    let mut rest = String::new();
    let _ = s.read_to_string(&mut rest);
    format!("{head}\r\n\r\n{}{rest}", String::from_utf8_lossy(&buf))
}

/// An h2c connection whose HEADERS frame on stream 1 (END_STREAM, no END_HEADERS) is not
/// continued in time: the frames the proxy sends on stream 1 until it resets it (type,
/// flags, and a DATA frame's payload). Nothing else is sent before, not even a SETTINGS
/// acknowledgement: only a CONTINUATION may follow the HEADERS frame. With `late`, the
/// CONTINUATION ending the block comes after the reset, then a GET of `/late` on stream 3:
/// also what comes on stream 1 after the reset (Envoy: nothing) and stream 3's body.
fn h2_unfinished_headers(http: u16, late: bool) -> Vec<String> {
    use h2_frames::{
        DATA, END_HEADERS, END_STREAM, HEADERS, frame, get, literal_block, preface, read,
    };
    let mut s = TcpStream::connect(("127.0.0.1", http)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let block = literal_block(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "h.test"),
        (":path", "/h2"),
    ]);
    let mut hello = preface();
    hello.extend(frame(HEADERS, END_STREAM, 1, &block));
    s.write_all(&hello).unwrap();
    let mut seen = Vec::new();
    let mut reset = false;
    let mut late_body = Vec::new();
    loop {
        let (kind, flags, stream, payload) =
            read(&mut s).unwrap_or_else(|e| panic!("a frame: {e} after {seen:?}"));
        match kind {
            DATA if stream == 3 => {
                late_body.extend(payload);
                if flags & END_STREAM != 0 {
                    seen.push(format!("stream 3: {}", String::from_utf8_lossy(&late_body)));
                    return seen;
                }
            }
            _ if stream != 1 => {}
            DATA => seen.push(format!(
                "DATA {flags} {}",
                String::from_utf8_lossy(&payload)
            )),
            3 if !reset => {
                seen.push(format!("RST_STREAM {payload:?}"));
                if !late {
                    return seen;
                }
                reset = true;
                let mut more = frame(9, END_HEADERS, 1, &literal_block(&[("x-late", "1")]));
                more.extend(get(3, "h.test", "/late"));
                s.write_all(&more).unwrap();
            }
            _ => seen.push(format!("frame {kind} {flags} on stream 1")),
        }
    }
}

/// The bootstrap: the cases' listener on `http`, and on `slow` one whose `request_timeout`
/// (0.5 s) is shorter than its `request_headers_timeout` (2 s), logging to `slowhead.log`.
fn bootstrap(admin: u16, (http, slow): (u16, u16), upstream: u16, dir: &Path) -> String {
    let log = logger(&dir.join("timeouts.log"), &text(FORMAT));
    let slow_log = logger(&dir.join("slowhead.log"), &text(FORMAT));
    let router = r#"{name: r, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}"#;
    let head = hcm_bootstrap_head(admin, http, "timeouts");
    let endpoint = format!(
        "{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}"
    );
    format!(
        r#"{head}          stream_idle_timeout: 1s
          request_timeout: 1.5s
          request_headers_timeout: 1s
          access_log: [{log}]
          http_filters:
          - {{name: envoy.filters.http.fault, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault, delay: {{header_delay: {{}}, percentage: {{numerator: 100}}}}}}}}
          - {router}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - {{match: {{prefix: /noidle}}, route: {{cluster: up, idle_timeout: 0s}}}}
              - {{match: {{prefix: /umsdr}}, route: {{cluster: short, idle_timeout: 0s}}}}
              - {{match: {{prefix: /}}, route: {{cluster: up}}}}
  - name: slowhead
    address: {{socket_address: {{address: 127.0.0.1, port_value: {slow}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: slowhead
          request_timeout: 0.5s
          request_headers_timeout: 2s
          access_log: [{slow_log}]
          http_filters: [{router}]
          route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, route: {{cluster: up}}}}]}}]}}
  clusters:
  - {{name: up, connect_timeout: 1s, load_assignment: {{cluster_name: up, endpoints: [{endpoint}]}}}}
  - {{name: short, connect_timeout: 1s, typed_extension_protocol_options: {{envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {{"@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, common_http_protocol_options: {{max_stream_duration: 0.5s}}, explicit_http_config: {{http_protocol_options: {{}}}}}}}}, load_assignment: {{cluster_name: short, endpoints: [{endpoint}]}}}}
"#
    )
}

/// The stats named `names`, one `name: value` line each.
fn named_stats(admin: u16, names: &[&str]) -> Vec<String> {
    let mut s = TcpStream::connect(("127.0.0.1", admin)).expect("admin accepts");
    s.write_all(b"GET /stats HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut stats = String::new();
    let _ = s.read_to_string(&mut stats);
    names
        .iter()
        .map(|n| {
            let name = format!("{n}:");
            stats
                .lines()
                .find(|l| l.starts_with(&name))
                .unwrap_or("missing")
                .to_owned()
        })
        .collect()
}

/// Runs the cases through the proxy `start` brings up; its lines and stats.
fn observe_timeouts(
    dir: &Path,
    upstream: u16,
    start: impl FnOnce(&str, u16) -> Proxy,
) -> (Vec<String>, Vec<String>) {
    let (admin, http, slow) = (free_port(), free_port(), free_port());
    let _proxy = start(&bootstrap(admin, (http, slow), upstream, dir), http);
    let uploads: [(&str, &[u64], &str); 7] = [
        ("/read", &[400, 400, 400, 400, 400], "HTTP/1.1 408"),
        ("/noidle/hold", &[], "HTTP/1.1 200"),
        ("/echo/trickle", &[600, 600, 600], "HTTP/1.1 200"),
        ("/echo/stalled", &[2000], "HTTP/1.1 200"),
        ("/umsdr/hold", &[], "HTTP/1.1 504"),
        ("/umsdr/read", &[400, 400], "HTTP/1.1 408"),
        ("/umsdr/echo", &[600, 600], "HTTP/1.1 200"),
    ];
    for (path, pauses, status) in uploads {
        let answer = flags::trickle(http, path, pauses);
        assert!(answer.starts_with(status), "{path}: {answer}");
        if path == "/echo/trickle" {
            assert!(answer.ends_with("\r\n\r\ndone\n"), "{path}: {answer}");
        }
    }
    let fault = "GET /noidle/fault HTTP/1.1\r\nhost: h.test\r\nx-envoy-fault-delay-request: 2500\r\nconnection: close\r\n\r\n";
    let answer = send_raw(http, fault.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 504"), "fault: {answer}");
    let partial = send_raw(http, b"GET /partial HTTP/1.1\r\nhost: h.test\r\n");
    assert!(
        partial.starts_with("HTTP/1.1 408") && partial.ends_with("\r\n\r\nrequest header timeout"),
        "partial head: {partial}"
    );
    // Under a request timeout shorter than the headers timeout, a head still arriving gets
    // the request timeout's 408.
    let partial = send_raw(slow, b"GET /partial HTTP/1.1\r\nhost: h.test\r\n");
    assert!(
        partial.starts_with("HTTP/1.1 408") && partial.ends_with("\r\n\r\nrequest timeout"),
        "partial head under request_timeout: {partial}"
    );
    let answer = handed_over_partial_head(http);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("\r\n\r\nrequest header timeout"),
        "a partial head after a chunked request: {answer}"
    );
    let frames = h2_unfinished_headers(http, false);
    let late_frames = h2_unfinished_headers(http, true);
    let slow_frames = h2_unfinished_headers(slow, false);
    let mut lines = read_lines(&dir.join("timeouts.log"), 14);
    lines.extend(read_lines(&dir.join("slowhead.log"), 2));
    lines.extend(frames);
    lines.extend(late_frames);
    lines.extend(slow_frames);
    let stats = named_stats(
        admin,
        &[
            "http.timeouts.downstream_rq_timeout",
            "http.timeouts.downstream_rq_header_timeout",
            "http.timeouts.downstream_rq_idle_timeout",
            "http.slowhead.downstream_rq_timeout",
            "http.slowhead.downstream_rq_header_timeout",
            "cluster.short.upstream_rq_max_duration_reached",
        ],
    );
    (lines, stats)
}

#[test]
fn request_timeouts_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("request_timeouts_match_envoy") else {
        return;
    };
    let upstream = upstream();
    let envoy_dir = log_dir("timeouts-envoy");
    let theirs = observe_timeouts(&envoy_dir, upstream, |yaml, http| {
        envoy_proxy(&envoy, yaml, "4715", http)
    });
    let revoy_dir = log_dir("timeouts-revoy");
    let ours = observe_timeouts(&revoy_dir, upstream, revoy_proxy);
    assert_eq!(theirs.0.len(), 16 + 10, "Envoy's lines: {:#?}", theirs.0);
    assert_eq!(ours, theirs, "revoy (left) and Envoy (right)");
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}
