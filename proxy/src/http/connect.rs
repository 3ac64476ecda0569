//! CONNECT ended at the proxy: a route whose CONNECT `upgrade_configs` entry has a
//! `connect_config`. The proxy connects to the route's cluster over TCP, answers `200` itself
//! (no body framing, as RFC 9110 requires of a 2xx to CONNECT), and copies the tunnel's bytes
//! both ways, as Envoy's TCP upstream does. Bytes the client sent before the `200` reach the
//! upstream first.

use http::{Request, Response, header};
use hyper_util::rt::TokioIo;

use super::stats::ActiveUpgrade;
use crate::body::{self, Body};
use crate::upstream::{Cluster, LbContext, UpstreamError};

/// Whether a CONNECT request is one Envoy's codec accepts: an authority with a port and no
/// path as its target, and no body framing headers. Envoy answers any other with `400`.
pub fn well_formed(req: &Request<Body>) -> bool {
    let uri = req.uri();
    uri.path_and_query().is_none()
        && uri.authority().is_some_and(|a| a.port().is_some())
        && !req.headers().contains_key(header::CONTENT_LENGTH)
        && !req.headers().contains_key(header::TRANSFER_ENCODING)
}

/// Connects to the cluster and answers `200`; the tunnel runs on its own task once the client
/// connection has switched. `Err` when no upstream connection could be made (the caller
/// answers it, as for any request). `upgrade` counts the tunnel as active while it runs.
pub async fn terminate(
    mut req: Request<Body>,
    cluster: &Cluster,
    lb: &LbContext,
    upgrade: ActiveUpgrade,
) -> Result<Response<Body>, UpstreamError> {
    let downstream = hyper::upgrade::on(&mut req);
    let conn = cluster.connect(lb).await?;
    let (active, mut upstream) = (conn.active, conn.stream);
    tokio::spawn(async move {
        let _active = (active, upgrade);
        if let Ok(down) = downstream.await {
            let mut down = TokioIo::new(down);
            let _ = tokio::io::copy_bidirectional(&mut down, &mut upstream).await;
        }
    });
    Ok(Response::new(body::empty()))
}
