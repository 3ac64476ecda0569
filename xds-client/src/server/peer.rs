//! What a stream knows of its client whatever the variant: its node id, the nonces handed
//! out, and its answers (ACK or NACK) to the last response of each type.

use std::time::SystemTime;

use proto::pb::envoy::config::core::v3::Node;
use proto::pb::google::rpc::Status as RpcStatus;

use super::log::{ClientEvent, EventLog, Protocol};
use crate::Verdict;

/// One stream's client: who it is and the nonces it was sent.
pub(crate) struct Peer {
    /// The stream's variant.
    protocol: Protocol,
    /// The client's `node.id` (empty until a request carries one).
    pub(crate) node_id: String,
    /// Nonces handed out on the stream.
    nonces: u64,
}

/// The last response of a type sent on a stream.
pub(crate) struct LastResponse {
    /// Its `version_info` / `system_version_info`.
    pub(crate) version: String,
    /// Its nonce.
    pub(crate) nonce: String,
    /// Whether the client answered it (later requests with its nonce are not answers).
    answered: bool,
}

impl LastResponse {
    /// A response just sent, not answered yet.
    pub(crate) fn new(version: String, nonce: String) -> Self {
        LastResponse {
            version,
            nonce,
            answered: false,
        }
    }
}

/// What a request's `response_nonce` refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NonceCheck {
    /// No nonce: a first request or a subscription change.
    Absent,
    /// The nonce of the type's last response: the request answers it.
    Last,
    /// A nonce while nothing of the type was sent on this stream (one of an earlier stream).
    NothingSent,
    /// The nonce of an older response.
    Stale,
}

impl Peer {
    /// A client not identified yet, on a stream of `protocol`.
    pub(crate) fn new(protocol: Protocol) -> Self {
        Peer {
            protocol,
            node_id: String::new(),
            nonces: 0,
        }
    }

    /// Takes the client's id from the first request that carries a node; answers whether the
    /// request names a type (one that does not is logged and ignored).
    pub(crate) fn admit(&mut self, node: Option<&Node>, type_url: &str) -> bool {
        if let Some(node) = node
            && self.node_id.is_empty()
        {
            self.node_id.clone_from(&node.id);
            tracing::info!(node = %self.node_id, "{} stream: node identified", self.protocol.label());
        }
        if type_url.is_empty() {
            tracing::warn!(node = %self.node_id, "{} request without a type_url ignored",
                self.protocol.label());
            return false;
        }
        true
    }

    /// The stream's variant.
    pub(crate) fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// A new nonce.
    pub(crate) fn next_nonce(&mut self) -> String {
        self.nonces += 1;
        self.nonces.to_string()
    }

    /// Checks a request's `response_nonce` against `last`, the last response of `type_url`;
    /// the first answer to it goes to `log`, an ACK or, with `error_detail`, a NACK.
    pub(crate) fn check_nonce(
        &self,
        type_url: &str,
        response_nonce: &str,
        error_detail: Option<&RpcStatus>,
        last: Option<&mut LastResponse>,
        log: &EventLog,
    ) -> NonceCheck {
        if response_nonce.is_empty() {
            return NonceCheck::Absent;
        }
        let Some(last) = last else {
            return NonceCheck::NothingSent;
        };
        if last.nonce != response_nonce {
            return NonceCheck::Stale;
        }
        if !last.answered {
            last.answered = true;
            log.record(ClientEvent {
                node_id: self.node_id.clone(),
                protocol: self.protocol,
                type_url: type_url.to_owned(),
                version: last.version.clone(),
                nonce: last.nonce.clone(),
                verdict: match error_detail {
                    Some(status) => Verdict::Nack(status.message.clone()),
                    None => Verdict::Ack,
                },
                at: SystemTime::now(),
            });
        }
        NonceCheck::Last
    }
}
