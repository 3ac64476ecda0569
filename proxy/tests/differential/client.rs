//! Sends a [`Case`] to one proxy and records what came back as an [`Observation`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;

use super::case::{Case, Kind, Proto};
use super::tls;
use super::upstream::grpc_frame;
use super::websocket;

/// Field name -> observed value. Fields are compared one by one between Envoy and revoy.
pub type Observation = BTreeMap<String, String>;

/// Value recorded for headers whose value varies naturally.
pub const PRESENT: &str = "<present>";

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `case` against the proxy listening on `port`; `render` fills template placeholders.
pub async fn observe(case: &Case, port: u16, render: &dyn Fn(&str) -> String) -> Observation {
    if case.repeat > 1 {
        return observe_spread(case, port, render).await;
    }
    match timeout(REQUEST_TIMEOUT, observe_once(case, port, render)).await {
        Ok(Ok(obs)) => obs,
        Ok(Err(err)) => error_observation(&err),
        Err(_) => error_observation("timeout"),
    }
}

fn error_observation(err: &str) -> Observation {
    let class = if err.contains("timeout") {
        "timeout"
    } else {
        "no response"
    };
    eprintln!("    (request error: {err})");
    Observation::from([("error".to_string(), class.to_string())])
}

async fn observe_spread(case: &Case, port: u16, render: &dyn Fn(&str) -> String) -> Observation {
    let single = Case {
        repeat: 1,
        ..case.clone()
    };
    let mut upstreams: BTreeMap<String, usize> = BTreeMap::new();
    let mut statuses = BTreeSet::new();
    for _ in 0..case.repeat {
        let obs = Box::pin(observe(&single, port, render)).await;
        let upstream = obs
            .get("upstream")
            .cloned()
            .unwrap_or_else(|| "<none>".to_string());
        *upstreams.entry(upstream).or_default() += 1;
        statuses.insert(
            obs.get("status")
                .cloned()
                .unwrap_or_else(|| "<none>".to_string()),
        );
    }
    if case.count {
        let counts: Vec<String> = upstreams.iter().map(|(u, n)| format!("{u}:{n}")).collect();
        return Observation::from([
            (
                "statuses".to_string(),
                statuses.into_iter().collect::<Vec<_>>().join(","),
            ),
            ("upstreams.counts".to_string(), counts.join(",")),
        ]);
    }
    let upstreams: BTreeSet<String> = upstreams.into_keys().collect();
    let join = |set: &BTreeSet<String>| set.iter().cloned().collect::<Vec<_>>().join(",");
    let mut obs = Observation::from([("statuses".to_string(), join(&statuses))]);
    if case.pool.is_empty() {
        obs.insert("upstreams".to_string(), join(&upstreams));
    } else {
        let outside: Vec<_> = upstreams
            .iter()
            .filter(|u| !case.pool.contains(u))
            .cloned()
            .collect();
        let verdict = if outside.is_empty() {
            "yes".to_string()
        } else {
            format!("no: {}", outside.join(","))
        };
        obs.insert("upstreams.within_pool".to_string(), verdict);
    }
    obs
}

async fn connect(port: u16, source: Option<IpAddr>, ipv6: bool) -> Result<TcpStream, String> {
    let (socket, target) = if ipv6 {
        (TcpSocket::new_v6(), IpAddr::V6(Ipv6Addr::LOCALHOST))
    } else {
        (TcpSocket::new_v4(), IpAddr::V4(Ipv4Addr::LOCALHOST))
    };
    let socket = socket.map_err(|e| e.to_string())?;
    if let Some(source) = source {
        socket
            .bind(SocketAddr::new(source, 0))
            .map_err(|e| format!("bind {source}: {e}"))?;
    }
    let addr = SocketAddr::new(target, port);
    socket
        .connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))
}

async fn observe_once(
    case: &Case,
    port: u16,
    render: &dyn Fn(&str) -> String,
) -> Result<Observation, String> {
    let stream = connect(port, case.source, case.ipv6).await?;
    match &case.kind {
        Kind::Http | Kind::Grpc(_) => match &case.tls {
            Some(sni) => {
                let alpn: &[u8] = if case.proto == Proto::H2 {
                    b"h2"
                } else {
                    b"http/1.1"
                };
                let stream = tls::connect(stream, sni.as_deref(), alpn).await?;
                http(case, stream, render).await
            }
            None => http(case, stream, render).await,
        },
        Kind::WebSocket(message) => ws(case, stream, message, render).await,
        Kind::Tcp(line) => match &case.tls {
            Some(sni) => {
                let stream = tls::connect(stream, sni.as_deref(), b"").await?;
                tcp(stream, line, case.watch_close).await
            }
            None => tcp(stream, line, case.watch_close).await,
        },
        Kind::Raw(bytes) => raw(stream, bytes).await,
        Kind::Conversation(bytes) => conversation(stream, bytes).await,
    }
}

fn build_request(
    case: &Case,
    render: &dyn Fn(&str) -> String,
) -> Result<Request<Full<Bytes>>, String> {
    let host = case.host.as_deref().map(render);
    let path = render(&case.path);
    let uri = match (case.proto, &host) {
        (Proto::H2, Some(host)) => format!("http://{host}{path}"),
        _ => path,
    };
    let mut builder = Request::builder().method(case.method.as_str()).uri(uri);
    if let (Proto::H1, Some(host)) = (case.proto, &host) {
        builder = builder.header("host", host);
    }
    for (name, value) in &case.headers {
        builder = builder.header(name, render(value));
    }
    let body = match &case.kind {
        Kind::Grpc(message) => {
            builder = builder
                .header("content-type", "application/grpc")
                .header("te", "trailers");
            grpc_frame(message.as_bytes())
        }
        _ => Bytes::from(case.body.clone()),
    };
    builder
        .body(Full::new(body))
        .map_err(|e| format!("build request: {e}"))
}

async fn http<S>(
    case: &Case,
    stream: S,
    render: &dyn Fn(&str) -> String,
) -> Result<Observation, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(stream);
    let mut sender = match case.proto {
        Proto::H1 => {
            let (sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Sender::H1(sender)
        }
        Proto::H2 => {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            Sender::H2(sender)
        }
    };
    let mut obs = Observation::new();
    for round in 1..=case.same_connection.max(1) {
        obs = http_exchange(case, &mut sender, render)
            .await
            .map_err(|e| format!("request {round} on the connection: {e}"))?;
    }
    if case.same_connection > 1 {
        obs.insert(
            "requests_on_connection".to_string(),
            case.same_connection.to_string(),
        );
    }
    Ok(obs)
}

/// A client connection of either HTTP version.
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

async fn http_exchange(
    case: &Case,
    sender: &mut Sender,
    render: &dyn Fn(&str) -> String,
) -> Result<Observation, String> {
    let request = build_request(case, render)?;
    let response = match sender {
        Sender::H1(sender) => {
            sender.ready().await.map_err(|e| e.to_string())?;
            sender.send_request(request).await
        }
        Sender::H2(sender) => sender.send_request(request).await,
    }
    .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let headers = header_pairs(response.headers());
    let collected = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    let trailers = collected.trailers().map(header_pairs).unwrap_or_default();
    let body = collected.to_bytes();
    let mut obs = response_observation(
        status,
        "",
        &headers,
        &body,
        matches!(case.kind, Kind::Grpc(_)),
    );
    for (name, value) in trailers {
        obs.insert(format!("trailer.{name}"), value);
    }
    Ok(obs)
}

fn header_pairs(headers: &http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// Observation of an HTTP response: status, headers (minus `date` and the body framing, since
/// content-length and chunked carry the same body), and either the echo's
/// report of what the upstream saw or the literal body of a local reply.
fn response_observation(
    status: u16,
    reason: &str,
    headers: &[(String, String)],
    body: &[u8],
    grpc: bool,
) -> Observation {
    let mut obs = Observation::from([("status".to_string(), status.to_string())]);
    if !reason.is_empty() {
        obs.insert("reason".to_string(), reason.to_string());
    }
    let echo = if grpc {
        body.get(5..).unwrap_or_default()
    } else {
        body
    };
    let echo: Option<Value> = serde_json::from_slice(echo)
        .ok()
        .filter(|v: &Value| v.get("upstream").is_some());
    let mut response_headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        let value = match name.as_str() {
            "date" | "content-length" | "transfer-encoding" => continue,
            "x-envoy-upstream-service-time" => PRESENT.to_string(),
            _ => value.clone(),
        };
        response_headers
            .entry(name.clone())
            .or_default()
            .push(value);
    }
    for (name, values) in response_headers {
        obs.insert(format!("response.header.{name}"), values.join(" | "));
    }
    match echo {
        Some(echo) => record_echo(&mut obs, &echo),
        None => {
            obs.insert("body".to_string(), body_text(body));
        }
    }
    obs
}

/// A local reply's body; JSON bodies are compared by value (keys sorted, compact), not layout.
fn body_text(body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(json @ (Value::Object(_) | Value::Array(_))) => {
            format!("json:{}", canonical_json(&json))
        }
        _ => String::from_utf8_lossy(body).into_owned(),
    }
}

fn canonical_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let fields: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), canonical_json(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(canonical_json)
                .collect::<Vec<_>>()
                .join(",")
        ),
        other => other.to_string(),
    }
}

fn record_echo(obs: &mut Observation, echo: &Value) {
    for field in [
        "upstream", "peer", "method", "path", "host", "version", "body",
    ] {
        let value = match &echo[field] {
            Value::String(s) => s.clone(),
            Value::Null => "<absent>".to_string(),
            other => other.to_string(),
        };
        let key = if field == "upstream" {
            field.to_string()
        } else {
            format!("upstream.{field}")
        };
        obs.insert(key, value);
    }
    if let Some(seq) = echo["conn_seq"].as_u64() {
        let reused = if seq > 1 { "yes" } else { "no" };
        obs.insert("upstream.connection_reused".to_string(), reused.to_string());
    }
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pair in echo["headers"].as_array().into_iter().flatten() {
        if let (Some(name), Some(value)) = (pair[0].as_str(), pair[1].as_str()) {
            seen.entry(name.to_string())
                .or_default()
                .push(value.to_string());
        }
    }
    // A retry carries the time left of the overall timeout, which varies from run to run.
    let retried = seen
        .get("x-envoy-attempt-count")
        .is_some_and(|v| v.iter().any(|a| a != "1"));
    if let Some(timeout) = seen
        .get_mut("x-envoy-expected-rq-timeout-ms")
        .filter(|_| retried)
    {
        *timeout = vec![PRESENT.to_string()];
    }
    for (name, values) in seen {
        obs.insert(format!("upstream.header.{name}"), values.join(" | "));
    }
    for pair in echo["trailers"].as_array().into_iter().flatten() {
        if let (Some(name), Some(value)) = (pair[0].as_str(), pair[1].as_str()) {
            obs.insert(format!("upstream.trailer.{name}"), value.to_string());
        }
    }
}

async fn ws(
    case: &Case,
    mut stream: TcpStream,
    message: &str,
    render: &dyn Fn(&str) -> String,
) -> Result<Observation, String> {
    let host = case.host.as_deref().map(render).unwrap_or_default();
    let handshake = format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        render(&case.path)
    );
    stream
        .write_all(handshake.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = stream
            .read_u8()
            .await
            .map_err(|e| format!("read handshake: {e}"))?;
        head.push(byte);
        if head.len() > 64 * 1024 {
            return Err("handshake response too large".to_string());
        }
    }
    let (status, reason, headers) = parse_head(&head)?;
    if status != 101 {
        let body = read_rest(&mut stream, &headers).await;
        return Ok(response_observation(
            status, &reason, &headers, &body, false,
        ));
    }
    let mut obs = response_observation(status, &reason, &headers, b"", false);
    obs.remove("body");
    let (_, first) = websocket::read_frame(&mut stream)
        .await
        .map_err(|e| format!("first frame: {e}"))?;
    if let Ok(echo) = serde_json::from_slice::<Value>(&first) {
        record_echo(&mut obs, &echo);
    }
    websocket::write_frame(
        &mut stream,
        websocket::TEXT,
        message.as_bytes(),
        Some([1, 2, 3, 4]),
    )
    .await
    .map_err(|e| e.to_string())?;
    let (opcode, echoed) = websocket::read_frame(&mut stream)
        .await
        .map_err(|e| format!("echo frame: {e}"))?;
    obs.insert(
        "ws.echo".to_string(),
        format!("opcode {opcode}: {}", String::from_utf8_lossy(&echoed)),
    );
    let _ = websocket::write_frame(&mut stream, websocket::CLOSE, &[], Some([5, 6, 7, 8])).await;
    Ok(obs)
}

async fn tcp<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    line: &str,
    watch_close: Option<Duration>,
) -> Result<Observation, String> {
    stream
        .write_all(format!("{line}\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    while !reply.ends_with(b"\n") && reply.len() < 4096 {
        match stream.read_u8().await {
            Ok(byte) => reply.push(byte),
            Err(_) => break,
        }
    }
    let reply = String::from_utf8_lossy(&reply).trim_end().to_string();
    let reply = if reply.is_empty() {
        "<closed without data>".to_string()
    } else {
        reply
    };
    let mut obs = Observation::from([("tcp.reply".to_string(), reply)]);
    if let Some(wait) = watch_close {
        let mut rest = Vec::new();
        let closed = timeout(wait, stream.read_to_end(&mut rest)).await.is_ok();
        obs.insert(
            "tcp.closed_by_proxy".to_string(),
            if closed { "yes" } else { "no" }.to_string(),
        );
    }
    Ok(obs)
}

async fn raw(mut stream: TcpStream, bytes: &[u8]) -> Result<Observation, String> {
    stream.write_all(bytes).await.map_err(|e| e.to_string())?;
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    while data.len() < 1 << 20 && !raw_complete(&data) {
        match timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => data.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let (interim, rest) = skip_interim(&data);
    let Some(end) = find(rest, b"\r\n\r\n") else {
        return Ok(Observation::from([(
            "error".to_string(),
            "no response".to_string(),
        )]));
    };
    let (status, reason, headers) = parse_head(&rest[..end + 4])?;
    let body = &rest[end + 4..];
    let (body, trailers) = if is_chunked(&headers) {
        dechunk(body)
    } else {
        (body.to_vec(), String::new())
    };
    let mut obs = response_observation(status, &reason, &headers, &body, false);
    if !trailers.is_empty() {
        obs.insert("trailers".to_string(), trailers);
    }
    if !interim.is_empty() {
        obs.insert("interim".to_string(), interim.join(","));
    }
    Ok(obs)
}

/// Writes several requests at once and reads until the proxy closes the connection or stays
/// quiet for 1.5 s (Envoy closes after a local reply only once its 1 s `delayed_close_timeout`
/// has passed). Observes each response as `<status> <path the upstream echoed>` (`-` for
/// a response the proxy made itself), and whether the connection was closed.
async fn conversation(mut stream: TcpStream, bytes: &[u8]) -> Result<Observation, String> {
    stream.write_all(bytes).await.map_err(|e| e.to_string())?;
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match timeout(Duration::from_millis(1500), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => data.extend_from_slice(&buf[..n]),
            Ok(_) => break "yes",
            Err(_) => break "no",
        }
    };
    let mut methods = request_methods(bytes).into_iter();
    let mut responses = Vec::new();
    let mut rest = &data[..];
    while let Some(end) = find(rest, b"\r\n\r\n") {
        let (status, _, headers) = parse_head(&rest[..end + 4])?;
        rest = &rest[end + 4..];
        let head_request = methods.next().is_some_and(|m| m == "HEAD");
        let body = if status == 204 || status == 304 || head_request {
            Vec::new()
        } else if is_chunked(&headers) {
            let end = find(rest, b"0\r\n\r\n").map_or(rest.len(), |e| e + 5);
            let (body, _) = dechunk(&rest[..end]);
            rest = &rest[end..];
            body
        } else {
            let len = content_length(&headers).unwrap_or(0).min(rest.len());
            let body = rest[..len].to_vec();
            rest = &rest[len..];
            body
        };
        let path = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["path"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "-".to_string());
        responses.push(format!("{status} {path}"));
    }
    let mut obs = Observation::from([
        ("responses".to_string(), responses.join(", ")),
        ("closed".to_string(), closed.to_string()),
    ]);
    if !rest.is_empty() {
        obs.insert(
            "trailing bytes".to_string(),
            String::from_utf8_lossy(rest).into_owned(),
        );
    }
    Ok(obs)
}

/// The method of each request in `bytes`, in order (bodies framed by `content-length` or
/// `transfer-encoding: chunked` are skipped).
fn request_methods(mut bytes: &[u8]) -> Vec<String> {
    let mut methods = Vec::new();
    while let Some(end) = find(bytes, b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
        methods.push(
            head.split(' ')
                .next()
                .unwrap_or_default()
                .to_ascii_uppercase(),
        );
        bytes = &bytes[end + 4..];
        let length = head.lines().find_map(|l| {
            l.strip_prefix("content-length:")
                .and_then(|v| v.trim().parse::<usize>().ok())
        });
        if head.contains("transfer-encoding: chunked") {
            let end = find(bytes, b"0\r\n\r\n").map_or(bytes.len(), |e| e + 5);
            bytes = &bytes[end..];
        } else if let Some(n) = length {
            bytes = &bytes[n.min(bytes.len())..];
        }
    }
    methods
}

/// Strips leading 1xx interim responses (except 101), returning their status codes.
fn skip_interim(mut data: &[u8]) -> (Vec<String>, &[u8]) {
    let mut interim = Vec::new();
    while let Some(end) = find(data, b"\r\n\r\n") {
        match parse_head(&data[..end + 4]) {
            Ok((status, _, _)) if (100..200).contains(&status) && status != 101 => {
                interim.push(status.to_string());
                data = &data[end + 4..];
            }
            _ => break,
        }
    }
    (interim, data)
}

/// Whether `data` holds a whole final response (framed by content-length or chunked encoding).
fn raw_complete(data: &[u8]) -> bool {
    let (_, rest) = skip_interim(data);
    let Some(end) = find(rest, b"\r\n\r\n") else {
        return false;
    };
    let Ok((_, _, headers)) = parse_head(&rest[..end + 4]) else {
        return false;
    };
    let body = &rest[end + 4..];
    if is_chunked(&headers) {
        return body.ends_with(b"0\r\n\r\n");
    }
    content_length(&headers).is_some_and(|len| body.len() >= len)
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"))
}

/// A chunked body's data, and its trailer section (the lines after the last chunk, joined by
/// `|`; empty when there are none).
fn dechunk(mut body: &[u8]) -> (Vec<u8>, String) {
    let mut out = Vec::new();
    while let Some(line_end) = find(body, b"\r\n") {
        let size = std::str::from_utf8(&body[..line_end])
            .ok()
            .and_then(|l| usize::from_str_radix(l.trim(), 16).ok());
        let Some(size) = size.filter(|s| *s > 0) else {
            let section = body.get(line_end + 2..).unwrap_or_default();
            let trailers = String::from_utf8_lossy(section)
                .split("\r\n")
                .take_while(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("|");
            return (out, trailers);
        };
        let chunk = body
            .get(line_end + 2..line_end + 2 + size)
            .unwrap_or_default();
        out.extend_from_slice(chunk);
        body = body.get(line_end + 4 + size..).unwrap_or_default();
    }
    (out, String::new())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn content_length(headers: &[(String, String)]) -> Option<usize> {
    headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
}

async fn read_rest(stream: &mut TcpStream, headers: &[(String, String)]) -> Vec<u8> {
    let mut body = vec![0u8; content_length(headers).unwrap_or(0).min(1 << 20)];
    let _ = timeout(Duration::from_secs(2), stream.read_exact(&mut body)).await;
    body
}

/// Status code, reason phrase and headers (names lowercased) of an HTTP/1.x response head.
type Head = (u16, String, Vec<(String, String)>);

/// Parses an HTTP/1.x status line and headers.
fn parse_head(head: &[u8]) -> Result<Head, String> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let _version = parts.next();
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or(format!("bad status line {status_line:?}"))?;
    let reason = parts.next().unwrap_or_default().to_string();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok((status, reason, headers))
}
