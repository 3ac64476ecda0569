//! The seam between the stream engine and the two xDS variants (SotW, Delta): how each opens
//! its stream, builds its requests and answers its responses.

use std::future::Future;

use proto::pb::envoy::config::core::v3::Node;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codec::Streaming;
use tonic::transport::Channel;

use super::subscriptions::{Subscription, Subscriptions};
use crate::{Handler, Push};

/// The answer to a response: the ACK/NACK to send, and what to log.
pub(super) struct Answer<R> {
    pub(super) request: R,
    pub(super) push: Push,
}

/// One xDS variant's protocol state: versions, nonces, what the stream was told.
pub(super) trait Protocol: Send + 'static {
    /// What the client sends.
    type Request: Send + 'static;
    /// What the server sends.
    type Response: Send + 'static;

    /// Opens the ADS stream that carries `requests`.
    fn open(
        channel: Channel,
        requests: UnboundedReceiverStream<Self::Request>,
    ) -> impl Future<Output = Result<Streaming<Self::Response>, tonic::Status>> + Send;

    /// The type a request is about.
    fn type_url(request: &Self::Request) -> &str;

    /// Sets the request's node.
    fn set_node(request: &mut Self::Request, node: &Node);

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

    /// The last version ACKed and the last nonce received, for a type.
    fn progress(&self, type_url: &str) -> (String, String);
}
