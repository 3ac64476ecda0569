//! The servers a tracing test talks to, all on loopback: a fake OTLP/gRPC collector, a fake
//! Zipkin HTTP collector, and an upstream that answers 200 and records the headers it saw.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use revoy::trace::otlp::ExportTraceServiceRequest;

/// What a fake server received, shared with the test.
pub type Log<T> = Arc<Mutex<Vec<T>>>;

async fn bind() -> (tokio::net::TcpListener, SocketAddr) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// A fake OTLP collector speaking gRPC over HTTP/2: every Export call is decoded, logged
/// and answered OK.
pub async fn otlp_collector() -> (SocketAddr, Log<ExportTraceServiceRequest>) {
    let (listener, addr) = bind().await;
    let log: Log<ExportTraceServiceRequest> = Arc::default();
    let kept = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let log = kept.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let mut body = req.into_body().collect().await.unwrap().to_bytes();
                        assert_eq!(path, revoy::trace::otlp::EXPORT_PATH);
                        assert_eq!(body.get_u8(), 0, "uncompressed gRPC message");
                        let len = body.get_u32() as usize;
                        let msg = ExportTraceServiceRequest::decode(&body[..len]).unwrap();
                        log.lock().unwrap().push(msg);
                        let mut trailers = HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        let frames = vec![
                            Ok::<_, Infallible>(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
                            Ok(Frame::trailers(trailers)),
                        ];
                        let resp = Response::builder()
                            .header("content-type", "application/grpc")
                            .body(StreamBody::new(tokio_stream::iter(frames)))
                            .unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, log)
}

/// One request a fake HTTP server got: path, headers and body.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The request path.
    pub path: String,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// An HTTP/1.1 and h2c server that logs every request and answers `status` with body "ok"
/// (the upstream, or a Zipkin collector).
pub async fn http_server(status: u16) -> (SocketAddr, Log<Seen>) {
    let (listener, addr) = bind().await;
    let log: Log<Seen> = Arc::default();
    let kept = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let log = kept.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let headers = req.headers().clone();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        log.lock().unwrap().push(Seen {
                            path,
                            headers,
                            body,
                        });
                        let resp = Response::builder()
                            .status(status)
                            .body(Full::new(Bytes::from_static(b"ok")))
                            .unwrap();
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, log)
}
