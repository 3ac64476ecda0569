//! WebSocket (and other `upgrade_configs`) forwarding: the upgrade request goes upstream on a
//! fresh connection; after a `101` (a `2xx` for a forwarded CONNECT), both upgraded streams
//! are spliced together. An HTTP/1 downstream's tunnel ends when either side closes (Envoy's
//! HTTP/1 codec has no half-close); an HTTP/2 stream's when the upstream closes or the stream
//! is reset (its END_STREAM is not passed on to the HTTP/1 upstream, as in Envoy).

use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Mutex, oneshot};
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::access_log::{Handover, Side, TunnelEnd, log_tunnel};
use super::forwarding;
use super::local_reply::local_reply;
use super::stats::ActiveUpgrade;
use super::upgrade_wire::MeteredIo;
use crate::body::{self, Body};
use crate::upstream::{Cluster, LbContext, UpstreamError, UpstreamHost};

/// An HTTP/2 extended CONNECT (RFC 8441: `CONNECT` with `:protocol`, offered under
/// `http2_protocol_options.allow_connect`) as Envoy's codec turns it into an HTTP/1 upgrade:
/// `GET` with `connection: upgrade` and `upgrade: <protocol>`, routed and forwarded like one.
/// The second value says whether `req` was one (its response then goes through
/// [`to_extended_connect`]).
pub fn from_extended_connect<B>(mut req: Request<B>) -> (Request<B>, bool) {
    if req.method() != http::Method::CONNECT {
        return (req, false);
    }
    let Some(protocol) = req.extensions_mut().remove::<hyper::ext::Protocol>() else {
        return (req, false);
    };
    let Ok(upgrade) = http::HeaderValue::from_str(protocol.as_str()) else {
        return (req, false);
    };
    *req.method_mut() = http::Method::GET;
    let headers = req.headers_mut();
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("upgrade"),
    );
    headers.insert(http::header::UPGRADE, upgrade);
    (req, true)
}

/// The response to an extended CONNECT as Envoy's codec writes it: a `101` becomes `200`
/// (which opens the stream's tunnel), without `upgrade`, `connection` or `content-length: 0`.
pub fn to_extended_connect(resp: &mut Response<Body>) {
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        *resp.status_mut() = StatusCode::OK;
    }
    let headers = resp.headers_mut();
    headers.remove(http::header::UPGRADE);
    headers.remove(http::header::CONNECTION);
    if headers
        .get(http::header::CONTENT_LENGTH)
        .is_some_and(|v| v == "0")
    {
        headers.remove(http::header::CONTENT_LENGTH);
    }
}

/// Forwards an upgrade request and, on `101 Switching Protocols` (any `2xx` to a CONNECT),
/// tunnels the two connections.
/// Any other answer is forwarded (a `2xx` or `3xx` one to an `Upgrade:` without its body, as
/// Envoy does), and an HTTP/1 downstream connection then closes, as in Envoy (the upstream
/// refused the upgrade; what the client sends next is not a request).
/// `Err` when no upstream connection could be made; the caller answers it. `upgrade` counts
/// the tunnel as active while it runs; `log`, when access logs keep a record, gets it back
/// once the response is sent, and the tunnel writes it when it closes. The tunnel closes both
/// connections when `drained` completes (its filter chain's drain ended).
pub async fn forward(
    mut req: Request<Body>,
    cluster: &Cluster,
    lb: &LbContext,
    upgrade: ActiveUpgrade,
    log: Option<oneshot::Receiver<Handover>>,
    drained: WaitForCancellationFutureOwned,
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
    let host = UpstreamHost {
        host: conn.addr,
        remote: active.remote(),
    };
    let io = MeteredIo::new(conn.stream, lb.target.clone());
    let (mut sender, connection) = match hyper::client::conn::http1::handshake(TokioIo::new(io))
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
    if let Some(t) = &lb.target {
        // As the upstream codec counts a response head's header bytes.
        let headers = upstream_resp.headers().iter();
        t.wire()
            .read_head(headers.map(|(n, v)| n.as_str().len() + v.len() + 3).sum());
    }
    // A CONNECT is accepted with any 2xx, an `Upgrade:` only with 101.
    let upgraded = if connect {
        upstream_resp.status().is_success()
    } else {
        upstream_resp.status() == StatusCode::SWITCHING_PROTOCOLS
    };
    if !upgraded {
        forwarding::mutate_response(upstream_resp.headers_mut(), false);
        let mut resp = if !connect && status_2xx_or_3xx(upstream_resp.status()) {
            without_body(upstream_resp)
        } else {
            upstream_resp.map(body::boxed)
        };
        if http1 {
            resp.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        return Ok(resp);
    }
    let upstream_upgrade = hyper::upgrade::on(&mut upstream_resp);
    tokio::spawn(async move {
        let _active = (active, upgrade);
        let mut end = TunnelEnd::default();
        if let (Ok(down), Ok(up)) = (downstream_upgrade.await, upstream_upgrade.await) {
            let (mut down_r, down_w) = tokio::io::split(TokioIo::new(down));
            let (mut up_r, up_w) = tokio::io::split(TokioIo::new(up));
            let (down_w, up_w) = (Mutex::new(down_w), Mutex::new(up_w));
            let (mut received, mut sent) = (0, 0);
            let tunnel = async {
                if http1 {
                    // Envoy's HTTP/1 codec has no half-close: the first side to close ends the
                    // stream, and both connections close (as they drop here).
                    tokio::select! {
                        biased;
                        _ = pump(&mut down_r, &up_w, &mut received) => Side::Downstream,
                        _ = pump(&mut up_r, &down_w, &mut sent) => Side::Upstream,
                    }
                } else {
                    // An HTTP/2 stream to an HTTP/1 upstream, as Envoy's codecs run it: the
                    // client's END_STREAM is not passed on (the upstream's codec has no
                    // half-close), and the tunnel ends when the upstream closes (the stream
                    // ends with it) or when the stream is reset or its connection goes.
                    let down_to_up = async {
                        if copy(&mut down_r, &up_w, &mut received).await {
                            gone(&down_w).await;
                        }
                    };
                    tokio::select! {
                        biased;
                        () = down_to_up => Side::Downstream,
                        _ = pump(&mut up_r, &down_w, &mut sent) => Side::Upstream,
                    }
                }
            };
            let closed_first = tokio::select! {
                side = tunnel => Some(side),
                () = drained => None,
            };
            end = TunnelEnd {
                received,
                sent,
                closed_first,
            };
        }
        if let Some(log) = log {
            log_tunnel(log, end).await;
        }
    });
    let (mut parts, _) = upstream_resp.into_parts();
    forwarding::mutate_response(&mut parts.headers, true);
    parts.extensions.insert(host);
    Ok(Response::from_parts(parts, body::empty()))
}

/// Whether `status` is one Envoy gives without a body when it answers an upgrade.
fn status_2xx_or_3xx(status: StatusCode) -> bool {
    status.is_success() || status.is_redirection()
}

/// A `2xx` or `3xx` answer to an upgrade (not `101`) as Envoy 1.40 gives it to the client:
/// the upstream's head without `content-type` and its framing, and no body (`content-length:
/// 0` where a body may be), probed side by side with Envoy.
fn without_body(resp: Response<hyper::body::Incoming>) -> Response<Body> {
    let (mut parts, _) = resp.into_parts();
    for name in [
        http::header::CONTENT_TYPE,
        http::header::CONTENT_LENGTH,
        http::header::TRANSFER_ENCODING,
    ] {
        parts.headers.remove(name);
    }
    if parts.status != StatusCode::NO_CONTENT && parts.status != StatusCode::NOT_MODIFIED {
        parts.headers.insert(
            http::header::CONTENT_LENGTH,
            http::HeaderValue::from_static("0"),
        );
    }
    Response::from_parts(parts, body::empty())
}

/// Copies `from` to `to` until `from` ends or either side fails, then shuts `to` down; counts
/// the bytes copied in `copied` as they go.
async fn pump<W: AsyncWrite + Unpin>(
    from: &mut (impl AsyncRead + Unpin),
    to: &Mutex<W>,
    copied: &mut u64,
) {
    copy(from, to, copied).await;
    let _ = to.lock().await.shutdown().await;
}

/// Copies `from` to `to` until `from` ends or either side fails, counting the bytes copied in
/// `copied` as they go; whether `from` ended cleanly.
async fn copy<W: AsyncWrite + Unpin>(
    from: &mut (impl AsyncRead + Unpin),
    to: &Mutex<W>,
    copied: &mut u64,
) -> bool {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) => return true,
            Err(_) => return false,
            Ok(n) => {
                if to.lock().await.write_all(&buf[..n]).await.is_err() {
                    return false;
                }
                *copied += n as u64;
            }
        }
    }
}

/// How often an HTTP/2 stream whose client ended its side is checked for a reset or a lost
/// connection: nothing else tells (hyper's upgraded stream reports them only to a write).
const STREAM_CHECK: Duration = Duration::from_millis(100);

/// Answers once writing to the HTTP/2 stream `to` fails: the client reset the stream, or its
/// connection went.
async fn gone<W: AsyncWrite + Unpin>(to: &Mutex<W>) {
    let mut check = tokio::time::interval(STREAM_CHECK);
    loop {
        check.tick().await;
        if to.lock().await.flush().await.is_err() {
            return;
        }
    }
}
