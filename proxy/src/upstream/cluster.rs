//! One cluster at run time: its current hosts, stats, and the request/connect entry points.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use http::{Request, Response};
use rustls::pki_types::ServerName;
use tokio::sync::Notify;

use crate::body::Body;
use crate::config::cluster::{
    AutoSni, ClusterConfig, Discovery, EndpointAddress, EndpointConfig, HealthStatus, Thresholds,
    UpstreamProtocol,
};
use crate::config::istio::alpn::UpstreamProtocol as AlpnProtocol;
use crate::config::upstream_transport::Socket;
use crate::stats::Store;
use crate::tls::stats::TlsStats;
use crate::tls::{Carries, ClientContext, ContextCertificates, SecretStore};

use super::error::UpstreamError;
use super::host::{Host, HostTransport};
use super::io::UpstreamIo;
use super::lb::{HostSet, LbContext};
use super::pool::{self, ActiveConnection, ConnectOptions};
use super::response::UpstreamBody;
use super::stats::ClusterStats;
use crate::access_log::AttemptTarget;

/// A TCP connection to a host of a cluster (for tcp_proxy). Counted as active until dropped.
#[derive(Debug)]
pub struct UpstreamConnection {
    /// The connected socket (TLS when the host's transport socket asks for it).
    pub stream: UpstreamIo,
    /// The host's address.
    pub addr: SocketAddr,
    /// Keep alive as long as the connection is in use (drives `cx_active`).
    pub active: ActiveConnection,
    /// The cluster's `istio.metadata_exchange` upstream filter, if it has one.
    pub mx: Option<Arc<crate::config::istio::metadata_exchange::TcpExchange>>,
    /// The cluster's name.
    pub cluster: String,
    /// The cluster's `istio` metadata.
    pub istio: Option<std::sync::Arc<crate::config::istio::IstioCluster>>,
}

/// A cluster: configuration, hosts and per-cluster state that survives config updates that
/// leave the cluster unchanged.
#[derive(Debug)]
pub struct Cluster {
    config: ClusterConfig,
    stats: Arc<ClusterStats>,
    hosts: ArcSwap<HostSet>,
    original_dst_hosts: Mutex<HashMap<SocketAddr, Arc<Host>>>,
    /// Whether the first host list is known.
    initialized: AtomicBool,
    /// Wakes [`Cluster::wait_initialized`] (a watch channel did both for ~340 bytes of heap
    /// per cluster).
    initialized_wake: Notify,
    resolver: Mutex<Option<tokio::task::AbortHandle>>,
    /// How hosts are connected to, by transport socket index (`UpstreamTransport::sockets`).
    transports: Vec<HostTransport>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(task) = self.resolver.lock().expect("resolver lock").take() {
            task.abort();
        }
    }
}

impl Cluster {
    /// A cluster with the config's static hosts (DNS clusters start empty until resolved).
    pub(crate) fn new(config: ClusterConfig, store: &Store, secrets: &SecretStore) -> Arc<Self> {
        let stats = Arc::new(ClusterStats::new(store, &config.observability_name));
        let transports = config
            .transport
            .sockets()
            .iter()
            .map(|socket| match socket {
                Socket::Plain => HostTransport::Plain,
                Socket::Refused(why) => HostTransport::Refused(why.clone()),
                Socket::Tls(spec) => {
                    let stats =
                        TlsStats::new(store, &format!("cluster.{}.", config.observability_name));
                    match ClientContext::new(spec, secrets, stats, config.auto_sni.as_ref()) {
                        Some(ctx) => HostTransport::Tls(Arc::new(ctx)),
                        None => HostTransport::Refused(
                            "tls_params allow no TLS version revoy implements (1.2, 1.3)".into(),
                        ),
                    }
                }
            })
            .collect();
        let initialized = !config.discovery.uses_dns();
        let cluster = Arc::new(Cluster {
            stats,
            hosts: ArcSwap::from_pointee(HostSet::default()),
            original_dst_hosts: Mutex::new(HashMap::new()),
            initialized: AtomicBool::new(initialized),
            initialized_wake: Notify::new(),
            resolver: Mutex::new(None),
            transports,
            config,
        });
        if !cluster.config.discovery.uses_dns() {
            let endpoints = cluster.config.endpoints.clone();
            cluster.set_endpoints(&endpoints);
        }
        cluster
    }

    pub(crate) fn set_resolver(&self, task: tokio::task::AbortHandle) {
        *self.resolver.lock().expect("resolver lock") = Some(task);
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The compiled configuration.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// The `cluster.<name>.*` stats (the router charges timeouts and retries here).
    pub fn stats(&self) -> &Arc<ClusterStats> {
        &self.stats
    }

    /// The current hosts.
    pub fn host_set(&self) -> Arc<HostSet> {
        self.hosts.load_full()
    }

    /// Hosts created on demand for ORIGINAL_DST clusters.
    pub fn original_dst_hosts(&self) -> Vec<Arc<Host>> {
        let mut v: Vec<_> = self
            .original_dst_hosts
            .lock()
            .expect("original_dst lock")
            .values()
            .cloned()
            .collect();
        v.sort_by_key(|h| h.addr);
        v
    }

    /// Whether the first host list is known (DNS clusters: after the first resolution).
    pub fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::SeqCst)
    }

    /// Waits until [`Cluster::is_initialized`].
    pub async fn wait_initialized(&self) {
        loop {
            // Registered before the flag is read, so a change after the read wakes it.
            let woken = self.initialized_wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.is_initialized() {
                return;
            }
            woken.await;
        }
    }

    /// The cluster was removed or replaced: every host's pool stops keeping connections.
    pub(crate) fn retire(&self) {
        for h in self.hosts.load().hosts() {
            h.retire();
        }
        for h in self
            .original_dst_hosts
            .lock()
            .expect("original_dst lock")
            .values()
        {
            h.retire();
        }
    }

    /// The TLS contexts of its transport sockets (`transport_socket`, then each of
    /// `transport_socket_matches`), for `/certs`.
    pub fn tls_contexts(&self) -> impl Iterator<Item = &ContextCertificates> {
        self.transports.iter().filter_map(|t| match t {
            HostTransport::Tls(ctx) => Some(&ctx.certificates),
            _ => None,
        })
    }

    /// How hosts with transport socket `index` are connected to.
    pub(crate) fn transport(&self, index: usize) -> HostTransport {
        self.transports
            .get(index)
            .cloned()
            .unwrap_or(HostTransport::Plain)
    }

    /// Replaces the hosts with IP endpoints (static config or EDS). Name endpoints are skipped.
    pub fn set_endpoints(&self, endpoints: &[EndpointConfig]) {
        let hosts = endpoints
            .iter()
            .filter_map(|e| match &e.address {
                EndpointAddress::Ip(addr) => {
                    let host = Host::new(
                        *addr,
                        e.hostname.clone(),
                        e.weight,
                        e.priority,
                        e.locality.clone(),
                        e.health,
                    )
                    .with_transport(self.transport(e.socket));
                    Some(if e.additional.is_empty() {
                        host
                    } else {
                        let all: Vec<SocketAddr> = std::iter::once(*addr)
                            .chain(e.additional.iter().copied())
                            .collect();
                        self.reached_at(host, &all)
                    })
                }
                EndpointAddress::Dns { .. } => None,
            })
            .collect();
        self.set_hosts(hosts);
    }

    /// `host` reached at `all` of its addresses (its own first), connected to as Envoy's
    /// Happy Eyeballs when there are several, in the order of the cluster's
    /// `happy_eyeballs_config`.
    pub(crate) fn reached_at(&self, host: Host, all: &[SocketAddr]) -> Host {
        if all.len() < 2 {
            return host;
        }
        host.with_addresses(self.config.happy_eyeballs.order(all).into())
    }

    /// Installs a new host list, keeping the existing host (pool, stats) for every unchanged one.
    pub(crate) fn set_hosts(&self, hosts: Vec<Host>) {
        let current = self.hosts.load();
        let changed = hosts.len() != current.hosts().len()
            || hosts
                .iter()
                .zip(current.hosts())
                .any(|(new, old)| !old.same_identity(new));
        if changed {
            // Filled one by one: collecting the mapped `Vec<Host>` would reuse its allocation
            // in place, keeping a `Host`'s size per 8-byte `Arc` for the life of the set.
            let mut merged: Vec<Arc<Host>> = Vec::with_capacity(hosts.len());
            for h in hosts {
                merged.push(
                    current
                        .hosts()
                        .iter()
                        .find(|old| old.same_identity(&h))
                        .cloned()
                        .unwrap_or_else(|| Arc::new(h)),
                );
            }
            for old in current.hosts() {
                if !merged.iter().any(|h| Arc::ptr_eq(h, old)) {
                    old.retire();
                }
            }
            let set = HostSet::new(merged, self.config.panic_threshold);
            self.stats.membership_total().set(set.hosts().len() as u64);
            // Envoy keeps `max_host_weight` for the clusters whose hosts it updates (EDS and
            // STRICT_DNS); the others show 0.
            if matches!(
                self.config.discovery,
                Discovery::Eds { .. } | Discovery::StrictDns
            ) {
                let max_weight = set.hosts().iter().map(|h| h.weight).max().unwrap_or(0);
                self.stats.max_host_weight().set(u64::from(max_weight));
            }
            let count = |status| set.hosts().iter().filter(|h| h.health == status).count();
            self.stats
                .membership_healthy()
                .set(count(HealthStatus::Healthy) as u64);
            self.stats
                .membership_degraded()
                .set(count(HealthStatus::Degraded) as u64);
            self.stats.membership_change().inc();
            self.hosts.store(Arc::new(set));
        }
        if !self.initialized.swap(true, Ordering::SeqCst) {
            self.initialized_wake.notify_waiters();
        }
    }

    fn connect_options<'a>(
        &'a self,
        carries: Carries,
        target: Option<&'a Arc<AttemptTarget>>,
    ) -> ConnectOptions<'a> {
        ConnectOptions {
            target,
            carries,
            timeout: self.config.connect_timeout,
            source: &self.config.source,
            idle_timeout: self.config.idle_timeout,
            max_requests: self.config.max_requests_per_connection,
            http1_trailers: self.config.http1_trailers,
            max_connections: self.config.circuit_breakers[0].max_connections,
            max_pending_requests: self.config.circuit_breakers[0].max_pending_requests,
            stats: &self.stats,
        }
    }

    /// The protocol a request goes upstream in, as `istio.alpn` keys its lists (Envoy's
    /// `upstreamHttpProtocol`, first choice): a cluster following the downstream protocol
    /// takes the request's, an ALPN-negotiating one counts as HTTP/2.
    fn alpn_protocol(&self, ctx: &LbContext, downstream_http10: bool) -> AlpnProtocol {
        match self.config.protocol {
            UpstreamProtocol::Http1 => AlpnProtocol::Http11,
            UpstreamProtocol::Http2 | UpstreamProtocol::Auto => AlpnProtocol::Http2,
            UpstreamProtocol::UseDownstream if ctx.downstream_h2 => AlpnProtocol::Http2,
            UpstreamProtocol::UseDownstream if downstream_http10 => AlpnProtocol::Http10,
            UpstreamProtocol::UseDownstream => AlpnProtocol::Http11,
        }
    }

    /// Picks a host for this request or connection.
    fn choose(
        &self,
        ctx: &LbContext,
        header_dst: Option<SocketAddr>,
    ) -> Result<Arc<Host>, UpstreamError> {
        let picked = match &self.config.discovery {
            Discovery::OriginalDst { port_override, .. } => {
                header_dst.or(ctx.original_dst).map(|mut addr| {
                    if let Some(p) = port_override {
                        addr.set_port(*p);
                    }
                    self.original_dst_host(addr)
                })
            }
            _ => self.hosts.load().pick(self.config.lb_policy, ctx),
        };
        picked.ok_or_else(|| {
            self.stats.upstream_cx_none_healthy().inc();
            UpstreamError::NoHealthyUpstream
        })
    }

    fn original_dst_host(&self, addr: SocketAddr) -> Arc<Host> {
        let mut hosts = self.original_dst_hosts.lock().expect("original_dst lock");
        hosts
            .entry(addr)
            .or_insert_with(|| {
                self.stats.membership_total().inc();
                self.stats.membership_healthy().inc();
                Arc::new(
                    Host::new(
                        addr,
                        String::new(),
                        1,
                        0,
                        Arc::default(),
                        HealthStatus::Healthy,
                    )
                    .with_transport(self.transport(0)),
                )
            })
            .clone()
    }

    /// Sends `req` to a host picked by the load balancer over a pooled connection and returns
    /// the response head with its streaming body. Response codes are charged to the cluster
    /// stats; on error, 503 (the local reply's code) is charged too, so the caller charges only
    /// the failures it detects itself (e.g. 504 on its timeout) via [`ClusterStats::charge_status`].
    ///
    /// `req` may be origin-form (`/path`, with a Host header) or absolute-form; it is rewritten
    /// for the upstream protocol: origin-form + Host for HTTP/1.1, `:authority` from Host for
    /// HTTP/2 (connection-specific headers are dropped).
    pub async fn request(
        &self,
        req: Request<Body>,
        ctx: &LbContext,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let result = self.attempt(req, ctx).await;
        match &result {
            Ok(resp) => self
                .stats
                .charge_status(resp.status().as_u16(), ctx.internal),
            Err(_) => self.stats.charge_status(503, ctx.internal),
        }
        result
    }

    /// Like [`Cluster::request`], but the response code (or the 503 of a failure) is left
    /// for the caller to charge: the router charges a retried attempt under `retry.`.
    pub async fn attempt(
        &self,
        req: Request<Body>,
        ctx: &LbContext,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let header_dst = match &self.config.discovery {
            Discovery::OriginalDst {
                use_http_header: true,
                header_name,
                ..
            } => req
                .headers()
                .get(header_name.as_str())
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok()),
            _ => None,
        };
        self.request_inner(req, ctx, header_dst).await
    }

    async fn request_inner(
        &self,
        req: Request<Body>,
        ctx: &LbContext,
        header_dst: Option<SocketAddr>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let host = self.choose(ctx, header_dst)?;
        let host = match &host.transport {
            HostTransport::Tls(_) => {
                let name = self
                    .config
                    .auto_sni
                    .as_ref()
                    .and_then(|auto| request_server_name(&req, auto));
                let alpn = ctx.alpn.as_ref().and_then(|a| {
                    a.overrides
                        .get(self.alpn_protocol(ctx, a.downstream_http10))
                        .cloned()
                });
                host.twin(name, alpn)
            }
            _ => host,
        };
        let limit = self.config.circuit_breakers[0].max_requests;
        if self.stats.upstream_rq_active().value() >= u64::from(limit) {
            self.stats.upstream_rq_pending_overflow().inc();
            return Err(UpstreamError::Overflow);
        }
        let _active = ActiveRequest::new(&host, &self.stats);
        let carries = match self.config.protocol {
            UpstreamProtocol::Http1 => Carries::Http1,
            UpstreamProtocol::Http2 => Carries::Http2,
            UpstreamProtocol::UseDownstream if ctx.downstream_h2 => Carries::Http2,
            UpstreamProtocol::UseDownstream => Carries::Http1,
            UpstreamProtocol::Auto => Carries::Auto,
        };
        let target = ctx.target.as_ref();
        let opts = self.connect_options(carries, target);
        let result = match carries {
            Carries::Http2 => pool::send_h2(&host, opts, req).await,
            Carries::Auto => pool::send_auto(&host, opts, req).await,
            _ => pool::send_h1(&host, opts, req).await,
        };
        let mut result = result;
        if ctx.report_host
            && let Ok(resp) = &mut result
        {
            // The pool noted which of the host's addresses its connection reached.
            let remote = match target.and_then(|t| t.get()) {
                Some((noted, remote, _)) if noted == host.addr => remote,
                _ => host.addr,
            };
            resp.extensions_mut().insert(pool::UpstreamHost {
                host: host.addr,
                remote,
            });
        }
        let hs = &host.stats;
        match &result {
            Ok(resp) => {
                self.stats.upstream_rq_total().inc();
                hs.rq_total.fetch_add(1, Ordering::Relaxed);
                let status = resp.status().as_u16();
                if status >= 500 {
                    hs.rq_error.fetch_add(1, Ordering::Relaxed);
                } else {
                    hs.rq_success.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(
                UpstreamError::ConnectFailure { .. }
                | UpstreamError::BindFailure { .. }
                | UpstreamError::ConnectTimeout { .. }
                | UpstreamError::TlsFailure { .. }
                | UpstreamError::SecretsNotReady { .. }
                | UpstreamError::TransportRefused { .. },
            ) => {
                hs.rq_error.fetch_add(1, Ordering::Relaxed);
                self.stats.upstream_rq_pending_failure_eject().inc();
            }
            // A circuit breaker kept the request from being sent.
            Err(UpstreamError::Overflow) => {}
            Err(_) => {
                self.stats.upstream_rq_total().inc();
                hs.rq_total.fetch_add(1, Ordering::Relaxed);
                hs.rq_error.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    /// Envoy's circuit breaker gauges of the default routing priority, under
    /// `cluster.<stat name>.circuit_breakers.default.`, from the thresholds and the live
    /// counts the breakers read: `cx_open`, `rq_pending_open`, `rq_open`, `rq_retry_open` (1
    /// while the count is at its limit), and under `track_remaining` the `remaining_*` (what
    /// is left under each limit; `remaining_cx_pools` is the maximum, as revoy does not limit
    /// connection pools). `HIGH`'s are in the `HIGH` thresholds' `remaining_*` only (revoy
    /// sends nothing at that priority; its `*_open` are the block's zeros).
    pub fn circuit_breaker_gauges(&self) -> Vec<(String, u64)> {
        let s = &self.stats;
        let [default, high] = &self.config.circuit_breakers;
        let (cx, pending, rq) = (
            s.upstream_cx_active().value(),
            s.upstream_rq_pending_active().value(),
            s.upstream_rq_active().value(),
        );
        let retries = u64::from(s.retries_in_flight.load(Ordering::Relaxed));
        let retry_limit = default.retry_limit(rq, pending);
        let prefix = format!("{}circuit_breakers.", s.prefix());
        let open = |count: u64, limit: u64| u64::from(count >= limit);
        let mut out = vec![
            (
                format!("{prefix}default.cx_open"),
                open(cx, default.max_connections.into()),
            ),
            (
                format!("{prefix}default.rq_open"),
                open(rq, default.max_requests.into()),
            ),
            (
                format!("{prefix}default.rq_pending_open"),
                open(pending, default.max_pending_requests.into()),
            ),
            (
                format!("{prefix}default.rq_retry_open"),
                open(retries, retry_limit),
            ),
        ];
        let remaining = |priority: &str, t: &Thresholds, retry_limit: u64, used: [u64; 4]| {
            let limits = [
                u64::from(t.max_connections),
                u64::from(t.max_pending_requests),
                retry_limit,
                u64::from(t.max_requests),
            ];
            let names = [
                "remaining_cx",
                "remaining_pending",
                "remaining_retries",
                "remaining_rq",
            ];
            let mut gauges: Vec<(String, u64)> = names
                .iter()
                .zip(limits.iter().zip(used))
                .map(|(name, (limit, used))| {
                    (
                        format!("{prefix}{priority}.{name}"),
                        limit.saturating_sub(used),
                    )
                })
                .collect();
            gauges.push((format!("{prefix}{priority}.remaining_cx_pools"), u64::MAX));
            gauges
        };
        if default.track_remaining {
            out.extend(remaining(
                "default",
                default,
                retry_limit,
                [cx, pending, retries, rq],
            ));
        }
        if high.track_remaining {
            out.extend(remaining("high", high, high.retry_limit(0, 0), [0; 4]));
        }
        out
    }

    /// Opens a TCP connection to a host picked by the load balancer (tcp_proxy).
    pub async fn connect(&self, ctx: &LbContext) -> Result<UpstreamConnection, UpstreamError> {
        let host = self.choose(ctx, None)?;
        let limit = self.config.circuit_breakers[0].max_connections;
        if self.stats.upstream_cx_active().value() >= u64::from(limit) {
            self.stats.upstream_cx_overflow().inc();
            return Err(UpstreamError::Overflow);
        }
        // Envoy's TCP connection pool counts each proxied connection as a request that
        // waited for a new upstream connection.
        self.stats.upstream_rq_pending_total().inc();
        let (stream, active) =
            match pool::connect(&host, self.connect_options(Carries::Raw, None)).await {
                Ok(connected) => connected,
                Err(e) => {
                    host.stats.rq_error.fetch_add(1, Ordering::Relaxed);
                    self.stats.upstream_rq_pending_failure_eject().inc();
                    return Err(e);
                }
            };
        self.stats.upstream_rq_total().inc();
        host.stats.rq_total.fetch_add(1, Ordering::Relaxed);
        Ok(UpstreamConnection {
            stream,
            addr: host.addr,
            active,
            mx: self.config.metadata_exchange.clone(),
            cluster: self.config.name.clone(),
            istio: self.config.istio.clone(),
        })
    }
}

/// Counts a request as active on the host and cluster while alive.
struct ActiveRequest<'a> {
    host: &'a Host,
    stats: &'a ClusterStats,
}

impl<'a> ActiveRequest<'a> {
    fn new(host: &'a Host, stats: &'a ClusterStats) -> Self {
        host.stats.rq_active.fetch_add(1, Ordering::Relaxed);
        stats.upstream_rq_active().inc();
        ActiveRequest { host, stats }
    }
}

impl Drop for ActiveRequest<'_> {
    fn drop(&mut self) {
        self.host.stats.rq_active.fetch_sub(1, Ordering::Relaxed);
        self.stats.upstream_rq_active().dec();
    }
}

/// The server name an `auto_sni` cluster's connection for `req` is opened with: the host of
/// the header `override_auto_sni_header` names when the request has it, else of its `Host`
/// (its authority). An address is a name only to check the certificate against
/// (`auto_san_validation`): no SNI is sent for one, as in Envoy, so without that check the
/// context's own name stays.
fn request_server_name(req: &Request<Body>, auto: &AutoSni) -> Option<ServerName<'static>> {
    let value = auto
        .header
        .as_ref()
        .and_then(|h| req.headers().get(h))
        .or_else(|| req.headers().get(http::header::HOST))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))?;
    let authority: http::uri::Authority = value.parse().ok()?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) if auto.san_validation => Some(ServerName::IpAddress(ip.into())),
        Ok(_) => None,
        Err(_) => ServerName::try_from(host.to_owned()).ok(),
    }
}
