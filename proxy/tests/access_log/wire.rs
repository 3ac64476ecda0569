//! Each stream's downstream wire bytes (`%DOWNSTREAM_WIRE_BYTES_RECEIVED%`,
//! `%DOWNSTREAM_WIRE_BYTES_SENT%`) and header bytes (`%DOWNSTREAM_HEADER_BYTES_*%`) against
//! Envoy 1.40: HTTP/1.1 GETs (to an upstream and to a direct response), a POST with a
//! `content-length`, a chunked POST (hyper's side of revoy), a keep-alive connection's second
//! request, two pipelined requests, a chunked response, HTTP/2 GETs and a POST (curl, prior
//! knowledge), a request no route takes, and requests the HTTP/1 codec refuses (a malformed
//! header line, both framings, a head over the size limit).

use super::*;

/// The wire logger's line.
const WIRE: &str = "%REQ(:METHOD)% %REQ(:PATH)% %PROTOCOL% %RESPONSE_CODE% %BYTES_RECEIVED% %BYTES_SENT% %DOWNSTREAM_WIRE_BYTES_RECEIVED% %DOWNSTREAM_WIRE_BYTES_SENT% %DOWNSTREAM_HEADER_BYTES_RECEIVED% %DOWNSTREAM_HEADER_BYTES_SENT%\n";

/// The upstream: reads each request whole (`content-length` or chunked), then answers
/// `/up/chunked` with a chunked body and anything else with `hello world\n`.
pub(super) fn wire_upstream() -> u16 {
    spawn_upstream(|mut s| {
        let mut buf = Vec::new();
        while let Some((head, length)) = read_head(&mut s, &mut buf) {
            let chunked = head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked");
            let whole = if chunked {
                read_chunked(&mut s, &mut buf)
            } else {
                read_body(&mut s, &mut buf, length)
            };
            let reply: &[u8] = if head.starts_with("GET /up/chunked ") {
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n7\r\nchunked\r\n0\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello world\n"
            };
            if !whole || s.write_all(reply).is_err() {
                return;
            }
        }
    })
}

fn wire_bootstrap(admin: u16, http: u16, upstream: u16, dir: &Path) -> String {
    let log = logger(&dir.join("wire.log"), &text(WIRE));
    format!(
        r#"{head}          codec_type: AUTO
          access_log: [{log}]
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router, suppress_envoy_headers: true}}}}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - {{match: {{prefix: /direct}}, direct_response: {{status: 200, body: {{inline_string: abc}}}}}}
              - {{match: {{prefix: /up}}, route: {{cluster: up}}}}
  clusters:
  - {{name: up, connect_timeout: 1s, load_assignment: {{cluster_name: up, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]}}}}
"#,
        head = hcm_bootstrap_head(admin, http, "wire"),
    )
}

/// Writes each of `requests` on one connection, reading the answer to each (`answers` bytes
/// long in all, or until the proxy closes) before the next.
pub(super) fn exchange(port: u16, requests: &[&[u8]]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for req in requests {
        s.write_all(req).unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        // A response ends with its body: `hello world\n`, `abc` or the last chunk.
        while !(got.ends_with(b"hello world\n")
            || got.ends_with(b"abc")
            || got.ends_with(b"0\r\n\r\n"))
        {
            match s.read(&mut chunk) {
                Ok(n) if n > 0 => got.extend_from_slice(&chunk[..n]),
                _ => panic!("the proxy closed: {}", String::from_utf8_lossy(&got)),
            }
        }
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&got)
        );
    }
}

/// Writes `requests` at once on one connection (pipelined) and reads until each has its
/// `hello world\n` answer.
fn pipelined(port: u16, requests: &[&[u8]]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&requests.concat()).unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let answers = |got: &[u8]| got.windows(12).filter(|w| w == b"hello world\n").count();
    while answers(&got) < requests.len() {
        match s.read(&mut chunk) {
            Ok(n) if n > 0 => got.extend_from_slice(&chunk[..n]),
            _ => panic!("the proxy closed: {}", String::from_utf8_lossy(&got)),
        }
    }
}

/// An HTTP/2 request by curl (prior knowledge, one connection each), `data` as its body.
fn curl_h2(port: u16, path: &str, data: Option<&str>) {
    curl_h2_with(port, path, data, &[]);
}

/// [`curl_h2`] with `headers` (`name: value`) added.
pub(super) fn curl_h2_with(port: u16, path: &str, data: Option<&str>, headers: &[&str]) {
    let mut c = Command::new("curl");
    c.args([
        "-s",
        "-o",
        "/dev/null",
        "--max-time",
        "10",
        "--http2-prior-knowledge",
    ])
    .args(["-w", "%{http_code}", "-H", "user-agent: test/1"]);
    if let Some(d) = data {
        c.args(["--data-raw", d]);
    }
    for h in headers {
        c.args(["-H", h]);
    }
    let out = c
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{path}");
}

/// The requests, in order; how many lines they log.
const LINES: usize = 17;

fn observe_wire(dir: &Path, start: impl FnOnce(&str) -> Proxy) -> Vec<String> {
    let (admin, http) = (free_port(), free_port());
    static UPSTREAM: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    let upstream = *UPSTREAM.get_or_init(wire_upstream);
    let _proxy = start(&wire_bootstrap(admin, http, upstream, dir));
    let ua = "user-agent: test/1\r\n";
    exchange(
        http,
        &[format!("GET /up HTTP/1.1\r\nhost: h.test\r\n{ua}\r\n").as_bytes()],
    );
    exchange(http, &[b"GET /direct HTTP/1.1\r\nhost: h.test\r\n\r\n"]);
    exchange(
        http,
        &[b"POST /up/post HTTP/1.1\r\nhost: h.test\r\ncontent-length: 10\r\n\r\n0123456789"],
    );
    // Two requests on one connection: the second's bytes are its own.
    exchange(
        http,
        &[
            b"GET /up/first HTTP/1.1\r\nhost: h.test\r\n\r\n",
            b"GET /up/second HTTP/1.1\r\nhost: h.test\r\nx-extra:   spaced   \r\n\r\n",
        ],
    );
    exchange(http, &[b"GET /up/chunked HTTP/1.1\r\nhost: h.test\r\n\r\n"]);
    // Pipelined: the second request's bytes arrive with the first's.
    pipelined(
        http,
        &[
            b"POST /up/pipe-1 HTTP/1.1\r\nhost: h.test\r\ncontent-length: 3\r\n\r\nabc",
            b"GET /up/pipe-2 HTTP/1.1\r\nhost: h.test\r\nx-second: yes\r\n\r\n",
        ],
    );
    // Chunked: hyper serves this connection on revoy's side, the next request too.
    exchange(
        http,
        &[
            b"POST /up/chunked-post HTTP/1.1\r\nhost: h.test\r\ntransfer-encoding: chunked\r\n\r\n5\r\n01234\r\na\r\n0123456789\r\n0\r\n\r\n",
            b"GET /up/after HTTP/1.1\r\nhost: h.test\r\n\r\n",
        ],
    );
    curl_h2(http, "/up/h2", None);
    curl_h2(http, "/direct/h2", None);
    curl_h2(http, "/up/h2-post", Some("0123456789"));
    // No route: a local reply.
    let answer = send_raw(
        http,
        b"GET /nothing HTTP/1.1\r\nhost: h.test\r\nconnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    // Refused by the codec: what was read of each and the reply; header bytes only once the
    // headers were whole (both framings).
    let refused: [&[u8]; 3] = [
        b"GET /bad HTTP/1.1\r\nhost: h.test\r\nuser-agent: test/1\r\nx-k;\r\n\r\n",
        b"POST /both HTTP/1.1\r\nhost: h.test\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        &[b"GET /big HTTP/1.1\r\nhost: h.test\r\nx-big: ".as_slice(), &[b'a'; 70_000], b"\r\n\r\n"].concat(),
    ];
    for raw in refused {
        let answer = send_raw(http, raw);
        assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
    }
    read_lines(&dir.join("wire.log"), LINES)
}

/// The HTTP/2 lines' sent bytes (wire and header), which may differ by one: the response's
/// `date` is Huffman-coded, and its digits' codes are 5 or 6 bits long, so two proxies
/// answering in different seconds may send dates a byte apart.
fn h2_sent_close(ours: &str, theirs: &str) -> bool {
    let fields = |l: &str| l.split(' ').map(str::to_owned).collect::<Vec<_>>();
    let (o, t) = (fields(ours), fields(theirs));
    let near = |i: usize| {
        let (a, b): (i64, i64) = (o[i].parse().unwrap(), t[i].parse().unwrap());
        (a - b).abs() <= 1
    };
    o.len() == t.len()
        && o.iter()
            .zip(&t)
            .enumerate()
            .all(|(i, (a, b))| a == b || ((i == 7 || i == 9) && near(i)))
}

/// A head over the size limit is refused once the proxy has read past the limit (60 KiB
/// here): how far past depends on its reads (Envoy read all 70,044 bytes the client sent,
/// revoy 64 KiB), so `%DOWNSTREAM_WIRE_BYTES_RECEIVED%` (the 7th field) of that line is
/// checked to be over the limit and then masked.
fn mask_head_too_large(line: &str) -> String {
    if !line.contains(" 431 ") {
        return line.to_owned();
    }
    let mut fields: Vec<&str> = line.split(' ').collect();
    let received: u64 = fields[6].parse().unwrap_or_else(|_| panic!("{line}"));
    assert!(received > 60 * 1024, "{line}");
    fields[6] = "OVER";
    fields.join(" ")
}

#[test]
fn wire_bytes_match_envoy() {
    let test = "wire_bytes_match_envoy";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    if Command::new("curl").arg("--version").output().is_err() {
        skip::skip(
            test,
            "curl not found",
            "Install curl (Debian: the curl package).",
        );
        return;
    }
    let envoy_dir = log_dir("wire-envoy");
    let theirs = observe_wire(&envoy_dir, |yaml| {
        envoy_proxy(&envoy, yaml, "4715", port_of(yaml))
    });
    let revoy_dir = log_dir("wire-revoy");
    let ours = observe_wire(&revoy_dir, |yaml| revoy_proxy(yaml, port_of(yaml)));
    assert_eq!(theirs.len(), LINES, "Envoy's log: {theirs:#?}");
    assert_eq!(ours.len(), LINES, "revoy's log: {ours:#?}");
    for (i, (r, e)) in ours.iter().zip(&theirs).enumerate() {
        if r.contains(" HTTP/2 ") {
            assert!(h2_sent_close(r, e), "line {i}:\n{r}\n{e}");
        } else {
            assert_eq!(mask_head_too_large(r), mask_head_too_large(e), "line {i}");
        }
    }
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}
