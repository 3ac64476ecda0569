//! xDS in the proxy: `dynamic_resources` served by the generic ADS client (`xds-client`) or by
//! watched files, applied by [`handler::ProxyHandler`] through the one writer
//! ([`crate::apply`]). Runs on its own thread and runtime, so a large push never takes a
//! data-path worker.

pub mod draining;
pub mod files;
pub mod handler;
pub mod records;
pub mod rtds;
pub mod sds;
mod stats;
mod waiting;

use std::sync::{Arc, OnceLock};

use xds_client::client::{self, Client, Mode, RateLimit, TlsConnect, Transport};

use crate::config::dynamic::{AdsConfig, ControlPlane, DynamicConfig, KeepAlive, Source};
use crate::config::upstream_transport::Socket;
use crate::process::Process;
use crate::tls::stats::TlsStats;
use crate::tls::{Carries, ClientContext};
use handler::ProxyHandler;

/// The proxy's xDS machinery, for admin (`/xds`, `/config_dump`, `/init_dump`).
pub struct Xds {
    /// The ADS client, when some source is ADS.
    pub client: Option<Client>,
    /// What was received and how it was applied.
    pub handler: Arc<ProxyHandler>,
}

/// How many pushes `/xds` keeps.
const PUSH_LOG_LEN: usize = 64;

/// Starts xDS for the bootstrap's `dynamic_resources`, and SDS for the secrets the static
/// listeners and clusters name; answers whether start-up waits for it (the server turns LIVE
/// when the initial fetch is done). `state` gets the xDS machinery once it runs.
pub fn start(process: &Arc<Process>, state: Arc<OnceLock<Xds>>) -> Result<bool, String> {
    let dynamic = process.bootstrap.dynamic.clone();
    let needs_sds = process
        .shared
        .secrets
        .sources()
        .iter()
        .any(|s| *s != crate::config::tls::sds::SecretSource::Static);
    if dynamic.is_none() && !needs_sds {
        return Ok(false);
    }
    let waits = dynamic.is_some();
    let process = process.clone();
    std::thread::Builder::new()
        .name("revoy-xds".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the xDS runtime");
                    return;
                }
            };
            rt.block_on(async move {
                match dynamic {
                    Some(dynamic) => run(&process, dynamic, &state),
                    None => sds::follow(process, None),
                }
                std::future::pending::<()>().await;
            });
        })
        .map_err(|e| format!("cannot start the xDS thread: {e}"))?;
    Ok(waits)
}

/// Sets up the client and file watchers on the xDS runtime, puts them in `state` and starts
/// the initial fetch.
fn run(process: &Arc<Process>, dynamic: DynamicConfig, state: &OnceLock<Xds>) {
    let handler = ProxyHandler::new(process, dynamic.clone());
    let client = dynamic
        .ads
        .as_ref()
        .and_then(|ads| match client_config(process, ads) {
            Ok(config) => Some(client::start(config, handler.clone())),
            Err(e) => {
                tracing::error!("dynamic_resources.ads_config: {e}; no ADS stream");
                None
            }
        });
    if let Some(c) = &client {
        handler.set_client(c.clone());
    }
    sds::follow(process.clone(), client.clone());
    let _ = state.set(Xds {
        client,
        handler: handler.clone(),
    });
    for (sub, type_url) in [
        (&dynamic.cds, xds_client::CLUSTER_TYPE_URL),
        (&dynamic.lds, xds_client::LISTENER_TYPE_URL),
    ] {
        if let Some(crate::config::dynamic::Subscription {
            source: Source::Path(path),
            ..
        }) = sub
        {
            files::watch(path.clone(), type_url, handler.clone());
        }
    }
    // As Envoy's cluster manager initializes the static clusters (their secrets included)
    // before CDS, the initial fetch starts once the static clusters' secrets are in.
    let process = process.clone();
    tokio::spawn(async move {
        sds::secrets_arrived(&process, &sds::static_cluster_secrets(&process)).await;
        handler.begin();
    });
}

/// How to reach a control plane at `target` through the static cluster `cluster` (if any):
/// over TLS when the cluster's transport socket is an `UpstreamTlsContext` (offering `h2`
/// when it names no ALPN), else in plaintext.
pub(crate) fn transport(
    process: &Process,
    target: &ControlPlane,
    cluster: Option<&str>,
) -> Result<Transport, String> {
    let tls = cluster
        .and_then(|name| process.bootstrap.clusters.iter().find(|c| c.name == name))
        .and_then(|c| match c.transport.sockets().first() {
            Some(Socket::Tls(spec)) => Some((c, spec.clone())),
            _ => None,
        });
    match (target, tls) {
        (ControlPlane::Tcp(addr), None) => Ok(Transport::Tcp(*addr)),
        (ControlPlane::Unix(path), None) => Ok(Transport::Unix(path.clone())),
        (ControlPlane::Unix(_), Some((c, _))) => Err(format!(
            "cluster '{}': TLS over a pipe to the control plane is not implemented by revoy",
            c.name
        )),
        (ControlPlane::Tcp(addr), Some((c, spec))) => {
            let stats = TlsStats::new(
                &process.shared.stats,
                &format!("cluster.{}.", c.observability_name),
            );
            let ctx = ClientContext::new(&spec, &process.shared.secrets, stats, None).ok_or_else(
                || {
                    format!(
                        "cluster '{}': tls_params allow no TLS version revoy implements",
                        c.name
                    )
                },
            )?;
            Ok(Transport::Tls(
                *addr,
                TlsConnect {
                    config: ctx.config(Carries::Http2),
                    server_name: ctx.server_name(*addr),
                    observer: Some(Arc::new(ctx)),
                },
            ))
        }
    }
}

fn client_config(process: &Process, ads: &AdsConfig) -> Result<client::Config, String> {
    let node = crate::load::effective_node(
        process.bootstrap.proto.decode().node.as_ref(),
        &process.options,
    );
    let transport = transport(process, &ads.target, ads.cluster.as_deref())?;
    let mode = if ads.delta { Mode::Delta } else { Mode::Sotw };
    let mut config = client::Config::new(transport, mode, node);
    config.set_node_on_first_message_only = ads.set_node_on_first_message_only;
    config.rate_limit = ads.rate_limit.map(|(max_tokens, fill_rate)| RateLimit {
        max_tokens,
        fill_rate,
    });
    config.push_log_len = PUSH_LOG_LEN;
    config.keep_alive = match ads.keep_alive {
        KeepAlive::Default => Some(client::KeepAlive::default()),
        KeepAlive::Off => None,
        KeepAlive::Every { interval, timeout } => Some(client::KeepAlive { interval, timeout }),
    };
    Ok(config)
}
