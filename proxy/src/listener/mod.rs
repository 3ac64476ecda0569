//! Accept loops: bind a listener's socket, run its listener filters, pick the filter chain and
//! hand the connection to the chain's terminal filter (HTTP connection manager or tcp_proxy).

mod inspect;
mod original_dst;

pub use inspect::parse_client_hello;
pub use original_dst::original_dst;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::config::filter_chain_match::{self, ConnectionFacts};
use crate::config::listener::{ChainConfig, ListenerConfig, Terminal};
use crate::http::{self, ConnContext, Hcm, forwarding::Downstream};
use crate::server::Shared;
use crate::stats::{Counter, Gauge};
use crate::upstream::LbContext;

/// The runtime side of one filter chain.
enum Chain {
    Http(Arc<Hcm>),
    Tcp(Arc<crate::tcp::TcpProxy>),
}

/// A listener with its chains' runtime state and stats handles.
pub struct Listener {
    config: Arc<ListenerConfig>,
    chains: Vec<Chain>,
    default_chain: Option<Chain>,
    cx_total: Counter,
    cx_active: Gauge,
    no_filter_chain: Counter,
}

impl Listener {
    /// Prepares a compiled listener for serving (resolves stats handles).
    pub fn new(config: Arc<ListenerConfig>, shared: &Shared) -> Self {
        let chain = |c: &ChainConfig| match &c.terminal {
            Terminal::Http(h) => Chain::Http(Arc::new(Hcm::new(h.clone(), &shared.stats))),
            Terminal::Tcp(t) => Chain::Tcp(Arc::new(crate::tcp::TcpProxy::new(
                (**t).clone(),
                &shared.stats,
            ))),
        };
        let prefix = config.stat_prefix();
        Listener {
            chains: config.chains.iter().map(chain).collect(),
            default_chain: config.default_chain.as_ref().map(chain),
            cx_total: shared
                .stats
                .counter(&format!("{prefix}.downstream_cx_total")),
            cx_active: shared
                .stats
                .gauge(&format!("{prefix}.downstream_cx_active")),
            no_filter_chain: shared
                .stats
                .counter(&format!("{prefix}.no_filter_chain_match")),
            config,
        }
    }

    /// The compiled configuration.
    pub fn config(&self) -> &Arc<ListenerConfig> {
        &self.config
    }

    /// Binds the listener's address (SO_REUSEADDR, like Envoy; SO_REUSEPORT when several
    /// workers each accept on their own socket).
    pub fn bind(&self, reuse_port: bool) -> std::io::Result<TcpListener> {
        let addr = self.config.address;
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
            socket.set_only_v6(false).ok();
        }
        socket.set_nonblocking(true)?;
        socket.set_tcp_nodelay(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        TcpListener::from_std(socket.into())
    }

    /// Accepts connections forever, each served on its own task.
    pub async fn run(self: Arc<Self>, listener: TcpListener, shared: Arc<Shared>) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let me = self.clone();
                    let shared = shared.clone();
                    tokio::spawn(async move { me.serve(stream, peer, shared).await });
                }
                Err(e) => {
                    tracing::warn!(listener = %self.config.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    async fn serve(&self, stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
        let _ = stream.set_nodelay(true);
        let local = stream.local_addr().unwrap_or(self.config.address);
        let original = self
            .config
            .filters
            .original_dst
            .then(|| original_dst(&stream, local))
            .flatten();
        let destination = original.unwrap_or(local);
        let f = self.config.filters;
        let needs_peek = f.tls_inspector || f.http_inspector;
        let inspected = if needs_peek {
            inspect::inspect(
                &stream,
                f.tls_inspector,
                f.http_inspector,
                Duration::from_secs(15),
            )
            .await
        } else {
            inspect::Inspected {
                transport_protocol: "raw_buffer",
                ..Default::default()
            }
        };
        let facts = ConnectionFacts {
            destination: Some(destination),
            source: Some(peer),
            server_name: inspected.server_name.as_deref(),
            transport_protocol: inspected.transport_protocol,
            application_protocols: &inspected.application_protocols,
        };
        let matchers: Vec<_> = self.config.chains.iter().map(|c| &c.matcher).collect();
        let chain = match filter_chain_match::select(&matchers, &facts) {
            Some(i) => &self.chains[i],
            None => match &self.default_chain {
                Some(c) => c,
                None => {
                    self.no_filter_chain.inc();
                    tracing::debug!(listener = %self.config.name, %peer, "no matching filter chain; closing");
                    return;
                }
            },
        };
        self.cx_total.inc();
        self.cx_active.inc();
        match chain {
            Chain::Http(hcm) => {
                let ctx = ConnContext {
                    hcm: hcm.clone(),
                    shared: shared.clone(),
                    down: Downstream { peer, tls: false },
                    local: destination,
                    original_dst: original,
                };
                http::serve(stream, Arc::new(ctx)).await;
            }
            Chain::Tcp(proxy) => {
                let lb = LbContext {
                    original_dst: original,
                    ..Default::default()
                };
                proxy.serve(stream, &shared.clusters, lb).await;
            }
        }
        self.cx_active.dec();
    }
}
