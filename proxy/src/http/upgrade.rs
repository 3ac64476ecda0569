//! WebSocket (and other `upgrade_configs`) forwarding: the upgrade request goes upstream on a
//! fresh connection; after a `101` (a `2xx` for a forwarded CONNECT), both upgraded streams
//! are spliced together.

use std::time::Instant;

use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use super::access_log::{Handover, TunnelEnd, log_tunnel};
use super::forwarding;
use super::local_reply::local_reply;
use super::stats::ActiveUpgrade;
use crate::body::{self, Body};
use crate::upstream::{Cluster, LbContext, UpstreamError, UpstreamHost};

/// Forwards an upgrade request and, on `101 Switching Protocols` (any `2xx` to a CONNECT),
/// tunnels the two connections.
/// Any other answer is forwarded as is, and an HTTP/1 downstream connection then closes, as in
/// Envoy (the upstream refused the upgrade; what the client sends next is not a request).
/// `Err` when no upstream connection could be made; the caller answers it. `upgrade` counts
/// the tunnel as active while it runs; `log`, when access logs keep a record, gets it back
/// once the response is sent, and the tunnel writes it when it closes.
pub async fn forward(
    mut req: Request<Body>,
    cluster: &Cluster,
    lb: &LbContext,
    upgrade: ActiveUpgrade,
    log: Option<oneshot::Receiver<Handover>>,
) -> Result<Response<Body>, UpstreamError> {
    let downstream_upgrade = hyper::upgrade::on(&mut req);
    let http1 = req.version() <= http::Version::HTTP_11;
    let connect = req.method() == http::Method::CONNECT;
    let conn = cluster.connect(lb).await?;
    if let Some(t) = &lb.target {
        t.note(
            conn.addr,
            conn.active.remote(),
            conn.active.local(),
            conn.active.sans(),
        );
    }
    let active = conn.active;
    let host = conn.addr;
    let (mut sender, connection) = match hyper::client::conn::http1::handshake(TokioIo::new(
        conn.stream,
    ))
    .await
    {
        Ok(pair) => pair,
        Err(e) => {
            return Ok(local_reply(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "upstream connect error or disconnect/reset before headers. reset reason: {e}"
                ),
            ));
        }
    };
    tokio::spawn(connection.with_upgrades());
    let mut upstream_resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => {
            return Ok(local_reply(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "upstream connect error or disconnect/reset before headers. reset reason: {e}"
                ),
            ));
        }
    };
    // A CONNECT is accepted with any 2xx, an `Upgrade:` only with 101.
    let upgraded = if connect {
        upstream_resp.status().is_success()
    } else {
        upstream_resp.status() == StatusCode::SWITCHING_PROTOCOLS
    };
    if !upgraded {
        forwarding::mutate_response(upstream_resp.headers_mut(), false);
        if http1 {
            upstream_resp.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        return Ok(upstream_resp.map(body::boxed));
    }
    let upstream_upgrade = hyper::upgrade::on(&mut upstream_resp);
    tokio::spawn(async move {
        let _active = (active, upgrade);
        let mut end = TunnelEnd::default();
        if let (Ok(down), Ok(up)) = (downstream_upgrade.await, upstream_upgrade.await) {
            let (mut down_r, mut down_w) = tokio::io::split(TokioIo::new(down));
            let (mut up_r, mut up_w) = tokio::io::split(TokioIo::new(up));
            let ((received, down_done), (sent, up_done)) =
                tokio::join!(pump(&mut down_r, &mut up_w), pump(&mut up_r, &mut down_w));
            end = TunnelEnd {
                received,
                sent,
                downstream_closed_first: down_done <= up_done,
            };
        }
        if let Some(log) = log {
            log_tunnel(log, end).await;
        }
    });
    let (mut parts, _) = upstream_resp.into_parts();
    forwarding::mutate_response(&mut parts.headers, true);
    parts.extensions.insert(UpstreamHost(host));
    Ok(Response::from_parts(parts, body::empty()))
}

/// Copies `from` to `to` until `from` ends or either side fails, then shuts `to` down; the
/// bytes copied and when reading ended.
async fn pump(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
) -> (u64, Instant) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut copied = 0;
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                copied += n as u64;
            }
        }
    }
    let ended = Instant::now();
    let _ = to.shutdown().await;
    (copied, ended)
}
