//! The requests the sandboxes' `verify.sh` sends, and their answers reduced to what the
//! comparison looks at.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

/// What a request carries as its body.
#[derive(Clone, Copy, Debug)]
pub enum Body {
    /// Nothing.
    Empty,
    /// The file body gzip-compressed, sent with `content-encoding: gzip` (the gzip sandbox's
    /// upload).
    Gzipped,
}

/// How much of the answer's body is compared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shown {
    /// The whole body, decoded.
    Whole,
    /// Only whether it decodes and is not empty, unless it is short (a local reply): an admin
    /// page the proxy forwards, whose text is each proxy's own.
    Decodes,
}

/// One request: to the port at `listener` (an index into the ports a sandbox passes),
/// `method`, `path`, extra request headers (each ending with CRLF), its body, and what of the
/// answer's body is compared.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub listener: usize,
    pub method: &'static str,
    pub path: &'static str,
    pub headers: &'static str,
    pub body: Body,
    pub shown: Shown,
}

/// A GET (or `method`) to `listener` with `headers`, its body compared whole.
pub const fn case(
    listener: usize,
    method: &'static str,
    path: &'static str,
    headers: &'static str,
) -> Case {
    Case {
        listener,
        method,
        path,
        headers,
        body: Body::Empty,
        shown: Shown::Whole,
    }
}

/// The response headers compared (names starting with one of these);
/// `x-envoy-upstream-service-time`, a timing, never.
const KEPT: &[&str] = &[
    "content-encoding",
    "content-length",
    "content-type",
    "transfer-encoding",
    "vary",
    "etag",
    "x-local-rate-limit",
    "x-envoy-",
    "access-control-",
    "transferred-size",
    "decompressed-size",
    "x-current-user",
];

/// The data of a chunked body.
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..i]).unwrap_or("0");
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        let after = &rest[i + 2..];
        if size == 0 || after.len() < size {
            break;
        }
        data.extend_from_slice(&after[..size]);
        rest = after[size..].strip_prefix(b"\r\n").unwrap_or_default();
    }
    data
}

/// Whether `response` (bytes read so far) holds a whole response: its head, then its body as
/// the head frames it (none for a HEAD); `None` when only the end of the connection ends it.
fn complete(response: &[u8], head_only: bool) -> Option<bool> {
    let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Some(false);
    };
    if head_only {
        return Some(true);
    }
    let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
    let body = &response[split + 4..];
    if head.contains("\r\ntransfer-encoding: chunked") {
        return Some(body.ends_with(b"0\r\n\r\n"));
    }
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))?;
    Some(body.len() >= length.trim().parse::<usize>().ok()?)
}

/// Reads one response from `conn`, up to its end as framed: a proxy may delay closing after
/// a local reply (Envoy's `delayed_close_timeout`), and waiting for that would let a rate
/// limiter's bucket refill between requests.
pub fn read_response(conn: &mut impl Read, head_only: bool) -> Vec<u8> {
    let mut response = Vec::new();
    let mut buf = [0u8; 16384];
    while complete(&response, head_only) != Some(true) {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
        }
    }
    response
}

/// Sends `case` to 127.0.0.1:`port` (over TLS when `tls`, any certificate accepted: the
/// sandboxes' own are self-signed) and returns the status line, the kept headers (sorted)
/// and the body decoded from its `content-encoding` as `case.shown` says.
pub fn send(port: u16, case: &Case, tls: bool) -> String {
    let body = match case.body {
        Body::Empty => Vec::new(),
        Body::Gzipped => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(&super::backends::file_body()).unwrap();
            e.finish().unwrap()
        }
    };
    let length = match case.body {
        Body::Empty => String::new(),
        Body::Gzipped => format!(
            "content-encoding: gzip\r\ncontent-length: {}\r\n",
            body.len()
        ),
    };
    let mut raw = format!(
        "{} {} HTTP/1.1\r\nhost: localhost\r\n{}{length}connection: close\r\n\r\n",
        case.method, case.path, case.headers
    )
    .into_bytes();
    raw.extend_from_slice(&body);
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(15))).ok();
    let head_only = case.method == "HEAD";
    let response = if tls {
        let config = Arc::new(crate::tls::accept_any(b"").unwrap());
        let name = ServerName::try_from("localhost").unwrap();
        let session = rustls::ClientConnection::new(config, name).unwrap();
        let mut stream = rustls::StreamOwned::new(session, conn);
        if let Err(e) = stream.write_all(&raw) {
            return format!("TLS: {e}");
        }
        read_response(&mut stream, head_only)
    } else {
        conn.write_all(&raw).unwrap();
        read_response(&mut conn, head_only)
    };
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(response.len());
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let rest = response.get(split + 4..).unwrap_or_default();
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            Some((n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        })
        .collect();
    let value = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map_or("", |(_, v)| v.as_str())
    };
    let data = if value("transfer-encoding") == "chunked" {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    let shown_body = match (
        crate::codings::decode(value("content-encoding"), &data),
        case.shown,
    ) {
        (None, _) => format!("{} bytes that do not decode", data.len()),
        (Some(d), Shown::Whole) if d == super::backends::file_body() => "the file body".to_owned(),
        (Some(d), Shown::Whole) => String::from_utf8_lossy(&d).into_owned(),
        (Some(d), Shown::Decodes) if d.len() < 64 => String::from_utf8_lossy(&d).into_owned(),
        (Some(_), Shown::Decodes) => "a page of its own".to_owned(),
    };
    let mut shown: Vec<String> = headers
        .iter()
        .filter(|(n, _)| {
            n != "x-envoy-upstream-service-time"
                && KEPT.iter().any(|k| n.starts_with(k))
                && !(case.shown == Shown::Decodes && (n == "content-length" || n == "content-type"))
        })
        .map(|(n, v)| format!("{n}: {v}"))
        .collect();
    shown.sort();
    format!("{status}\n{}\n{shown_body}", shown.join("\n"))
}
