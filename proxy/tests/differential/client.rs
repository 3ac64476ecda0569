//! Sends a [`Case`] to one proxy and records what came back as an [`Observation`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;

use super::case::{Balance, Case, Kind, Proto, StickyKey};
use super::tls;
use super::upstream::{self, grpc_frame};
use super::websocket;
use super::wire::{Watched, Wire, WireLog, garbage, io_ending};

/// Field name -> observed value. Fields are compared one by one between Envoy and revoy.
pub type Observation = BTreeMap<String, String>;

/// Value recorded for headers whose value varies naturally.
pub const PRESENT: &str = "<present>";

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `case` against the proxy listening on `port`; `render` fills template placeholders.
pub async fn observe(case: &Case, port: u16, render: &dyn Fn(&str) -> String) -> Observation {
    if let Some(balance) = &case.balance {
        return observe_balance(case, balance, port, render).await;
    }
    if case.repeat > 1 {
        return observe_spread(case, port, render).await;
    }
    let wire = WireLog::default();
    let result = timeout(REQUEST_TIMEOUT, observe_once(case, port, render, &wire)).await;
    let wire = wire.lock().expect("wire log");
    match result {
        Ok(Ok(obs)) => obs,
        Ok(Err(err)) => error_observation(&failure(case, &wire, &err), &err),
        Err(_) => error_observation(&failure(case, &wire, "timeout"), "timeout"),
    }
}

fn error_observation(class: &str, err: &str) -> Observation {
    eprintln!("    (request error: {err})");
    Observation::from([("error".to_string(), class.to_string())])
}

/// How an exchange that got no (whole) HTTP response ended, from what its connection saw:
/// `refused`, `closed` (EOF before any byte), `reset` (ECONNRESET), `timeout`, `garbage: ...`
/// (bytes that are not the protocol spoken), an HTTP/2 GOAWAY or RST_STREAM with its reason,
/// or one of those endings after part of a response (or during the body).
fn failure(case: &Case, wire: &Wire, err: &str) -> String {
    if err.starts_with("connect ") {
        return if err.contains("refused") {
            "refused".to_string()
        } else {
            err.to_string()
        };
    }
    if let Some(at) = err.find(H2_PREFIX) {
        return format!("h2 {}", &err[at + H2_PREFIX.len()..]);
    }
    let ending = if err == "timeout" {
        "timeout".to_string()
    } else {
        wire.ending()
    };
    if let Some(tls) = err.strip_prefix("tls handshake: ") {
        let alert = tls.split_once("alert: ").map(|(_, a)| a);
        return match alert {
            Some(alert) => format!("tls handshake: alert {alert}"),
            None => format!("tls handshake: {ending}"),
        };
    }
    let speaks = if case.tls.is_some() {
        Speaks::Tls
    } else if case.proto == Proto::H2 && matches!(case.kind, Kind::Http | Kind::Grpc(_)) {
        Speaks::H2
    } else {
        Speaks::H1
    };
    if err.contains(UNPARSABLE) {
        return wire.garbage();
    }
    let ending = if err.contains(BODY) {
        format!("{ending} during the body")
    } else {
        ending
    };
    no_response(&wire.first, wire.read, &ending, speaks)
}

/// The protocol a connection's first bytes should be in.
#[derive(Clone, Copy)]
enum Speaks {
    H1,
    H2,
    Tls,
}

/// Marks an error hyper reported as an unparsable response.
const UNPARSABLE: &str = "[unparsable] ";
/// Marks an HTTP/2 error frame (GOAWAY, RST_STREAM) as the reason an exchange failed.
const H2_PREFIX: &str = "[h2] ";
/// Marks an error while the response body was read (its head had arrived).
const BODY: &str = "[body] ";

/// `ending` (`closed`, `reset`, `timeout`, ...) qualified by what had been read: nothing, part
/// of a response (or, over HTTP/2 or TLS, that protocol's frames), or garbage.
fn no_response(first: &[u8], read: usize, ending: &str, speaks: Speaks) -> String {
    if read == 0 {
        return ending.to_string();
    }
    let fits = match speaks {
        Speaks::H1 => first.starts_with(b"HTTP/") || b"HTTP/".starts_with(first),
        // A server's first frame is its SETTINGS (type 4).
        Speaks::H2 => first.get(3).is_none_or(|t| *t == 4),
        Speaks::Tls => (0x14..=0x17).contains(&first[0]),
    };
    if !fits {
        return garbage(first);
    }
    match speaks {
        Speaks::H1 => format!("{ending} after part of a response"),
        Speaks::H2 => format!("{ending} after HTTP/2 frames"),
        Speaks::Tls => format!("{ending} after TLS records"),
    }
}

/// A hyper error as the text `failure` reads: HTTP/2 error frames and parse errors are marked.
fn hyper_failure(err: &hyper::Error) -> String {
    if err.is_parse() {
        return format!("{UNPARSABLE}{err}");
    }
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            let reason = h2
                .reason()
                .map_or_else(|| "without a reason".to_string(), |r| format!("{r:?}"));
            let by = if h2.is_remote() {
                ""
            } else {
                " (sent by the client)"
            };
            if h2.is_go_away() {
                return format!("{H2_PREFIX}GOAWAY {reason}{by}");
            }
            if h2.is_reset() {
                return format!("{H2_PREFIX}RST_STREAM {reason}{by}");
            }
        }
        source = cause.source();
    }
    err.to_string()
}

/// Observes a load-balancing property over several requests (see [`Balance`]).
async fn observe_balance(
    case: &Case,
    balance: &Balance,
    port: u16,
    render: &dyn Fn(&str) -> String,
) -> Observation {
    let single = Case {
        balance: None,
        repeat: 1,
        ..case.clone()
    };
    let upstream_of = |obs: &Observation| {
        obs.get("upstream")
            .cloned()
            .unwrap_or_else(|| format!("<none: {}>", obs.get("error").map_or("", String::as_str)))
    };
    let mut statuses = BTreeSet::new();
    let mut obs = Observation::new();
    match balance {
        Balance::Sticky { key, keys, repeat } => {
            let mut split = Vec::new();
            let mut reached = BTreeSet::new();
            for n in 0..*keys {
                let keyed = keyed(&single, key, n);
                let mut hosts = BTreeSet::new();
                for _ in 0..*repeat {
                    let seen = Box::pin(observe(&keyed, port, render)).await;
                    statuses.insert(seen.get("status").cloned().unwrap_or_default());
                    hosts.insert(upstream_of(&seen));
                }
                if hosts.len() > 1 {
                    split.push(format!("key-{n}: {}", join(&hosts)));
                }
                reached.extend(hosts);
            }
            let same = if split.is_empty() {
                "yes".to_string()
            } else {
                format!("no: {}", split.join("; "))
            };
            obs.insert("sticky.same_key_same_host".to_string(), same);
            let several = if reached.len() > 1 { "yes" } else { "no" };
            obs.insert(
                "sticky.keys_reach_several_hosts".to_string(),
                several.to_string(),
            );
        }
        Balance::AvoidBusy { n, hold_ms } => {
            let held = single
                .clone()
                .header("x-echo-delay-ms", &hold_ms.to_string());
            let started = upstream::delays_started();
            let others = async {
                for _ in 0..500 {
                    if upstream::delays_started() > started {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let mut hosts = Vec::new();
                for _ in 0..*n {
                    hosts.push(Box::pin(observe(&single, port, render)).await);
                }
                hosts
            };
            let (held, others) = tokio::join!(Box::pin(observe(&held, port, render)), others);
            let busy = upstream_of(&held);
            statuses.insert(held.get("status").cloned().unwrap_or_default());
            let mut hits = 0;
            for other in &others {
                statuses.insert(other.get("status").cloned().unwrap_or_default());
                hits += usize::from(upstream_of(other) == busy);
            }
            let avoided = if hits == 0 {
                "yes".to_string()
            } else {
                format!("no: {hits} of {n} reached the busy host {busy}")
            };
            obs.insert("busy.avoided".to_string(), avoided);
        }
        Balance::Order { n } => {
            let mut order = Vec::new();
            for _ in 0..*n {
                let seen = Box::pin(observe(&single, port, render)).await;
                statuses.insert(seen.get("status").cloned().unwrap_or_default());
                order.push(upstream_of(&seen));
            }
            let hosts: BTreeSet<String> = order.iter().cloned().collect();
            let k = hosts.len();
            let rotation = order.iter().enumerate().all(|(i, h)| *h == order[i % k]);
            obs.insert("upstreams".to_string(), join(&hosts));
            obs.insert(
                "upstreams.strict_rotation".to_string(),
                if rotation { "yes" } else { "no" }.to_string(),
            );
        }
    }
    obs.insert("statuses".to_string(), join(&statuses));
    obs
}

fn join(set: &BTreeSet<String>) -> String {
    set.iter().cloned().collect::<Vec<_>>().join(",")
}

/// `single` with key number `n` put where `key` says.
fn keyed(single: &Case, key: &StickyKey, n: usize) -> Case {
    let value = format!("key-{n}");
    match key {
        StickyKey::Header(name) => single.clone().header(name, &value),
        StickyKey::Cookie(name) => single.clone().header("cookie", &format!("{name}={value}")),
        StickyKey::Query(name) => {
            let sep = if single.path.contains('?') { '&' } else { '?' };
            Case {
                path: format!("{}{sep}{name}={value}", single.path),
                ..single.clone()
            }
        }
        StickyKey::SourceIp => Case {
            source: Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + n as u8))),
            ..single.clone()
        },
    }
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
            ("statuses".to_string(), join(&statuses)),
            ("upstreams.counts".to_string(), counts.join(",")),
        ]);
    }
    let upstreams: BTreeSet<String> = upstreams.into_keys().collect();
    Observation::from([
        ("statuses".to_string(), join(&statuses)),
        ("upstreams".to_string(), join(&upstreams)),
    ])
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
    wire: &WireLog,
) -> Result<Observation, String> {
    let stream = connect(port, case.source, case.ipv6).await?;
    let stream = Watched::new(stream, wire.clone());
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
        Kind::Raw(pieces) => raw(stream, pieces).await,
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
                .map_err(|e| hyper_failure(&e))?;
            tokio::spawn(conn);
            Sender::H1(sender)
        }
        Proto::H2 => {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| hyper_failure(&e))?;
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
            sender.ready().await.map_err(|e| hyper_failure(&e))?;
            sender.send_request(request).await
        }
        Sender::H2(sender) => sender.send_request(request).await,
    }
    .map_err(|e| hyper_failure(&e))?;
    let status = response.status().as_u16();
    let headers = header_pairs(response.headers());
    let collected = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{BODY}{}", hyper_failure(&e)))?;
    let trailers = collected.trailers().map(header_pairs).unwrap_or_default();
    let body = collected.to_bytes();
    let exchange = Exchange {
        h2: case.proto == Proto::H2,
        head: case.method == "HEAD",
        grpc: matches!(case.kind, Kind::Grpc(_)),
    };
    let mut obs = response_observation(status, "", &headers, &body, exchange);
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

/// How the response body was delimited: over HTTP/1.1 `transfer-encoding: ...`,
/// `content-length: N`, both joined by ` + `, `close-delimited` (neither, the body runs to the
/// connection's end) or `none` (neither, on a response that has no body); over HTTP/2
/// `content-length: N` or `no content-length`. On an echo, whose length varies with what the
/// upstream saw, `N` is written `<body>` when it is the length of the body received.
fn framing(
    headers: &[(String, String)],
    h2: bool,
    no_body: bool,
    body_len: usize,
    echo: bool,
) -> String {
    let values = |name: &str| -> Vec<&str> {
        headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let mut parts = Vec::new();
    let encodings = values("transfer-encoding");
    if !encodings.is_empty() {
        parts.push(format!("transfer-encoding: {}", encodings.join(", ")));
    }
    match values("content-length").as_slice() {
        [] => {}
        [one] if echo && one.parse() == Ok(body_len) => {
            parts.push("content-length: <body>".to_string());
        }
        lengths => parts.push(format!("content-length: {}", lengths.join(", "))),
    }
    if parts.is_empty() {
        let without = if h2 {
            "no content-length"
        } else if no_body {
            "none"
        } else {
            "close-delimited"
        };
        parts.push(without.to_string());
    }
    parts.join(" + ")
}

/// What the client asked, as far as reading the response depends on it.
#[derive(Clone, Copy, Default)]
struct Exchange {
    /// The response came over HTTP/2.
    h2: bool,
    /// The request was a HEAD (its response has no body, whatever the headers say).
    head: bool,
    /// The body is a gRPC message.
    grpc: bool,
}

/// Observation of an HTTP response: status, headers (minus `date`; `content-length` and
/// `transfer-encoding` are observed as its `framing`), and either the echo's report of what the
/// upstream saw or the literal body of a local reply.
fn response_observation(
    status: u16,
    reason: &str,
    headers: &[(String, String)],
    body: &[u8],
    exchange: Exchange,
) -> Observation {
    let grpc = exchange.grpc;
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
    let no_body = exchange.head || status < 200 || status == 204 || status == 304;
    obs.insert(
        "framing".to_string(),
        framing(headers, exchange.h2, no_body, body.len(), echo.is_some()),
    );
    let listing = std::str::from_utf8(body).ok().and_then(help_listing);
    match (echo, listing) {
        (Some(echo), _) => record_echo(&mut obs, &echo),
        (None, Some((first, entries))) => {
            obs.insert("body".to_string(), first);
            for (path, entry) in entries {
                obs.insert(format!("help.{path}"), entry);
            }
        }
        (None, None) => {
            obs.insert("body".to_string(), body_text(body));
        }
    }
    obs
}

/// The admin's list of endpoints (`/help`, and the answer to an unknown path): its first line,
/// and each endpoint's entry (its line and its parameters' lines) by path, so that the entries
/// of endpoints both proxies serve are compared one by one.
fn help_listing(text: &str) -> Option<(String, Vec<(String, String)>)> {
    let (first, rest) = text.split_once('\n')?;
    if !first.ends_with("admin commands are:") {
        return None;
    }
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in rest.lines() {
        match (line.strip_prefix("      "), entries.last_mut()) {
            (Some(_), Some((_, entry))) => {
                entry.push('\n');
                entry.push_str(line);
            }
            _ => {
                let path = line
                    .trim_start()
                    .split([':', ' '])
                    .next()
                    .unwrap_or_default();
                entries.push((path.to_string(), line.to_string()));
            }
        }
    }
    Some((first.to_string(), entries))
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

async fn ws<S: AsyncRead + AsyncWrite + Unpin>(
    case: &Case,
    mut stream: S,
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
            status,
            &reason,
            &headers,
            &body,
            Exchange::default(),
        ));
    }
    let mut obs = response_observation(status, &reason, &headers, b"", Exchange::default());
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
    // A close and a reset are one here: whether the proxy's close finds the line unread
    // (a reset) is a race in Envoy itself (DIFFERENCES.md).
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

async fn raw<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    pieces: &[Vec<u8>],
) -> Result<Observation, String> {
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(super::case::TRICKLE).await;
        }
        stream.write_all(piece).await.map_err(|e| e.to_string())?;
        stream.flush().await.map_err(|e| e.to_string())?;
    }
    let bytes = &pieces.concat();
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let ending = loop {
        if data.len() >= 1 << 20 || raw_complete(&data) {
            break "given up with the connection open".to_string();
        }
        match timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
            Ok(Ok(0)) => break "closed".to_string(),
            Ok(Ok(n)) => data.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => break io_ending(e.kind()),
            Err(_) => break "timeout".to_string(),
        }
    };
    let (interim, rest) = skip_interim(&data);
    let Some(end) = find(rest, b"\r\n\r\n") else {
        let first = &data[..data.len().min(48)];
        let class = no_response(first, data.len(), &ending, Speaks::H1);
        return Ok(Observation::from([("error".to_string(), class)]));
    };
    let (status, reason, headers) = parse_head(&rest[..end + 4])?;
    let body = &rest[end + 4..];
    let (body, trailers) = if is_chunked(&headers) {
        dechunk(body)
    } else {
        (body.to_vec(), String::new())
    };
    let exchange = Exchange {
        head: request_methods(bytes).first().is_some_and(|m| m == "HEAD"),
        ..Exchange::default()
    };
    let mut obs = response_observation(status, &reason, &headers, &body, exchange);
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
/// a response the proxy made itself), each response's framing, and whether the connection was
/// closed.
async fn conversation<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    bytes: &[u8],
) -> Result<Observation, String> {
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
    let mut framings = Vec::new();
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
            .and_then(|v| v["path"].as_str().map(str::to_owned));
        let no_body = head_request || status < 200 || status == 204 || status == 304;
        framings.push(framing(
            &headers,
            false,
            no_body,
            body.len(),
            path.is_some(),
        ));
        let path = path.unwrap_or_else(|| "-".to_string());
        responses.push(format!("{status} {path}"));
    }
    let mut obs = Observation::from([
        ("responses".to_string(), responses.join(", ")),
        ("framings".to_string(), framings.join(", ")),
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

async fn read_rest<S: AsyncRead + Unpin>(stream: &mut S, headers: &[(String, String)]) -> Vec<u8> {
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
        .ok_or(format!("{UNPARSABLE}bad status line {status_line:?}"))?;
    let reason = parts.next().unwrap_or_default().to_string();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok((status, reason, headers))
}
