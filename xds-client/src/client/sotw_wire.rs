//! SotW requests as they go on the wire. Every SotW request names every resource subscribed
//! to, ACKs included (naming fewer would unsubscribe the others), so at 10,000 EDS clusters
//! each ACK carried 10,000 names: cloned into the request, encoded, dropped. Here a
//! subscription's names are encoded once, when it changes, and a request copies those bytes
//! between its other fields, through a tonic codec that writes them as they are. Fields go in
//! number order, so the bytes are those prost writes for the same `DiscoveryRequest`.

use bytes::{BufMut, Bytes, BytesMut};
use prost::{EncodeError, Message};
use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use proto::pb::google::rpc::Status as RpcStatus;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use super::subscriptions::WILDCARD;

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
    /// Encodes the request, reserving its length in `buf` first.
    fn encode(self, buf: &mut EncodeBuf<'_>) -> Result<(), EncodeError> {
        let wire = Wire::from(self);
        buf.reserve(wire.len());
        wire.put(buf)
    }

    /// The bytes the codec writes for the request.
    #[cfg(test)]
    pub(super) fn into_bytes(self) -> Vec<u8> {
        let wire = Wire::from(self);
        let len = wire.len();
        let mut buf = Vec::with_capacity(len);
        wire.put(&mut buf).expect("a Vec grows");
        assert_eq!(buf.len(), len, "Wire::len");
        buf
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
    /// How many bytes [`Wire::put`] writes.
    fn len(&self) -> usize {
        let wildcard = if self.wildcard {
            entry_len(WILDCARD)
        } else {
            0
        };
        self.head.encoded_len() + wildcard + self.names.len() + self.tail.encoded_len()
    }

    /// Writes the request into a growable `buf` (as the codec's buffer is).
    fn put(self, buf: &mut impl BufMut) -> Result<(), EncodeError> {
        self.head.encode(buf)?;
        if self.wildcard {
            put_entry(buf, WILDCARD);
        }
        buf.put_slice(&self.names);
        self.tail.encode(buf)
    }
}

/// The SotW stream's codec: [`SotwRequest`]s out, `DiscoveryResponse`s in.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SotwCodec;

/// Decodes `DiscoveryResponse`s with prost.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ResponseDecoder;

impl Codec for SotwCodec {
    type Encode = SotwRequest;
    type Decode = DiscoveryResponse;
    type Encoder = SotwCodec;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> SotwCodec {
        SotwCodec
    }

    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

impl Encoder for SotwCodec {
    type Item = SotwRequest;
    type Error = Status;

    fn encode(&mut self, item: SotwRequest, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding a DiscoveryRequest: {e}")))
    }
}

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
            let bytes = request.into_bytes();
            assert_eq!(bytes, expected.encode_to_vec());
            assert_eq!(
                DiscoveryRequest::decode(bytes.as_slice()).unwrap(),
                expected
            );
        }
    }
}
