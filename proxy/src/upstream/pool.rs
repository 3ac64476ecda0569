//! Connections to one host: TCP connect (timeout, source address), an HTTP/1.1 keep-alive
//! pool and one multiplexed HTTP/2 connection. Each host has its own pool, so requests to
//! different hosts never contend; the critical sections only push or pop a sender.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use http::header::{CONNECTION, HOST, TE, TRANSFER_ENCODING, UPGRADE};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};

use crate::body::Body;

use super::error::{ResetReason, UpstreamError};
use super::host::Host;
use super::stats::ClusterStats;

/// Connection settings from the cluster config.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectOptions<'a> {
    pub timeout: Duration,
    pub source: Option<SocketAddr>,
    pub idle_timeout: Option<Duration>,
    pub max_requests: Option<u32>,
    pub stats: &'a Arc<ClusterStats>,
}

/// Keeps a connection counted in `cx_active` / `upstream_cx_active` while alive.
#[derive(Debug)]
pub struct ActiveConnection {
    host: Arc<Host>,
    stats: Arc<ClusterStats>,
}

impl Drop for ActiveConnection {
    fn drop(&mut self) {
        self.host.stats.cx_active.fetch_sub(1, Ordering::Relaxed);
        self.stats.upstream_cx_active.dec();
    }
}

/// A host's pooled HTTP connections.
#[derive(Default)]
pub(crate) struct Pool {
    idle_h1: Mutex<Vec<IdleH1>>,
    h2: ArcSwapOption<http2::SendRequest<Body>>,
    h2_connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

impl Pool {
    pub(crate) fn idle_http1(&self) -> usize {
        self.idle_h1.lock().expect("pool lock").len()
    }
}

/// The response head size Envoy's upstream codec accepts by default (`max_response_headers_kb`
/// unset: 80 KiB; Envoy 1.40 takes a 70 KB head and resets on a 100 KB one): a larger head is
/// an upstream protocol error.
const MAX_RESPONSE_HEAD: usize = 80 * 1024;

/// The upstream host that answered, attached to a response when `LbContext::report_host`.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamHost(pub SocketAddr);

/// Whether a response head is over [`MAX_RESPONSE_HEAD`].
fn head_too_large(resp: &Response<Incoming>) -> bool {
    resp.headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len())
        .sum::<usize>()
        > MAX_RESPONSE_HEAD
}

struct IdleH1 {
    sender: http1::SendRequest<Body>,
    since: Instant,
    used: u32,
}

/// Opens a TCP connection to `host`, charging connection stats.
pub(crate) async fn connect(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
) -> Result<(TcpStream, ActiveConnection), UpstreamError> {
    let addr = host.addr;
    host.stats.cx_total.fetch_add(1, Ordering::Relaxed);
    opts.stats.upstream_cx_total.inc();
    let fail = |e: UpstreamError| {
        host.stats.cx_connect_fail.fetch_add(1, Ordering::Relaxed);
        opts.stats.upstream_cx_connect_fail.inc();
        e
    };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|source| fail(UpstreamError::ConnectFailure { host: addr, source }))?;
    if let Some(src) = opts.source.filter(|s| s.is_ipv4() == addr.is_ipv4()) {
        socket
            .bind(src)
            .map_err(|source| fail(UpstreamError::ConnectFailure { host: addr, source }))?;
    }
    let stream = match tokio::time::timeout(opts.timeout, socket.connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(source)) => return Err(fail(UpstreamError::ConnectFailure { host: addr, source })),
        Err(_) => {
            opts.stats.upstream_cx_connect_timeout.inc();
            return Err(fail(UpstreamError::ConnectTimeout { host: addr }));
        }
    };
    let _ = stream.set_nodelay(true);
    host.stats.cx_active.fetch_add(1, Ordering::Relaxed);
    opts.stats.upstream_cx_active.inc();
    Ok((
        stream,
        ActiveConnection {
            host: host.clone(),
            stats: opts.stats.clone(),
        },
    ))
}

/// Sends `req` over a pooled HTTP/1.1 connection (reusing an idle one when possible).
pub(crate) async fn send_h1(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
    req: Request<Body>,
) -> Result<Response<Incoming>, UpstreamError> {
    let mut req = to_h1(req);
    loop {
        let (mut idle, reused) = match take_idle(host, opts.idle_timeout) {
            Some(idle) => (idle, true),
            None => {
                opts.stats.upstream_rq_pending_total.inc();
                // Boxed: connection setup is rare, and inline it would enlarge every
                // request's future (which tokio and hyper move around) by its state.
                (Box::pin(connect_h1(host, opts)).await?, false)
            }
        };
        match idle.sender.try_send_request(req).await {
            Ok(resp) if head_too_large(&resp) => {
                return Err(UpstreamError::Reset {
                    host: host.addr,
                    reason: ResetReason::ProtocolError,
                    detail: "response headers over max_response_headers_kb".into(),
                });
            }
            Ok(resp) => {
                idle.used += 1;
                release_h1(host.clone(), idle, opts.max_requests);
                return Ok(resp);
            }
            Err(mut e) => match e.take_message() {
                // A reused connection closed before the request was written: use another.
                Some(r) if reused => req = r,
                _ => return Err(UpstreamError::from_hyper(host.addr, e.error())),
            },
        }
    }
}

/// Takes the most recently used connection that is ready for a request. Connections whose
/// previous response is still streaming stay listed (they are returned as soon as they are
/// needed again); closed or idle-expired ones are dropped.
fn take_idle(host: &Host, idle_timeout: Option<Duration>) -> Option<IdleH1> {
    let mut idle = host.pool.idle_h1.lock().expect("pool lock");
    let mut i = idle.len();
    while i > 0 {
        i -= 1;
        let c = &idle[i];
        let expired = idle_timeout.is_some_and(|t| c.since.elapsed() >= t);
        if c.sender.is_closed() || (expired && c.sender.is_ready()) {
            idle.swap_remove(i);
        } else if c.sender.is_ready() {
            return Some(idle.swap_remove(i));
        }
    }
    None
}

/// Lists the connection again right away; it is handed out once its response is fully read
/// (no task per request to wait for that).
fn release_h1(host: Arc<Host>, mut idle: IdleH1, max_requests: Option<u32>) {
    if max_requests.is_some_and(|m| idle.used >= m) {
        return;
    }
    idle.since = Instant::now();
    host.pool.idle_h1.lock().expect("pool lock").push(idle);
}

async fn connect_h1(host: &Arc<Host>, opts: ConnectOptions<'_>) -> Result<IdleH1, UpstreamError> {
    let (stream, active) = connect(host, opts).await?;
    opts.stats.upstream_cx_http1_total.inc();
    let (sender, conn) = http1::Builder::new()
        .handshake::<_, Body>(TokioIo::new(stream))
        .await
        .map_err(|e| UpstreamError::from_hyper(host.addr, &e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
        drop(active);
    });
    Ok(IdleH1 {
        sender,
        since: Instant::now(),
        used: 0,
    })
}

/// Sends `req` on the host's HTTP/2 connection, opening (or replacing a closed) one first.
pub(crate) async fn send_h2(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
    req: Request<Body>,
) -> Result<Response<Incoming>, UpstreamError> {
    let mut req = to_h2(req, host.addr);
    let mut fresh_tried = false;
    loop {
        let (mut sender, fresh) = h2_sender(host, opts).await?;
        fresh_tried |= fresh;
        if sender.ready().await.is_err() {
            host.pool.h2.store(None);
            if fresh_tried {
                return Err(UpstreamError::Reset {
                    host: host.addr,
                    reason: super::error::ResetReason::ConnectionTermination,
                    detail: "http2 connection closed".into(),
                });
            }
            continue;
        }
        match sender.try_send_request(req).await {
            Ok(resp) => return Ok(resp),
            Err(mut e) => match e.take_message() {
                // The connection went away (GOAWAY/close) before the stream started.
                Some(r) if !fresh_tried => {
                    host.pool.h2.store(None);
                    req = r;
                }
                _ => return Err(UpstreamError::from_hyper(host.addr, e.error())),
            },
        }
    }
}

async fn h2_sender(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
) -> Result<(http2::SendRequest<Body>, bool), UpstreamError> {
    let usable = || {
        host.pool
            .h2
            .load_full()
            .filter(|s| !s.is_closed())
            .map(|s| (*s).clone())
    };
    if let Some(s) = usable() {
        return Ok((s, false));
    }
    opts.stats.upstream_rq_pending_total.inc();
    // Boxed for the same reason as `connect_h1`: rare, and large inline.
    Box::pin(open_h2(host, opts, usable)).await
}

/// Opens the host's HTTP/2 connection, unless another request opened it meanwhile.
async fn open_h2(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
    usable: impl Fn() -> Option<http2::SendRequest<Body>>,
) -> Result<(http2::SendRequest<Body>, bool), UpstreamError> {
    let _connecting = host.pool.h2_connecting.lock().await;
    if let Some(s) = usable() {
        return Ok((s, false));
    }
    let (stream, active) = connect(host, opts).await?;
    opts.stats.upstream_cx_http2_total.inc();
    let (sender, conn) = http2::Builder::new(crate::spawn::Executor)
        .handshake::<_, Body>(TokioIo::new(stream))
        .await
        .map_err(|e| UpstreamError::from_hyper(host.addr, &e))?;
    tokio::spawn(async move {
        let _ = conn.await;
        drop(active);
    });
    host.pool.h2.store(Some(Arc::new(sender.clone())));
    Ok((sender, true))
}

/// HTTP/1.1 wants origin-form with a Host header.
fn to_h1(mut req: Request<Body>) -> Request<Body> {
    if req.uri().authority().is_some() {
        if !req.headers().contains_key(HOST)
            && let Some(a) = req.uri().authority()
            && let Ok(v) = HeaderValue::from_str(a.as_str())
        {
            req.headers_mut().insert(HOST, v);
        }
        let pq = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        *req.uri_mut() = Uri::try_from(pq).unwrap_or_else(|_| Uri::from_static("/"));
    }
    if req.version() != Version::HTTP_10 {
        *req.version_mut() = Version::HTTP_11;
    }
    req
}

/// HTTP/2 wants an absolute URI (`:authority` from Host) and no connection-specific headers.
fn to_h2(mut req: Request<Body>, addr: SocketAddr) -> Request<Body> {
    let authority = req
        .headers_mut()
        .remove(HOST)
        .and_then(|h| Authority::try_from(h.as_bytes()).ok())
        .or_else(|| req.uri().authority().cloned())
        .or_else(|| Authority::try_from(addr.to_string()).ok());
    let mut parts = std::mem::take(req.uri_mut()).into_parts();
    parts.scheme.get_or_insert(Scheme::HTTP);
    parts.authority = authority;
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(PathAndQuery::from_static("/"));
    }
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    let h = req.headers_mut();
    for name in [CONNECTION, TRANSFER_ENCODING, UPGRADE] {
        h.remove(name);
    }
    h.remove("keep-alive");
    h.remove("proxy-connection");
    if h.get(TE).is_some_and(|v| v != "trailers") {
        h.remove(TE);
    }
    *req.version_mut() = Version::HTTP_2;
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h1_requests_are_origin_form_with_host() {
        let req = Request::get("http://example.com:8080/a?b=1")
            .body(crate::body::empty())
            .unwrap();
        let req = to_h1(req);
        assert_eq!(req.uri(), "/a?b=1");
        assert_eq!(req.headers()[HOST], "example.com:8080");
        assert_eq!(req.version(), Version::HTTP_11);
    }

    #[test]
    fn h2_requests_take_authority_from_host_and_drop_connection_headers() {
        let req = Request::get("/p")
            .header(HOST, "svc.local")
            .header(CONNECTION, "keep-alive")
            .header(TE, "gzip")
            .body(crate::body::empty())
            .unwrap();
        let req = to_h2(req, "127.0.0.1:1".parse().unwrap());
        assert_eq!(req.uri(), "http://svc.local/p");
        assert!(req.headers().get(HOST).is_none());
        assert!(req.headers().get(CONNECTION).is_none());
        assert!(req.headers().get(TE).is_none());
        assert_eq!(req.version(), Version::HTTP_2);
    }
}
