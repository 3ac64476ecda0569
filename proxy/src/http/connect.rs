//! CONNECT ended at the proxy: a route whose CONNECT `upgrade_configs` entry has a
//! `connect_config`. The proxy connects to the route's cluster over TCP, answers `200` itself
//! (no body framing, as RFC 9110 requires of a 2xx to CONNECT), and copies the tunnel's bytes
//! both ways, as Envoy's TCP upstream does. Bytes the client sent before the `200` reach the
//! upstream first. On an HTTP/2 stream the client's end half-closes the upstream connection,
//! and the upstream's close ends the stream.

use http::{Request, Response, header};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::WaitForCancellationFutureOwned;

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
/// answers it, as for any request). `upgrade` counts the tunnel as active while it runs; the
/// tunnel closes when `drained` completes (its filter chain's drain ended).
pub async fn terminate(
    mut req: Request<Body>,
    cluster: &Cluster,
    lb: &LbContext,
    upgrade: ActiveUpgrade,
    drained: WaitForCancellationFutureOwned,
) -> Result<Response<Body>, UpstreamError> {
    let downstream = hyper::upgrade::on(&mut req);
    let http2 = req.version() == http::Version::HTTP_2;
    let conn = cluster.connect(lb).await?;
    let (active, mut upstream) = (conn.active, conn.stream);
    tokio::spawn(async move {
        let _active = (active, upgrade);
        if let Ok(down) = downstream.await {
            let mut down = TokioIo::new(down);
            let tunnel = async {
                if http2 {
                    http2_tunnel(down, upstream).await;
                } else {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut upstream).await;
                }
            };
            tokio::select! {
                () = tunnel => {}
                () = drained => {}
            }
        }
    });
    Ok(Response::new(body::empty()))
}

/// An HTTP/2 stream's tunnel, as Envoy 1.40's: the client's end of the stream half-closes
/// the upstream connection and the tunnel waits for the upstream's close, which ends the
/// response (`END_STREAM`) and then the stream: both halves drop with the request unfinished,
/// and h2 resets it with `NO_ERROR`, as Envoy's connection manager resets a stream whose
/// response ended first.
async fn http2_tunnel(down: impl AsyncRead + AsyncWrite, upstream: impl AsyncRead + AsyncWrite) {
    let (mut down_r, mut down_w) = tokio::io::split(down);
    let (mut up_r, mut up_w) = tokio::io::split(upstream);
    let to_upstream = async {
        let _ = tokio::io::copy(&mut down_r, &mut up_w).await;
        let _ = up_w.shutdown().await;
        std::future::pending::<()>().await
    };
    let to_client = async {
        let _ = tokio::io::copy(&mut up_r, &mut down_w).await;
        let _ = down_w.shutdown().await;
    };
    tokio::select! {
        () = to_client => {}
        () = to_upstream => {}
    }
}
