//! HTTP/2 upstream responses the proxy's own codec refuses, against Envoy 1.40: a response
//! head with a connection-specific header (`connection`), one with an uppercase header name,
//! one without `:status`, a 1xx head that ends the stream (each 502 `UPE`
//! `upstream_reset_before_response_started{protocol_error}`), one with more headers than
//! `max_headers_count` (Envoy's codec resets the stream and its router reports the reset as
//! the upstream's: 503 `UR` `remote_reset`), a body longer than its `content-length` in one
//! DATA frame and trailers with an uppercase name (after the response head: `UPE`
//! `upstream_reset_after_response_started{protocol_error}`), heads by size: a 59,000-byte
//! value (200), a 65,600-byte one (a field Envoy's decoder refuses: 502 `UPE`), two 31,000-byte
//! ones (over `max_response_headers_kb`'s 60 KiB: 503 `UR` `remote_reset`), a GOAWAY whose last stream is
//! below the request's (503 `UR` `remote_refused_stream_reset`) and a DATA frame on stream 0
//! (a connection error: 502 `UPE`). Envoy 1.40 reports none of these
//! as `LR`: its HTTP/2 client codec's messaging errors are protocol errors, and no upstream a
//! test can script makes it reset an upstream stream with `LocalReset` (README, access logs).
//! Each case is a cluster of its own whose upstream answers every request the same way,
//! with frames written by hand.

use super::*;

use h2_frames::{DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, SETTINGS, frame, read};

const FORMAT: &str = "%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %UPSTREAM_CLUSTER% %UPSTREAM_REQUEST_ATTEMPT_COUNT%\n";

/// A header block of literal fields without indexing (RFC 7541 6.2.2), names as given
/// (uppercase ones too).
fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, v) in fields {
        out.push(0);
        for s in [n, v] {
            string(&mut out, s.as_bytes());
        }
    }
    out
}

/// A string literal, not Huffman-coded: its length as a 7-bit-prefix integer (RFC 7541 5.1).
fn string(out: &mut Vec<u8>, s: &[u8]) {
    let mut len = s.len();
    if len < 127 {
        out.push(len as u8);
    } else {
        out.push(127);
        len -= 127;
        while len >= 128 {
            out.push((len % 128) as u8 | 0x80);
            len /= 128;
        }
        out.push(len as u8);
    }
    out.extend(s);
}

/// A response head of `fields` on stream `s`, ending it: HEADERS, then CONTINUATIONs, each
/// within the smallest frame size a peer takes.
fn long_head(s: u32, fields: &[(&str, &str)]) -> Vec<u8> {
    let block = block(fields);
    let pieces: Vec<&[u8]> = block.chunks(16_384).collect();
    let mut out = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        let (kind, mut flags) = if i == 0 {
            (HEADERS, END_STREAM)
        } else {
            (CONTINUATION, 0)
        };
        if i + 1 == pieces.len() {
            flags |= END_HEADERS;
        }
        out.extend(frame(kind, flags, s, piece));
    }
    out
}

/// CONTINUATION.
const CONTINUATION: u8 = 9;

/// The cases: the route prefix (and cluster name), the frames the upstream answers a request
/// on stream `s` with, and the status line's start the client gets.
type Case = (&'static str, fn(u32) -> Vec<u8>, &'static str);

const CASES: [Case; 12] = [
    (
        "/h2conn",
        |s| {
            let head = block(&[(":status", "200"), ("connection", "close")]);
            [
                frame(HEADERS, END_HEADERS, s, &head),
                frame(DATA, END_STREAM, s, b"up\n"),
            ]
            .concat()
        },
        "HTTP/1.1 502",
    ),
    (
        "/h2upper",
        |s| {
            let head = block(&[(":status", "200"), ("X-Upper", "1")]);
            [
                frame(HEADERS, END_HEADERS, s, &head),
                frame(DATA, END_STREAM, s, b"up\n"),
            ]
            .concat()
        },
        "HTTP/1.1 502",
    ),
    (
        "/h2nostatus",
        |s| {
            let head = block(&[("content-length", "3")]);
            [
                frame(HEADERS, END_HEADERS, s, &head),
                frame(DATA, END_STREAM, s, b"up\n"),
            ]
            .concat()
        },
        "HTTP/1.1 502",
    ),
    (
        "/h2informational",
        |s| {
            frame(
                HEADERS,
                END_HEADERS | END_STREAM,
                s,
                &block(&[(":status", "100")]),
            )
        },
        "HTTP/1.1 502",
    ),
    (
        "/h2many",
        |s| {
            let names: Vec<String> = (0..150).map(|i| format!("x-h{i}")).collect();
            let mut fields = vec![(":status", "200")];
            fields.extend(names.iter().map(|n| (n.as_str(), "v")));
            let head = block(&fields);
            [
                frame(HEADERS, END_HEADERS, s, &head),
                frame(DATA, END_STREAM, s, b"up\n"),
            ]
            .concat()
        },
        "HTTP/1.1 503",
    ),
    (
        "/h2length",
        |s| {
            let head = block(&[(":status", "200"), ("content-length", "3")]);
            [
                frame(HEADERS, END_HEADERS, s, &head),
                frame(DATA, END_STREAM, s, b"upup\n"),
            ]
            .concat()
        },
        "HTTP/1.1 200",
    ),
    (
        "/h2trailers",
        |s| {
            let head = block(&[(":status", "200")]);
            let trailers = block(&[("X-Upper", "1")]);
            [
                frame(HEADERS, END_HEADERS, s, &head),
                frame(DATA, 0, s, b"up\n"),
                frame(HEADERS, END_HEADERS | END_STREAM, s, &trailers),
            ]
            .concat()
        },
        "HTTP/1.1 200",
    ),
    (
        "/h2smallfield",
        |s| long_head(s, &[(":status", "200"), ("x-a", &"a".repeat(59_000))]),
        "HTTP/1.1 200",
    ),
    (
        "/h2fieldsize",
        |s| long_head(s, &[(":status", "200"), ("x-a", &"a".repeat(65_600))]),
        "HTTP/1.1 502",
    ),
    (
        "/h2headsize",
        |s| {
            let half = "b".repeat(31_000);
            long_head(s, &[(":status", "200"), ("x-a", &half), ("x-b", &half)])
        },
        "HTTP/1.1 503",
    ),
    (
        "/h2goaway",
        |_| frame(GOAWAY, 0, 0, &[0; 8]),
        "HTTP/1.1 503",
    ),
    ("/h2stream0", |_| frame(DATA, 0, 0, b"x"), "HTTP/1.1 502"),
];

/// An HTTP/2 (prior knowledge) upstream answering every request with `answer`'s frames:
/// SETTINGS first, SETTINGS acknowledged, the answer once a request's stream has ended.
fn scripted_h2_upstream(answer: fn(u32) -> Vec<u8>) -> u16 {
    spawn_upstream(move |mut s| {
        let mut preface = [0u8; 24];
        if s.read_exact(&mut preface).is_err() || s.write_all(&frame(SETTINGS, 0, 0, &[])).is_err()
        {
            return;
        }
        while let Ok((kind, flags, stream, _)) = read(&mut s) {
            let reply = match kind {
                SETTINGS if flags & 1 == 0 => frame(SETTINGS, 1, 0, &[]),
                HEADERS | DATA if flags & END_STREAM != 0 => answer(stream),
                _ => continue,
            };
            if s.write_all(&reply).is_err() {
                return;
            }
        }
    })
}

fn bootstrap(admin: u16, http: u16, upstreams: &[u16], dir: &Path) -> String {
    let log = logger(&dir.join("h2up.log"), &text(FORMAT));
    let head = hcm_bootstrap_head(admin, http, "h2up");
    let router = r#"{name: r, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}"#;
    let mut routes = String::new();
    let mut clusters = String::new();
    for ((path, _, _), port) in CASES.iter().zip(upstreams) {
        let name = &path[1..];
        routes.push_str(&format!(
            "              - {{match: {{prefix: {path}}}, route: {{cluster: {name}}}}}\n"
        ));
        clusters.push_str(&format!(
            r#"  - {{name: {name}, connect_timeout: 1s, typed_extension_protocol_options: {{envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {{"@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {{http2_protocol_options: {{}}}}}}}}, load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}}}
"#
        ));
    }
    format!(
        r#"{head}          access_log: [{log}]
          http_filters: [{router}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
{routes}  clusters:
{clusters}"#
    )
}

/// Sends each case's request through the proxy `start` brings up; its lines.
fn observe(dir: &Path, upstreams: &[u16], start: impl FnOnce(&str, u16) -> Proxy) -> Vec<String> {
    let (admin, http) = (free_port(), free_port());
    let _proxy = start(&bootstrap(admin, http, upstreams, dir), http);
    for (path, _, status) in CASES {
        let raw = format!("GET {path} HTTP/1.1\r\nhost: h.test\r\nconnection: close\r\n\r\n");
        let answer = send_raw(http, raw.as_bytes());
        assert!(
            answer.starts_with(status),
            "{path}: {}",
            &answer[..answer.len().min(200)]
        );
    }
    read_lines(&dir.join("h2up.log"), CASES.len())
}

#[test]
fn refused_h2_upstream_responses_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("refused_h2_upstream_responses_match_envoy") else {
        return;
    };
    let upstreams: Vec<u16> = CASES
        .iter()
        .map(|(_, answer, _)| scripted_h2_upstream(*answer))
        .collect();
    let envoy_dir = log_dir("h2up-envoy");
    let theirs = observe(&envoy_dir, &upstreams, |yaml, http| {
        envoy_proxy(&envoy, yaml, "4716", http)
    });
    let revoy_dir = log_dir("h2up-revoy");
    let ours = observe(&revoy_dir, &upstreams, revoy_proxy);
    assert_eq!(theirs.len(), CASES.len(), "Envoy's lines: {theirs:#?}");
    assert_eq!(ours, theirs, "revoy (left) and Envoy (right)");
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}
