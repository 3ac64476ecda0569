//! The HTTP connection manager: serves downstream HTTP/1.1 and HTTP/2 connections with hyper
//! and runs each request through the router.

mod attempts;
mod buffered_body;
pub mod forwarding;
pub mod local_reply;
mod mirror;
mod retry;
mod router;
mod stats;
mod stream_limits;
mod timeouts;
mod upgrade;

pub use stats::HcmStats;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::config::hcm::{Codec, HcmConfig};
use crate::server::Shared;
use forwarding::Downstream;

/// A connection manager ready to serve: its config plus resolved stats handles.
#[derive(Debug)]
pub struct Hcm {
    /// The compiled configuration.
    pub config: Arc<HcmConfig>,
    /// Its stats (`http.<stat_prefix>.*`).
    pub stats: HcmStats,
}

impl Hcm {
    /// Resolves the stats handles of `config`.
    pub fn new(config: Arc<HcmConfig>, store: &crate::stats::Store) -> Self {
        let stats = HcmStats::new(store, &config.stat_prefix);
        Hcm { config, stats }
    }
}

/// Everything a request on one downstream connection needs.
pub struct ConnContext {
    /// The connection manager serving the connection.
    pub hcm: Arc<Hcm>,
    /// Process-wide state (clusters, RDS tables, stats).
    pub shared: Arc<Shared>,
    /// Peer and TLS facts.
    pub down: Downstream,
    /// Local address (after `original_dst`).
    pub local: SocketAddr,
    /// Original destination, when the connection was redirected.
    pub original_dst: Option<SocketAddr>,
}

/// Serves one downstream connection until it closes.
pub async fn serve<I>(io: I, ctx: Arc<ConnContext>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let stats = &ctx.hcm.stats;
    stats.cx_total.inc();
    stats.cx_active.inc();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .preserve_header_case(false);
    builder.http2().timer(TokioTimer::new());
    let builder = match ctx.hcm.config.codec {
        Codec::Http1 => builder.http1_only(),
        Codec::Http2 => builder.http2_only(),
        Codec::Auto => builder,
    };
    let svc_ctx = ctx.clone();
    let service = service_fn(move |req| {
        let ctx = svc_ctx.clone();
        async move { Ok::<_, Infallible>(router::handle(req, &ctx).await) }
    });
    if let Err(e) = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .await
    {
        tracing::debug!(peer = %ctx.down.peer, error = %e, "downstream connection ended with an error");
    }
    stats.cx_active.dec();
}
