//! xDS in the proxy: where `dynamic_resources` are served from. Until the ADS client is wired
//! in, a bootstrap with `dynamic_resources` keeps the server INITIALIZING (not ready) while its
//! static resources serve.

use std::sync::Arc;

/// The proxy's xDS state (filled in with the ADS client).
pub struct Xds;

/// Starts xDS for the bootstrap; answers whether start-up waits for it.
pub fn start(shared: &Arc<crate::server::Shared>) -> Result<bool, String> {
    if let Some(why) = &shared.bootstrap.awaits_xds {
        tracing::error!("dynamic_resources: {why}");
    }
    Ok(shared.bootstrap.awaits_xds.is_some())
}
