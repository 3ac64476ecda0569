//! A minimal HTTP/1.1 client for tests: one GET with `connection: close`, read to the end,
//! `content-length` or chunked bodies; and the server side of bodiless requests
//! ([`answer_heads`]).
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A GET of `path` from `addr`, from the local address `source` when given: the status and
/// the body, or what went wrong.
pub fn get(
    source: Option<SocketAddr>,
    addr: SocketAddr,
    path: &str,
) -> Result<(u16, String), String> {
    get_with(source, addr, path, "")
}

/// [`get`] with `headers` (whole lines, each ending in `\r\n`) added to the request.
pub fn get_with(
    source: Option<SocketAddr>,
    addr: SocketAddr,
    path: &str,
    headers: &str,
) -> Result<(u16, String), String> {
    get_head(source, addr, path, headers).map(|(status, _, body)| (status, body))
}

/// [`get_with`], answering the response head too (status line and headers, lower-cased).
pub fn get_head(
    source: Option<SocketAddr>,
    addr: SocketAddr,
    path: &str,
    headers: &str,
) -> Result<(u16, String, String), String> {
    let mut conn = match source {
        None => TcpStream::connect_timeout(&addr, Duration::from_secs(5)),
        Some(source) => {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .map_err(|e| e.to_string())?;
            socket
                .bind(&source.into())
                .map_err(|e| format!("bind {source}: {e}"))?;
            socket
                .connect_timeout(&addr.into(), Duration::from_secs(5))
                .map(|()| TcpStream::from(socket))
        }
    }
    .map_err(|e| format!("connect {addr}: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nhost: netcov\r\n{headers}connection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw)
        .map_err(|e| format!("read: {e}"))?;
    let end = find(&raw, b"\r\n\r\n").ok_or_else(|| format!("no response head: {raw:?}"))?;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {head}"))?;
    let mut body = raw[end + 4..].to_vec();
    if head.contains("\r\ntransfer-encoding: chunked") {
        body = dechunk(&body)?;
    }
    Ok((status, head, String::from_utf8_lossy(&body).into_owned()))
}

/// Serves bodiless requests on `stream` until it ends: each request head (up to its blank
/// line, as text) is answered with the whole response `answer` makes of it.
pub fn answer_heads(stream: &mut (impl Read + Write), mut answer: impl FnMut(&str) -> String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        while let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            buf.drain(..end + 4);
            if stream.write_all(answer(&head).as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// A `200 OK` response carrying `body`.
pub fn ok(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line = find(raw, b"\r\n").ok_or("truncated chunk size")?;
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..line]).trim(), 16)
            .map_err(|e| format!("chunk size: {e}"))?;
        raw = &raw[line + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(raw.get(..size).ok_or("truncated chunk")?);
        raw = raw.get(size + 2..).ok_or("truncated chunk")?;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
