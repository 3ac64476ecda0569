//! The grpc-bridge sandbox's two ends: its KV service (`server/service.go`, `protos/kv.proto`:
//! `kv.KV` with `Get` and `Set` over one in-memory map), a gRPC server over HTTP/2 here with
//! its two messages encoded by hand; and its client (`client/client.py`), HTTP/1.1 POSTs of one
//! gRPC frame with `content-type: application/grpc` to the client-side proxy.

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backends::{Log, Service};

/// Starts the KV service on a free loopback port, its map empty. It answers as the sandbox's
/// Go service does: `Set` stores the value and answers `ok: true`, `Get` answers the stored
/// value (empty for a key never set, with status OK); a method it lacks is answered
/// trailers-only with `UNIMPLEMENTED`, as grpc-go answers it. Not in the sandbox's service:
/// `/kv.KV/Fail` sends its headers, then trailers `NOT_FOUND` (what a server failing after its
/// headers sends, the case the bridge turns into a 503). It logs each call: its path, headers
/// (`x-request-id` left out) and body.
pub fn kv() -> Service {
    let log = Log::default();
    let seen = log.clone();
    let store: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let port = crate::h2_server::serve(move |request, respond| {
        call(request, respond, seen.clone(), store.clone())
    });
    Service { port, log }
}

/// One call to [`kv`].
async fn call(
    request: crate::h2_server::Request,
    mut respond: crate::h2_server::Respond,
    seen: Log,
    store: Arc<Mutex<HashMap<String, String>>>,
) {
    let (head, mut body) = request.into_parts();
    let mut data = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let mut headers: Vec<String> = head
        .headers
        .iter()
        .filter(|(n, _)| n.as_str() != "x-request-id")
        .map(|(n, v)| format!("{n}: {}", String::from_utf8_lossy(v.as_bytes())))
        .collect();
    headers.sort();
    let path = head.uri.path().to_owned();
    seen.lock().unwrap().push(format!(
        "{} {path} [{}] body {}",
        head.method,
        headers.join("; "),
        data.escape_ascii()
    ));
    let message = data.get(5..).unwrap_or_default();
    let reply = match path.as_str() {
        "/kv.KV/Set" => {
            let key = string_field(message, 1);
            let value = string_field(message, 2);
            store.lock().unwrap().insert(key, value);
            Ok(vec![0x08, 0x01])
        }
        "/kv.KV/Get" => {
            let value = store
                .lock()
                .unwrap()
                .get(&string_field(message, 1))
                .cloned()
                .unwrap_or_default();
            Ok(encode_string(1, &value))
        }
        "/kv.KV/Fail" => Err(("5", "no such key")),
        _ => {
            let method = path.rsplit('/').next().unwrap_or_default();
            let status = format!("unknown method {method} for service kv.KV");
            let resp = grpc_head()
                .header("grpc-status", "12")
                .header("grpc-message", status)
                .body(())
                .unwrap();
            let _ = respond.send_response(resp, true);
            return;
        }
    };
    let Ok(mut send) = respond.send_response(grpc_head().body(()).unwrap(), false) else {
        return;
    };
    let (status, message) = match reply {
        Ok(message) => {
            let _ = send.send_data(frame(&message).into(), false);
            ("0", None)
        }
        Err((status, message)) => (status, Some(message)),
    };
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static(status));
    if let Some(message) = message {
        trailers.insert("grpc-message", http::HeaderValue::from_static(message));
    }
    let _ = send.send_trailers(trailers);
}

/// A gRPC response's head: 200, `content-type: application/grpc`.
fn grpc_head() -> http::response::Builder {
    http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
}

/// `message` in an uncompressed gRPC frame.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A protobuf string field `number` holding `value` (left out when empty, as proto3 does).
pub fn encode_string(number: u8, value: &str) -> Vec<u8> {
    if value.is_empty() {
        return Vec::new();
    }
    let mut out = vec![number << 3 | 2];
    let mut len = value.len();
    while len >= 0x80 {
        out.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(value.as_bytes());
    out
}

/// The string field `number` of the protobuf `message` (empty when absent or malformed).
fn string_field(message: &[u8], number: u8) -> String {
    let mut rest = message;
    while let Some((&tag, after)) = rest.split_first() {
        let (len, after) = varint(after).unwrap_or((usize::MAX, after));
        let Some(value) = after.get(..len) else {
            break;
        };
        if tag == number << 3 | 2 {
            return String::from_utf8_lossy(value).into_owned();
        }
        rest = &after[len..];
    }
    String::new()
}

/// A varint at the start of `data`, and what follows it.
fn varint(data: &[u8]) -> Option<(usize, &[u8])> {
    let mut value = 0usize;
    for (i, byte) in data.iter().enumerate().take(9) {
        value |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, &data[i + 1..]));
        }
    }
    None
}

/// What the sandbox's client sends for one call: a POST of `message` framed to `method` of
/// `kv.KV`, with python-requests' headers and the client's `content-type` and `Host: grpc`,
/// to 127.0.0.1:`port` on a connection of its own. Returns the status line, every response
/// header (sorted; `date`'s value and `x-envoy-upstream-service-time`'s, a timing, masked)
/// and the body's bytes.
pub fn send(port: u16, method: &str, message: &[u8]) -> String {
    let body = frame(message);
    let mut raw = format!(
        "POST /kv.KV/{method} HTTP/1.1\r\nHost: grpc\r\nUser-Agent: python-requests/2.32.3\r\nAccept-Encoding: gzip, deflate\r\nAccept: */*\r\nConnection: keep-alive\r\ncontent-type: application/grpc\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&body);
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(15))).ok();
    conn.write_all(&raw).unwrap();
    let response = crate::client::read_response(&mut conn, false);
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(response.len());
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let body = response.get(split + 4..).unwrap_or_default();
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let mut headers: Vec<String> = lines
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            let n = n.trim().to_ascii_lowercase();
            let v = match n.as_str() {
                "date" | "x-envoy-upstream-service-time" => "<masked>",
                _ => v.trim(),
            };
            Some(format!("{n}: {v}"))
        })
        .collect();
    headers.sort();
    format!(
        "{status}\n{}\nbody {}",
        headers.join("\n"),
        body.escape_ascii()
    )
}
