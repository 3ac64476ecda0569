//! SotW requests as they go on the wire. Every SotW request names every resource subscribed
//! to, ACKs included (naming fewer would unsubscribe the others), so at 10,000 EDS clusters
//! each ACK carried 10,000 names: cloned into the request, encoded, dropped. Here a
//! subscription's names are encoded once, when it changes, and the stream's request body
//! (what tonic's generated client would send, written here) hands those bytes to HTTP/2 as
//! they are, between the request's other fields: h2 writes them to the socket from there, so
//! an ACK copies no name in user space. Fields go in number order, so the bytes are those
//! prost writes for the same `DiscoveryRequest`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderValue, Method, Version};
use http_body::Frame;
use prost::Message;
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use proto::pb::google::rpc::Status as RpcStatus;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codec::{DecodeBuf, Decoder, Streaming};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tower::{Service, ServiceExt as _};

use super::Service as XdsService;
use super::subscriptions::WILDCARD;

/// The SotW ADS method.
const STREAM_AGGREGATED_RESOURCES: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// The SotW SDS method (a secret server of its own, such as Istio's pilot-agent).
const STREAM_SECRETS: &str = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets";

/// The key of `DiscoveryRequest.resource_names`: field 3, length-delimited.
const RESOURCE_NAMES_KEY: u8 = (3 << 3) | 2;

/// Names encoded as `DiscoveryRequest.resource_names` entries: key, length and name each.
#[derive(Debug, Clone, Default)]
pub(super) struct EncodedNames(Bytes);

impl EncodedNames {
    /// Encodes `names`, in order.
    pub(super) fn new<'a>(names: impl Iterator<Item = &'a str> + Clone) -> Self {
        let len = names.clone().map(entry_len).sum();
        let mut buf = BytesMut::with_capacity(len);
        for name in names {
            put_entry(&mut buf, name);
        }
        EncodedNames(buf.freeze())
    }
}

/// The length of `name`'s entry.
fn entry_len(name: &str) -> usize {
    1 + prost::length_delimiter_len(name.len()) + name.len()
}

/// Writes `name`'s entry.
fn put_entry(buf: &mut impl BufMut, name: &str) {
    buf.put_u8(RESOURCE_NAMES_KEY);
    let mut len = name.len();
    while len >= 0x80 {
        buf.put_u8((len as u8) | 0x80);
        len >>= 7;
    }
    buf.put_u8(len as u8);
    buf.put_slice(name.as_bytes());
}

/// A SotW `DiscoveryRequest` whose `resource_names` are already encoded.
#[derive(Debug, Clone, Default)]
pub(super) struct SotwRequest {
    /// `version_info`: the version ACKed.
    pub(super) version_info: String,
    /// `node`, when due.
    pub(super) node: Option<Node>,
    /// Whether `resource_names` begins with the explicit wildcard.
    pub(super) wildcard: bool,
    /// The other entries of `resource_names`.
    pub(super) names: EncodedNames,
    /// `type_url`.
    pub(super) type_url: String,
    /// `response_nonce`.
    pub(super) response_nonce: String,
    /// `error_detail`, on a NACK.
    pub(super) error_detail: Option<RpcStatus>,
}

impl SotwRequest {
    /// The message [`RequestBody`] sends for the request, its gRPC prefix checked.
    #[cfg(test)]
    pub(super) fn into_message(self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for chunk in Wire::from(self).into_chunks().expect("a small request") {
            bytes.extend_from_slice(&chunk);
        }
        let message = bytes.split_off(GRPC_PREFIX);
        let len = u32::try_from(message.len()).unwrap().to_be_bytes();
        assert_eq!(bytes, [0, len[0], len[1], len[2], len[3]], "gRPC prefix");
        message
    }
}

/// A request cut around `resource_names`: fields 1-2, field 3, fields 4-6.
struct Wire {
    head: DiscoveryRequest,
    wildcard: bool,
    names: Bytes,
    tail: DiscoveryRequest,
}

impl From<SotwRequest> for Wire {
    fn from(request: SotwRequest) -> Wire {
        Wire {
            head: DiscoveryRequest {
                version_info: request.version_info,
                node: request.node,
                ..Default::default()
            },
            wildcard: request.wildcard,
            names: request.names.0,
            tail: DiscoveryRequest {
                type_url: request.type_url,
                response_nonce: request.response_nonce,
                error_detail: request.error_detail,
                ..Default::default()
            },
        }
    }
}

impl Wire {
    /// The length of the encoded request.
    fn len(&self) -> usize {
        let wildcard = if self.wildcard {
            entry_len(WILDCARD)
        } else {
            0
        };
        self.head.encoded_len() + wildcard + self.names.len() + self.tail.encoded_len()
    }

    /// The request as a gRPC message in three chunks: the message prefix with fields 1-2 (and
    /// the wildcard), the names as they are kept, then fields 4-6. Empty chunks are left out.
    fn into_chunks(self) -> Result<impl Iterator<Item = Bytes>, Status> {
        let len = self.len();
        let len = u32::try_from(len).map_err(|_| {
            Status::resource_exhausted(format!("a DiscoveryRequest of {len} bytes"))
        })?;
        let mut head =
            BytesMut::with_capacity(GRPC_PREFIX + self.head.encoded_len() + entry_len(WILDCARD));
        // Not compressed, then the message's length.
        head.put_u8(0);
        head.put_u32(len);
        self.head
            .encode(&mut head)
            .map_err(|e| Status::internal(e.to_string()))?;
        if self.wildcard {
            put_entry(&mut head, WILDCARD);
        }
        let tail = Bytes::from(self.tail.encode_to_vec());
        let chunks = [head.freeze(), self.names, tail];
        Ok(chunks.into_iter().filter(|chunk| !chunk.is_empty()))
    }
}

/// The length of a gRPC message's prefix (compression flag, length).
const GRPC_PREFIX: usize = 5;

/// The request body of the SotW stream: each request a gRPC message written as its chunks.
struct RequestBody {
    requests: UnboundedReceiver<SotwRequest>,
    /// What is left to send of the current request.
    chunks: VecDeque<Bytes>,
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        loop {
            if let Some(chunk) = self.chunks.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            let Some(request) = ready!(self.requests.poll_recv(cx)) else {
                return Poll::Ready(None);
            };
            match Wire::from(request).into_chunks() {
                Ok(chunks) => self.chunks.extend(chunks),
                Err(status) => return Poll::Ready(Some(Err(status))),
            }
        }
    }
}

/// Opens `StreamAggregatedResources` on `channel`, sending `requests`: the call tonic's
/// generated client makes (`te: trailers`, `application/grpc`; a trailers-only answer ends
/// it with its status), with the request body written by [`RequestBody`] and responses of
/// any size.
pub(super) async fn open(
    mut channel: Channel,
    service: XdsService,
    requests: UnboundedReceiverStream<SotwRequest>,
) -> Result<Streaming<DiscoveryResponse>, Status> {
    let body = RequestBody {
        requests: requests.into_inner(),
        chunks: VecDeque::new(),
    };
    let mut request = http::Request::new(tonic::body::Body::new(body));
    *request.method_mut() = Method::POST;
    *request.version_mut() = Version::HTTP_2;
    *request.uri_mut() = http::Uri::from_static(match service {
        XdsService::Aggregated => STREAM_AGGREGATED_RESOURCES,
        XdsService::Secret => STREAM_SECRETS,
    });
    let headers = request.headers_mut();
    headers.insert(TE, HeaderValue::from_static("trailers"));
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let ready = channel
        .ready()
        .await
        .map_err(|e| Status::unknown(format!("the xDS channel is not ready: {e}")))?;
    let response = ready
        .call(request)
        .await
        .map_err(|e| Status::from_error(Box::new(e)))?;
    let (parts, body) = response.into_parts();
    match Status::from_header_map(&parts.headers) {
        Some(status) if status.code() != Code::Ok => Err(status),
        Some(_) => Ok(Streaming::new_empty(ResponseDecoder, body)),
        None => Ok(Streaming::new_response(
            ResponseDecoder,
            body,
            parts.status,
            None,
            Some(usize::MAX),
        )),
    }
}

/// Decodes `DiscoveryResponse`s with prost.
#[derive(Debug, Clone, Copy, Default)]
struct ResponseDecoder;

impl Decoder for ResponseDecoder {
    type Item = DiscoveryResponse;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DiscoveryResponse>, Status> {
        DiscoveryResponse::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use proto::pb::envoy::config::core::v3::Node;

    use super::*;

    #[test]
    fn encodes_as_prost_does() {
        let long = "n".repeat(300);
        let names = [
            "outbound|80||a.ns.svc.cluster.local",
            "",
            long.as_str(),
            "é",
        ];
        let cases = [
            SotwRequest::default(),
            SotwRequest {
                version_info: "v7".into(),
                node: Some(Node {
                    id: "sidecar~127.0.0.1~a.ns~ns.svc.cluster.local".into(),
                    cluster: "a".into(),
                    ..Default::default()
                }),
                wildcard: true,
                names: EncodedNames::new(names.iter().copied()),
                type_url: crate::ENDPOINT_TYPE_URL.into(),
                response_nonce: "n3".into(),
                error_detail: Some(RpcStatus {
                    code: 3,
                    message: "x: bad".into(),
                    details: Vec::new(),
                }),
            },
            SotwRequest {
                wildcard: true,
                type_url: crate::CLUSTER_TYPE_URL.into(),
                ..Default::default()
            },
        ];
        for request in cases {
            let mut expected = DiscoveryRequest {
                version_info: request.version_info.clone(),
                node: request.node.clone(),
                resource_names: Vec::new(),
                type_url: request.type_url.clone(),
                response_nonce: request.response_nonce.clone(),
                error_detail: request.error_detail.clone(),
                ..Default::default()
            };
            if request.wildcard {
                expected.resource_names.push(WILDCARD.into());
            }
            if !request.names.0.is_empty() {
                expected
                    .resource_names
                    .extend(names.iter().map(|n| n.to_string()));
            }
            let bytes = request.into_message();
            assert_eq!(bytes, expected.encode_to_vec());
            assert_eq!(
                DiscoveryRequest::decode(bytes.as_slice()).unwrap(),
                expected
            );
        }
    }
}
