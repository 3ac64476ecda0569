//! tcp_proxy: connects each downstream connection to a host of the configured cluster and
//! copies bytes both ways.
//!
//! Half-close follows Envoy: end of stream from one side is passed on as a write shutdown
//! (FIN) to the other, and the connection ends when both directions have ended. A read or
//! write error on either side, the idle timeout or the maximum connection duration close both.
//!
//! On Linux the bytes move with `splice(2)` through a pipe per direction (no copy through user
//! space); where a pipe cannot be created or splice is refused, they are copied through a buffer.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};

use crate::access_log::record::Downstream;
use crate::access_log::{Flags, Record, ResponseFlag};
use crate::config::tcp_proxy::{TcpProxyConfig, TcpRoute};
use crate::filter_state::FilterState;
use crate::stats::{Block, Counter, Slot, Store};
use crate::upstream::{ClusterManager, LbContext, UpstreamConnection, UpstreamIo};
use istio_report::{IstioTcpReport, Target};

#[cfg(target_os = "linux")]
pub mod exchange;
mod istio_report;
mod splice;
mod tunnel;

const BUFFER: usize = 16 * 1024;

/// Called as the downstream's bytes are passed upstream, from the first bytes on (the chain's
/// network RBAC filters count their verdicts then, as Envoy's do on their first data).
pub type OnData<'a> = Option<&'a (dyn Fn() + Sync)>;

/// A compiled tcp_proxy with its `tcp.<stat_prefix>.*` stats.
#[derive(Debug)]
pub struct TcpProxy {
    config: TcpProxyConfig,
    stats: TcpStats,
    /// Holds the proxy's [`ZEROS`].
    _zeros: Block,
    /// Set when a listener update changed or removed the chain: its connections end when the
    /// drain time does.
    retirement: crate::drain::Retirement,
}

#[derive(Debug)]
struct TcpStats {
    downstream_cx_total: Counter,
    downstream_cx_no_route: Counter,
    downstream_cx_rx_bytes_total: Counter,
    downstream_cx_tx_bytes_total: Counter,
    idle_timeout: Counter,
    max_downstream_connection_duration: Counter,
}

/// `tcp.<prefix>.*` stats Envoy lists for a tcp_proxy that stay 0 in revoy, which has no
/// overload manager to close its connections, none of Envoy's flow-control events, and no
/// TLS early data.
static ZEROS: [Slot; 4] = [
    Slot::counter("downstream_cx_overload_close"),
    Slot::counter("downstream_flow_control_paused_reading_total"),
    Slot::counter("downstream_flow_control_resumed_reading_total"),
    Slot::counter("early_data_received_count_total"),
];

impl TcpProxy {
    /// Counts a connection of the chain that a network filter before the proxy closed
    /// (`downstream_cx_total` counts every connection the chain was made for, as in Envoy).
    pub fn count_refused(&self) {
        self.stats.downstream_cx_total.inc();
    }

    /// Resolves the stats of `config` in `store`.
    pub fn new(config: TcpProxyConfig, store: &Store) -> Self {
        let p = format!("tcp.{}.", config.stat_prefix);
        let c = |n: &str| store.counter(&format!("{p}{n}"));
        TcpProxy {
            stats: TcpStats {
                downstream_cx_total: c("downstream_cx_total"),
                downstream_cx_no_route: c("downstream_cx_no_route"),
                downstream_cx_rx_bytes_total: c("downstream_cx_rx_bytes_total"),
                downstream_cx_tx_bytes_total: c("downstream_cx_tx_bytes_total"),
                idle_timeout: c("idle_timeout"),
                max_downstream_connection_duration: c("max_downstream_connection_duration"),
            },
            _zeros: store.block_with_zeros(&p, &[], &ZEROS),
            config,
            retirement: crate::drain::Retirement::default(),
        }
    }

    /// Ends this proxy's connections `after` from now (its chain was changed or removed by a
    /// listener update; new connections use the new chain).
    pub fn retire(&self, after: std::time::Duration) {
        self.retirement.start(after);
    }

    /// The compiled configuration.
    pub fn config(&self) -> &TcpProxyConfig {
        &self.config
    }

    fn pick_cluster(&self) -> &str {
        match &self.config.route {
            TcpRoute::Cluster(c) => c,
            TcpRoute::Weighted(list) => {
                let total: u64 = list.iter().map(|(_, w)| u64::from(*w)).sum();
                let mut r = rand::rng().random_range(0..total.max(1));
                for (name, w) in list {
                    if r < u64::from(*w) {
                        return name;
                    }
                    r -= u64::from(*w);
                }
                &list[0].0
            }
        }
    }

    /// Whether an access log reads the connection's filter state (`%FILTER_STATE()%`): its
    /// TLS session is then kept for the record.
    pub fn reads_filter_state(&self) -> bool {
        self.config
            .access_logs
            .logs()
            .iter()
            .any(|l| l.format.reads_filter_state())
    }

    /// The record of a connection from `peer` to `local` (`sni`: what the listener's
    /// tls_inspector read; `filter_state`: its TLS session, when a log reads its filter state),
    /// when this proxy has access logs or its chain `istio.stats` (`istio`), which labels its
    /// metrics with the record's flags.
    fn record(
        &self,
        peer: Option<SocketAddr>,
        local: Option<SocketAddr>,
        sni: Option<&str>,
        filter_state: Option<Arc<dyn FilterState>>,
        istio: Option<&exchange::IstioFilters<'_>>,
    ) -> Option<Box<Record>> {
        if self.config.access_logs.is_empty() && istio.is_none_or(|i| i.stats.is_none()) {
            return None;
        }
        let rec = Box::new(Record::new(Downstream {
            remote: peer,
            direct_remote: peer,
            local,
            server_name: sni.map(Into::into),
            filter_state,
        }));
        Some(rec)
    }

    /// Writes the record of a connection that ended, with the bytes `activity` counted.
    fn log(&self, rec: Option<Box<Record>>, activity: Option<&Activity<'_>>) {
        let Some(mut rec) = rec else { return };
        rec.end = Some(Instant::now());
        if let Some(a) = activity {
            rec.bytes_received = a.rx.load(Ordering::Relaxed);
            rec.bytes_sent = a.tx.load(Ordering::Relaxed);
            // A connection's wire bytes are its bytes each way, no headers, on both of its
            // connections (as Envoy's); with no upstream connection, none went upstream.
            rec.downstream_wire.received = rec.bytes_received;
            rec.downstream_wire.sent = rec.bytes_sent;
            if let Some(up) = &mut rec.upstream_wire {
                up.sent = rec.bytes_received;
                up.received = rec.bytes_sent;
            }
        }
        self.config.access_logs.log(&rec);
    }

    /// Writes the record of a connection tunnelled over HTTP: its upstream wire bytes print
    /// `-`, where Envoy 1.40 counts the CONNECT's heads and every tunnelled byte twice.
    fn log_tunnelled(&self, mut rec: Option<Box<Record>>, activity: &Activity<'_>) {
        if let Some(r) = &mut rec {
            r.upstream_wire = None;
        }
        self.log(rec, Some(activity));
    }

    /// Proxies a plaintext `downstream` until both directions end, an error occurs or a
    /// timeout fires. `sni`: the server name the listener's tls_inspector read (Envoy's
    /// requested server name, which only that filter sets).
    pub async fn serve(
        &self,
        mut downstream: TcpStream,
        clusters: &ClusterManager,
        ctx: LbContext,
        sni: Option<&str>,
        on_data: OnData<'_>,
        istio: Option<exchange::IstioFilters<'_>>,
    ) {
        let mut rec = self.record(
            downstream.peer_addr().ok(),
            ctx.original_dst.or(downstream.local_addr().ok()),
            sni,
            None,
            istio.as_ref(),
        );
        let ends = tunnel::Endpoints {
            remote: downstream.peer_addr().ok(),
            local: ctx.original_dst.or(downstream.local_addr().ok()),
        };
        let Some((mut upstream, h2)) = self.upstream(clusters, ctx, rec.as_deref_mut()).await
        else {
            if let Some(istio) = &istio {
                record_istio_unconnected(istio, clusters, rec.as_deref());
            }
            return self.log(rec, None);
        };
        let activity = Activity::new(on_data);
        if self.config.tunneling.is_some() {
            let tunnel = TunnelTarget::of(istio.as_ref(), &upstream);
            self.tunnelled(
                upstream,
                h2,
                &mut downstream,
                &ends,
                &activity,
                rec.as_deref_mut(),
            )
            .await;
            tunnel.close(istio.as_ref(), &activity, flags_of(&rec));
            return self.log_tunnelled(rec, &activity);
        }
        let local_san = upstream.active.local_uri_san();
        let mut target = Target::connected(&upstream.cluster, upstream.istio.as_deref(), local_san);
        let report = match &mut upstream.stream {
            UpstreamIo::Plain(u) => {
                let mut report = IstioTcpReport::new(istio.as_ref(), target, (None, None));
                let (dr, dw) = downstream.split();
                let (ur, uw) = u.split();
                let rx = Tally::new(&self.stats.downstream_cx_rx_bytes_total, Some(&activity.rx))
                    .on_data(activity.on_data);
                let tx = Tally::new(&self.stats.downstream_cx_tx_bytes_total, Some(&activity.tx));
                let copy = async {
                    tokio::try_join!(pump(dr, uw, &activity, &rx), pump(ur, dw, &activity, &tx),)
                };
                self.run(copy, &activity, rec.as_deref_mut(), report.as_mut())
                    .await;
                report
            }
            tls => {
                let up_peer = upstream_exchange(istio.as_ref(), &upstream.mx, tls).await;
                target.peer_san = tls.peer_uri_san();
                let mut report =
                    IstioTcpReport::new(istio.as_ref(), target, (None, up_peer.clone()));
                self.run(
                    self.copy_exchanging(&mut downstream, None, tls, up_peer, &activity),
                    &activity,
                    rec.as_deref_mut(),
                    report.as_mut(),
                )
                .await;
                report
            }
        };
        if let Some(r) = report {
            r.close(Some(&activity), flags_of(&rec));
        }
        self.log(rec, Some(&activity));
    }

    /// Proxies a `downstream` whose TLS revoy terminated (a chain with a
    /// `DownstreamTlsContext` in front of tcp_proxy); `sni` as for [`TcpProxy::serve`];
    /// `filter_state`: the session's, when an access log reads it.
    #[expect(
        clippy::too_many_arguments,
        reason = "the listener's facts about one connection, each used once"
    )]
    pub async fn serve_tls(
        &self,
        mut downstream: tokio_rustls::server::TlsStream<TcpStream>,
        clusters: &ClusterManager,
        ctx: LbContext,
        sni: Option<&str>,
        filter_state: Option<Arc<dyn FilterState>>,
        on_data: OnData<'_>,
        istio: Option<exchange::IstioFilters<'_>>,
    ) {
        let tcp = downstream.get_ref().0;
        let mut rec = self.record(
            tcp.peer_addr().ok(),
            ctx.original_dst.or(tcp.local_addr().ok()),
            sni,
            filter_state,
            istio.as_ref(),
        );
        let ends = tunnel::Endpoints {
            remote: tcp.peer_addr().ok(),
            local: ctx.original_dst.or(tcp.local_addr().ok()),
        };
        let Some((mut upstream, h2)) = self.upstream(clusters, ctx, rec.as_deref_mut()).await
        else {
            if let Some(istio) = &istio {
                record_istio_unconnected(istio, clusters, rec.as_deref());
            }
            return self.log(rec, None);
        };
        let activity = Activity::new(on_data);
        if self.config.tunneling.is_some() {
            let tunnel = TunnelTarget::of(istio.as_ref(), &upstream);
            self.tunnelled(
                upstream,
                h2,
                &mut downstream,
                &ends,
                &activity,
                rec.as_deref_mut(),
            )
            .await;
            tunnel.close(istio.as_ref(), &activity, flags_of(&rec));
            return self.log_tunnelled(rec, &activity);
        }
        let local_san = upstream.active.local_uri_san();
        let mut target = Target::connected(&upstream.cluster, upstream.istio.as_deref(), local_san);
        let report = {
            let down_peer = match &istio {
                Some(x) => downstream_exchange(x, &mut downstream).await,
                None => None,
            };
            let up_peer =
                upstream_exchange(istio.as_ref(), &upstream.mx, &mut upstream.stream).await;
            target.peer_san = upstream.stream.peer_uri_san();
            let mut report =
                IstioTcpReport::new(istio.as_ref(), target, (down_peer.clone(), up_peer.clone()));
            self.run(
                self.copy_exchanging(
                    &mut downstream,
                    down_peer,
                    &mut upstream.stream,
                    up_peer,
                    &activity,
                ),
                &activity,
                rec.as_deref_mut(),
                report.as_mut(),
            )
            .await;
            report
        };
        if let Some(r) = report {
            r.close(Some(&activity), flags_of(&rec));
        }
        self.log(rec, Some(&activity));
    }

    /// [`TcpProxy::copy_both`], each side's peer frame read off first where an exchange
    /// started (`down_peer`, `up_peer`: where the peers' workloads go).
    async fn copy_exchanging<D, U>(
        &self,
        down: &mut D,
        down_peer: Option<Peer>,
        up: &mut U,
        up_peer: Option<Peer>,
        activity: &Activity<'_>,
    ) -> std::io::Result<((), ())>
    where
        D: AsyncRead + AsyncWrite + Unpin,
        U: AsyncRead + AsyncWrite + Unpin,
    {
        use exchange::PeerFrame;
        match (down_peer, up_peer) {
            (None, None) => self.copy_both(down, up, activity, false).await,
            (Some(d), None) => {
                self.copy_both(&mut PeerFrame::new(down, d), up, activity, false)
                    .await
            }
            (None, Some(u)) => {
                self.copy_both(down, &mut PeerFrame::new(up, u), activity, false)
                    .await
            }
            (Some(d), Some(u)) => {
                let mut down = PeerFrame::new(down, d);
                self.copy_both(&mut down, &mut PeerFrame::new(up, u), activity, false)
                    .await
            }
        }
    }

    /// Opens the configured tunnel on `upstream` (over HTTP/2 when `h2`, the cluster's
    /// protocol), hands the downstream what the upstream sent after its answer, and relays
    /// the rest; the connection is closed when the tunnel cannot be opened.
    async fn tunnelled<D: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut upstream: UpstreamConnection,
        h2: bool,
        downstream: &mut D,
        ends: &tunnel::Endpoints,
        activity: &Activity<'_>,
        mut rec: Option<&mut Record>,
    ) {
        let Some(t) = &self.config.tunneling else {
            return;
        };
        let failed = |e: tunnel::TunnelError, rec: Option<&mut Record>| {
            tracing::debug!(error = %e, "tcp_proxy: tunnel not opened");
            if let Some(r) = rec {
                r.flags.set(ResponseFlag::UpstreamConnectionFailure);
            }
        };
        if h2 {
            match tunnel::open_h2(upstream, t, ends).await {
                Ok(mut stream) => {
                    self.run(
                        self.copy_both(downstream, &mut stream, activity, false),
                        activity,
                        rec,
                        None,
                    )
                    .await
                }
                Err(e) => failed(e, rec),
            }
            return;
        }
        let opened = match tunnel::open(&mut upstream.stream, t, ends).await {
            Ok(first) if first.is_empty() => Ok(()),
            Ok(first) => downstream.write_all(&first).await.map_err(Into::into),
            Err(e) => Err(e),
        };
        match opened {
            Ok(()) => {
                self.run(
                    self.copy_both(downstream, &mut upstream.stream, activity, t.use_post),
                    activity,
                    rec.as_deref_mut(),
                    None,
                )
                .await
            }
            Err(e) => failed(e, rec),
        }
    }

    /// Connects to a host of the cluster (retrying up to `max_connect_attempts` hosts); with
    /// whether the cluster speaks HTTP/2 (for a tunnel).
    async fn upstream(
        &self,
        clusters: &ClusterManager,
        mut ctx: LbContext,
        mut rec: Option<&mut Record>,
    ) -> Option<(UpstreamConnection, bool)> {
        self.stats.downstream_cx_total.inc();
        let name = self.pick_cluster();
        let Some(cluster) = clusters.handle(name) else {
            tracing::debug!(cluster = name, "tcp_proxy: unknown cluster");
            self.stats.downstream_cx_no_route.inc();
            if let Some(r) = rec {
                r.flags.set(ResponseFlag::NoClusterFound);
            }
            return None;
        };
        if let Some(r) = rec.as_deref_mut() {
            r.upstream_cluster = Some(name.into());
        }
        let h2 = cluster.config().protocol == crate::config::cluster::UpstreamProtocol::Http2;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match cluster.connect(&ctx).await {
                Ok(u) => {
                    if let Some(r) = rec {
                        r.upstream_host = Some(u.addr);
                        r.upstream_remote = Some(u.active.remote());
                        r.upstream_local = u.active.local();
                        r.attempts = attempts;
                    }
                    return Some((u, h2));
                }
                Err(e) => {
                    tracing::debug!(cluster = name, error = %e, "tcp_proxy: upstream connect failed");
                    if let Some(r) = rec.as_deref_mut() {
                        r.attempts = attempts;
                        r.upstream_host = e.host().or(r.upstream_host);
                        r.upstream_transport_failure = e.transport_failure_reason();
                    }
                    if attempts >= self.config.max_connect_attempts {
                        // Envoy's tcp_proxy marks the failure, then the attempts used up
                        // (even when only one was allowed).
                        if let Some(r) = rec {
                            r.flags.set(
                                ResponseFlag::from_short(e.response_flag())
                                    .unwrap_or(ResponseFlag::UpstreamConnectionFailure),
                            );
                            r.flags.set(ResponseFlag::UpstreamRetryLimitExceeded);
                        }
                        return None;
                    }
                    if let Some(h) = e.host() {
                        ctx.avoid.push(h);
                    }
                }
            }
        }
    }

    /// Copies both ways through buffers (one side or both speak TLS, or a tunnel's HTTP, so no
    /// splice); `chunked`: what goes upstream is framed as HTTP/1.1 chunks.
    async fn copy_both<D, U>(
        &self,
        down: &mut D,
        up: &mut U,
        activity: &Activity<'_>,
        chunked: bool,
    ) -> std::io::Result<((), ())>
    where
        D: AsyncRead + AsyncWrite + Unpin,
        U: AsyncRead + AsyncWrite + Unpin,
    {
        let (dr, dw) = tokio::io::split(down);
        let (ur, uw) = tokio::io::split(up);
        let rx = Tally::new(&self.stats.downstream_cx_rx_bytes_total, Some(&activity.rx))
            .on_data(activity.on_data);
        let tx = Tally::new(&self.stats.downstream_cx_tx_bytes_total, Some(&activity.tx));
        // An HTTP/1.1 POST tunnel carries the downstream's bytes as a chunked body.
        if chunked {
            let uw = tunnel::Chunked::new(uw);
            return tokio::try_join!(copy(dr, uw, activity, &rx), copy(ur, dw, activity, &tx));
        }
        tokio::try_join!(copy(dr, uw, activity, &rx), copy(ur, dw, activity, &tx),)
    }

    /// Runs `copy` until it ends, the connection idles out, reaches its maximum duration or
    /// its chain is retired; `report`'s periodic Istio reports are made meanwhile.
    async fn run(
        &self,
        copy: impl Future<Output = std::io::Result<((), ())>>,
        activity: &Activity<'_>,
        rec: Option<&mut Record>,
        mut report: Option<&mut IstioTcpReport<'_>>,
    ) {
        let max_duration = async {
            match self.config.max_connection_duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let mut reports = report.as_ref().and_then(|r| r.every()).map(|every| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let idle = activity.idle(self.config.idle_timeout);
        let retired = self.retirement.ended();
        tokio::pin!(copy, max_duration, idle, retired);
        loop {
            tokio::select! {
                r = &mut copy => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "tcp_proxy: connection error");
                    }
                }
                _ = &mut idle => self.stats.idle_timeout.inc(),
                _ = &mut max_duration => {
                    self.stats.max_downstream_connection_duration.inc();
                    if let Some(r) = rec {
                        r.flags.set(ResponseFlag::DurationTimeout);
                    }
                }
                _ = &mut retired => tracing::debug!("tcp_proxy: chain retired by a listener update; connection closed after the drain time"),
                () = next_tick(&mut reports) => {
                    if let Some(r) = report.as_deref_mut() {
                        r.tick(activity);
                    }
                    continue;
                }
            }
            return;
        }
    }
}

/// Waits for the next periodic report (forever without any).
async fn next_tick(reports: &mut Option<tokio::time::Interval>) {
    match reports {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Where a peer's exchanged workload goes.
type Peer = std::sync::Arc<std::sync::OnceLock<crate::config::istio::workload::Workload>>;

/// Starts the exchange with a downstream that negotiated the chain's exchange ALPN: sends
/// this side's frame; `Some` (where the peer's goes) when it started.
async fn downstream_exchange(
    exchange: &exchange::IstioFilters<'_>,
    downstream: &mut tokio_rustls::server::TlsStream<TcpStream>,
) -> Option<Peer> {
    let mx = exchange.downstream?;
    if downstream.get_ref().1.alpn_protocol() != Some(mx.protocol.as_slice()) {
        return None;
    }
    exchange::send_frame(downstream, exchange.local)
        .await
        .ok()?;
    Some(Peer::default())
}

/// Starts the exchange with an upstream whose cluster has the exchange filter and that
/// negotiated its ALPN: sends this side's frame; `Some` when it started.
async fn upstream_exchange(
    istio: Option<&exchange::IstioFilters<'_>>,
    mx: &Option<std::sync::Arc<crate::config::istio::metadata_exchange::TcpExchange>>,
    upstream: &mut UpstreamIo,
) -> Option<Peer> {
    let (istio, mx) = (istio?, mx.as_ref()?);
    if upstream.alpn() != Some(mx.protocol.as_slice()) {
        return None;
    }
    exchange::send_frame(upstream, istio.local).await.ok()?;
    Some(Peer::default())
}

/// The flags of a connection's record (none without one).
fn flags_of(rec: &Option<Box<Record>>) -> Flags {
    rec.as_ref().map_or_else(Flags::default, |r| r.flags)
}

/// Records a connection that never reached an upstream (no cluster, or no connection) in
/// Istio's TCP metrics, as Istio's stats filter reports one when it closes: opened and
/// closed, no bytes, labelled with the record's flags (`UF,URX`, `NC`, ...).
fn record_istio_unconnected(
    istio: &exchange::IstioFilters<'_>,
    clusters: &ClusterManager,
    rec: Option<&Record>,
) {
    let name = rec.and_then(|r| r.upstream_cluster.clone());
    let cluster = name.as_deref().and_then(|n| clusters.get(n));
    let target = Target {
        cluster: name.as_deref().map(|n| {
            (
                n,
                cluster.as_ref().and_then(|c| c.config().istio.as_deref()),
            )
        }),
        peer_san: String::new(),
        local_san: String::new(),
    };
    if let Some(r) = IstioTcpReport::new(Some(istio), target, (None, None)) {
        r.close(None, rec.map_or_else(Flags::default, |r| r.flags));
    }
}

/// What a tunnelled connection's Istio TCP metrics need of its upstream, kept before the
/// tunnel takes the connection (none without `istio.stats`). Such a connection exchanges no
/// peer metadata, so, as in Istio, it is reported only when it closes.
struct TunnelTarget(
    Option<(
        String,
        Option<std::sync::Arc<crate::config::istio::IstioCluster>>,
        String,
    )>,
);

impl TunnelTarget {
    fn of(istio: Option<&exchange::IstioFilters<'_>>, upstream: &UpstreamConnection) -> Self {
        TunnelTarget(istio.filter(|i| i.stats.is_some()).map(|_| {
            (
                upstream.cluster.clone(),
                upstream.istio.clone(),
                upstream.active.local_uri_san(),
            )
        }))
    }

    /// Reports the closed connection with the bytes `activity` counted.
    fn close(
        self,
        istio: Option<&exchange::IstioFilters<'_>>,
        activity: &Activity<'_>,
        flags: Flags,
    ) {
        let Some((cluster, meta, local_san)) = self.0 else {
            return;
        };
        let target = Target::connected(&cluster, meta.as_deref(), local_san);
        if let Some(r) = IstioTcpReport::new(istio, target, (None, None)) {
            r.close(Some(activity), flags);
        }
    }
}

/// The last time bytes moved, shared by both directions, the bytes each way, and who is told
/// when the downstream's bytes move.
struct Activity<'a> {
    start: Instant,
    last_ms: AtomicU64,
    /// Bytes from the downstream.
    rx: AtomicU64,
    /// Bytes to the downstream.
    tx: AtomicU64,
    /// Told as the downstream's bytes go upstream.
    on_data: OnData<'a>,
}

/// Where one direction's bytes are counted: the proxy's stat and the connection's own count
/// (and who else is told that bytes moved).
struct Tally<'a> {
    total: &'a Counter,
    conn: Option<&'a AtomicU64>,
    on_data: OnData<'a>,
}

impl<'a> Tally<'a> {
    fn new(total: &'a Counter, conn: Option<&'a AtomicU64>) -> Self {
        Tally {
            total,
            conn,
            on_data: None,
        }
    }

    /// The same, calling `on_data` whenever bytes are counted.
    fn on_data(mut self, on_data: OnData<'a>) -> Self {
        self.on_data = on_data;
        self
    }

    fn add(&self, n: u64) {
        self.total.add(n);
        if let Some(c) = self.conn {
            c.fetch_add(n, Ordering::Relaxed);
        }
        if let Some(f) = self.on_data {
            f();
        }
    }
}

impl<'a> Activity<'a> {
    fn new(on_data: OnData<'a>) -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            rx: AtomicU64::new(0),
            tx: AtomicU64::new(0),
            on_data,
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing moved for `timeout` (never when `None`).
    async fn idle(&self, timeout: Option<Duration>) {
        let Some(timeout) = timeout else {
            return std::future::pending().await;
        };
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = last + timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    }
}

/// Forwards `r` to `w` until end of stream, then shuts down `w` (half-close): with splice(2)
/// where available, else through a user-space buffer.
async fn pump(
    r: ReadHalf<'_>,
    mut w: WriteHalf<'_>,
    activity: &Activity<'_>,
    bytes: &Tally<'_>,
) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    match splice::Pipe::new() {
        Ok(pipe) => match pipe
            .forward(r.as_ref(), w.as_ref(), activity, bytes)
            .await?
        {
            splice::Forwarded::Eof => return w.shutdown().await,
            splice::Forwarded::Unsupported => {
                tracing::debug!("tcp_proxy: splice unsupported, copying");
            }
        },
        Err(e) => tracing::debug!(error = %e, "tcp_proxy: no pipe for splice, copying"),
    }
    copy(r, w, activity, bytes).await
}

/// Copies `r` to `w` through a buffer until end of stream, then shuts down `w`.
async fn copy<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut r: R,
    mut w: W,
    activity: &Activity<'_>,
    bytes: &Tally<'_>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; BUFFER];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return w.shutdown().await;
        }
        w.write_all(&buf[..n]).await?;
        bytes.add(n as u64);
        activity.touch();
    }
}
