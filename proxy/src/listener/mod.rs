//! Accept loops: bind a listener's socket, run its listener filters, pick the filter chain and
//! hand the connection to the chain's terminal filter (HTTP connection manager or tcp_proxy).

mod active;
mod http_inspect;
mod inspect;
mod limits;
mod original_dst;
mod slot;

pub use active::ActiveListeners;
#[cfg(fuzzing)]
pub(crate) use inspect::inspect_for_fuzzing;
pub use inspect::parse_client_hello;
pub use original_dst::original_dst;
pub use slot::{Slot, accept_loop};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::Acceptor;
use tokio::net::TcpStream;
use tokio_rustls::{LazyConfigAcceptor, TlsAcceptor};

use crate::config::filter_chain_match::{self, ConnectionFacts};
use crate::config::filter_disabled::runs;
use crate::config::listener::{ChainConfig, ListenAddress, ListenerConfig, Terminal};
use crate::http::{self, ConnContext, Hcm, forwarding::Downstream};
use crate::rbac::network::{self as network_rbac, NetworkRbac};
use crate::shared::Shared;
use crate::stats::{self, Block, Connections, Counter, Gauge, Store};
use crate::tls::stats::TlsStats;
use crate::tls::{ContextCertificates, PeerTls, SecretStore, ServerStream};
use crate::upstream::LbContext;

/// How long a TLS client may take to finish its handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The runtime side of one filter chain, shared by the listener generations whose chain is
/// unchanged (same `FilterChain` proto), so an update leaves its connections alone.
struct Chain {
    /// [`ChainConfig::fingerprint`] and [`ChainConfig::refused`]: what makes two chains the same.
    identity: (u64, Option<Arc<str>>),
    /// The network filters that may close a new connection before `kind` sees it.
    limits: limits::NetworkLimiters,
    kind: ChainKind,
    /// Its network RBAC filters, run on each connection before the terminal filter.
    rbac: Box<[NetworkRbac]>,
    /// Its `istio.metadata_exchange` filter (for a TCP proxy's connections).
    metadata_exchange: Option<Arc<crate::config::istio::metadata_exchange::TcpExchange>>,
    /// Its `istio.stats` network filter (for a TCP proxy's connections).
    istio_stats: Option<Arc<crate::config::istio::stats::IstioStatsConfig>>,
}

/// A chain's TLS termination: its context (the rustls configurations, whose resolvers read
/// the live secrets, and what it presents and trusts, for `/certs`) and the listener's
/// `ssl.*` stats.
struct Tls {
    context: crate::tls::ServerContext,
    stats: TlsStats,
    /// The chain has Istio's `istio_authn` filter.
    istio_authn: bool,
}

impl Tls {
    /// Completes the handshake of `stream` within [`TLS_HANDSHAKE_TIMEOUT`], counting it.
    async fn accept(&self, stream: TcpStream, peer: SocketAddr) -> Option<ServerStream> {
        let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, self.handshake(stream));
        self.finish(handshake.await, peer)
    }

    /// The handshake itself: with the chain's ALPN when the client's offer shares a protocol
    /// with it (or offers none), else without ALPN.
    async fn handshake(
        &self,
        stream: TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        let sessions = &self.context.sessions().value;
        let Some(without_alpn) = &sessions.without_alpn else {
            return TlsAcceptor::from(sessions.config.clone())
                .accept(stream)
                .await;
        };
        let start = LazyConfigAcceptor::new(Acceptor::default(), stream).await?;
        let ours = &sessions.config.alpn_protocols;
        let shares_one = start
            .client_hello()
            .alpn()
            .is_none_or(|mut offered| offered.any(|p| ours.iter().any(|o| o == p)));
        let config = if shares_one {
            &sessions.config
        } else {
            without_alpn
        };
        start.into_stream(config.clone()).await
    }

    /// [`Tls::accept`], also returning the connection's certificates (the client's chain and
    /// the one presented to it) for the connection manager's request rules.
    async fn accept_recording(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> Option<(ServerStream, PeerTls)> {
        let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, self.handshake(stream));
        let (outcome, presented) = crate::tls::certs::recording_pick(handshake).await;
        let stream = self.finish(outcome, peer)?;
        let certificates = PeerTls::new(stream.get_ref().1.peer_certificates(), presented)
            .with_istio_authn(self.istio_authn);
        Some((stream, certificates))
    }

    /// Counts a handshake's outcome; the stream when it completed.
    fn finish(
        &self,
        outcome: Result<
            std::io::Result<tokio_rustls::server::TlsStream<TcpStream>>,
            tokio::time::error::Elapsed,
        >,
        peer: SocketAddr,
    ) -> Option<ServerStream> {
        match outcome {
            Ok(Ok(s)) => {
                self.stats.handshake_done(s.get_ref().1);
                Some(Box::new(s))
            }
            Ok(Err(e)) => {
                self.stats.handshake_failed(&e);
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        }
    }
}

enum ChainKind {
    Http(Arc<Hcm>, Option<Tls>),
    Tcp(Arc<crate::tcp::TcpProxy>, Option<Tls>),
    /// Every connection is closed at once: the chain needs a feature revoy does not
    /// implement and must not skip (see [`ChainConfig::refused`]).
    Refused,
}

impl ChainKind {
    /// Counts a connection a limiting network filter closed in the terminal filter's
    /// connection total, as Envoy does (its filters are made for every connection of the
    /// chain, before any of them runs).
    fn count_refused(&self) {
        match self {
            ChainKind::Http(hcm, _) => drop(hcm.stats.open()),
            ChainKind::Tcp(proxy, _) => proxy.count_refused(),
            ChainKind::Refused => {}
        }
    }
}

impl Chain {
    /// The chain was changed or removed by a listener update: its HTTP connections start
    /// their drain at a response (per `--drain-strategy`), and whatever is left of them (idle
    /// ones too) and its TCP connections close after `drain_time`, as in Envoy.
    fn drain(&self, drain_time: Duration) {
        match &self.kind {
            ChainKind::Http(hcm, _) => hcm.retirement.start(drain_time),
            ChainKind::Tcp(proxy, _) => proxy.retire(drain_time),
            ChainKind::Refused => {}
        }
    }
}

/// A socket counted in its listener's `downstream_pre_cx_active` until dropped, when its
/// listener filters have finished (or it was closed).
struct PreConnection<'a>(&'a Gauge);

impl<'a> PreConnection<'a> {
    fn new(active: &'a Gauge) -> Self {
        active.inc();
        PreConnection(active)
    }
}

impl Drop for PreConnection<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A listener with its chains' runtime state and stats handles.
pub struct Listener {
    config: Arc<ListenerConfig>,
    chains: Vec<Arc<Chain>>,
    default_chain: Option<Arc<Chain>>,
    cx: Connections,
    cx_destroy: Counter,
    no_filter_chain: Counter,
    /// `downstream_pre_cx_timeout`: connections closed (or let through) when the listener
    /// filters' timeout passed.
    pre_cx_timeout: Counter,
    /// `downstream_listener_filter_remote_close`: connections the client closed while the
    /// listener filters waited for bytes.
    listener_filter_remote_close: Counter,
    /// `downstream_pre_cx_active`: sockets whose inspecting listener filters are running.
    pre_cx_active: Gauge,
    /// Its TLS and HTTP inspectors' stats.
    inspectors: inspect::InspectorStats,
    /// `downstream_cx_fail_closed` (revoy's own), when some chain refuses its connections.
    fail_closed: Option<Counter>,
    /// Its `envoy.filters.listener.local_ratelimit`.
    rate_limit: Option<limits::ListenerRateLimiter>,
    /// Holds the listener's [`ZEROS`].
    _zeros: Block,
}

/// `listener.<address>.*` stats Envoy lists for every listener that stay 0 in revoy, which
/// never has their events: no overload manager (its connection rejections and global
/// limit), no per-listener connection limit from the runtime, no
/// `transport_socket_connect_timeout`.
static ZEROS: [stats::Slot; 4] = [
    stats::Slot::counter("downstream_cx_overflow"),
    stats::Slot::counter("downstream_cx_overload_reject"),
    stats::Slot::counter("downstream_cx_transport_socket_connect_timeout"),
    stats::Slot::counter("downstream_global_cx_overflow"),
];

impl Listener {
    /// Prepares a compiled listener for serving (resolves stats handles). Chains unchanged
    /// from `previous` (the listener it replaces) are kept with their state, unless the
    /// listener's stats name changed (its address or `stat_prefix`): a chain counts into its
    /// listener's scope (`listener.<address>.http.<prefix>.*`, TLS), and Envoy replaces such
    /// a listener whole; new rate limits with a `share_key` take their bucket from `buckets`.
    pub fn new(
        config: Arc<ListenerConfig>,
        stats: &Store,
        secrets: &SecretStore,
        buckets: &crate::limits::SharedBuckets,
        previous: Option<&Listener>,
    ) -> Self {
        let prefix = config.stat_prefix();
        let previous = previous.filter(|p| p.config().stats_name == config.stats_name);
        let tls = |c: &ChainConfig| {
            let spec = c.tls.as_ref()?;
            let stats = TlsStats::new(stats, &format!("{prefix}."));
            let context = crate::tls::server_context(spec, secrets, stats.clone())?;
            Some(Tls {
                context,
                stats,
                istio_authn: c.istio_authn,
            })
        };
        let chain = |c: &ChainConfig| -> Arc<Chain> {
            let identity = (c.fingerprint, c.refused.clone());
            if let Some(kept) = previous.and_then(|p| p.chain_by_identity(&identity)) {
                return kept;
            }
            let kind = if let Some(why) = &c.refused {
                tracing::warn!(
                    listener = %config.name, chain = %c.name,
                    "{why}; connections on this chain are refused"
                );
                ChainKind::Refused
            } else {
                match &c.terminal {
                    Terminal::Http(h) => {
                        ChainKind::Http(Arc::new(Hcm::new(h.clone(), stats, &prefix)), tls(c))
                    }
                    Terminal::Tcp(t) => ChainKind::Tcp(
                        Arc::new(crate::tcp::TcpProxy::new((**t).clone(), stats)),
                        tls(c),
                    ),
                }
            };
            let limits = limits::NetworkLimiters::new(&c.limits, stats, buckets);
            let rbac = c
                .rbac
                .iter()
                .map(|r| NetworkRbac::new(r.clone(), stats))
                .collect();
            Arc::new(Chain {
                identity,
                limits,
                kind,
                rbac,
                metadata_exchange: c.metadata_exchange.clone(),
                istio_stats: c.istio_stats.clone(),
            })
        };
        Listener {
            chains: config.chains.iter().map(chain).collect(),
            default_chain: config.default_chain.as_ref().map(chain),
            cx: Connections::timed(stats, &prefix),
            _zeros: stats.block_with_zeros(&format!("{prefix}."), &[], &ZEROS),
            cx_destroy: stats.counter(&format!("{prefix}.downstream_cx_destroy")),
            no_filter_chain: stats.counter(&format!("{prefix}.no_filter_chain_match")),
            pre_cx_timeout: stats.counter(&format!("{prefix}.downstream_pre_cx_timeout")),
            listener_filter_remote_close: stats
                .counter(&format!("{prefix}.downstream_listener_filter_remote_close")),
            pre_cx_active: stats.gauge(&format!("{prefix}.downstream_pre_cx_active")),
            inspectors: inspect::InspectorStats::new(
                stats,
                config.filters.tls_inspector,
                config.filters.http_inspector,
            ),
            fail_closed: config
                .chains
                .iter()
                .chain(&config.default_chain)
                .any(|c| c.refused.is_some())
                .then(|| stats.counter(&format!("{prefix}.downstream_cx_fail_closed"))),
            rate_limit: config
                .filters
                .rate_limit
                .as_ref()
                .map(|r| limits::ListenerRateLimiter::new(r, stats)),
            config,
        }
    }

    /// The compiled configuration.
    pub fn config(&self) -> &Arc<ListenerConfig> {
        &self.config
    }

    fn chains(&self) -> impl Iterator<Item = &Arc<Chain>> {
        self.chains.iter().chain(&self.default_chain)
    }

    /// The TLS contexts of the chains that terminate TLS, in chain order (the default chain
    /// last), for `/certs`.
    pub fn tls_contexts(&self) -> impl Iterator<Item = &ContextCertificates> {
        self.chains().filter_map(|c| match &c.kind {
            ChainKind::Http(_, Some(tls)) | ChainKind::Tcp(_, Some(tls)) => {
                Some(&tls.context.certificates)
            }
            _ => None,
        })
    }

    fn chain_by_identity(&self, identity: &(u64, Option<Arc<str>>)) -> Option<Arc<Chain>> {
        self.chains().find(|c| &c.identity == identity).cloned()
    }

    /// Drains every chain that `next` (the listener replacing this one, if any) does not
    /// keep: HTTP connections start their drain at a response, and every connection left
    /// (HTTP or TCP) closes after `drain_time`.
    pub fn retire(&self, next: Option<&Listener>, drain_time: Duration) {
        for c in self.chains() {
            let kept = next.is_some_and(|n| n.chains().any(|k| Arc::ptr_eq(k, c)));
            if !kept {
                c.drain(drain_time);
            }
        }
    }

    /// Binds one of the listener's addresses with its transparency ([`bind_socket`]), not
    /// listening yet: see [`listen`].
    pub fn bind(&self, address: ListenAddress) -> std::io::Result<socket2::Socket> {
        bind_socket(address, self.config.transparent)
    }

    /// Serves one accepted connection; `bound_local`: its local address when the accepting
    /// socket is bound to one address (else it is asked of the socket); `listeners`: those a
    /// `use_original_dst` hand-off picks from; `worker`: the accepting worker's listener stats.
    pub(crate) async fn serve(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        bound_local: Option<SocketAddr>,
        shared: Arc<Shared>,
        listeners: Arc<ActiveListeners>,
        worker: Connections,
    ) {
        // No TCP_NODELAY here: an accepted socket inherits it from the listening socket
        // (`bind` sets it), one setsockopt(2) fewer per connection.
        let local = match bound_local {
            Some(local) => local,
            None => stream.local_addr().unwrap_or(self.config.address),
        };
        let f = &self.config.filters;
        let original_dst_runs =
            f.original_dst && runs(f.disabled.original_dst.as_ref(), local.port());
        let original = (original_dst_runs || self.config.use_original_dst)
            .then(|| original_dst(&stream, local))
            .flatten();
        if self.config.use_original_dst
            && let Some(to) = original.filter(|o| *o != local)
        {
            let listeners = listeners.load_full();
            if let Some(target) = handoff_target(&listeners, to, self) {
                // The accepting listener's filters run before the hand-off, as in Envoy.
                if self.rate_limited(to.port(), &shared) {
                    return;
                }
                return target
                    .serve_on(stream, peer, &shared, None, local, original)
                    .await;
            }
        }
        self.serve_on(stream, peer, &shared, Some(&worker), local, original)
            .await
    }

    /// Whether the listener's `local_ratelimit` (when it runs for `port`) refuses the socket.
    fn rate_limited(&self, port: u16, shared: &Shared) -> bool {
        let disabled = self.config.filters.disabled.rate_limit.as_ref();
        self.rate_limit
            .as_ref()
            .is_some_and(|r| runs(disabled, port) && !r.admit(&shared.runtime))
    }

    /// Writes the listener's access logs for a connection no filter chain took (`NR`).
    fn log_unmatched(&self, peer: SocketAddr, local: SocketAddr, sni: Option<&str>) {
        let logs = &self.config.access_logs;
        if logs.is_empty() {
            return;
        }
        let mut rec = crate::access_log::Record::new(crate::access_log::record::Downstream {
            remote: Some(peer),
            direct_remote: Some(peer),
            local: Some(local),
            server_name: sni.map(Into::into),
            filter_state: None,
        });
        rec.flags.set(crate::access_log::ResponseFlag::NoRouteFound);
        rec.details = Some("filter_chain_not_found".to_owned());
        rec.end = Some(std::time::Instant::now());
        logs.log(&rec);
    }

    /// Serves an accepted connection (`original`: its destination before an iptables
    /// redirect): runs this listener's inspecting filters, picks a chain and hands the
    /// connection to it. `worker`: the per-worker stats of the accepting listener (`None` for a
    /// connection handed off by a `use_original_dst` listener, counted on this listener alone).
    async fn serve_on(
        &self,
        mut stream: TcpStream,
        peer: SocketAddr,
        shared: &Arc<Shared>,
        worker: Option<&Connections>,
        local: SocketAddr,
        original: Option<SocketAddr>,
    ) {
        let destination = original.unwrap_or(local);
        let f = &self.config.filters;
        let rate_limited = || self.rate_limited(destination.port(), shared);
        if f.rate_limit_first && rate_limited() {
            return;
        }
        // The inspectors that run here: configured, and not disabled for the port.
        let port = destination.port();
        let inspectors = (
            f.tls_inspector && runs(f.disabled.tls_inspector.as_ref(), port),
            f.http_inspector && runs(f.disabled.http_inspector.as_ref(), port),
        );
        let needs_peek = inspectors.0 || inspectors.1;
        let plain = || inspect::Inspected {
            transport_protocol: "raw_buffer",
            ..Default::default()
        };
        let inspected = if needs_peek {
            let _inspecting = PreConnection::new(&self.pre_cx_active);
            // Boxed while it runs, as every phase a connection leaves behind: the task is
            // sized for its largest state and kept while the connection lives.
            let inspecting =
                crate::spawn::boxed(|| self.inspectors.inspect(&stream, inspectors, f.timeout));
            match inspecting.await {
                Ok(inspected) => inspected,
                Err(inspect::Unfinished::TimedOut) if f.continue_on_timeout => {
                    self.pre_cx_timeout.inc();
                    // The cut-short wait left the socket's readiness cleared with bytes
                    // waiting: a fresh registration sees them.
                    match stream.into_std().and_then(TcpStream::from_std) {
                        Ok(fresh) => stream = fresh,
                        Err(e) => {
                            tracing::debug!(listener = %self.config.name, %peer, "re-registering after the listener filters' timeout: {e}");
                            return;
                        }
                    }
                    plain()
                }
                Err(unfinished) => {
                    match unfinished {
                        inspect::Unfinished::TimedOut => self.pre_cx_timeout.inc(),
                        inspect::Unfinished::Closed => self.listener_filter_remote_close.inc(),
                        inspect::Unfinished::TooLarge => {}
                    }
                    tracing::debug!(listener = %self.config.name, %peer, ?unfinished, "listener filters unfinished; closing");
                    return;
                }
            }
        } else {
            plain()
        };
        if !f.rate_limit_first && rate_limited() {
            return;
        }
        // In a block: the matching's values are not kept in the connection's future.
        let chain = {
            let facts = ConnectionFacts {
                destination: Some(destination),
                source: Some(peer),
                server_name: inspected.server_name.as_deref(),
                transport_protocol: inspected.transport_protocol,
                application_protocols: &inspected.application_protocols,
            };
            let matchers: Vec<_> = self.config.chains.iter().map(|c| &c.matcher).collect();
            match filter_chain_match::select(&matchers, &facts) {
                Some(i) => &self.chains[i],
                None => match &self.default_chain {
                    Some(c) => c,
                    None => {
                        self.no_filter_chain.inc();
                        self.log_unmatched(peer, destination, inspected.server_name.as_deref());
                        tracing::debug!(listener = %self.config.name, %peer, "no matching filter chain; closing");
                        return;
                    }
                },
            }
        };
        let _open = (self.cx.open(), worker.map(Connections::open));
        let downstream = || crate::access_log::record::Downstream {
            remote: Some(peer),
            direct_remote: Some(peer),
            local: Some(destination),
            server_name: inspected.server_name.as_deref().map(Into::into),
            filter_state: None,
        };
        let Some(_admitted) = chain
            .limits
            .admit(&shared.clusters, &shared.runtime, downstream)
            .await
        else {
            chain.kind.count_refused();
            self.cx_destroy.inc();
            return;
        };
        // Envoy's requested server name: only the tls_inspector sets it, not the handshake.
        let sni = inspected.server_name.as_deref();
        let rbac = RbacGate {
            filters: &chain.rbac,
            local: destination,
            peer,
            sni,
        };
        let plaintext = matches!(
            &chain.kind,
            ChainKind::Http(_, None) | ChainKind::Tcp(_, None)
        );
        let checked = plaintext.then(|| rbac.check(None)).flatten();
        if let Some(denied) = checked.as_ref().filter(|c| !c.allowed()) {
            denied.close(&mut stream).await;
            self.cx_destroy.inc();
            return;
        }
        match &chain.kind {
            ChainKind::Http(hcm, tls) => {
                let accepted = tokio::time::Instant::now();
                let ctx = |tls| ConnContext {
                    hcm: hcm.clone(),
                    shared: shared.clone(),
                    down: Downstream { peer, tls },
                    local: destination,
                    original_dst: original,
                    drain_scope: crate::drain::Scope {
                        inbound: self.config.inbound,
                        modify_only: self.config.drain_modify_only,
                    },
                    rate_limiter: std::sync::OnceLock::new(),
                    wire: hcm.keeps_records().then(Arc::default),
                    limits: http::ConnLimits::new(accepted),
                    codec: http::CodecCounted::default(),
                };
                let serve = async {
                    match tls {
                        None => {
                            if let Some(admitted) = &checked
                                && crate::spawn::boxed(|| first_bytes(&stream)).await
                            {
                                admitted.count();
                            }
                            // Boxed: a TLS connection's task would otherwise keep room for it.
                            crate::spawn::boxed(|| http::serve(stream, Arc::new(ctx(None)))).await
                        }
                        // Boxed: the handshake and a TLS stream are kilobytes, and every
                        // plaintext connection's task would otherwise be sized for them.
                        Some(tls) => {
                            // The handshake and the RBAC filters boxed apart: their state
                            // (kilobytes) and what they leave on the way are freed when they
                            // end instead of sizing the future an established connection keeps.
                            let established = crate::spawn::boxed(|| {
                                establish_tls(tls, stream, peer, &rbac, |peer_tls| {
                                    let peer_tls = peer_tls.with_server_name(sni);
                                    Arc::new(ctx(Some(Arc::new(peer_tls))))
                                })
                            });
                            crate::spawn::boxed(|| serve_tls(established)).await
                        }
                    }
                };
                // A drained chain's connections that are left when its drain time ends are
                // closed, idle ones included (HTTP/2 without a GOAWAY), as Envoy closes them.
                tokio::select! {
                    () = serve => {}
                    () = hcm.retirement.ended() => {
                        tracing::debug!(listener = %self.config.name, %peer, "filter chain drained; connection closed");
                    }
                }
            }
            ChainKind::Refused => {
                if let Some(c) = &self.fail_closed {
                    c.inc();
                }
                tracing::debug!(listener = %self.config.name, %peer, "filter chain fails closed; closing");
            }
            ChainKind::Tcp(proxy, tls) => {
                let lb = LbContext {
                    original_dst: original,
                    ..Default::default()
                };
                let istio = |sans: (String, String)| crate::tcp::exchange::IstioFilters {
                    local: &shared.local_workload,
                    downstream: chain.metadata_exchange.as_deref(),
                    stats: chain.istio_stats.as_deref(),
                    store: &shared.stats,
                    inbound: self.config.inbound,
                    sans,
                };
                // Boxed: an HTTP connection's task would otherwise be sized for a TCP proxy's.
                match tls {
                    None => {
                        let count = checked.as_ref().map(|c| move || c.count());
                        let on_data = count.as_ref().map(|f| f as &(dyn Fn() + Sync));
                        let istio = istio(Default::default());
                        crate::spawn::boxed(|| {
                            proxy.serve(stream, &shared.clusters, lb, sni, on_data, Some(istio))
                        })
                        .await
                    }
                    Some(tls)
                        if !rbac.filters.is_empty()
                            || chain.istio_stats.is_some()
                            || proxy.reads_filter_state() =>
                    {
                        crate::spawn::boxed(|| async {
                            let Some((mut s, peer_tls)) = tls.accept_recording(stream, peer).await
                            else {
                                return;
                            };
                            let checked = rbac.check(Some(&peer_tls));
                            if let Some(checked) = &checked
                                && !checked.allowed()
                            {
                                return checked.close(&mut s).await;
                            }
                            let count = checked.as_ref().map(|c| move || c.count());
                            let on_data = count.as_ref().map(|f| f as &(dyn Fn() + Sync));
                            let sans = (
                                peer_tls
                                    .peer()
                                    .and_then(|c| c.uri_sans().next().map(str::to_owned))
                                    .unwrap_or_default(),
                                peer_tls
                                    .local_uri_sans()
                                    .first()
                                    .cloned()
                                    .unwrap_or_default(),
                            );
                            let filter_state = proxy.reads_filter_state().then(|| {
                                Arc::new(peer_tls) as Arc<dyn crate::filter_state::FilterState>
                            });
                            proxy
                                .serve_tls(
                                    *s,
                                    &shared.clusters,
                                    lb,
                                    sni,
                                    filter_state,
                                    on_data,
                                    Some(istio(sans)),
                                )
                                .await;
                        })
                        .await
                    }
                    Some(tls) => {
                        crate::spawn::boxed(|| async {
                            if let Some(s) = tls.accept(stream, peer).await {
                                let istio = istio(Default::default());
                                proxy
                                    .serve_tls(
                                        *s,
                                        &shared.clusters,
                                        lb,
                                        sni,
                                        None,
                                        None,
                                        Some(istio),
                                    )
                                    .await;
                            }
                        })
                        .await
                    }
                }
            }
        }
        self.cx_destroy.inc();
    }
}

/// The listener a `use_original_dst` listener hands a connection for `to` to, as Envoy finds
/// it: one with exactly that address (its `address` or an additional one), else one with the
/// wildcard address of its family with that port (bound or not); never `from` itself.
fn handoff_target<'l>(
    listeners: &'l [Arc<Listener>],
    to: SocketAddr,
    from: &Listener,
) -> Option<&'l Arc<Listener>> {
    let others = || listeners.iter().filter(|l| !std::ptr::eq(&***l, from));
    let has = |l: &Listener, wanted: &dyn Fn(SocketAddr) -> bool| {
        l.config.addresses().any(|a| wanted(a.address))
    };
    others().find(|l| has(l, &|a| a == to)).or_else(|| {
        others().find(|l| {
            has(l, &|a| {
                a.ip().is_unspecified() && a.port() == to.port() && a.is_ipv4() == to.is_ipv4()
            })
        })
    })
}

/// What a chain's network RBAC filters check a connection against, less its TLS.
struct RbacGate<'a> {
    filters: &'a [NetworkRbac],
    local: SocketAddr,
    peer: SocketAddr,
    sni: Option<&'a str>,
}

impl<'a> RbacGate<'a> {
    /// The chain's network RBAC verdicts on the connection (`tls`: its certificates, on a
    /// TLS chain); `None` when the chain has no such filter.
    fn check(&self, tls: Option<&PeerTls>) -> Option<network_rbac::Checked<'a>> {
        if self.filters.is_empty() {
            return None;
        }
        let facts = crate::rbac::Facts {
            request: None,
            local: self.local,
            source: self.peer.ip(),
            direct_remote: self.peer.ip(),
            remote: self.peer.ip(),
            tls,
            server_name: self.sni.unwrap_or(""),
            metadata: None,
        };
        Some(network_rbac::check(self.filters, &facts))
    }
}

/// How long a connection manager's connection is waited on for its first bytes before it is
/// served uncounted by network RBAC filters (Envoy's default idle timeout).
const FIRST_BYTES_WAIT: Duration = Duration::from_secs(3600);

/// Whether a plaintext connection sent bytes (they stay unread), waiting at most
/// [`FIRST_BYTES_WAIT`].
async fn first_bytes(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    let peek = stream.peek(&mut byte);
    matches!(tokio::time::timeout(FIRST_BYTES_WAIT, peek).await, Ok(Ok(n)) if n > 0)
}

/// Whether a TLS connection sent application bytes: some the handshake already read, else
/// bytes on the socket (they stay unread), waiting at most [`FIRST_BYTES_WAIT`].
async fn first_tls_bytes(stream: &mut tokio_rustls::server::TlsStream<TcpStream>) -> bool {
    let (tcp, conn) = stream.get_mut();
    if conn
        .process_new_packets()
        .is_ok_and(|state| state.plaintext_bytes_to_read() > 0)
    {
        return true;
    }
    first_bytes(tcp).await
}

/// Serves a TLS connection once `established` (its handshake and network RBAC filters, see
/// [`establish_tls`]) gives its stream and context.
async fn serve_tls(
    established: std::pin::Pin<Box<impl Future<Output = Option<(ServerStream, Arc<ConnContext>)>>>>,
) {
    if let Some((tls_stream, ctx)) = established.await {
        let hcm = ctx.hcm.clone();
        let _open = hcm.stats.open();
        http::serve_tls(tls_stream, ctx).await
    }
}

/// Completes the TLS handshake of a connection and runs the chain's network RBAC filters: the
/// stream and the context `ctx` makes from its certificates, when it is to be served.
async fn establish_tls(
    tls: &Tls,
    stream: TcpStream,
    peer: SocketAddr,
    rbac: &RbacGate<'_>,
    ctx: impl FnOnce(PeerTls) -> Arc<ConnContext>,
) -> Option<(ServerStream, Arc<ConnContext>)> {
    let (mut tls_stream, certificates) = tls.accept_recording(stream, peer).await?;
    if let Some(checked) = rbac.check(Some(&certificates)) {
        if !checked.allowed() {
            checked.close(&mut tls_stream).await;
            return None;
        }
        if first_tls_bytes(&mut tls_stream).await {
            checked.count();
        }
    }
    Some((tls_stream, ctx(certificates)))
}

/// Sets `IP_TRANSPARENT` (`IPV6_TRANSPARENT` on an IPv6 socket) to `on`: a listener's
/// `transparent` (needs `CAP_NET_ADMIN`; failing to set it fails the bind, as in Envoy).
fn set_transparent(socket: &socket2::Socket, addr: SocketAddr, on: bool) -> std::io::Result<()> {
    let (level, option) = if addr.is_ipv6() {
        (libc::SOL_IPV6, libc::IPV6_TRANSPARENT)
    } else {
        (libc::SOL_IP, libc::IP_TRANSPARENT)
    };
    let value = libc::c_int::from(on);
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from `value`, which lives across the
    // call, on a socket descriptor `socket` owns.
    let rc = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(socket),
            level,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Starts listening on a socket [`Listener::bind`] bound, registered with the current worker's
/// runtime (call it inside that runtime's context).
pub fn listen(socket: socket2::Socket) -> std::io::Result<tokio::net::TcpListener> {
    socket.listen(1024)?;
    tokio::net::TcpListener::from_std(socket.into())
}

/// A non-blocking TCP socket bound to `address` (not listening), with `SO_REUSEADDR`,
/// `SO_REUSEPORT` on a fixed port (each worker binds its own socket; as Envoy's default
/// `enable_reuse_port`, one worker or several, so a listener on 127.0.0.2:80 binds beside one
/// on 0.0.0.0:80), `IP_TRANSPARENT` as `transparent` says, `IPV6_V6ONLY` unless the address
/// takes IPv4 too, and `TCP_NODELAY` for the connections it accepts.
pub fn bind_socket(
    address: ListenAddress,
    transparent: Option<bool>,
) -> std::io::Result<socket2::Socket> {
    let reuse_port = address.address.port() != 0;
    let addr = address.address;
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(!address.ipv4_compat)?;
    }
    if let Some(on) = transparent {
        set_transparent(&socket, addr, on)?;
    }
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener compiled from `address` and `extra` (YAML lines), with one TCP proxy chain.
    fn listener(name: &str, address: &str, extra: &str) -> Arc<Listener> {
        let yaml = format!(
            "name: {name}\naddress: {{socket_address: {address}}}\n{extra}\nfilter_chains:\n- filters:\n  - name: t\n    typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t, cluster: c}}\n"
        );
        let value = proto::Codec::parse_text(&yaml, proto::Format::Yaml).unwrap();
        let proto = proto::Codec::new().decode(value, false).unwrap().message;
        let io = crate::config::FakeIo::new();
        let ctx = crate::config::Context::new(&io);
        let mut warnings = crate::config::Warnings::new();
        let config =
            crate::config::listener::compile_listener(&ctx, &proto, None, &mut warnings).unwrap();
        Arc::new(Listener::new(
            Arc::new(config),
            &Store::new(),
            &SecretStore::new(),
            &crate::limits::SharedBuckets::default(),
            None,
        ))
    }

    #[test]
    fn a_hand_off_finds_a_listener_by_any_of_its_addresses() {
        let from = listener(
            "virtual",
            "{address: 0.0.0.0, port_value: 15001}",
            "use_original_dst: true",
        );
        let dual = listener(
            "dual",
            "{address: 127.0.0.1, port_value: 9080}",
            "bind_to_port: false\nadditional_addresses: [{address: {socket_address: {address: '::1', port_value: 9080}}}]",
        );
        let wildcard = listener(
            "wildcard",
            "{address: 0.0.0.0, port_value: 9090}",
            "bind_to_port: false\nadditional_addresses: [{address: {socket_address: {address: '::', port_value: 9090}}}]",
        );
        let all = [from.clone(), dual, wildcard];
        let target = |to: &str| {
            handoff_target(&all, to.parse().unwrap(), &from).map(|l| l.config().name.clone())
        };
        assert_eq!(target("127.0.0.1:9080").as_deref(), Some("dual"));
        assert_eq!(target("[::1]:9080").as_deref(), Some("dual"));
        assert_eq!(target("127.0.0.2:9090").as_deref(), Some("wildcard"));
        assert_eq!(target("[::1]:9090").as_deref(), Some("wildcard"));
        assert_eq!(target("[::1]:9091"), None);
    }
}
