//! The pods' applications, run as [`APP_UID`] on threads that entered the pod's network
//! namespace (sockets take the uid of the thread that makes them, which is what iptables'
//! `owner` match reads): an echo server in the manner of Istio's `pkg/test/echo` (HTTP/1.1
//! and h2c on one port, gRPC over h2c, a TCP echo, a server-first TCP port), answering
//! `Key=Value` lines, and clients for each protocol.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::config::{FIRST_PORT, HTTP_PORT, TCP_PORT};
use crate::netns::Netns;

/// The uid and gid the applications run as (not the proxy's 1337).
pub const APP_UID: u32 = 1000;

/// The banner a server-first port sends before reading anything.
pub const BANNER: &str = "server-first hello\n";

/// Runs `f` as [`APP_UID`] in `ns` (on a thread of its own, whose credentials change alone:
/// the raw system calls, not libc's, which would change every thread's).
pub fn as_app<T: Send + 'static>(ns: &Netns, f: impl FnOnce() -> T + Send + 'static) -> T {
    ns.enter(move || {
        set_thread_ids(APP_UID);
        f()
    })
}

/// Sets the calling thread's real, effective and saved uid and gid to `id`.
fn set_thread_ids(id: u32) {
    // SAFETY: plain system calls on this thread's credentials.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
            0
        );
        assert_eq!(libc::syscall(libc::SYS_setresgid, id, id, id), 0);
        assert_eq!(libc::syscall(libc::SYS_setresuid, id, id, id), 0);
    }
}

/// The path prefix of requests the echo holds: `/held/<key>` is answered once [`release`]
/// is called with `<key>` (a test's own key, as tests share the process).
pub const HELD: &str = "/held/";

/// Held requests by key: whether one arrived, and whether they are released.
static HELD_KEYS: Mutex<Option<HashMap<String, (bool, bool)>>> = Mutex::new(None);

/// Runs `f` on the held requests' state of `key`.
fn held<T>(key: &str, f: impl FnOnce(&mut (bool, bool)) -> T) -> T {
    let mut keys = HELD_KEYS.lock().unwrap_or_else(|e| e.into_inner());
    f(keys
        .get_or_insert_with(HashMap::new)
        .entry(key.to_owned())
        .or_default())
}

/// Whether a request for `/held/<key>` reached an echo.
pub fn arrived(key: &str) -> bool {
    held(key, |(arrived, _)| *arrived)
}

/// Lets the echo answer the requests for `/held/<key>`, those held and those to come.
pub fn release(key: &str) {
    held(key, |(_, released)| *released = true);
}

/// Marks a request for `/held/<key>` as arrived and waits until [`release`]d.
async fn hold(key: &str) {
    held(key, |(arrived, _)| *arrived = true);
    while !held(key, |(_, released)| *released) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts the echo application of pod `pod` in `ns`: HTTP (HTTP/1.1 and h2c, gRPC) on
/// `0.0.0.0:<HTTP_PORT>`, a TCP echo on `0.0.0.0:<TCP_PORT>` and a server-first TCP port on
/// `0.0.0.0:<FIRST_PORT>` (the ports of `config`), and on `[::]` too when `ipv6`. It runs
/// until the test process exits (the namespace's deletion ends its sockets).
pub fn serve(ns: &Netns, pod: &'static str, ipv6: bool) {
    for http in bind(ns, HTTP_PORT, ipv6) {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("app runtime");
            rt.block_on(http_server(pod, http));
        });
    }
    serve_tcp(ns, pod, TCP_PORT, ipv6, false);
    serve_tcp(ns, pod, FIRST_PORT, ipv6, true);
}

/// Starts a TCP echo of pod `pod` on `0.0.0.0:<port>` in `ns` (and `[::]:<port>` when
/// `ipv6`), server-first when `server_first`, until the test process exits.
pub fn serve_tcp(ns: &Netns, pod: &'static str, port: u16, ipv6: bool, server_first: bool) {
    for listener in bind(ns, port, ipv6) {
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                std::thread::spawn(move || tcp_echo(pod, conn, server_first));
            }
        });
    }
}

/// The application's listeners on `port` in `ns`: `0.0.0.0`, and `[::]` (IPv6 only, as a
/// dual-stack application's second socket) when `ipv6`.
fn bind(ns: &Netns, port: u16, ipv6: bool) -> Vec<TcpListener> {
    as_app(ns, move || {
        let mut listeners = vec![TcpListener::bind(("0.0.0.0", port)).expect("app binds")];
        if ipv6 {
            let addr = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
            let socket = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None)
                .expect("an IPv6 socket");
            socket.set_only_v6(true).expect("IPV6_V6ONLY");
            socket.set_reuse_address(true).expect("SO_REUSEADDR");
            socket.bind(&addr.into()).expect("app binds [::]");
            socket.listen(128).expect("listen");
            listeners.push(socket.into());
        }
        listeners
    })
}

async fn http_server(pod: &'static str, listener: TcpListener) {
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    loop {
        let Ok((conn, peer)) = listener.accept().await else {
            continue;
        };
        let local = conn.local_addr().ok();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| echo(pod, peer, local, req));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(conn), service)
                .await;
        });
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The echo: `Key=Value` lines naming the pod, what was asked, over what and from where, and
/// the request's `x-forwarded-client-cert`; gRPC requests get them as one framed message with
/// `grpc-status: 0` in the trailers.
async fn echo(
    pod: &'static str,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let grpc = header("content-type").is_some_and(|v| v.starts_with("application/grpc"));
    let host = header("host")
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let text = format!(
        "Hostname={pod}\nProto={:?}\nMethod={}\nHost={host}\nPath={}\nSourceIP={}\nServicePort={}\nXFCC={}\nGrpc={grpc}\n",
        req.version(),
        req.method(),
        req.uri().path(),
        peer.ip(),
        local.map(|l| l.port()).unwrap_or(0),
        header("x-forwarded-client-cert").unwrap_or_default(),
    );
    if let Some(key) = req.uri().path().strip_prefix(HELD) {
        hold(key).await;
    }
    let _ = req.into_body().collect().await;
    if !grpc {
        return Ok(Response::new(Full::new(Bytes::from(text)).boxed()));
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let frames = [
        Ok(Frame::data(grpc_frame(text.as_bytes()))),
        Ok(Frame::trailers(trailers)),
    ];
    let body = StreamBody::new(tokio_stream::iter(frames)).boxed();
    Ok(Response::builder()
        .header("content-type", "application/grpc")
        .body(body)
        .expect("a gRPC response"))
}

/// `message` as one uncompressed gRPC length-prefixed message.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    Bytes::from(framed)
}

/// Echoes what the peer writes, after [`BANNER`] when `server_first`, prefixed by a line
/// naming the pod and the peer's address (`<pod> from <ip>`).
fn tcp_echo(pod: &str, mut conn: TcpStream, server_first: bool) {
    let peer = conn
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    if server_first && conn.write_all(BANNER.as_bytes()).is_err() {
        return;
    }
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let line = format!("{pod} from {peer}: {}", String::from_utf8_lossy(&buf[..n]));
                if conn.write_all(line.as_bytes()).is_err() {
                    return;
                }
            }
        }
    }
}

/// How a client speaks HTTP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.1.
    H1,
    /// HTTP/2 with prior knowledge (h2c).
    H2,
    /// A unary gRPC call (over h2c) to `/echo.Echo/Call`-style paths.
    Grpc,
}

/// One request from an application in `ns` to `addr` with `host` and `path`: the status (the
/// `grpc-status` for gRPC, as `grpc-<n>`) and the body, or what went wrong.
pub fn request(
    ns: &Netns,
    proto: Proto,
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> Result<(String, String), String> {
    let (host, path) = (host.to_owned(), path.to_owned());
    as_app(ns, move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("client runtime")
            .block_on(async move {
                tokio::time::timeout(Duration::from_secs(10), send(proto, addr, &host, &path))
                    .await
                    .map_err(|_| "timed out".to_owned())?
            })
    })
}

async fn send(
    proto: Proto,
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> Result<(String, String), String> {
    let conn = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let io = TokioIo::new(conn);
    let mut req = Request::builder().uri(path);
    req = match proto {
        Proto::H1 => req.header("host", host),
        Proto::H2 => req.uri(format!("http://{host}{path}")),
        Proto::Grpc => req
            .uri(format!("http://{host}{path}"))
            .method("POST")
            .header("content-type", "application/grpc")
            .header("te", "trailers"),
    };
    let body = match proto {
        Proto::Grpc => Full::new(grpc_frame(b"ping")),
        Proto::H1 | Proto::H2 => Full::new(Bytes::new()),
    };
    let req = req.body(body).map_err(|e| e.to_string())?;
    let response = if proto == Proto::H1 {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        sender.send_request(req).await
    } else {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        sender.send_request(req).await
    }
    .map_err(|e| format!("request: {e}"))?;
    let status = response.status().as_u16();
    let collected = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    let trailers = collected.trailers().cloned();
    let body = collected.to_bytes();
    if proto != Proto::Grpc {
        return Ok((
            status.to_string(),
            String::from_utf8_lossy(&body).into_owned(),
        ));
    }
    let grpc_status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_else(|| format!("none (HTTP {status})"));
    let message = body.get(5..).unwrap_or_default();
    Ok((
        format!("grpc-{grpc_status}"),
        String::from_utf8_lossy(message).into_owned(),
    ))
}

/// A TCP exchange from an application in `ns` with `addr`: reads the banner first when
/// `server_first`, writes `message`, reads the answer; what was read, or what went wrong.
pub fn tcp(
    ns: &Netns,
    addr: SocketAddr,
    server_first: bool,
    message: &str,
) -> Result<String, String> {
    let message = message.to_owned();
    as_app(ns, move || {
        let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| format!("connect {addr}: {e}"))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        if server_first {
            let n = conn
                .read(&mut buf)
                .map_err(|e| format!("read banner: {e}"))?;
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        conn.write_all(message.as_bytes())
            .map_err(|e| format!("write: {e}"))?;
        match conn.read(&mut buf) {
            Ok(0) => Err(format!("closed after {seen:?}")),
            Ok(n) => {
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                Ok(seen)
            }
            Err(e) => Err(format!("read: {e} after {seen:?}")),
        }
    })
}

/// One HTTP/1.1 exchange of `request` (whole, with `connection: close`) from an application
/// in `ns`: everything that came back, the head with the body.
pub fn http1_raw(ns: &Netns, addr: SocketAddr, request: &str) -> Result<String, String> {
    let request = request.to_owned();
    as_app(ns, move || {
        let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| format!("connect {addr}: {e}"))?;
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        conn.write_all(request.as_bytes())
            .map_err(|e| format!("write: {e}"))?;
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer)
            .map_err(|e| format!("read: {e}"))?;
        Ok(String::from_utf8_lossy(&answer).into_owned())
    })
}

/// The value of `key` in an echo answer's `Key=Value` lines.
pub fn field<'a>(answer: &'a str, key: &str) -> Option<&'a str> {
    answer
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}
