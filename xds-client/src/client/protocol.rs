//! The seam between the stream engine and the two xDS variants (SotW, Delta): how each opens
//! its stream, builds its requests and answers its responses.

use std::future::Future;

use proto::pb::envoy::config::core::v3::Node;
use proto::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codec::Streaming;
use tonic::transport::Channel;

use super::Service;
use super::sotw_wire::SotwRequest;
use super::subscriptions::{Subscription, Subscriptions};
use crate::{Handler, Push};

/// The answer to a response: the ACK/NACK to send, and what to log.
pub(super) struct Answer<R> {
    pub(super) request: R,
    pub(super) push: Push,
}

/// A type's progress with the server.
#[derive(Debug, Clone, Default)]
pub(super) struct Progress {
    /// The last version ACKed (kept across streams).
    pub(super) acked_version: String,
    /// The last nonce received on this stream.
    pub(super) nonce: String,
}

/// A request of either variant, as the engine sees it.
pub(super) trait Request: Send + 'static {
    /// The type the request is about.
    fn type_url(&self) -> &str;

    /// Sets the request's node.
    fn set_node(&mut self, node: &Node);
}

/// Implements [`Request`] for request messages, which spell its fields alike.
macro_rules! impl_request {
    ($($message:ty),*) => {$(
        impl Request for $message {
            fn type_url(&self) -> &str {
                &self.type_url
            }

            fn set_node(&mut self, node: &Node) {
                self.node = Some(node.clone());
            }
        }
    )*};
}

impl_request!(SotwRequest, DeltaDiscoveryRequest);

/// One xDS variant's protocol state: versions, nonces, what the stream was told.
pub(super) trait Protocol: Default + Send + Sync + 'static {
    /// What the client sends.
    type Request: Request;
    /// What the server sends.
    type Response: Send + 'static;

    /// Opens the stream of `service` that carries `requests`.
    fn open(
        channel: Channel,
        service: Service,
        requests: UnboundedReceiverStream<Self::Request>,
    ) -> impl Future<Output = Result<Streaming<Self::Response>, tonic::Status>> + Send;

    /// Forgets what the previous stream was told; answers the requests that (re)subscribe
    /// every type on a new one.
    fn new_stream(&mut self, subscriptions: &Subscriptions) -> Vec<Self::Request>;

    /// The request for a subscription that changed from `before` to `now`, if one is needed.
    fn changed(&mut self, now: &Subscription, before: &Subscription) -> Option<Self::Request>;

    /// Decodes a response, hands it to the handler and builds the ACK or NACK; `None` for a
    /// type nobody subscribed to.
    fn respond(
        &mut self,
        response: Self::Response,
        subscriptions: &Subscriptions,
        handler: &dyn Handler,
    ) -> Option<Answer<Self::Request>>;

    /// The progress of a type, once a request or response of it went by.
    fn progress(&self, type_url: &str) -> Option<&Progress>;

    /// Stops claiming to hold resource `name` of `type_url` (Delta's
    /// `initial_resource_versions`); nothing to do over SotW.
    fn forget(&mut self, _type_url: &str, _name: &str) {}
}
