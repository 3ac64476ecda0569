//! Unary gRPC calls revoy makes itself (trace exports, authorization checks), sent through a
//! cluster like any other request (its pool, load balancing and stats), as Envoy's gRPC
//! client does.

use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderName, HeaderValue};
use http_body_util::BodyExt;

use super::{ClusterManager, LbContext};

/// gRPC's status for a call that ran out of time.
pub const DEADLINE_EXCEEDED: u32 = 4;
/// gRPC's status for a call that could not reach its service.
pub const UNAVAILABLE: u32 = 14;

/// One call: where it goes and what it carries besides its message.
pub struct Call<'a> {
    /// The cluster.
    pub cluster: &'a str,
    /// `/package.Service/Method`.
    pub path: &'static str,
    /// The `:authority`.
    pub authority: &'a str,
    /// Extra request metadata.
    pub metadata: &'a [(HeaderName, HeaderValue)],
    /// Deadline of the whole call, sent as `grpc-timeout` too.
    pub timeout: Option<Duration>,
}

/// Why a call failed: its gRPC status (a failure to reach the service is `UNAVAILABLE`, a
/// timeout `DEADLINE_EXCEEDED`) and what happened.
#[derive(Debug)]
pub struct Failure {
    /// The gRPC status code.
    pub status: u32,
    /// What happened.
    pub message: String,
}

impl Failure {
    fn unavailable(message: impl Into<String>) -> Failure {
        Failure {
            status: UNAVAILABLE,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Sends `message` and returns the response message's bytes.
pub async fn unary(
    clusters: &ClusterManager,
    call: &Call<'_>,
    message: &impl prost::Message,
) -> Result<Bytes, Failure> {
    let cluster = clusters
        .get(call.cluster)
        .ok_or_else(|| Failure::unavailable(format!("unknown cluster '{}'", call.cluster)))?;
    let len = message.encoded_len();
    let mut framed = Vec::with_capacity(5 + len);
    framed.push(0);
    framed.extend_from_slice(&(len as u32).to_be_bytes());
    message
        .encode(&mut framed)
        .map_err(|e| Failure::unavailable(e.to_string()))?;
    let mut req = http::Request::post(call.path)
        .version(http::Version::HTTP_2)
        .header(http::header::HOST, call.authority)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(crate::body::full(framed))
        .map_err(|e| Failure::unavailable(e.to_string()))?;
    for (name, value) in call.metadata {
        req.headers_mut().append(name, value.clone());
    }
    if let Some(t) = call.timeout
        && let Ok(v) = HeaderValue::from_str(&format!("{}m", t.as_millis()))
    {
        req.headers_mut().insert("grpc-timeout", v);
    }
    let lb = LbContext {
        internal: true,
        ..LbContext::default()
    };
    let exchange = async {
        let resp = cluster
            .request(req, &lb)
            .await
            .map_err(|e| Failure::unavailable(e.to_string()))?;
        let head_status = resp.headers().get("grpc-status").cloned();
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| Failure::unavailable(e.to_string()))?;
        let trailers = body.trailers().cloned();
        let grpc_status = head_status.or_else(|| trailers.as_ref()?.get("grpc-status").cloned());
        match grpc_status
            .as_ref()
            .map(|v| v.to_str().map(str::parse::<u32>))
        {
            Some(Ok(Ok(0))) => unframe(body.to_bytes()),
            Some(Ok(Ok(code))) => Err(Failure {
                status: code,
                message: format!("grpc-status {code}"),
            }),
            _ => Err(Failure::unavailable(format!(
                "HTTP {status} without grpc-status"
            ))),
        }
    };
    match call.timeout {
        Some(t) => tokio::time::timeout(t, exchange)
            .await
            .map_err(|_| Failure {
                status: DEADLINE_EXCEEDED,
                message: "timeout".into(),
            })?,
        None => exchange.await,
    }
}

/// The message of a unary response body (one uncompressed length-prefixed message).
fn unframe(mut body: Bytes) -> Result<Bytes, Failure> {
    if body.len() < 5 || body[0] != 0 {
        return Err(Failure::unavailable("malformed gRPC response body"));
    }
    body.advance(1);
    let len = body.get_u32() as usize;
    if body.len() < len {
        return Err(Failure::unavailable("truncated gRPC response message"));
    }
    Ok(body.split_to(len))
}
