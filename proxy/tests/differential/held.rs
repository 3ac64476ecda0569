//! Connections a case keeps open for later cases (`Case::held("name")`): a keep-alive
//! HTTP/1.1 connection or an HTTP/2 connection opened before, say, a drain, and used again
//! after it, to see how the proxy tells an open connection to close (HTTP/1.1
//! `connection: close`, an HTTP/2 GOAWAY).
//!
//! Both are spoken by hand so that what the proxy sends is seen as sent: HTTP/1.1 requests as
//! raw bytes, HTTP/2 as frames (HPACK literals without indexing; of the response head only a
//! `:status` from the static table is decoded, enough for the local replies these cases use).

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio::time::timeout;

use super::case::{Case, Proto};
use super::client::Observation;

const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One side's held connections, by name.
#[derive(Default)]
pub struct Held {
    conns: Mutex<HashMap<String, Conn>>,
}

/// A held connection and, for HTTP/2, the next stream id.
struct Conn {
    stream: TcpStream,
    next_stream: u32,
}

impl Held {
    /// Sends `case` on the connection it names (opened to `port` on first use).
    pub async fn observe(
        &self,
        case: &Case,
        name: &str,
        port: u16,
        render: &dyn Fn(&str) -> String,
    ) -> Observation {
        let mut conns = self.conns.lock().await;
        if !conns.contains_key(name) {
            let opened = match TcpStream::connect(("127.0.0.1", port)).await {
                Ok(stream) => stream,
                Err(e) => return error(&format!("connect: {e}")),
            };
            let mut conn = Conn {
                stream: opened,
                next_stream: 1,
            };
            if case.proto == Proto::H2
                && let Err(e) = conn.h2_start().await
            {
                return error(&e);
            }
            conns.insert(name.to_string(), conn);
        }
        let conn = conns.get_mut(name).expect("held connection");
        let result = match case.proto {
            Proto::H1 => timeout(READ_TIMEOUT, conn.h1_exchange(case, render)).await,
            Proto::H2 => timeout(READ_TIMEOUT, conn.h2_exchange(case, render)).await,
        };
        match result {
            Ok(Ok(obs)) => obs,
            Ok(Err(e)) => error(&e),
            Err(_) => error("timeout"),
        }
    }
}

fn error(what: &str) -> Observation {
    eprintln!("    (held connection: {what})");
    let class = if what.contains("closed") {
        "closed"
    } else if what.contains("timeout") {
        "timeout"
    } else {
        "no response"
    };
    Observation::from([("error".to_string(), class.to_string())])
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Conn {
    /// One HTTP/1.1 request without a body; observes the status, the `connection` header and
    /// the response body (framed by `content-length`).
    async fn h1_exchange(
        &mut self,
        case: &Case,
        render: &dyn Fn(&str) -> String,
    ) -> Result<Observation, String> {
        let mut request = format!("{} {} HTTP/1.1\r\n", case.method, render(&case.path));
        if let Some(host) = &case.host {
            request.push_str(&format!("Host: {}\r\n", render(host)));
        }
        for (n, v) in &case.headers {
            request.push_str(&format!("{n}: {}\r\n", render(v)));
        }
        request.push_str("\r\n");
        self.stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        let end = loop {
            if let Some(end) = find(&data, b"\r\n\r\n") {
                break end;
            }
            match self.stream.read(&mut buf).await {
                Ok(0) => return Err("closed before a response".to_string()),
                Ok(n) => data.extend_from_slice(&buf[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        };
        let head = String::from_utf8_lossy(&data[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .unwrap_or_default()
            .to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map_or("<missing>".to_string(), |(_, v)| v.clone())
        };
        let length: usize = header("content-length").parse().unwrap_or(0);
        let mut body = data[end + 4..].to_vec();
        while body.len() < length {
            match self.stream.read(&mut buf).await {
                Ok(0) => return Err("closed inside the body".to_string()),
                Ok(n) => body.extend_from_slice(&buf[..n]),
                Err(e) => return Err(format!("read body: {e}")),
            }
        }
        Ok(Observation::from([
            ("status".to_string(), status),
            (
                "response.header.connection".to_string(),
                header("connection"),
            ),
            (
                "body".to_string(),
                String::from_utf8_lossy(&body).into_owned(),
            ),
        ]))
    }

    /// The client preface and an empty SETTINGS frame.
    async fn h2_start(&mut self) -> Result<(), String> {
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend_from_slice(&frame(SETTINGS, 0, 0, &[]));
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| format!("write preface: {e}"))
    }

    /// One HTTP/2 request without a body on a new stream; observes the `:status` and the
    /// first GOAWAY the proxy sent (`none` if it sent none) up to the end of the response and
    /// a PING round trip after it (so a GOAWAY queued with the response is seen), or up to
    /// the proxy closing the connection after the response.
    async fn h2_exchange(
        &mut self,
        case: &Case,
        render: &dyn Fn(&str) -> String,
    ) -> Result<Observation, String> {
        let id = self.next_stream;
        self.next_stream += 2;
        let mut block = Vec::new();
        let authority = case.host.as_deref().map(render).unwrap_or_default();
        let path = render(&case.path);
        for (n, v) in [
            (":method", case.method.as_str()),
            (":scheme", "http"),
            (":authority", authority.as_str()),
            (":path", path.as_str()),
        ] {
            literal(&mut block, n, v);
        }
        for (n, v) in &case.headers {
            literal(&mut block, n, &render(v));
        }
        let headers = frame(HEADERS, END_STREAM | END_HEADERS, id, &block);
        self.stream
            .write_all(&headers)
            .await
            .map_err(|e| format!("write headers: {e}"))?;
        let (mut status, mut goaway, mut ended) = ("<none>".to_string(), None, false);
        let ping = *b"revoyhld";
        let mut pinged = false;
        let mut pending = Vec::new();
        loop {
            // A proxy that closes once the response is out has said all it would.
            let (kind, flags, stream, payload) = match self.read_frame(&mut pending).await {
                Ok(frame) => frame,
                Err(_) if ended => break,
                Err(e) => return Err(e),
            };
            match kind {
                SETTINGS if flags & ACK == 0 => self.send(&frame(SETTINGS, ACK, 0, &[])).await?,
                PING if flags & ACK == 0 => self.send(&frame(PING, ACK, 0, &payload)).await?,
                PING if payload == ping => break,
                GOAWAY if goaway.is_none() && payload.len() >= 8 => {
                    let last = u32::from_be_bytes(payload[..4].try_into().unwrap()) & 0x7fff_ffff;
                    let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                    goaway = Some(format!("last_stream={last} error={code}"));
                }
                HEADERS if stream == id => {
                    status = static_status(&payload, flags);
                    ended |= flags & END_STREAM != 0;
                }
                DATA if stream == id => ended |= flags & END_STREAM != 0,
                RST_STREAM if stream == id => return Err("stream reset".to_string()),
                _ => {}
            }
            if ended && !pinged {
                pinged = true;
                self.send(&frame(PING, 0, 0, &ping)).await?;
            }
        }
        Ok(Observation::from([
            ("status".to_string(), status),
            (
                "h2.goaway".to_string(),
                goaway.unwrap_or_else(|| "none".to_string()),
            ),
        ]))
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stream
            .write_all(bytes)
            .await
            .map_err(|e| format!("write: {e}"))
    }

    /// The next frame: type, flags, stream id, payload.
    async fn read_frame(
        &mut self,
        pending: &mut Vec<u8>,
    ) -> Result<(u8, u8, u32, Vec<u8>), String> {
        let mut buf = [0u8; 16384];
        loop {
            if pending.len() >= 9 {
                let len = u32::from_be_bytes([0, pending[0], pending[1], pending[2]]) as usize;
                if pending.len() >= 9 + len {
                    let (kind, flags) = (pending[3], pending[4]);
                    let stream =
                        u32::from_be_bytes(pending[5..9].try_into().unwrap()) & 0x7fff_ffff;
                    let payload = pending[9..9 + len].to_vec();
                    pending.drain(..9 + len);
                    return Ok((kind, flags, stream, payload));
                }
            }
            match self.stream.read(&mut buf).await {
                Ok(0) => return Err("closed by the proxy".to_string()),
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK literal header field without indexing, name and value as plain strings (both
/// under 127 bytes).
fn literal(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0);
    block.push(name.len() as u8);
    block.extend_from_slice(name.as_bytes());
    block.push(value.len() as u8);
    block.extend_from_slice(value.as_bytes());
}

/// The `:status` of a response HEADERS frame whose first field is an indexed static-table
/// status (8-14), or `?`.
fn static_status(payload: &[u8], flags: u8) -> String {
    let mut at = 0;
    if flags & PADDED != 0 {
        at += 1;
    }
    if flags & PRIORITY != 0 {
        at += 5;
    }
    let statuses = ["200", "204", "206", "304", "400", "404", "500"];
    match payload.get(at) {
        Some(b) if (0x88..=0x8e).contains(b) => statuses[usize::from(b - 0x88)].to_string(),
        _ => "?".to_string(),
    }
}
