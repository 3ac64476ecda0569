//! In-test upstream servers on loopback: an HTTP echo (HTTP/1.1 and h2c, gRPC unary, WebSocket)
//! a TCP echo and a TLS echo. Each says which upstream answered.
//!
//! The HTTP echo answers a JSON document `{upstream, peer, method, path, host, version, headers,
//! body, trailers, conn_seq}` describing the request it received (`trailers` only when the
//! request had some) (`peer` is the proxy's source IP,
//! `conn_seq` how many requests this upstream connection has carried, this one included). Request headers steer it:
//! `x-echo-status: N` answers status N, `x-echo-delay-ms: N` waits first (at most 10 s),
//! `x-echo-response-header: name=value` (repeatable) adds a response header (a
//! `content-length` one answers without a body, for 304 and HEAD answers),
//! `x-echo-trailer: name=value` (repeatable) sends the body with these trailers (announced in
//! a `trailer` header),
//! `x-echo-big-response-header: N` adds an N-byte `x-big` response header,
//! `x-echo-abort: 1` drops the connection without answering,
//! `x-echo-early: 1` answers at once, without reading the request body (the echo's body is "").
//! A `content-type: application/grpc*` request gets the same JSON as one gRPC message, with the
//! decoded request message as `body`, and `grpc-status: 0` trailers.
//! A WebSocket upgrade gets a 101, then a text frame with the JSON, then every frame echoed.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::websocket;

/// Running upstream servers; aborted when dropped.
#[derive(Default)]
pub struct Upstreams {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Upstreams {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl Upstreams {
    /// Starts an HTTP echo that identifies itself as `id`; returns its port.
    pub async fn http_echo(&mut self, id: &str) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind http echo");
        let port = listener.local_addr().expect("local addr").port();
        let id: Arc<str> = id.into();
        self.tasks.push(tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = listener.accept().await else {
                    continue;
                };
                let id = id.clone();
                tokio::spawn(async move {
                    let served = Arc::new(AtomicU64::new(0));
                    let service = service_fn(move |req| {
                        let seq = served.fetch_add(1, Ordering::Relaxed) + 1;
                        handle(id.clone(), peer.ip(), seq, req)
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
        }));
        port
    }

    /// Starts a TCP echo: each line `L` is answered `id:L`; returns its port.
    pub async fn tcp_echo(&mut self, id: &str) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind tcp echo");
        let port = listener.local_addr().expect("local addr").port();
        let id = id.to_string();
        self.tasks.push(tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let id = id.clone();
                tokio::spawn(async move {
                    let (read, write) = stream.into_split();
                    echo_lines(read, write, &id).await;
                });
            }
        }));
        port
    }
}

impl Upstreams {
    /// Starts a TLS echo (the test certificate from `certs/`): after the handshake, each line `L`
    /// is answered `id:L`; returns its port.
    pub async fn tls_echo(&mut self, id: &str) -> u16 {
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_tls_config()));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind tls echo");
        let port = listener.local_addr().expect("local addr").port();
        let id = id.to_string();
        self.tasks.push(tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (id, acceptor) = (id.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let (read, write) = tokio::io::split(tls);
                    echo_lines(read, write, &id).await;
                });
            }
        }));
        port
    }
}

/// The rustls server config serving `certs/server.pem` with `certs/server.key`.
fn server_tls_config() -> rustls::ServerConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/differential/certs");
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .expect("read server.pem")
        .collect::<Result<_, _>>()
        .expect("parse server.pem");
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("read server.key");
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("tls versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server certificate")
}

type EchoBody = BoxBody<Bytes, Infallible>;

/// How many delayed answers (`x-echo-delay-ms`) the echoes have started waiting for.
static DELAYS_STARTED: AtomicU64 = AtomicU64::new(0);

/// How many delayed answers have begun: a client waits for this to grow to know that a request
/// it sent is being held at the upstream.
pub fn delays_started() -> u64 {
    DELAYS_STARTED.load(Ordering::Relaxed)
}

async fn handle(
    id: Arc<str>,
    peer: std::net::IpAddr,
    conn_seq: u64,
    mut req: Request<Incoming>,
) -> Result<Response<EchoBody>, std::io::Error> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let status: u16 = header("x-echo-status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let big_header: Option<usize> =
        header("x-echo-big-response-header").and_then(|s| s.parse().ok());
    let delay: u64 = header("x-echo-delay-ms")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let is_grpc = header("content-type").is_some_and(|ct| ct.starts_with("application/grpc"));
    // An upgrade asking for a status (`x-echo-status`) is refused with it, as a plain answer.
    let ws_key = header("sec-websocket-key")
        .filter(|_| header("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket")))
        .filter(|_| header("x-echo-status").is_none());
    let pairs = |name: &str| -> Vec<(String, String)> {
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok()?.split_once('='))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect()
    };
    let extra = pairs("x-echo-response-header");
    let trailer_fields = pairs("x-echo-trailer");
    let mut echo = json!({
        "upstream": &*id,
        "peer": peer.to_string(),
        "conn_seq": conn_seq,
        "method": req.method().as_str(),
        "path": req.uri().path_and_query().map_or("", |p| p.as_str()),
        "host": header("host").or_else(|| req.uri().authority().map(|a| a.to_string())),
        "version": format!("{:?}", req.version()),
        "headers": req.headers().iter()
            .map(|(n, v)| json!([n.as_str(), String::from_utf8_lossy(v.as_bytes())]))
            .collect::<Vec<_>>(),
    });

    if let Some(key) = ws_key {
        echo["body"] = json!("");
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                ws_echo(TokioIo::new(upgraded), echo).await;
            }
        });
        let response = Response::builder()
            .status(101)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-accept", websocket::accept_key(&key))
            .body(Full::new(Bytes::new()).boxed())
            .expect("101 response");
        return Ok(response);
    }

    if header("x-echo-abort").is_some() {
        return Err(std::io::Error::other(
            "x-echo-abort: dropping the connection",
        ));
    }
    if header("x-echo-early").is_some() {
        echo["body"] = json!("");
        return Ok(Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(echo.to_string())).boxed())
            .expect("early response"));
    }
    let collected = req.into_body().collect().await.ok();
    if let Some(trailers) = collected.as_ref().and_then(|c| c.trailers()) {
        echo["trailers"] = trailers
            .iter()
            .map(|(n, v)| json!([n.as_str(), String::from_utf8_lossy(v.as_bytes())]))
            .collect();
    }
    let body = collected.map(|c| c.to_bytes()).unwrap_or_default();
    if delay > 0 {
        DELAYS_STARTED.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(delay.min(10_000))).await;
    }
    let mut builder = Response::builder().status(status);
    for (name, value) in &extra {
        builder = builder.header(name, value);
    }
    if let Some(size) = big_header {
        builder = builder.header("x-big", "b".repeat(size.min(1 << 20)));
    }
    if is_grpc {
        let message = body.get(5..).unwrap_or_default();
        echo["body"] = json!(String::from_utf8_lossy(message));
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
            Ok(Frame::data(grpc_frame(echo.to_string().as_bytes()))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = StreamBody::new(tokio_stream::iter(frames)).boxed();
        return Ok(builder
            .header("content-type", "application/grpc")
            .body(body)
            .expect("grpc response"));
    }
    echo["body"] = json!(String::from_utf8_lossy(&body));
    if !trailer_fields.is_empty() {
        let mut trailers = http::HeaderMap::new();
        for (name, value) in &trailer_fields {
            if let (Ok(n), Ok(v)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(value),
            ) {
                trailers.append(n, v);
            }
        }
        let names: Vec<&str> = trailer_fields.iter().map(|(n, _)| n.as_str()).collect();
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
            Ok(Frame::data(Bytes::from(echo.to_string()))),
            Ok(Frame::trailers(trailers)),
        ];
        return Ok(builder
            .header("content-type", "application/json")
            .header("trailer", names.join(", "))
            .body(StreamBody::new(tokio_stream::iter(frames)).boxed())
            .expect("echo response with trailers"));
    }
    if extra
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("content-length"))
    {
        // The test's own content-length stands only over a body of unknown length (hyper
        // checks a known one against it): for 304 and HEAD answers, which have none.
        let nothing = tokio_stream::iter(Vec::<Result<Frame<Bytes>, Infallible>>::new());
        return Ok(builder
            .body(StreamBody::new(nothing).boxed())
            .expect("echo response without body"));
    }
    let body = Full::new(Bytes::from(echo.to_string())).boxed();
    Ok(builder
        .header("content-type", "application/json")
        .body(body)
        .expect("echo response"))
}

/// One length-prefixed, uncompressed gRPC message.
pub fn grpc_frame(message: &[u8]) -> Bytes {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

async fn ws_echo<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut io: S, echo: Value) {
    if websocket::write_frame(&mut io, websocket::TEXT, echo.to_string().as_bytes(), None)
        .await
        .is_err()
    {
        return;
    }
    for _ in 0..64 {
        let Ok((opcode, payload)) = websocket::read_frame(&mut io).await else {
            return;
        };
        if websocket::write_frame(&mut io, opcode, &payload, None)
            .await
            .is_err()
            || opcode == websocket::CLOSE
        {
            return;
        }
    }
}

/// Answers each line `L` read from `read` with `id:L` (at most 64 lines).
async fn echo_lines<R, W>(read: R, mut write: W, id: &str)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut lines = BufReader::new(read).lines();
    for _ in 0..64 {
        let Ok(Some(line)) = lines.next_line().await else {
            return;
        };
        if write
            .write_all(format!("{id}:{line}\n").as_bytes())
            .await
            .is_err()
        {
            return;
        }
    }
}
