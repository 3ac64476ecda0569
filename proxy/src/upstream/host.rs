//! Hosts (one upstream endpoint each, at one address or several) with their counters and connection pool.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rustls::pki_types::ServerName;

use crate::config::cluster::{HealthStatus, Locality};
use crate::config::istio::alpn::AlpnList;
use crate::config::upstream_transport::Refusal;
use crate::tls::ClientContext;

use super::pool::Pool;

/// Per-host counters and gauges shown by `/clusters`.
#[derive(Debug, Default)]
pub struct HostStats {
    /// Connections ever opened.
    pub cx_total: AtomicU64,
    /// Connections open now.
    pub cx_active: AtomicU64,
    /// Connection attempts that failed or timed out.
    pub cx_connect_fail: AtomicU64,
    /// Requests sent.
    pub rq_total: AtomicU64,
    /// Requests in flight.
    pub rq_active: AtomicU64,
    /// Requests answered with a status below 500.
    pub rq_success: AtomicU64,
    /// Requests that failed or were answered with 5xx.
    pub rq_error: AtomicU64,
    /// Requests that timed out.
    pub rq_timeout: AtomicU64,
}

impl HostStats {
    /// The counters in `/clusters` order (name, value).
    pub fn counters(&self) -> [(&'static str, u64); 6] {
        let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("cx_connect_fail", v(&self.cx_connect_fail)),
            ("cx_total", v(&self.cx_total)),
            ("rq_error", v(&self.rq_error)),
            ("rq_success", v(&self.rq_success)),
            ("rq_timeout", v(&self.rq_timeout)),
            ("rq_total", v(&self.rq_total)),
        ]
    }

    /// The gauges in `/clusters` order (name, value).
    pub fn gauges(&self) -> [(&'static str, u64); 3] {
        let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("cx_active", v(&self.cx_active)),
            ("rq_active", v(&self.rq_active)),
            ("rq_pending_active", 0),
        ]
    }
}

/// How connections to a host are made (its cluster's transport socket for it).
#[derive(Debug, Clone)]
pub enum HostTransport {
    /// Plaintext TCP.
    Plain,
    /// TLS with the cluster's context for this socket.
    Tls(Arc<ClientContext>),
    /// None at all: the socket is one revoy does not implement (never replaced by plaintext).
    Refused(Refusal),
}

impl HostTransport {
    /// Whether two hosts connect alike (so one's pool can stand for the other's).
    fn same(&self, other: &HostTransport) -> bool {
        match (self, other) {
            (HostTransport::Plain, HostTransport::Plain) => true,
            (HostTransport::Tls(a), HostTransport::Tls(b)) => Arc::ptr_eq(a, b),
            (HostTransport::Refused(a), HostTransport::Refused(b)) => a == b,
            _ => false,
        }
    }
}

/// One upstream address of a cluster.
#[derive(Debug)]
pub struct Host {
    /// Where to connect: the endpoint's `address`, which names the host (in `/clusters`,
    /// stats and `%UPSTREAM_HOST%`).
    pub addr: SocketAddr,
    /// Every address of an endpoint with `additional_addresses`, in the order Happy Eyeballs
    /// tries them; empty (no allocation) for an endpoint with `addr` alone.
    pub addresses: Box<[SocketAddr]>,
    /// The DNS name it was resolved from (empty for IP endpoints).
    pub hostname: String,
    /// Load balancing weight.
    pub weight: u32,
    /// Priority level.
    pub priority: u32,
    /// Locality (shared by the endpoints of one `LocalityLbEndpoints`).
    pub locality: Arc<Locality>,
    /// Health as configured / reported by EDS.
    pub health: HealthStatus,
    /// Counters (shared with its [`Host::named`] twins).
    pub stats: Arc<HostStats>,
    /// How connections to it are made: plaintext, TLS, or not at all.
    pub transport: HostTransport,
    /// Made at the first connection: most hosts of a large mesh are never connected to.
    pool: OnceLock<Box<Pool>>,
    /// The host as reached under each server name (`auto_sni`) or ALPN list (`istio.alpn`):
    /// the same host with a pool of its own per name and list (made at the first request
    /// for them).
    named: OnceLock<Box<Mutex<Vec<Arc<Host>>>>>,
    /// The server name its TLS connections send, for one of those twins (boxed: most hosts
    /// have none).
    pub server_name: Option<Box<ServerName<'static>>>,
    /// The ALPN list its TLS connections offer instead of the context's, for one of those
    /// twins.
    pub alpn: Option<AlpnList>,
}

impl Host {
    /// A new host with empty stats and pool.
    pub fn new(
        addr: SocketAddr,
        hostname: String,
        weight: u32,
        priority: u32,
        locality: Arc<Locality>,
        health: HealthStatus,
    ) -> Self {
        Host {
            addr,
            addresses: Box::default(),
            hostname,
            weight,
            priority,
            locality,
            health,
            stats: Arc::default(),
            transport: HostTransport::Plain,
            pool: OnceLock::new(),
            named: OnceLock::new(),
            server_name: None,
            alpn: None,
        }
    }

    /// This host as reached under the server name `name` (`auto_sni`) and offering the ALPN
    /// list `alpn` (`istio.alpn`), each in place of its own when given: its stats, its own
    /// pool. Retired with it.
    pub(crate) fn twin(
        self: &Arc<Self>,
        name: Option<ServerName<'static>>,
        alpn: Option<AlpnList>,
    ) -> Arc<Host> {
        if name.is_none() && alpn.is_none() {
            return self.clone();
        }
        let mut twins = self
            .named
            .get_or_init(Box::default)
            .lock()
            .expect("named hosts");
        if let Some(twin) = twins
            .iter()
            .find(|t| t.server_name.as_deref() == name.as_ref() && t.alpn == alpn)
        {
            return twin.clone();
        }
        let twin = Arc::new(Host {
            addr: self.addr,
            addresses: self.addresses.clone(),
            hostname: self.hostname.clone(),
            weight: self.weight,
            priority: self.priority,
            locality: self.locality.clone(),
            health: self.health,
            stats: self.stats.clone(),
            transport: self.transport.clone(),
            pool: OnceLock::new(),
            named: OnceLock::new(),
            server_name: name.map(Box::new),
            alpn,
        });
        if self.pool().is_retired() {
            twin.retire();
        }
        twins.push(twin.clone());
        twin
    }

    /// The same host, connected to over `transport`.
    pub fn with_transport(mut self, transport: HostTransport) -> Self {
        self.transport = transport;
        self
    }

    /// The same host, reached at `addresses` (all of them, in the order they are tried).
    pub fn with_addresses(mut self, addresses: Box<[SocketAddr]>) -> Self {
        self.addresses = addresses;
        self
    }

    /// Whether the host takes traffic outside panic mode.
    pub fn is_healthy(&self) -> bool {
        matches!(self.health, HealthStatus::Healthy | HealthStatus::Degraded)
    }

    /// Whether `other` has the same identity (so this host's pool and stats can stand for it).
    pub(crate) fn same_identity(&self, other: &Host) -> bool {
        self.addr == other.addr
            && self.addresses == other.addresses
            && self.hostname == other.hostname
            && self.weight == other.weight
            && self.priority == other.priority
            && self.locality == other.locality
            && self.health == other.health
            && self.transport.same(&other.transport)
    }

    /// How many HTTP/1.1 connections are pooled for this host (idle, or finishing a response).
    pub fn idle_http1_connections(&self) -> usize {
        self.pool.get().map_or(0, |p| p.idle_http1())
    }

    /// The host's connection pool, made on first use.
    pub(crate) fn pool(&self) -> &Pool {
        self.pool.get_or_init(Box::default)
    }

    /// The host left its cluster (or the cluster went away): its pool stops keeping
    /// connections. (A pool is made for it if it had none, so that one made by a request
    /// racing with this call is retired too.)
    pub(crate) fn retire(&self) {
        self.pool().retire();
        if let Some(twins) = self.named.get() {
            for twin in twins.lock().expect("named hosts").iter() {
                twin.retire();
            }
        }
    }

    /// Envoy's `health_flags` text.
    pub fn health_flags(&self) -> &'static str {
        match self.health {
            HealthStatus::Healthy => "healthy",
            HealthStatus::Degraded => "/degraded_eds_health",
            HealthStatus::Unhealthy => "/failed_eds_health",
            HealthStatus::Draining => "/eds_status_draining",
        }
    }
}
