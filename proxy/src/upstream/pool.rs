//! Connections to one host: TCP connect (timeout, source address, Happy Eyeballs across an
//! endpoint's addresses), a pool of idle HTTP/1.1
//! connections and one multiplexed HTTP/2 connection. Each host has its own pool, so requests to
//! different hosts never contend; the critical sections only push or pop a sender.
//!
//! An idle HTTP/1.1 connection is taken again only on the thread that opened it, as Envoy's
//! pools are per worker: its socket is registered with that thread's runtime, so on another
//! worker every readiness of it would reach the request through the opener's event loop and a
//! cross-thread wake-up.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use http::header::HOST;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri, Version};
use hyper::client::conn::http2;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::{TcpSocket, TcpStream};

use crate::access_log::{AttemptTarget, UpstreamSans};
use crate::body::Body;
use crate::config::cluster::SourceAddresses;
use crate::config::istio::alpn::AlpnList;

use super::error::{ResetReason, UpstreamError};
use super::h1;
use super::h2_wire::{H2Meter, H2Tables};
use super::host::{Host, HostTransport};
use super::io::UpstreamIo;
use super::response::UpstreamBody;
use super::stats::ClusterStats;
use crate::tls::{Carries, ClientContext};

/// Connection settings from the cluster config.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectOptions<'a> {
    pub timeout: Duration,
    /// The cluster's source addresses (`upstream_bind_config`).
    pub source: &'a SourceAddresses,
    pub idle_timeout: Option<Duration>,
    pub max_requests: Option<u32>,
    /// Forward an HTTP/1.1 response's trailers (`enable_trailers`).
    pub http1_trailers: bool,
    /// The `max_connections` circuit breaker: HTTP/1.1 connections to the cluster's hosts.
    pub max_connections: u32,
    /// The `max_pending_requests` circuit breaker: requests waiting for a connection.
    pub max_pending_requests: u32,
    pub stats: &'a Arc<ClusterStats>,
    /// What the connections carry (the ALPN a TLS host is offered when its context names none).
    pub carries: Carries,
    /// Where to note the host and connection each request goes out on, and its bytes on
    /// them (for access logs).
    pub target: Option<&'a Arc<AttemptTarget>>,
}

/// Keeps a connection counted in `cx_active` / `upstream_cx_active` while alive; when it
/// closes, records its `upstream_cx_length_ms` and `upstream_rq_per_cx`.
#[derive(Debug)]
pub struct ActiveConnection {
    host: Arc<Host>,
    stats: Arc<ClusterStats>,
    /// When it was opened, for `upstream_cx_length_ms`.
    opened: std::time::Instant,
    /// Requests sent on it, for `upstream_rq_per_cx` (HTTP/2: streams, counted by its pool).
    requests: Requests,
    /// The socket's local address (`%UPSTREAM_LOCAL_ADDRESS%`), read once when it connected.
    local: Option<SocketAddr>,
    /// The address it is connected to (`%UPSTREAM_REMOTE_ADDRESS%`): the host's, or one of its
    /// additional addresses.
    remote: SocketAddr,
    /// Over TLS, the two certificates' identities, read once when it connected.
    sans: Option<Arc<UpstreamSans>>,
}

/// How a connection's requests are counted: by its one user (HTTP/1.1), or by every request
/// that opens a stream on it (HTTP/2, shared with the pool).
#[derive(Debug)]
enum Requests {
    Own(u32),
    Shared(Arc<std::sync::atomic::AtomicU32>),
}

impl ActiveConnection {
    /// The connection's local address.
    pub fn local(&self) -> Option<SocketAddr> {
        self.local
    }

    /// The address the connection reached.
    pub fn remote(&self) -> SocketAddr {
        self.remote
    }

    /// Over TLS, the identities of the upstream's certificate and this side's.
    pub fn sans(&self) -> Option<&Arc<UpstreamSans>> {
        self.sans.as_ref()
    }

    /// The first URI SAN of the certificate this side presents on it (TLS with a client
    /// certificate), else empty.
    pub fn local_uri_san(&self) -> String {
        let HostTransport::Tls(tls) = &self.host.transport else {
            return String::new();
        };
        tls.certificates
            .presented
            .current()
            .first()
            .and_then(|c| c.key.cert.first())
            .and_then(|der| crate::tls::x509::parse(der).ok())
            .and_then(|info| info.uri_sans().next().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Its cluster's stats.
    pub(crate) fn stats(&self) -> &ClusterStats {
        &self.stats
    }

    /// Counts a request sent on this connection.
    pub(crate) fn count_request(&mut self) {
        match &mut self.requests {
            Requests::Own(n) => *n += 1,
            Requests::Shared(n) => {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// How many requests it has carried.
    pub(crate) fn requests(&self) -> u32 {
        match &self.requests {
            Requests::Own(n) => *n,
            Requests::Shared(n) => n.load(Ordering::Relaxed),
        }
    }
}

impl Drop for ActiveConnection {
    fn drop(&mut self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        self.stats.cx_length_ms().record(ms);
        self.stats.rq_per_cx().record(u64::from(self.requests()));
        self.host.stats.cx_active.fetch_sub(1, Ordering::Relaxed);
        self.stats.upstream_cx_active().dec();
        self.stats.upstream_cx_destroy().inc();
        self.host.pool().wake_a_waiter();
    }
}

/// Connection attempts counted in `upstream_cx_total` that end in `upstream_cx_destroy` when
/// this drops, unless they connected: failed, given up with their request, or lost a race.
struct Ended<'a> {
    stats: &'a ClusterStats,
    attempts: u64,
}

impl<'a> Ended<'a> {
    fn after(stats: &'a ClusterStats, attempts: u64) -> Self {
        Ended { stats, attempts }
    }

    /// One more attempt.
    fn add(&mut self) {
        self.attempts += 1;
    }

    /// The attempts connected: none ends here.
    fn defuse(mut self) {
        self.attempts = 0;
    }
}

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        if self.attempts > 0 {
            self.stats.upstream_cx_destroy().add(self.attempts);
        }
    }
}

/// Counts a request in its host pool's `waiting` while alive.
struct Waiting<'a>(&'a Pool);

impl<'a> Waiting<'a> {
    fn count(pool: &'a Pool) -> Self {
        pool.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting(pool)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts a request as pending (waiting for a connection) while alive.
struct Pending<'a>(&'a ClusterStats);

impl<'a> Pending<'a> {
    /// Enters the pending state, unless `max_pending_requests` are pending already (then the
    /// request overflows, as Envoy's `upstream_rq_pending_overflow`).
    fn enter(opts: &ConnectOptions<'a>) -> Result<Self, UpstreamError> {
        let stats = opts.stats;
        if stats.upstream_rq_pending_active().value() >= u64::from(opts.max_pending_requests) {
            stats.upstream_rq_pending_overflow().inc();
            return Err(UpstreamError::Overflow);
        }
        stats.upstream_rq_pending_total().inc();
        stats.upstream_rq_pending_active().inc();
        Ok(Pending(stats))
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.upstream_rq_pending_active().dec();
    }
}

/// A host's HTTP/2 connection: what sends on it, its streams so far (which its
/// [`ActiveConnection`] records as `upstream_rq_per_cx` when it closes) and its local address.
struct H2Connection {
    sender: http2::SendRequest<Body>,
    requests: Arc<std::sync::atomic::AtomicU32>,
    local: Option<SocketAddr>,
    remote: SocketAddr,
    sans: Option<Arc<UpstreamSans>>,
    /// Its HPACK tables, for its streams' wire bytes.
    tables: Arc<H2Tables>,
}

/// A host's pooled HTTP connections.
#[derive(Default)]
pub(crate) struct Pool {
    idle_h1: Mutex<Vec<h1::Connection>>,
    /// Wakes the longest-waiting request under the `max_connections` circuit breaker when a
    /// connection goes back to the idle list or closes.
    released: tokio::sync::Notify,
    /// How many requests wait on `released`: a release with none waiting (every response,
    /// normally) touches nothing else.
    waiting: AtomicUsize,
    h2: ArcSwapOption<H2Connection>,
    h2_connecting: tokio::sync::Mutex<()>,
    /// The host left its cluster (or the cluster went away): connections are no longer kept.
    retired: std::sync::atomic::AtomicBool,
    /// `auto_config`: the protocol the host's first TLS handshake chose (0: not yet, 1:
    /// HTTP/1.1, 2: HTTP/2).
    negotiated: std::sync::atomic::AtomicU8,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

impl Pool {
    /// Tells one request waiting for a connection that one came free, if any waits. A waiter
    /// counts itself before it looks at the idle list (under its lock), so a release either
    /// is seen by its look or sees its count.
    fn wake_a_waiter(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.released.notify_one();
        }
    }

    /// The host left its cluster: closes its idle connections now, and those in use when
    /// their response ends (an idle connection holds its host, so keeping one would keep the
    /// host, its stats and the socket for ever).
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
        self.idle_h1.lock().expect("pool lock").clear();
        self.h2.store(None);
    }

    /// Whether [`Pool::retire`] was called.
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    pub(crate) fn idle_http1(&self) -> usize {
        self.idle_h1.lock().expect("pool lock").len()
    }
}

/// The upstream host that answered and the address its connection reached, attached to a
/// response when `LbContext::report_host`.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamHost {
    /// The host, named by its endpoint's `address` (`%UPSTREAM_HOST%`).
    pub host: SocketAddr,
    /// The address the connection reached (`%UPSTREAM_REMOTE_ADDRESS%`): the host's own, or
    /// the one Happy Eyeballs connected to among its others.
    pub remote: SocketAddr,
}

/// Opens a connection to `host` (TCP, then TLS when its transport socket asks for it),
/// charging connection stats. A host with several addresses is connected to as Envoy's Happy
/// Eyeballs does (see [`race`]); `connect_timeout` covers the whole of it.
pub(crate) async fn connect(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
) -> Result<(UpstreamIo, ActiveConnection), UpstreamError> {
    if let HostTransport::Refused(reason) = &host.transport {
        host.stats.cx_connect_fail.fetch_add(1, Ordering::Relaxed);
        opts.stats.upstream_cx_connect_fail().inc();
        opts.stats.fail_closed();
        return Err(UpstreamError::TransportRefused {
            host: host.addr,
            reason: reason.clone(),
        });
    }
    host.stats.cx_total.fetch_add(1, Ordering::Relaxed);
    opts.stats.upstream_cx_total().inc();
    let connecting = Ended::after(opts.stats, 1);
    let started = std::time::Instant::now();
    // `connect_timeout` covers the TCP connect and the TLS handshake together, as in Envoy,
    // whose connection counts as connected once its transport socket is.
    let deadline = tokio::time::Instant::now() + opts.timeout;
    let connected = if host.addresses.is_empty() {
        attempt(host, opts, host.addr, deadline).await
    } else {
        // Boxed: rare, and its state would otherwise enlarge every connect.
        Box::pin(race(host, opts, deadline)).await
    };
    let (stream, local, remote) = match connected {
        Ok(c) => c,
        Err(e) => {
            if let UpstreamError::ConnectTimeout { .. } = e {
                opts.stats.upstream_cx_connect_timeout().inc();
            }
            host.stats.cx_connect_fail.fetch_add(1, Ordering::Relaxed);
            opts.stats.upstream_cx_connect_fail().inc();
            return Err(e);
        }
    };
    connecting.defuse();
    host.stats.cx_active.fetch_add(1, Ordering::Relaxed);
    opts.stats.upstream_cx_active().inc();
    let opened = std::time::Instant::now();
    let connect_ms = opened.duration_since(started).as_millis() as u64;
    opts.stats.cx_connect_ms().record(connect_ms);
    let mut active = ActiveConnection {
        host: host.clone(),
        stats: opts.stats.clone(),
        opened,
        requests: Requests::Own(0),
        local,
        remote,
        sans: None,
    };
    if let UpstreamIo::Tls(_) = &stream {
        active.sans = Some(Arc::new(UpstreamSans {
            peer: stream.peer_uri_san(),
            local: active.local_uri_san(),
        }));
    }
    Ok((stream, active))
}

/// How long Happy Eyeballs waits for an attempt before starting the next (Envoy's 300 ms).
const NEXT_ATTEMPT_DELAY: Duration = Duration::from_millis(300);

/// A connected socket, its local address and the address it reached.
type Connected = (UpstreamIo, Option<SocketAddr>, SocketAddr);

/// Connects to a host with several addresses as Envoy's Happy Eyeballs: one attempt per
/// address in [`Host::addresses`] order, the next starting 300 ms after the last began, or at
/// once when an attempt fails; the first connected (TLS included) wins and the others are
/// closed. Every attempt after the first counts in `cx_total` as in Envoy. When all fail, the
/// last failure is the connection's.
async fn race(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
    deadline: tokio::time::Instant,
) -> Result<Connected, UpstreamError> {
    let addresses = &host.addresses;
    let start = |addr| Box::pin(attempt(host, opts, addr, deadline));
    let mut running = Vec::with_capacity(addresses.len());
    running.push(start(addresses[0]));
    // The attempts after the first end here whichever wins (the caller counts one).
    let mut others = Ended::after(opts.stats, 0);
    let mut next = 1;
    let timer = tokio::time::sleep(NEXT_ATTEMPT_DELAY);
    tokio::pin!(timer);
    let mut last_error = None;
    std::future::poll_fn(|cx| {
        loop {
            // Whether the next address is due: its timer fired, or an attempt failed.
            let mut due = next < addresses.len() && timer.as_mut().poll(cx).is_ready();
            let mut i = 0;
            while !due && i < running.len() {
                match running[i].as_mut().poll(cx) {
                    Poll::Pending => i += 1,
                    Poll::Ready(Ok(connected)) => return Poll::Ready(Ok(connected)),
                    Poll::Ready(Err(e)) => {
                        drop(running.remove(i));
                        last_error = Some(e);
                        due = next < addresses.len();
                    }
                }
            }
            if due {
                host.stats.cx_total.fetch_add(1, Ordering::Relaxed);
                opts.stats.upstream_cx_total().inc();
                others.add();
                running.push(start(addresses[next]));
                next += 1;
                timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + NEXT_ATTEMPT_DELAY);
                // Polls the new attempt, the others and the re-armed timer again.
                continue;
            }
            if running.is_empty()
                && let Some(e) = last_error.take()
            {
                return Poll::Ready(Err(e));
            }
            return Poll::Pending;
        }
    })
    .await
}

/// One connection attempt to `addr`, one of `host`'s addresses: TCP from the cluster's source
/// address for its IP version, then TLS when the host's transport asks for it, by `deadline`.
/// Failures name the host by its own address.
async fn attempt(
    host: &Host,
    opts: ConnectOptions<'_>,
    addr: SocketAddr,
    deadline: tokio::time::Instant,
) -> Result<Connected, UpstreamError> {
    let name = host.addr;
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|source| UpstreamError::ConnectFailure { host: name, source })?;
    if let Some(src) = opts.source.for_host(addr) {
        socket
            .bind(src)
            .map_err(|source| UpstreamError::BindFailure {
                host: name,
                source_address: src,
                source,
            })?;
    }
    let stream = match tokio::time::timeout_at(deadline, socket.connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(source)) => return Err(UpstreamError::ConnectFailure { host: name, source }),
        Err(_) => return Err(UpstreamError::ConnectTimeout { host: name }),
    };
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().ok();
    let stream = match &host.transport {
        HostTransport::Tls(tls) if !tls.may_handshake() => {
            drop(stream);
            return Err(UpstreamError::SecretsNotReady { host: name });
        }
        HostTransport::Tls(tls) => {
            let server_name = host.server_name.as_deref().cloned();
            match tokio::time::timeout_at(
                deadline,
                handshake(
                    tls,
                    opts.carries,
                    host.alpn.as_ref(),
                    stream,
                    addr,
                    server_name,
                ),
            )
            .await
            {
                Ok(Ok(s)) => UpstreamIo::Tls(Box::new(s)),
                Ok(Err(UpstreamError::TlsFailure { reason, .. })) => {
                    return Err(UpstreamError::TlsFailure { host: name, reason });
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(UpstreamError::ConnectTimeout { host: name }),
            }
        }
        _ => UpstreamIo::Plain(stream),
    };
    Ok((stream, local, addr))
}

/// The TLS handshake on a connected socket, under `server_name` (else the context's) and
/// offering `alpn` (else the context's list for what it carries), counted in the cluster's
/// `ssl.*` stats.
async fn handshake(
    tls: &ClientContext,
    carries: Carries,
    alpn: Option<&AlpnList>,
    stream: TcpStream,
    addr: SocketAddr,
    server_name: Option<ServerName<'static>>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, UpstreamError> {
    let config = match alpn {
        Some(alpn) => tls.config_offering(alpn),
        None => tls.config(carries),
    };
    let connector = tokio_rustls::TlsConnector::from(config);
    let name = server_name.unwrap_or_else(|| tls.server_name(addr));
    match connector.connect(name, stream).await {
        Ok(s) => {
            tls.stats.handshake_done(s.get_ref().1);
            Ok(s)
        }
        Err(e) => {
            tls.stats.handshake_failed(&e);
            Err(UpstreamError::TlsFailure {
                host: addr,
                reason: crate::tls::failure_reason(&e),
            })
        }
    }
}

/// Sends `req` over a pooled HTTP/1.1 connection (reusing an idle one when possible).
pub(crate) async fn send_h1(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
    req: Request<Body>,
) -> Result<Response<UpstreamBody>, UpstreamError> {
    let mut req = to_h1(req);
    loop {
        let (conn, reused) = match take_idle(host, opts.idle_timeout) {
            Some(conn) => (conn, true),
            // Boxed: connection setup is rare, and inline it would enlarge every request's
            // future (which tokio and hyper move around) by its state.
            None => Box::pin(wait_for_h1(host, opts)).await?,
        };
        if let Some(t) = opts.target {
            t.note(host.addr, conn.remote(), conn.local(), conn.sans());
        }
        let release = h1::Release {
            host: host.clone(),
            max_requests: opts.max_requests,
        };
        // Boxed: the exchange's state would otherwise sit in every request's future, HTTP/2
        // streams included, which tokio and hyper move by value.
        let meter = opts.target.cloned();
        match crate::spawn::boxed(|| {
            h1::exchange(conn, req, reused, release, opts.http1_trailers, meter)
        })
        .await
        {
            Ok(resp) => return Ok(resp.map(UpstreamBody::http1)),
            // A reused connection closed before the request was written: use another.
            Err(h1::Failed {
                unsent: Some(r), ..
            }) => req = r,
            Err(failed) => return Err(failed.error),
        }
    }
}

/// A connection for a request that found none idle: a new one, or, while the cluster has
/// `max_connections` open, the next one its host releases (waiters are served in arrival
/// order). The request is pending meanwhile; it overflows when `max_pending_requests` are
/// pending already. As in Envoy, `upstream_cx_overflow` counts each time a connection was
/// wanted but not allowed: when the request starts waiting, and when a released connection
/// goes to it while others still wait. Returns the connection and whether it was used before.
async fn wait_for_h1(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
) -> Result<(h1::Connection, bool), UpstreamError> {
    let _pending = Pending::enter(&opts)?;
    let _waiting = Waiting::count(host.pool());
    let stats = opts.stats;
    let at_limit = || stats.upstream_cx_active().value() >= u64::from(opts.max_connections);
    let mut waited = false;
    loop {
        let released = host.pool().released.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        if let Some(conn) = take_idle(host, opts.idle_timeout) {
            if waited && stats.upstream_rq_pending_active().value() > 1 && at_limit() {
                stats.upstream_cx_overflow().inc();
            }
            return Ok((conn, true));
        }
        if at_limit() {
            close_idle_elsewhere(host);
        }
        // As in Envoy, a host with no connection at all gets one even at the limit (counted as
        // an overflow): otherwise it could wait for a release that never comes.
        let none_here = host.stats.cx_active.load(Ordering::Relaxed) == 0;
        if !at_limit() || none_here {
            if at_limit() && !waited {
                stats.upstream_cx_overflow().inc();
            }
            return Ok((connect_h1(host, opts).await?, false));
        }
        if !waited {
            stats.upstream_cx_overflow().inc();
            waited = true;
        }
        released.await;
    }
}

/// Takes the most recently used idle connection this thread opened that is still open and not
/// idle-expired; the others of this thread it meets are closed.
fn take_idle(host: &Host, idle_timeout: Option<Duration>) -> Option<h1::Connection> {
    let here = this_thread();
    let mut idle = host.pool().idle_h1.lock().expect("pool lock");
    while let Some(i) = idle.iter().rposition(|c| c.thread == here) {
        let mut conn = idle.remove(i);
        let expired = idle_timeout.is_some_and(|t| conn.since.elapsed() >= t);
        if !expired && !conn.is_closed() {
            return Some(conn);
        }
    }
    None
}

/// Closes the least recently used idle connection another thread opened, if any: room under
/// `max_connections` for one this thread can use.
fn close_idle_elsewhere(host: &Host) {
    let here = this_thread();
    let closed = {
        let mut idle = host.pool().idle_h1.lock().expect("pool lock");
        let oldest = idle.iter().position(|c| c.thread != here);
        oldest.map(|i| idle.remove(i))
    };
    drop(closed);
}

/// The calling thread's number, given at its first call: which runtime's sockets a pooled
/// connection can be served on (each worker is a thread with a runtime of its own).
pub(super) fn this_thread() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static THREAD: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    THREAD.with(|t| *t)
}

/// Puts a connection whose response ended back in its host's pool, unless it carried
/// `max_requests` already.
pub(super) fn release_h1(host: &Host, mut conn: h1::Connection, max_requests: Option<u32>) {
    if max_requests.is_some_and(|m| conn.requests() >= m)
        || host.pool().retired.load(Ordering::Relaxed)
    {
        return;
    }
    conn.since = Instant::now();
    host.pool().idle_h1.lock().expect("pool lock").push(conn);
    host.pool().wake_a_waiter();
}

async fn connect_h1(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
) -> Result<h1::Connection, UpstreamError> {
    let (stream, active) = connect(host, opts).await?;
    opts.stats.upstream_cx_http1_total().inc();
    Ok(h1::Connection::new(stream, active))
}

/// Sends `req` on the host's HTTP/2 connection, opening (or replacing a closed) one first.
pub(crate) async fn send_h2(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
    req: Request<Body>,
) -> Result<Response<UpstreamBody>, UpstreamError> {
    // Envoy's codec ends the body of an HTTP/1 client's request in a DATA frame of its own.
    let end_apart = req.version() < Version::HTTP_2;
    let host_at = opts
        .target
        .and_then(|_| req.headers().keys().position(|k| k == HOST));
    let mut req = to_h2(req, host.addr);
    let mut fresh_tried = false;
    let mut metered = false;
    loop {
        let (mut sender, requests, (local, remote, sans), fresh, tables) =
            h2_sender(host, opts).await?;
        fresh_tried |= fresh;
        let meter = opts.target.map(|t| {
            t.note(host.addr, remote, local, sans.as_ref());
            H2Meter::new(t.clone(), tables)
        });
        if sender.ready().await.is_err() {
            host.pool().h2.store(None);
            if fresh_tried {
                return Err(UpstreamError::Reset {
                    host: host.addr,
                    reason: ResetReason::ConnectionTermination,
                    detail: "http2 connection closed".into(),
                });
            }
            continue;
        }
        if let Some(m) = meter.as_ref().filter(|_| !metered) {
            req = m.send(req, end_apart, host_at);
            metered = true;
        }
        match sender.try_send_request(req).await {
            Ok(resp) if let Some(reason) = head_refusal(&resp) => {
                requests.fetch_add(1, Ordering::Relaxed);
                // Dropped: the stream is reset.
                return Err(UpstreamError::Reset {
                    host: host.addr,
                    reason,
                    detail: "response headers over Envoy's limits".into(),
                });
            }
            Ok(resp) => {
                requests.fetch_add(1, Ordering::Relaxed);
                if let Some(m) = &meter {
                    m.received_head(resp.status(), resp.headers());
                }
                return Ok(resp.map(|b| UpstreamBody::http2(b, meter)));
            }
            Err(mut e) => match e.take_message() {
                // The connection went away (GOAWAY/close) before the stream started.
                Some(r) if !fresh_tried => {
                    host.pool().h2.store(None);
                    req = r;
                }
                _ => return Err(UpstreamError::from_hyper(host.addr, e.error())),
            },
        }
    }
}

/// The largest header field Envoy's HTTP/2 client codec decodes: a response with a longer
/// one is a protocol error (Envoy 1.40 takes a 62,000-byte value and refuses a 65,600-byte
/// one).
const MAX_H2_FIELD: usize = 64 * 1024;

/// The response head size Envoy's HTTP/2 client codec takes (`max_response_headers_kb`
/// unset: 60 KiB, names and values with `:status`).
const MAX_H2_HEAD: usize = 60 * 1024;

/// How large a header list revoy's HTTP/2 client lets through to [`head_refusal`], which
/// applies Envoy's limits (h2 refuses a larger one as a protocol error).
const H2_HEADER_LIST: u32 = 1024 * 1024;

/// Why Envoy's codec would refuse an HTTP/2 response head: a header field over
/// [`MAX_H2_FIELD`] is a protocol error; more headers than `max_headers_count` (its
/// `:status` counted) or more than [`MAX_H2_HEAD`] bytes and Envoy's codec resets the
/// stream, which its router reports as the upstream's reset (`UR`, `remote_reset`).
fn head_refusal<B>(resp: &http::Response<B>) -> Option<ResetReason> {
    let headers = resp.headers();
    let mut size = ":status".len() + 3;
    for (name, value) in headers {
        let (n, v) = (name.as_str().len(), value.len());
        if n > MAX_H2_FIELD || v > MAX_H2_FIELD {
            return Some(ResetReason::ProtocolError);
        }
        size += n + v;
    }
    (headers.len() + 1 > crate::wire::MAX_HEADERS || size > MAX_H2_HEAD)
        .then_some(ResetReason::RemoteReset)
}

/// The host's usable HTTP/2 connection: its sender, its stream count, its local address and
/// TLS identities, whether it was opened for this request, and its HPACK tables.
type H2Sender = (
    http2::SendRequest<Body>,
    Arc<std::sync::atomic::AtomicU32>,
    (Option<SocketAddr>, SocketAddr, Option<Arc<UpstreamSans>>),
    bool,
    Arc<H2Tables>,
);

async fn h2_sender(host: &Arc<Host>, opts: ConnectOptions<'_>) -> Result<H2Sender, UpstreamError> {
    let usable = || {
        host.pool()
            .h2
            .load_full()
            .filter(|c| !c.sender.is_closed())
            .map(|c| {
                (
                    c.sender.clone(),
                    c.requests.clone(),
                    (c.local, c.remote, c.sans.clone()),
                    false,
                    c.tables.clone(),
                )
            })
    };
    if let Some(s) = usable() {
        return Ok(s);
    }
    let _pending = Pending::enter(&opts)?;
    // Boxed for the same reason as `wait_for_h1`: rare, and large inline.
    Box::pin(open_h2(host, opts, usable)).await
}

/// Opens the host's HTTP/2 connection, unless another request opened it meanwhile.
async fn open_h2(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
    usable: impl Fn() -> Option<H2Sender>,
) -> Result<H2Sender, UpstreamError> {
    let _connecting = host.pool().h2_connecting.lock().await;
    if let Some(s) = usable() {
        return Ok(s);
    }
    let (stream, active) = connect(host, opts).await?;
    let at = (active.local(), active.remote(), active.sans().cloned());
    let (sender, requests, tables) = start_h2(host, opts, stream, active).await?;
    Ok((sender, requests, at, true, tables))
}

/// Starts HTTP/2 on a connected socket and makes it the host's HTTP/2 connection; answers
/// its sender, stream count and HPACK tables.
async fn start_h2(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
    stream: UpstreamIo,
    mut active: ActiveConnection,
) -> Result<
    (
        http2::SendRequest<Body>,
        Arc<std::sync::atomic::AtomicU32>,
        Arc<H2Tables>,
    ),
    UpstreamError,
> {
    opts.stats.upstream_cx_http2_total().inc();
    let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
    active.requests = Requests::Shared(requests.clone());
    let (sender, conn) = http2::Builder::new(crate::spawn::Executor)
        .max_header_list_size(H2_HEADER_LIST)
        .handshake::<_, Body>(TokioIo::new(stream))
        .await
        .map_err(|e| UpstreamError::from_hyper(host.addr, &e))?;
    let local = active.local();
    let remote = active.remote();
    let sans = active.sans().cloned();
    tokio::spawn(async move {
        let _ = conn.await;
        drop(active);
    });
    let tables = Arc::new(H2Tables::default());
    host.pool().h2.store(Some(Arc::new(H2Connection {
        sender: sender.clone(),
        requests: requests.clone(),
        local,
        remote,
        sans,
        tables: tables.clone(),
    })));
    Ok((sender, requests, tables))
}

/// Sends `req` over HTTP/2 or HTTP/1.1 as the host's TLS handshake decides (`auto_config`:
/// ALPN `h2` or `http/1.1`; a plaintext host speaks HTTP/1.1). The first connection to the
/// host decides for the ones after it.
pub(crate) async fn send_auto(
    host: &Arc<Host>,
    opts: ConnectOptions<'_>,
    req: Request<Body>,
) -> Result<Response<UpstreamBody>, UpstreamError> {
    const UNKNOWN: u8 = 0;
    const HTTP1: u8 = 1;
    const HTTP2: u8 = 2;
    match host.pool().negotiated.load(Ordering::Relaxed) {
        HTTP2 => return send_h2(host, opts, req).await,
        HTTP1 => return send_h1(host, opts, req).await,
        _ if !matches!(host.transport, HostTransport::Tls(_)) => {
            host.pool().negotiated.store(HTTP1, Ordering::Relaxed);
            return send_h1(host, opts, req).await;
        }
        _ => {}
    }
    let (stream, active) = Box::pin(connect(host, opts)).await?;
    if stream.alpn() == Some(b"h2") {
        host.pool().negotiated.store(HTTP2, Ordering::Relaxed);
        Box::pin(start_h2(host, opts, stream, active)).await?;
        send_h2(host, opts, req).await
    } else {
        if host.pool().negotiated.load(Ordering::Relaxed) == UNKNOWN {
            host.pool().negotiated.store(HTTP1, Ordering::Relaxed);
        }
        opts.stats.upstream_cx_http1_total().inc();
        release_h1(host, h1::Connection::new(stream, active), opts.max_requests);
        send_h1(host, opts, req).await
    }
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
    crate::wire::strip_hop_by_hop(req.headers_mut());
    *req.version_mut() = Version::HTTP_2;
    req
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{CONNECTION, TE};
    use http_body_util::BodyExt;
    use std::io::{BufRead, BufReader, Write};

    /// A keep-alive HTTP/1.1 server on loopback answering every request 200 with no body; how
    /// many connections it accepted.
    fn keep_alive_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut writer = conn;
                    let mut line = String::new();
                    while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                        if line == "\r\n" {
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                            if writer.write_all(ok).is_err() {
                                return;
                            }
                        }
                        line.clear();
                    }
                });
            }
        });
        (addr, accepted)
    }

    /// A runtime of the calling thread's own, as a worker's.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// One GET to `host` on `rt` (the calling thread's), its (empty) body read to the end so
    /// the connection goes back to the pool.
    fn get(
        rt: &tokio::runtime::Runtime,
        host: &Arc<Host>,
        stats: &Arc<ClusterStats>,
        max_connections: u32,
    ) {
        let opts = ConnectOptions {
            timeout: Duration::from_secs(5),
            source: &SourceAddresses::NONE,
            idle_timeout: None,
            max_requests: None,
            http1_trailers: false,
            max_connections,
            max_pending_requests: 1024,
            stats,
            carries: Carries::Http1,
            target: None,
        };
        // A connection another thread's runtime serves never turns readable here: the bound
        // makes that a failure rather than a hang.
        let exchange = async {
            let req = Request::get("/").body(crate::body::empty()).unwrap();
            let resp = send_h1(host, opts, req).await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap();
        };
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), exchange).await })
            .expect("the upstream's answer read on this thread");
    }

    fn loopback_host(addr: SocketAddr) -> Arc<Host> {
        Arc::new(Host::new(
            addr,
            String::new(),
            1,
            0,
            Arc::default(),
            crate::config::cluster::HealthStatus::Healthy,
        ))
    }

    #[test]
    fn an_idle_connection_is_reused_only_by_the_thread_that_opened_it() {
        let (addr, accepted) = keep_alive_upstream();
        let host = loopback_host(addr);
        let stats = Arc::new(ClusterStats::new(&crate::stats::Store::new(), "web"));
        let rt = runtime();
        get(&rt, &host, &stats, 1024);
        get(&rt, &host, &stats, 1024);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "reused on its own thread"
        );
        let (h, s) = (host.clone(), stats.clone());
        std::thread::spawn(move || get(&runtime(), &h, &s, 1024))
            .join()
            .unwrap();
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "another thread opens its own"
        );
        assert_eq!(host.pool().idle_http1(), 2);
        get(&rt, &host, &stats, 1024);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "still reused on the first thread"
        );
    }

    #[test]
    fn at_max_connections_another_threads_idle_connection_makes_room() {
        let (addr, accepted) = keep_alive_upstream();
        let host = loopback_host(addr);
        let stats = Arc::new(ClusterStats::new(&crate::stats::Store::new(), "web"));
        get(&runtime(), &host, &stats, 1);
        let (h, s) = (host.clone(), stats.clone());
        std::thread::spawn(move || get(&runtime(), &h, &s, 1))
            .join()
            .unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(host.pool().idle_http1(), 1, "the first thread's was closed");
        assert_eq!(stats.upstream_cx_active().value(), 1);
        assert_eq!(stats.upstream_cx_overflow().value(), 0);
    }

    #[test]
    fn a_host_whose_first_addresses_refuse_is_reached_at_the_next() {
        let (live, accepted) = keep_alive_upstream();
        let closed_port = || {
            let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            refused.local_addr().unwrap()
        };
        let (closed, also_closed) = (closed_port(), closed_port());
        let host = Arc::new(
            Host::new(
                closed,
                String::new(),
                1,
                0,
                Arc::default(),
                crate::config::cluster::HealthStatus::Healthy,
            )
            .with_addresses(vec![closed, also_closed, live].into()),
        );
        let stats = Arc::new(ClusterStats::new(&crate::stats::Store::new(), "web"));
        get(&runtime(), &host, &stats, 1024);
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // Three attempts, one connection, no failure: as Envoy counts a Happy Eyeballs connect.
        assert_eq!(host.stats.cx_total.load(Ordering::Relaxed), 3);
        assert_eq!(stats.upstream_cx_total().value(), 3);
        assert_eq!(host.stats.cx_connect_fail.load(Ordering::Relaxed), 0);
        assert_eq!(stats.upstream_cx_active().value(), 1);
    }

    #[test]
    fn h1_requests_are_origin_form_with_host() {
        let req = Request::get("http://example.com:8080/a?b=1")
            .body(crate::body::empty())
            .unwrap();
        let req = to_h1(req);
        assert_eq!(req.uri(), "/a?b=1");
        assert_eq!(req.headers()[HOST], "example.com:8080");
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
