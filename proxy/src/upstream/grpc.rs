//! Unary gRPC calls through a cluster, as Envoy's async gRPC client makes them: the request
//! goes through the cluster's pool, load balancing and stats like any other request (the
//! OpenTelemetry exporter, the rate limit service client).

use std::time::Duration;

use http_body_util::BodyExt;
use prost::Message;

use super::{ClusterManager, LbContext};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    /// The cluster is not configured.
    #[error("unknown cluster '{0}'")]
    UnknownCluster(String),
    /// No answer within the call's timeout.
    #[error("timeout")]
    Timeout,
    /// The request could not be sent or the answer read.
    #[error("{0}")]
    Transport(String),
    /// The answer carried a `grpc-status` other than 0, or none.
    #[error("{0}")]
    Status(String),
    /// The answer's message did not decode.
    #[error("bad response message: {0}")]
    Decode(String),
}

/// Calls `path` (`/package.Service/Method`) on `cluster` with `message`, `authority` as the
/// `:authority`, within `timeout` (also sent as `grpc-timeout`); the decoded answer.
pub async fn unary<Resp: Message + Default>(
    clusters: &ClusterManager,
    cluster: &str,
    authority: &str,
    path: &str,
    timeout: Option<Duration>,
    message: &impl Message,
) -> Result<Resp, GrpcError> {
    let target = clusters
        .get(cluster)
        .ok_or_else(|| GrpcError::UnknownCluster(cluster.to_owned()))?;
    let encoded = message.encode_to_vec();
    let mut framed = Vec::with_capacity(5 + encoded.len());
    framed.push(0);
    framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    framed.extend_from_slice(&encoded);
    let mut req = http::Request::post(path)
        .version(http::Version::HTTP_2)
        .header(http::header::HOST, authority)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(crate::body::full(framed))
        .map_err(|e| GrpcError::Transport(e.to_string()))?;
    if let Some(t) = timeout
        && let Ok(v) = http::HeaderValue::from_str(&format!("{}m", t.as_millis()))
    {
        req.headers_mut().insert("grpc-timeout", v);
    }
    let lb = LbContext {
        internal: true,
        ..LbContext::default()
    };
    let call = async {
        let resp = target
            .request(req, &lb)
            .await
            .map_err(|e| GrpcError::Transport(e.to_string()))?;
        let head_status = resp.headers().get("grpc-status").cloned();
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| GrpcError::Transport(e.to_string()))?;
        let grpc_status = head_status.or_else(|| body.trailers()?.get("grpc-status").cloned());
        match grpc_status.as_ref().map(http::HeaderValue::as_bytes) {
            Some(b"0") => {}
            Some(code) => {
                return Err(GrpcError::Status(format!(
                    "grpc-status {}",
                    String::from_utf8_lossy(code)
                )));
            }
            None => {
                return Err(GrpcError::Status(format!(
                    "HTTP {status} without grpc-status"
                )));
            }
        }
        decode_frame(&body.to_bytes())
    };
    match timeout {
        Some(t) => tokio::time::timeout(t, call)
            .await
            .map_err(|_| GrpcError::Timeout)?,
        None => call.await,
    }
}

/// The message of a response body holding one uncompressed gRPC frame (an empty body is an
/// empty message).
fn decode_frame<Resp: Message + Default>(body: &[u8]) -> Result<Resp, GrpcError> {
    if body.is_empty() {
        return Ok(Resp::default());
    }
    let (head, rest) = body
        .split_at_checked(5)
        .ok_or_else(|| GrpcError::Decode("truncated frame".to_owned()))?;
    if head[0] != 0 {
        return Err(GrpcError::Decode("compressed frame".to_owned()));
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let payload = rest
        .get(..len)
        .ok_or_else(|| GrpcError::Decode("truncated frame".to_owned()))?;
    Resp::decode(payload).map_err(|e| GrpcError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_decode() {
        let msg = proto::pb::google::protobuf::StringValue { value: "hi".into() };
        let encoded = msg.encode_to_vec();
        let mut framed = vec![0, 0, 0, 0, encoded.len() as u8];
        framed.extend_from_slice(&encoded);
        let back: proto::pb::google::protobuf::StringValue = decode_frame(&framed).unwrap();
        assert_eq!(back.value, "hi");
        assert!(decode_frame::<()>(&[]).is_ok());
        assert!(decode_frame::<()>(&[0, 0, 0]).is_err());
        assert!(decode_frame::<()>(&[1, 0, 0, 0, 0]).is_err());
    }
}
