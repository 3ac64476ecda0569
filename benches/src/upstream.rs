//! The fast upstream every contender forwards to: a hyper server (HTTP/1.1 and h2c, and
//! HTTP/1.1 over TLS on a listener of its own) on its own single-threaded runtime, and a TCP
//! source that streams a requested number of bytes.

use std::convert::Infallible;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener, TcpStream};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio_rustls::TlsAcceptor;

use crate::tls::Pki;

/// The body of every small response.
pub const SMALL_BODY: &[u8] = b"hello from the benchmark upstream\n";
/// Path answered with a 64 KiB body.
pub const LARGE_PATH: &str = "/64k";
/// Size of the large body.
pub const LARGE_LEN: usize = 64 * 1024;
/// Path answered with a 64 KiB JSON body (`application/json`, compressible like real JSON).
pub const JSON_PATH: &str = "/64k.json";
/// Paths starting with this prefix get a gRPC unary reply (framed message + `grpc-status: 0`).
pub const GRPC_PREFIX: &str = "/grpc";
/// The protobuf payload carried in each gRPC frame (request and reply).
pub const GRPC_PAYLOAD: &[u8] = b"0123456789abcdef";

/// Addresses of a running upstream.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// HTTP listeners (127.0.0.1, 127.0.0.2, 127.0.0.3): the three endpoints of a mesh cluster.
    pub http: Vec<SocketAddr>,
    /// The TCP source: reads a big-endian u64 byte count, writes that many bytes, closes.
    pub tcp: SocketAddr,
    /// HTTP/1.1 over TLS 1.3 (127.0.0.1), serving [`Pki::upstream`]'s certificate; the same
    /// responses as `http`.
    pub https: SocketAddr,
    /// The certificates of the TLS scenarios, made when the upstream started.
    pub pki: Arc<Pki>,
}

/// A gRPC message frame around `payload` (uncompressed, 4-byte big-endian length).
pub fn grpc_frame(payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Starts the upstream servers on background threads that live as long as the process.
pub fn start() -> io::Result<Upstream> {
    let mut listeners = Vec::new();
    for last in 1..=3u8 {
        let listener = StdListener::bind((Ipv4Addr::new(127, 0, 0, last), 0))?;
        listener.set_nonblocking(true)?;
        listeners.push(listener);
    }
    let http = listeners
        .iter()
        .map(StdListener::local_addr)
        .collect::<io::Result<Vec<_>>>()?;
    let pki = Arc::new(Pki::generate().map_err(io::Error::other)?);
    let tls = TlsAcceptor::from(pki.upstream_server().map_err(io::Error::other)?);
    let https_listener = StdListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    https_listener.set_nonblocking(true)?;
    let https = https_listener.local_addr()?;
    thread::Builder::new()
        .name("upstream-http".into())
        .spawn(move || serve_http(listeners, (https_listener, tls)))?;
    let tcp_listener = StdListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let tcp = tcp_listener.local_addr()?;
    thread::Builder::new()
        .name("upstream-tcp".into())
        .spawn(move || serve_tcp(tcp_listener))?;
    Ok(Upstream {
        http,
        tcp,
        https,
        pki,
    })
}

fn serve_http(listeners: Vec<StdListener>, (https, tls): (StdListener, TlsAcceptor)) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("upstream runtime");
    runtime.block_on(async move {
        let large = Bytes::from(vec![b'x'; LARGE_LEN]);
        let mut tasks = Vec::new();
        for listener in listeners {
            let listener = tokio::net::TcpListener::from_std(listener).expect("upstream listener");
            let large = large.clone();
            tasks.push(tokio::spawn(accept_loop(listener, large)));
        }
        let https = tokio::net::TcpListener::from_std(https).expect("upstream TLS listener");
        tasks.push(tokio::spawn(accept_tls_loop(https, tls, large)));
        for task in tasks {
            let _ = task.await;
        }
    });
}

async fn accept_loop(listener: tokio::net::TcpListener, large: Bytes) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let large = large.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| respond(req, large.clone()));
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http2().max_concurrent_streams(1024);
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn accept_tls_loop(listener: tokio::net::TcpListener, tls: TlsAcceptor, large: Bytes) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (tls, large) = (tls.clone(), large.clone());
        tokio::spawn(async move {
            let Ok(stream) = tls.accept(stream).await else {
                return;
            };
            let service = service_fn(move |req| respond(req, large.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn respond(req: Request<Incoming>, large: Bytes) -> Result<Response<Reply>, Infallible> {
    let path = req.uri().path().to_owned();
    // Read the whole request body so that neither protocol sees an early reset.
    let _ = req.into_body().collect().await;
    let response = if path.starts_with(GRPC_PREFIX) {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        Response::builder()
            .header("content-type", "application/grpc")
            .body(Reply {
                data: Some(Bytes::from(grpc_frame(GRPC_PAYLOAD))),
                trailers: Some(trailers),
            })
    } else if path == JSON_PATH {
        Response::builder()
            .header("content-type", "application/json")
            .body(Reply::data(json_body()))
    } else if path == LARGE_PATH {
        Response::builder()
            .header("content-type", "application/octet-stream")
            .body(Reply::data(large))
    } else {
        Response::builder()
            .header("content-type", "text/plain")
            .body(Reply::data(Bytes::from_static(SMALL_BODY)))
    };
    Ok(response.expect("static response parts are valid"))
}

/// The body of [`JSON_PATH`]: [`LARGE_LEN`] bytes of JSON objects, made once.
pub fn json_body() -> Bytes {
    static BODY: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    BODY.get_or_init(|| {
        let mut out = Vec::with_capacity(LARGE_LEN + 128);
        let mut i = 0u64;
        while out.len() < LARGE_LEN {
            let item = format!(
                "{{\"id\":{i},\"name\":\"user-{}\",\"score\":{},\"tags\":[\"a{}\",\"b{}\"]}},",
                i * 7919 % 10007,
                i * 31 % 997,
                i % 13,
                i % 29
            );
            out.extend_from_slice(item.as_bytes());
            i += 1;
        }
        out.truncate(LARGE_LEN);
        Bytes::from(out)
    })
    .clone()
}

/// A response body: one data frame, then optional trailers.
struct Reply {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Reply {
    fn data(data: Bytes) -> Self {
        Reply {
            data: Some(data),
            trailers: None,
        }
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

fn serve_tcp(listener: StdListener) {
    for stream in listener.incoming().flatten() {
        let _ = thread::Builder::new()
            .name("upstream-tcp-conn".into())
            .spawn(move || stream_bytes(stream));
    }
}

fn stream_bytes(mut stream: TcpStream) -> io::Result<()> {
    let mut len = [0u8; 8];
    stream.read_exact(&mut len)?;
    let mut remaining = u64::from_be_bytes(len);
    let chunk = vec![0u8; 256 * 1024];
    while remaining > 0 {
        let n = remaining.min(chunk.len() as u64) as usize;
        stream.write_all(&chunk[..n])?;
        remaining -= n as u64;
    }
    stream.shutdown(std::net::Shutdown::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_frame_has_length_prefix() {
        assert_eq!(grpc_frame(b"ab"), vec![0, 0, 0, 0, 2, b'a', b'b']);
    }

    #[test]
    fn tcp_source_streams_the_requested_count() {
        let upstream = start().unwrap();
        let mut stream = TcpStream::connect(upstream.tcp).unwrap();
        stream.write_all(&300_000u64.to_be_bytes()).unwrap();
        let mut got = Vec::new();
        stream.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 300_000);
    }

    #[test]
    fn tls_listener_serves_full_handshakes_and_the_client_counts_resumed_ones() {
        use crate::clients::{tls_get, tls_idle_connections, tls_new_connections};
        let upstream = start().unwrap();
        let port = upstream.https.port();
        let client = upstream.pki.client(crate::tls::UPSTREAM_NAME).unwrap();
        assert_eq!(tls_get(port, &client, "/", true).unwrap().1, 200);
        let (idle, not_ok) = tls_idle_connections(port, &client, "/", 3).unwrap();
        assert_eq!((idle.len(), not_ok), (3, 0));
        let run = tls_new_connections(port, &client, "/", 2, 1).unwrap();
        assert!(run.throughput.count > 0, "{run:?}");
        assert_eq!((run.throughput.errors, run.resumed), (0, 0), "{run:?}");
        assert!(run.negotiated.unwrap().contains("TLS13"));
        // The same client keeping the server's tickets resumes, and is counted.
        let mut resuming = client.clone();
        let mut config = (*client.config).clone();
        config.resumption = rustls::client::Resumption::in_memory_sessions(16);
        resuming.config = Arc::new(config);
        let run = tls_new_connections(port, &resuming, "/", 1, 1).unwrap();
        assert!(run.resumed > 0, "{run:?}");
        // A client expecting another name fails its handshakes.
        let wrong = upstream.pki.client(crate::tls::PROXY_NAME).unwrap();
        assert!(tls_get(port, &wrong, "/", true).is_err());
    }

    #[test]
    fn http_paths() {
        let upstream = start().unwrap();
        for (path, expect) in [
            ("/", SMALL_BODY.len()),
            (LARGE_PATH, LARGE_LEN),
            (JSON_PATH, LARGE_LEN),
        ] {
            let mut stream = TcpStream::connect(upstream.http[1]).unwrap();
            write!(
                stream,
                "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
            )
            .unwrap();
            let mut got = Vec::new();
            stream.read_to_end(&mut got).unwrap();
            let text = String::from_utf8_lossy(&got);
            assert!(text.starts_with("HTTP/1.1 200"), "{text}");
            assert!(
                text.contains(&format!("content-length: {expect}")),
                "{text}"
            );
        }
    }
}
