//! xDS in the proxy: `dynamic_resources` served by the generic ADS client (`xds-client`) or by
//! watched files, applied by [`handler::ProxyHandler`] through the one writer
//! ([`crate::apply`]). Runs on its own thread and runtime, so a large push never takes a
//! data-path worker.

pub mod files;
pub mod handler;
pub mod records;
pub mod sds;
mod stats;
mod waiting;

use std::sync::Arc;

use xds_client::client::{self, Client, Mode, RateLimit, Transport};

use crate::config::dynamic::{AdsConfig, ControlPlane, DynamicConfig, Source};
use crate::lifecycle::ServerState;
use crate::shared::Shared;
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
/// once the static resources' secrets have arrived and the initial fetch is done).
pub fn start(shared: &Arc<Shared>) -> Result<bool, String> {
    let dynamic = shared.bootstrap.dynamic.clone();
    let needs_sds = !sds::static_secrets(shared).is_empty();
    if dynamic.is_none() && !needs_sds {
        return Ok(false);
    }
    let shared = shared.clone();
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
                    Some(dynamic) => run(&shared, dynamic),
                    None => {
                        sds::follow(shared.clone(), None);
                        sds::static_secrets_arrived(&shared).await;
                        shared.lifecycle.set_state(ServerState::Live);
                        tracing::info!(
                            "the static listeners' and clusters' secrets arrived; revoy is live"
                        );
                    }
                }
                std::future::pending::<()>().await;
            });
        })
        .map_err(|e| format!("cannot start the xDS thread: {e}"))?;
    Ok(true)
}

/// Sets up the client and file watchers on the xDS runtime and starts the initial fetch.
fn run(shared: &Arc<Shared>, dynamic: DynamicConfig) {
    let handler = ProxyHandler::new(shared, dynamic.clone());
    let client = dynamic
        .ads
        .as_ref()
        .map(|ads| client::start(client_config(shared, ads), handler.clone()));
    if let Some(c) = &client {
        handler.set_client(c.clone());
    }
    sds::follow(shared.clone(), client.clone());
    let _ = shared.xds.set(Xds {
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
    // before CDS, the initial fetch starts once the static resources' secrets are in.
    let shared = shared.clone();
    tokio::spawn(async move {
        sds::static_secrets_arrived(&shared).await;
        handler.begin();
    });
}

fn client_config(shared: &Shared, ads: &AdsConfig) -> client::Config {
    let node = crate::load::effective_node(
        shared.bootstrap.proto.decode().node.as_ref(),
        &shared.options,
    );
    let transport = match &ads.target {
        ControlPlane::Tcp(addr) => Transport::Tcp(*addr),
        ControlPlane::Unix(path) => Transport::Unix(path.clone()),
    };
    let mode = if ads.delta { Mode::Delta } else { Mode::Sotw };
    let mut config = client::Config::new(transport, mode, node);
    config.set_node_on_first_message_only = ads.set_node_on_first_message_only;
    config.rate_limit = ads.rate_limit.map(|(max_tokens, fill_rate)| RateLimit {
        max_tokens,
        fill_rate,
    });
    config.push_log_len = PUSH_LOG_LEN;
    config
}
