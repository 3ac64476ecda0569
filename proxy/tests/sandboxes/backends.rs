//! The sandboxes' services, on loopback: the backend every sandbox routes to (it records what
//! reached it) and the ext_authz sandbox's HTTP authorization service.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a service saw, one line per request.
pub type Log = Arc<Mutex<Vec<String>>>;

/// The body `/file.json` and `/file.txt` answer: JSON-like text, deterministic.
pub fn file_body() -> Vec<u8> {
    let mut out = String::from("[");
    for i in 0..200 {
        out.push_str(&format!("{{\"id\":{i},\"name\":\"item {i}\"}},"));
    }
    out.push(']');
    out.into_bytes()
}

/// A running service: its port and what it saw.
pub struct Service {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// What it saw.
    pub log: Log,
}

impl Service {
    /// What it saw since the last call, emptied.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// One request as read: method, path, headers (lower-cased names) and body.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    /// The value of `name`, if sent.
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The request as a log line: method, path, the headers sorted (`x-request-id`, random,
    /// left out), the body's size and, when gzip-encoded, its decoded size.
    fn line(&self) -> String {
        let mut headers: Vec<String> = self
            .headers
            .iter()
            .filter(|(n, _)| n != "x-request-id")
            .map(|(n, v)| format!("{n}: {v}"))
            .collect();
        headers.sort();
        let decoded = match self.header("content-encoding") {
            Some("gzip") => format!(", gunzipped {:?}", gunzipped_len(&self.body)),
            _ => String::new(),
        };
        format!(
            "{} {} [{}] body {} bytes{decoded}",
            self.method,
            self.path,
            headers.join("; "),
            self.body.len()
        )
    }
}

/// The length of `data` gunzipped (`None` when it does not decode).
fn gunzipped_len(data: &[u8]) -> Option<usize> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(data)
        .read_to_end(&mut out)
        .ok()?;
    Some(out.len())
}

/// Reads one request from `r`; `None` at the end of the connection.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let path = parts.next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':')?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let mut req = Request {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    if req.header("transfer-encoding") == Some("chunked") {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            r.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            req.body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(n) = req.header("content-length").and_then(|v| v.parse().ok()) {
        req.body = vec![0; n];
        r.read_exact(&mut req.body).ok()?;
    }
    Some(req)
}

/// Serves each connection to a new listener on its own thread with `answer`, logging every
/// request.
fn serve(answer: fn(&Request) -> Vec<u8>) -> Service {
    let listener = TcpListener::bind("127.0.0.1:0").expect("service binds");
    let port = listener.local_addr().unwrap().port();
    let log = Log::default();
    let seen = log.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let seen = seen.clone();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(10))).ok();
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                while let Some(req) = read_request(&mut r) {
                    seen.lock().unwrap().push(req.line());
                    if w.write_all(&answer(&req)).is_err() {
                        break;
                    }
                }
            });
        }
    });
    Service { port, log }
}

/// A response with `status`, `headers` (each ending with CRLF) and `body`.
fn response(status: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// The backend, as the sandboxes' services answer: `/file.json` and `/file.txt` the file body
/// as JSON and as text (the gzip and brotli sandboxes' service), `/upload` the sizes of what it
/// got (`transferred-size`, and `decompressed-size` when it was gzip), anything else
/// `Success` (the csrf sandbox's service; a 200 for the others).
pub fn backend() -> Service {
    serve(|req| {
        let path = req.path.split('?').next().unwrap_or_default();
        match path {
            "/file.json" => response("200 OK", "content-type: application/json\r\n", &file_body()),
            "/file.txt" => response("200 OK", "content-type: text/plain\r\n", &file_body()),
            "/upload" => {
                let decoded = match req.header("content-encoding") {
                    Some("gzip") => gunzipped_len(&req.body)
                        .map_or(String::new(), |n| format!("decompressed-size: {n}\r\n")),
                    _ => String::new(),
                };
                let headers = format!("transferred-size: {}\r\n{decoded}", req.body.len());
                response("200 OK", &headers, b"OK")
            }
            _ => response("200 OK", "content-type: text/plain\r\n", b"Success"),
        }
    })
}

/// The ext_authz sandbox's HTTP authorization service (`auth/http-service/server.js`): a
/// `Bearer` token it knows is allowed with `x-current-user` naming its user; anything else
/// is 403.
pub fn authz() -> Service {
    serve(|req| {
        let user = match req.header("authorization") {
            Some("Bearer token1") => Some("user1"),
            Some("Bearer token2") => Some("user2"),
            _ => None,
        };
        match user {
            Some(user) => response("200 OK", &format!("x-current-user: {user}\r\n"), b""),
            None => response("403 Forbidden", "", b""),
        }
    })
}

/// The ext_authz sandbox's gRPC authorization service (`auth/grpc-service`, its v3 server):
/// a `Bearer` token it knows is OK with the request header `x-current-user` set to its user;
/// anything else is PERMISSION_DENIED with no HTTP response of its own. It logs each check's
/// method, path, host and headers (the request id left out).
pub fn grpc_authz() -> Service {
    let listener = TcpListener::bind("127.0.0.1:0").expect("service binds");
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let log = Log::default();
    let seen = log.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let _ = tonic::transport::Server::builder()
                .add_service(grpc::AuthorizationServer::new(grpc::Users(seen)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
    });
    Service { port, log }
}

/// The gRPC authorization service's implementation.
mod grpc {
    use proto::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
    pub use proto::pb::envoy::service::auth::v3::authorization_server::{
        Authorization, AuthorizationServer,
    };
    use proto::pb::envoy::service::auth::v3::{
        CheckRequest, CheckResponse, OkHttpResponse, check_response,
    };
    use proto::pb::google::rpc::Status;

    /// The service, logging to its log.
    pub struct Users(pub super::Log);

    // The sandbox's service sets the deprecated `append: false`, as here.
    #[allow(deprecated)]
    #[tonic::async_trait]
    impl Authorization for Users {
        async fn check(
            &self,
            req: tonic::Request<CheckRequest>,
        ) -> Result<tonic::Response<CheckResponse>, tonic::Status> {
            let http = req
                .into_inner()
                .attributes
                .and_then(|a| a.request)
                .and_then(|r| r.http)
                .unwrap_or_default();
            let mut headers: Vec<String> = http
                .headers
                .iter()
                .filter(|(n, _)| n.as_str() != "x-request-id")
                .map(|(n, v)| format!("{n}: {v}"))
                .collect();
            headers.sort();
            self.0.lock().unwrap().push(format!(
                "check {} {} {} [{}]",
                http.method,
                http.path,
                http.host,
                headers.join("; ")
            ));
            let user = match http.headers.get("authorization").map(String::as_str) {
                Some("Bearer token1") => Some("user1"),
                Some("Bearer token2") => Some("user2"),
                _ => None,
            };
            let resp = match user {
                Some(user) => CheckResponse {
                    status: Some(Status::default()),
                    http_response: Some(check_response::HttpResponse::OkResponse(OkHttpResponse {
                        headers: vec![HeaderValueOption {
                            header: Some(HeaderValue {
                                key: "x-current-user".into(),
                                value: user.into(),
                                ..Default::default()
                            }),
                            append: Some(proto::pb::google::protobuf::BoolValue { value: false }),
                            ..Default::default()
                        }],
                        ..Default::default()
                    })),
                    ..Default::default()
                },
                None => CheckResponse {
                    status: Some(Status {
                        code: 7,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            };
            Ok(tonic::Response::new(resp))
        }
    }
}
