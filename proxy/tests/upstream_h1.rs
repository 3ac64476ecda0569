//! revoy's HTTP/1.1 upstream client driven through `Cluster::request` against scripted raw-TCP
//! upstreams on loopback: what goes on the wire, how responses are delimited, when connections
//! are reused, and how failures surface.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use revoy::body::Body;
use revoy::config::cluster::compile_cluster;
use revoy::stats::Store;
use revoy::upstream::{
    Cluster, ClusterManager, LbContext, ResetReason, UpstreamBody, UpstreamError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// How long any single step may take before the test fails instead of hanging.
const LIMIT: Duration = Duration::from_secs(5);

/// A keep-alive response with a two-byte body.
const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// Awaits `fut`, failing the test if it takes longer than [`LIMIT`].
async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(LIMIT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no progress within {LIMIT:?}"))
}

/// A pause short enough to keep tests fast, long enough for loopback bytes to land.
async fn pause() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// A scripted upstream: every accepted connection runs the script with its own [`Peer`].
struct Upstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    seen: mpsc::UnboundedReceiver<String>,
}

impl Upstream {
    async fn start<F, Fut>(script: F) -> Self
    where
        F: Fn(Peer) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (seen_tx, seen) = mpsc::unbounded_channel();
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let index = count.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::spawn(script(Peer {
                    stream,
                    buf: Vec::new(),
                    index,
                    seen: seen_tx.clone(),
                }));
            }
        });
        Upstream {
            addr,
            accepted,
            seen,
        }
    }

    /// How many TCP connections the upstream accepted so far.
    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The next complete request the upstream read, exactly as it was on the wire.
    async fn next_request(&mut self) -> String {
        within("request seen upstream", self.seen.recv())
            .await
            .expect("upstream stopped")
    }
}

/// The upstream's side of one connection.
struct Peer {
    stream: TcpStream,
    buf: Vec<u8>,
    /// 1 for the first connection accepted, 2 for the second, ...
    index: usize,
    seen: mpsc::UnboundedSender<String>,
}

impl Peer {
    /// Reads more bytes; `false` once the client closed the connection.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    async fn take(&mut self, n: usize) -> Option<String> {
        while self.buf.len() < n {
            if !self.fill().await {
                return None;
            }
        }
        Some(String::from_utf8(self.buf.drain(..n).collect()).unwrap())
    }

    async fn take_through(&mut self, delim: &str) -> Option<String> {
        loop {
            if let Some(at) = self
                .buf
                .windows(delim.len())
                .position(|w| w == delim.as_bytes())
            {
                return self.take(at + delim.len()).await;
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// Reads one request head; `None` when the client closed first.
    async fn head(&mut self) -> Option<String> {
        self.take_through("\r\n\r\n").await
    }

    /// Reads one whole request (head, then the body by its framing), reports it and returns it.
    async fn request(&mut self) -> Option<String> {
        let mut raw = self.head().await?;
        if let Some(n) = header(&raw, "content-length") {
            let n = n.parse().unwrap();
            raw += &self.take(n).await?;
        } else if header(&raw, "transfer-encoding").is_some_and(|v| v.ends_with("chunked")) {
            loop {
                let line = self.take_through("\r\n").await?;
                raw += &line;
                let size = line.trim_end().split(';').next().unwrap();
                let size = usize::from_str_radix(size, 16).unwrap();
                if size == 0 {
                    loop {
                        let trailer = self.take_through("\r\n").await?;
                        raw += &trailer;
                        if trailer == "\r\n" {
                            break;
                        }
                    }
                    break;
                }
                raw += &self.take(size + 2).await?;
            }
        }
        let _ = self.seen.send(raw.clone());
        Some(raw)
    }

    async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        let _ = self.stream.write_all(bytes.as_ref()).await;
    }

    /// Answers every request with `response` until the client closes the connection.
    async fn serve(&mut self, response: &str) {
        while self.request().await.is_some() {
            self.send(response).await;
        }
    }

    /// Reads and discards until the client closes the connection.
    async fn until_closed(&mut self) {
        while self.fill().await {
            self.buf.clear();
        }
    }
}

/// The value of header `name` in a raw request head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n")
        .skip(1)
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_once(':'))
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// A cluster of one static host: the upstream at `addr`.
struct Client {
    _manager: ClusterManager,
    cluster: Arc<Cluster>,
    store: Store,
}

impl Client {
    fn new(addr: SocketAddr) -> Self {
        Self::with(addr, "")
    }

    /// A client whose cluster config also has the YAML lines in `extra`.
    fn with(addr: SocketAddr, extra: &str) -> Self {
        let yaml = format!(
            "name: up\n{extra}\nload_assignment:\n  endpoints:\n  - lb_endpoints:\n    - endpoint: {{address: {{socket_address: {{address: \"{}\", port_value: {}}}}}}}\n",
            addr.ip(),
            addr.port()
        );
        let value = proto::Codec::parse_text(&yaml, proto::Format::Yaml).unwrap();
        let config = proto::Codec::new().decode(value, false).unwrap().message;
        let store = Store::new();
        let manager = ClusterManager::new(store.clone(), Default::default());
        manager.update(vec![
            compile_cluster(
                &revoy::config::Context::new(&revoy::config::SystemIo),
                &config,
                revoy::config::cluster::SourceAddresses::NONE,
            )
            .unwrap(),
        ]);
        let cluster = manager.get("up").unwrap();
        Client {
            _manager: manager,
            cluster,
            store,
        }
    }

    async fn send(&self, req: Request<Body>) -> Result<Response<UpstreamBody>, UpstreamError> {
        within(
            "response head",
            self.cluster.request(req, &LbContext::default()),
        )
        .await
    }

    /// Sends `req` and returns the response's status and body text.
    async fn exchange(&self, req: Request<Body>) -> (StatusCode, String) {
        let resp = self.send(req).await.unwrap();
        (resp.status(), text(resp).await)
    }

    /// Idle HTTP/1.1 connections in the host's pool.
    fn idle(&self) -> usize {
        self.cluster.host_set().hosts()[0].idle_http1_connections()
    }
}

/// The connection was kept: another GET answers `ok` and the upstream saw one connection.
async fn next_request_reuses_the_connection(client: &Client, up: &Upstream) {
    assert_eq!(
        client.exchange(get("/")).await,
        (StatusCode::OK, "ok".into())
    );
    assert_eq!(up.accepted(), 1);
}

fn get(path: &str) -> Request<Body> {
    Request::get(path)
        .header("host", "svc")
        .body(revoy::body::empty())
        .unwrap()
}

async fn text(resp: Response<UpstreamBody>) -> String {
    let body = within("response body", resp.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// Every frame of a response body, up to and including the first error.
async fn frames(resp: Response<UpstreamBody>) -> Vec<Result<Frame<Bytes>, String>> {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = within("body frame", body.frame()).await {
        let failed = frame.is_err();
        out.push(frame.map_err(|e| e.to_string()));
        if failed {
            break;
        }
    }
    out
}

type FrameTx = mpsc::Sender<Result<Frame<Bytes>, Infallible>>;

/// A request body of unknown size fed frame by frame through the returned sender.
fn channel_body() -> (FrameTx, Body) {
    let (tx, rx) = mpsc::channel(16);
    (
        tx,
        revoy::body::boxed(StreamBody::new(ReceiverStream::new(rx))),
    )
}

fn data(s: &'static str) -> Result<Frame<Bytes>, Infallible> {
    Ok(Frame::data(Bytes::from_static(s.as_bytes())))
}

/// A broken request body is the downstream's fault: Envoy's codec answers it 400.
fn assert_request_body_error(err: &UpstreamError) {
    assert!(matches!(err, UpstreamError::RequestBody { .. }), "{err:?}");
    assert_eq!(err.local_reply_status(), StatusCode::BAD_REQUEST);
    assert_eq!(err.local_reply_body(), "Bad Request");
}

fn reset_reason(err: &UpstreamError) -> ResetReason {
    match err {
        UpstreamError::Reset { reason, .. } => *reason,
        other => panic!("expected a reset, got {other:?}"),
    }
}

#[tokio::test]
async fn get_goes_out_origin_form_with_host_and_no_body_framing() {
    let mut up = Upstream::start(|mut peer| async move { peer.serve(OK).await }).await;
    let client = Client::new(up.addr);
    let req = Request::get("/p?q")
        .header("Host", "svc.example")
        .header("X-Mixed-Case", "Value")
        .body(revoy::body::empty())
        .unwrap();
    assert_eq!(client.exchange(req).await, (StatusCode::OK, "ok".into()));
    assert_eq!(
        up.next_request().await,
        "GET /p?q HTTP/1.1\r\nhost: svc.example\r\nx-mixed-case: Value\r\n\r\n"
    );
    // An absolute-form URI becomes origin-form, its authority the Host header.
    let req = Request::get("http://svc.example:8080/a/b?x=1")
        .body(revoy::body::empty())
        .unwrap();
    client.exchange(req).await;
    assert_eq!(
        up.next_request().await,
        "GET /a/b?x=1 HTTP/1.1\r\nhost: svc.example:8080\r\n\r\n"
    );
}

#[tokio::test]
async fn post_with_a_known_size_gets_content_length() {
    let mut up = Upstream::start(|mut peer| async move { peer.serve(OK).await }).await;
    let client = Client::new(up.addr);
    let req = Request::post("/submit")
        .header("host", "svc")
        .body(revoy::body::full("hello=world"))
        .unwrap();
    assert_eq!(client.exchange(req).await, (StatusCode::OK, "ok".into()));
    assert_eq!(
        up.next_request().await,
        "POST /submit HTTP/1.1\r\nhost: svc\r\ncontent-length: 11\r\n\r\nhello=world"
    );
    // A body larger than what goes out with the head still arrives whole.
    let big = "x".repeat(100 * 1024);
    let req = Request::put("/big")
        .header("host", "svc")
        .body(revoy::body::full(big.clone()))
        .unwrap();
    assert_eq!(client.exchange(req).await, (StatusCode::OK, "ok".into()));
    assert_eq!(
        up.next_request().await,
        format!("PUT /big HTTP/1.1\r\nhost: svc\r\ncontent-length: 102400\r\n\r\n{big}")
    );
}

#[tokio::test]
async fn streaming_body_of_unknown_size_goes_chunked() {
    let mut up = Upstream::start(|mut peer| async move { peer.serve(OK).await }).await;
    let client = Arc::new(Client::with(
        up.addr,
        "http_protocol_options: {enable_trailers: true}",
    ));
    let send = |body: Body| {
        let client = client.clone();
        let req = Request::post("/up")
            .header("host", "svc")
            .body(body)
            .unwrap();
        tokio::spawn(async move { client.exchange(req).await })
    };

    let (tx, body) = channel_body();
    tx.send(data("hello")).await.unwrap();
    let pending = send(body);
    pause().await;
    tx.send(data(" world")).await.unwrap();
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", "abc".parse().unwrap());
    tx.send(Ok(Frame::trailers(trailers))).await.unwrap();
    drop(tx);
    let got = within("streamed exchange", pending).await.unwrap();
    assert_eq!(got, (StatusCode::OK, "ok".into()));
    assert_eq!(
        up.next_request().await,
        "POST /up HTTP/1.1\r\nhost: svc\r\ntransfer-encoding: chunked\r\n\r\n\
         5\r\nhello\r\n6\r\n world\r\n0\r\nx-checksum: abc\r\n\r\n"
    );

    // An empty data frame does not end the body; the end without trailers is `0\r\n\r\n`.
    let (tx, body) = channel_body();
    let pending = send(body);
    tx.send(data("a")).await.unwrap();
    tx.send(data("")).await.unwrap();
    pause().await;
    tx.send(data("0123456789abcdef0")).await.unwrap();
    drop(tx);
    within("streamed exchange", pending).await.unwrap();
    assert_eq!(
        up.next_request().await,
        "POST /up HTTP/1.1\r\nhost: svc\r\ntransfer-encoding: chunked\r\n\r\n\
         1\r\na\r\n11\r\n0123456789abcdef0\r\n0\r\n\r\n"
    );
    assert_eq!(up.accepted(), 1);
}

#[tokio::test]
async fn request_trailers_are_dropped_unless_the_cluster_enables_them() {
    let mut up = Upstream::start(|mut peer| async move { peer.serve(OK).await }).await;
    let client = Client::new(up.addr);
    let (tx, body) = channel_body();
    tx.send(data("hello")).await.unwrap();
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", "abc".parse().unwrap());
    tx.send(Ok(Frame::trailers(trailers))).await.unwrap();
    drop(tx);
    let req = Request::post("/up")
        .header("host", "svc")
        .body(body)
        .unwrap();
    let got = within("exchange", client.exchange(req)).await;
    assert_eq!(got, (StatusCode::OK, "ok".into()));
    assert_eq!(
        up.next_request().await,
        "POST /up HTTP/1.1\r\nhost: svc\r\ntransfer-encoding: chunked\r\n\r\n\
         5\r\nhello\r\n0\r\n\r\n"
    );
}

#[tokio::test]
async fn a_declared_content_length_is_kept_for_a_streaming_body() {
    let mut up = Upstream::start(|mut peer| async move { peer.serve(OK).await }).await;
    let client = Client::new(up.addr);
    let (tx, body) = channel_body();
    tx.send(data("abc")).await.unwrap();
    tx.send(data("def")).await.unwrap();
    drop(tx);
    let req = Request::post("/len")
        .header("host", "svc")
        .header("content-length", "6")
        .body(body)
        .unwrap();
    assert_eq!(client.exchange(req).await, (StatusCode::OK, "ok".into()));
    assert_eq!(
        up.next_request().await,
        "POST /len HTTP/1.1\r\nhost: svc\r\ncontent-length: 6\r\n\r\nabcdef"
    );
}

#[tokio::test]
async fn content_length_body_arriving_in_pieces_is_read_exactly() {
    let up = Upstream::start(|mut peer| async move {
        while peer.request().await.is_some() {
            peer.send("HTTP/1.1 200 OK\r\nx-up").await;
            pause().await;
            peer.send(": 1\r\ncontent-length: 11\r\n\r\nhello").await;
            pause().await;
            peer.send(" world").await;
        }
    })
    .await;
    let client = Client::new(up.addr);
    for _ in 0..2 {
        let resp = client.send(get("/")).await.unwrap();
        assert_eq!(resp.headers()["x-up"], "1");
        assert_eq!(text(resp).await, "hello world");
    }
    assert_eq!(up.accepted(), 1, "the body's end was found exactly");
}

/// A chunked response sent in pieces that split its size lines, CRLFs and trailer section.
async fn chunked_upstream_with_trailers() -> Upstream {
    Upstream::start(|mut peer| async move {
        while peer.request().await.is_some() {
            let pieces = [
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
                "lo\r\n6\r",
                "\n world\r\n0\r\n",
                "x-trailer: yes\r\n",
                "\r\n",
            ];
            for piece in pieces {
                peer.send(piece).await;
                pause().await;
            }
        }
    })
    .await
}

#[tokio::test]
async fn chunked_body_split_across_writes_yields_data_then_trailers() {
    let up = chunked_upstream_with_trailers().await;
    let client = Client::with(up.addr, "http_protocol_options: {enable_trailers: true}");
    for _ in 0..2 {
        let resp = client.send(get("/")).await.unwrap();
        let frames = frames(resp).await;
        let (last, data) = frames.split_last().expect("frames");
        let data: Vec<u8> = data
            .iter()
            .flat_map(|f| f.as_ref().unwrap().data_ref().expect("data frame").to_vec())
            .collect();
        assert_eq!(data, b"hello world");
        let trailers = last
            .as_ref()
            .unwrap()
            .trailers_ref()
            .expect("trailers last");
        assert_eq!(trailers["x-trailer"], "yes");
    }
    assert_eq!(up.accepted(), 1, "the chunked body's end was found exactly");
}

#[tokio::test]
async fn trailers_are_dropped_unless_the_cluster_enables_them() {
    let up = chunked_upstream_with_trailers().await;
    let client = Client::new(up.addr);
    for _ in 0..2 {
        let resp = client.send(get("/")).await.unwrap();
        let frames = frames(resp).await;
        let data: Vec<u8> = frames
            .iter()
            .flat_map(|f| f.as_ref().unwrap().data_ref().expect("only data").to_vec())
            .collect();
        assert_eq!(data, b"hello world");
    }
    assert_eq!(
        up.accepted(),
        1,
        "the connection is reused after the dropped trailers"
    );
}

#[tokio::test]
async fn close_delimited_body_is_read_until_the_upstream_closes() {
    let up = Upstream::start(|mut peer| async move {
        peer.request().await;
        peer.send("HTTP/1.1 200 OK\r\n\r\nfirst ").await;
        pause().await;
        peer.send("second").await;
    })
    .await;
    let client = Client::new(up.addr);
    for _ in 0..2 {
        assert_eq!(
            client.exchange(get("/")).await,
            (StatusCode::OK, "first second".into())
        );
    }
    assert_eq!(up.accepted(), 2);
}

#[tokio::test]
async fn head_response_has_no_body_despite_its_content_length() {
    let up = Upstream::start(|mut peer| async move {
        while let Some(req) = peer.request().await {
            if req.starts_with("HEAD ") {
                peer.send("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n")
                    .await;
            } else {
                peer.send(OK).await;
            }
        }
    })
    .await;
    let client = Client::new(up.addr);
    let head = Request::head("/")
        .header("host", "svc")
        .body(revoy::body::empty())
        .unwrap();
    let resp = client.send(head).await.unwrap();
    assert_eq!(resp.headers()["content-length"], "10");
    assert_eq!(text(resp).await, "");
    next_request_reuses_the_connection(&client, &up).await;
}

#[tokio::test]
async fn no_content_and_not_modified_have_empty_bodies() {
    let up = Upstream::start(|mut peer| async move {
        let answers = [
            "HTTP/1.1 204 No Content\r\n\r\n",
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 7\r\n\r\n",
            OK,
        ];
        for answer in answers {
            if peer.request().await.is_none() {
                return;
            }
            peer.send(answer).await;
        }
    })
    .await;
    let client = Client::new(up.addr);
    let got = [
        client.exchange(get("/")).await,
        client.exchange(get("/")).await,
        client.exchange(get("/")).await,
    ];
    assert_eq!(
        got,
        [
            (StatusCode::NO_CONTENT, String::new()),
            (StatusCode::NOT_MODIFIED, String::new()),
            (StatusCode::OK, "ok".into()),
        ]
    );
    assert_eq!(up.accepted(), 1);
}

#[tokio::test]
async fn interim_responses_are_skipped() {
    let up = Upstream::start(|mut peer| async move {
        peer.request().await;
        peer.send("HTTP/1.1 100 Continue\r\n\r\n").await;
        pause().await;
        peer.send(OK).await;
        peer.request().await;
        peer.send(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </s.css>\r\n\r\n\
             HTTP/1.1 201 Created\r\ncontent-length: 3\r\n\r\nyes",
        )
        .await;
        peer.until_closed().await;
    })
    .await;
    let client = Client::new(up.addr);
    assert_eq!(
        client.exchange(get("/")).await,
        (StatusCode::OK, "ok".into())
    );
    let resp = client.send(get("/")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    assert_eq!(resp.headers().get("link"), None);
    assert_eq!(text(resp).await, "yes");
}

#[tokio::test]
async fn keep_alive_upstream_serves_sequential_requests_on_one_connection() {
    let up = Upstream::start(|mut peer| async move { peer.serve(OK).await }).await;
    let client = Client::new(up.addr);
    for _ in 0..3 {
        assert_eq!(
            client.exchange(get("/")).await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(client.idle(), 1);
    }
    assert_eq!(up.accepted(), 1);
    assert_eq!(
        client
            .store
            .counter("cluster.up.upstream_cx_http1_total")
            .value(),
        1
    );
}

#[tokio::test]
async fn concurrent_requests_use_separate_connections() {
    let both = Arc::new(tokio::sync::Barrier::new(2));
    let up = Upstream::start(move |mut peer| {
        let both = both.clone();
        async move {
            // The first answer waits until both connections are open: two requests sharing
            // one connection would never be answered.
            peer.request().await;
            both.wait().await;
            peer.send(OK).await;
            peer.serve(OK).await;
        }
    })
    .await;
    let client = Client::new(up.addr);
    let (a, b) = tokio::join!(client.exchange(get("/a")), client.exchange(get("/b")));
    assert_eq!((a.1.as_str(), b.1.as_str()), ("ok", "ok"));
    assert_eq!(client.idle(), 2);
    client.exchange(get("/c")).await;
    client.exchange(get("/d")).await;
    assert_eq!(up.accepted(), 2);
}

#[tokio::test]
async fn connection_close_response_is_not_reused() {
    // The upstream keeps the connection open: only the header tells the client to stop.
    let up = Upstream::start(|mut peer| async move {
        peer.serve("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok")
            .await;
    })
    .await;
    let client = Client::new(up.addr);
    for _ in 0..2 {
        assert_eq!(
            client.exchange(get("/")).await,
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(client.idle(), 0);
    }
    assert_eq!(up.accepted(), 2);
}

#[tokio::test]
async fn http_1_0_response_is_reused_only_with_keep_alive() {
    let up = Upstream::start(|mut peer| async move {
        while let Some(req) = peer.request().await {
            if req.starts_with("GET /keep-alive ") {
                peer.send(
                    "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 2\r\n\r\nok",
                )
                .await;
            } else {
                peer.send("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            }
        }
    })
    .await;
    let client = Client::new(up.addr);
    client.exchange(get("/plain")).await;
    client.exchange(get("/plain")).await;
    assert_eq!(up.accepted(), 2);
    client.exchange(get("/keep-alive")).await;
    client.exchange(get("/keep-alive")).await;
    assert_eq!(up.accepted(), 3);
}

#[tokio::test]
async fn idle_connection_closed_by_the_upstream_is_replaced() {
    let (closed_tx, mut closed) = mpsc::unbounded_channel();
    let up = Upstream::start(move |mut peer| {
        let closed_tx = closed_tx.clone();
        async move {
            match peer.index {
                1 | 2 => {
                    peer.request().await;
                    peer.send(OK).await;
                    // The first closes with a FIN, the second with a RST.
                    if peer.index == 2 {
                        peer.stream.set_zero_linger().unwrap();
                    }
                    drop(peer);
                    let _ = closed_tx.send(());
                }
                _ => peer.serve(OK).await,
            }
        }
    })
    .await;
    let client = Client::new(up.addr);
    for _ in 0..2 {
        assert_eq!(
            client.exchange(get("/")).await,
            (StatusCode::OK, "ok".into())
        );
        within("upstream close", closed.recv()).await.unwrap();
        pause().await;
    }
    assert_eq!(
        client.exchange(get("/")).await,
        (StatusCode::OK, "ok".into())
    );
    assert_eq!(up.accepted(), 3);
}

#[tokio::test]
async fn max_requests_per_connection_opens_a_new_connection() {
    let up = Upstream::start(|mut peer| async move { peer.serve(OK).await }).await;
    let extra = r#"typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {http_protocol_options: {}}
    common_http_protocol_options: {max_requests_per_connection: 2}"#;
    let client = Client::with(up.addr, extra);
    for _ in 0..3 {
        client.exchange(get("/")).await;
    }
    assert_eq!(up.accepted(), 2);
}

#[tokio::test]
async fn idle_timed_out_connection_is_not_reused() {
    let up = Upstream::start(|mut peer| async move { peer.serve(OK).await }).await;
    let extra = r#"typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {http_protocol_options: {}}
    common_http_protocol_options: {idle_timeout: 0.05s}"#;
    let client = Client::with(up.addr, extra);
    client.exchange(get("/")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.exchange(get("/")).await;
    assert_eq!(up.accepted(), 2);
}

#[tokio::test]
async fn upstream_closing_before_a_response_is_connection_termination() {
    let up = Upstream::start(|mut peer| async move {
        peer.request().await;
    })
    .await;
    let client = Client::new(up.addr);
    let err = client.send(get("/")).await.unwrap_err();
    assert_eq!(reset_reason(&err), ResetReason::ConnectionTermination);
    assert_eq!(err.reset_reason(), Some("connection termination"));
}

#[tokio::test]
async fn garbage_status_line_is_a_protocol_error() {
    let up = Upstream::start(|mut peer| async move {
        peer.request().await;
        peer.send("garbage here\r\n\r\n").await;
        peer.until_closed().await;
    })
    .await;
    let client = Client::new(up.addr);
    let err = client.send(get("/")).await.unwrap_err();
    assert_eq!(reset_reason(&err), ResetReason::ProtocolError);
    assert_eq!(err.local_reply_status(), StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn framing_envoy_refuses_is_a_protocol_error() {
    // Each answer was sent to Envoy 1.40 the same way: it replies 502 with reset reason
    // "protocol error" to every one of them.
    let refused = [
        "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok",
        "HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nok",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nxyz",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: identity\r\ncontent-length: 2\r\n\r\nok",
        "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello",
        "HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n",
    ];
    for answer in refused {
        let up = Upstream::start(move |mut peer| async move {
            peer.request().await;
            peer.send(answer).await;
            peer.until_closed().await;
        })
        .await;
        let err = Client::new(up.addr).send(get("/")).await.unwrap_err();
        assert_eq!(reset_reason(&err), ResetReason::ProtocolError, "{answer:?}");
        assert_eq!(err.local_reply_status(), StatusCode::BAD_GATEWAY);
    }
}

#[tokio::test]
async fn folded_header_is_forwarded_joined_and_chunked_matches_any_case() {
    let up = Upstream::start(|mut peer| async move {
        peer.request().await;
        peer.send("HTTP/1.1 200 OK\r\nx-fold: a\r\n b\r\ncontent-length: 2\r\n\r\nok")
            .await;
        peer.request().await;
        peer.send("HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
            .await;
        peer.until_closed().await;
    })
    .await;
    let client = Client::new(up.addr);
    let resp = client.send(get("/")).await.unwrap();
    assert_eq!(resp.headers()["x-fold"], "a b");
    assert_eq!(text(resp).await, "ok");
    next_request_reuses_the_connection(&client, &up).await;
}

#[tokio::test]
async fn response_head_over_80_kib_is_a_protocol_error() {
    let up = Upstream::start(|mut peer| async move {
        peer.request().await;
        let value = "v".repeat(81 * 1024);
        // The head is never finished: the limit alone must end the wait.
        peer.send(format!("HTTP/1.1 200 OK\r\nx-big: {value}\r\n"))
            .await;
        peer.until_closed().await;
    })
    .await;
    let client = Client::new(up.addr);
    let err = client.send(get("/")).await.unwrap_err();
    assert_eq!(reset_reason(&err), ResetReason::ProtocolError);
}

#[tokio::test]
async fn response_head_of_70_kb_is_accepted() {
    let up = Upstream::start(|mut peer| async move {
        peer.request().await;
        let value = "v".repeat(70_000);
        peer.send(format!(
            "HTTP/1.1 200 OK\r\nx-big: {value}\r\ncontent-length: 2\r\n\r\nok"
        ))
        .await;
        peer.until_closed().await;
    })
    .await;
    let client = Client::new(up.addr);
    let resp = client.send(get("/")).await.unwrap();
    assert_eq!(resp.headers()["x-big"].len(), 70_000);
    assert_eq!(text(resp).await, "ok");
}

#[tokio::test]
async fn truncated_or_broken_bodies_end_in_an_error() {
    let up = Upstream::start(|mut peer| async move {
        peer.request().await;
        match peer.index {
            1 => {
                peer.send("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
                    .await
            }
            2 => {
                peer.send("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel")
                    .await;
            }
            _ => {
                // Broken framing with the connection still open.
                peer.send("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
                    .await;
                peer.until_closed().await;
            }
        }
    })
    .await;
    let client = Client::new(up.addr);
    for (expected, truncated) in [("abc", true), ("hel", true), ("", false)] {
        let resp = client.send(get("/")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let frames = frames(resp).await;
        let (last, data) = frames.split_last().expect("frames");
        let data: Vec<u8> = data
            .iter()
            .flat_map(|f| f.as_ref().unwrap().data_ref().unwrap().to_vec())
            .collect();
        assert_eq!(data, expected.as_bytes());
        let err = last.as_ref().expect_err("the body fails");
        assert_eq!(err.contains("closed"), truncated, "{err}");
    }
    assert_eq!(up.accepted(), 3);
}

#[tokio::test]
async fn early_response_arrives_while_the_request_body_is_still_open() {
    let up = Upstream::start(|mut peer| async move {
        if peer.index == 1 {
            peer.head().await;
            peer.send("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nearly")
                .await;
            peer.until_closed().await;
        } else {
            peer.serve(OK).await;
        }
    })
    .await;
    let client = Client::new(up.addr);
    let (tx, body) = channel_body();
    tx.send(data("part-1")).await.unwrap();
    let req = Request::post("/upload")
        .header("host", "svc")
        .body(body)
        .unwrap();
    let resp = client.send(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(text(resp).await, "early");
    // The connection still carries the unfinished request body: another request needs another.
    assert_eq!(
        client.exchange(get("/")).await,
        (StatusCode::OK, "ok".into())
    );
    assert_eq!(up.accepted(), 2);
    drop(tx);
}

#[tokio::test]
async fn early_response_is_read_while_the_upstream_does_not_read_the_request_body() {
    let up = Upstream::start(|mut peer| async move {
        peer.head().await;
        peer.send("HTTP/1.1 413 Payload Too Large\r\ncontent-length: 8\r\n\r\ntoo big!")
            .await;
        // The peer (and its connection) lives on without reading the request body.
        std::future::pending::<()>().await;
    })
    .await;
    let client = Client::new(up.addr);
    let chunk = Bytes::from(vec![b'x'; 1024 * 1024]);
    let endless = tokio_stream::iter(std::iter::repeat_with(move || {
        Ok::<_, Infallible>(Frame::data(chunk.clone()))
    }));
    let req = Request::post("/upload")
        .header("host", "svc")
        .body(revoy::body::boxed(StreamBody::new(endless)))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(text(resp).await, "too big!");
}

#[tokio::test]
async fn status_line_without_reason_phrase_is_accepted() {
    let up = Upstream::start(|mut peer| async move {
        peer.serve("HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok")
            .await;
    })
    .await;
    let client = Client::new(up.addr);
    assert_eq!(
        client.exchange(get("/")).await,
        (StatusCode::OK, "ok".into())
    );
}

#[tokio::test]
async fn dropped_response_body_closes_its_connection() {
    let (closed_tx, mut closed) = mpsc::unbounded_channel();
    let up = Upstream::start(move |mut peer| {
        let closed_tx = closed_tx.clone();
        async move {
            if peer.index == 1 {
                peer.request().await;
                peer.send("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
                    .await;
                peer.until_closed().await;
                let _ = closed_tx.send(());
            } else {
                peer.serve(OK).await;
            }
        }
    })
    .await;
    let client = Client::new(up.addr);
    let resp = client.send(get("/")).await.unwrap();
    let mut body = resp.into_body();
    let first = within("first frame", body.frame()).await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "abc");
    drop(body);
    within("upstream sees the close", closed.recv())
        .await
        .unwrap();
    assert_eq!(
        client.exchange(get("/")).await,
        (StatusCode::OK, "ok".into())
    );
    assert_eq!(up.accepted(), 2);
}

#[tokio::test]
async fn failing_request_body_is_a_downstream_error_and_closes_the_connection() {
    let (closed_tx, mut closed) = mpsc::unbounded_channel();
    let up = Upstream::start(move |mut peer| {
        let closed_tx = closed_tx.clone();
        async move {
            peer.head().await;
            peer.until_closed().await;
            let _ = closed_tx.send(());
        }
    })
    .await;
    let client = Client::new(up.addr);

    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    tx.send(Ok(Frame::data(Bytes::from_static(b"abc"))))
        .await
        .unwrap();
    tx.send(Err(std::io::Error::other("downstream reset")))
        .await
        .unwrap();
    let req = Request::post("/")
        .header("host", "svc")
        .body(revoy::body::boxed(StreamBody::new(ReceiverStream::new(rx))))
        .unwrap();
    let err = client.send(req).await.unwrap_err();
    assert_request_body_error(&err);
    within("upstream sees the close", closed.recv())
        .await
        .unwrap();

    // A body that ends short of its declared content-length.
    let (tx, body) = channel_body();
    tx.send(data("abc")).await.unwrap();
    drop(tx);
    let req = Request::post("/")
        .header("host", "svc")
        .header("content-length", "10")
        .body(body)
        .unwrap();
    let err = client.send(req).await.unwrap_err();
    assert_request_body_error(&err);
    within("upstream sees the close", closed.recv())
        .await
        .unwrap();
}

#[tokio::test]
async fn unsolicited_bytes_after_a_response_retire_the_connection() {
    let junk_sent = Arc::new(tokio::sync::Notify::new());
    let sent = junk_sent.clone();
    let up = Upstream::start(move |mut peer| {
        let sent = sent.clone();
        async move {
            match peer.index {
                1 => {
                    peer.request().await;
                    peer.send(format!("{OK}junk")).await;
                }
                2 => {
                    peer.request().await;
                    peer.send(OK).await;
                    pause().await;
                    peer.send("junk").await;
                    sent.notify_one();
                }
                _ => {}
            }
            // A client that reused the connection would read the junk as its response head.
            peer.serve(OK).await;
        }
    })
    .await;
    let client = Client::new(up.addr);
    assert_eq!(
        client.exchange(get("/")).await,
        (StatusCode::OK, "ok".into())
    );
    assert_eq!(
        client.exchange(get("/")).await,
        (StatusCode::OK, "ok".into())
    );
    // Once the junk is on its way (waited for, not slept on: on a busy machine it can come
    // late), the idle connection it reached is not reused.
    within("the junk sent", junk_sent.notified()).await;
    pause().await;
    assert_eq!(
        client.exchange(get("/")).await,
        (StatusCode::OK, "ok".into())
    );
    assert_eq!(up.accepted(), 3);
}
