//! State of the world: `DiscoveryRequest`/`DiscoveryResponse` on `StreamAggregatedResources`.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use prost::Message;
use proto::pb::envoy::service::discovery::v3::{
    DiscoveryRequest, DiscoveryResponse, Resource as WrappedResource,
};
use proto::pb::google::protobuf::Any;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codec::Streaming;
use tonic::transport::Channel;

use super::Service;
use super::deliver::{Incoming, deliver};
use super::protocol::{Answer, Progress, Protocol, ads_client, sds_client};
use super::resource_name::name_of;
use super::subscriptions::{Subscription, Subscriptions, WILDCARD};
use crate::{Handler, Rejected, Resource, is_full_state};

/// The type URL of a resource wrapped in `envoy.service.discovery.v3.Resource`.
const WRAPPED_TYPE_URL: &str = "type.googleapis.com/envoy.service.discovery.v3.Resource";

/// One type's SotW state.
#[derive(Debug, Default)]
struct TypeState {
    /// The version ACKed and the nonce received.
    progress: Progress,
    /// For full-state types: the names of the last response handed to the handler.
    known: BTreeSet<String>,
    /// Whether a request for this type was sent on this stream.
    sent: bool,
    /// Whether a request for this type carried names on this stream: from then on an empty
    /// list no longer means wildcard.
    named: bool,
}

/// The SotW variant's state.
#[derive(Debug, Default)]
pub(super) struct Sotw {
    types: HashMap<String, TypeState>,
}

/// A response's resource, decoded as far as the client goes.
enum Decoded {
    Resource(Resource),
    Refused { name: String, reason: String },
}

/// Reads a resource's name (and unwraps `Resource`), checking its type URL.
fn decode(index: usize, any: Any, type_url: &str, version_info: &str) -> Decoded {
    let (any, version, wrapped_name) = if any.type_url == WRAPPED_TYPE_URL {
        match WrappedResource::decode(any.value.as_slice()) {
            Ok(wrapped) => match wrapped.resource {
                Some(inner) => (inner, wrapped.version, Some(wrapped.name)),
                None => {
                    return Decoded::Refused {
                        name: wrapped.name,
                        reason: "wrapped Resource has no resource".to_string(),
                    };
                }
            },
            Err(error) => {
                return Decoded::Refused {
                    name: format!("resources[{index}]"),
                    reason: format!("invalid wrapped Resource: {error}"),
                };
            }
        }
    } else {
        (any, String::new(), None)
    };
    let name = match wrapped_name.filter(|name| !name.is_empty()) {
        Some(name) => name,
        None => match name_of(&any.value) {
            Ok(name) => name,
            Err(error) => {
                return Decoded::Refused {
                    name: format!("resources[{index}]"),
                    reason: error.to_string(),
                };
            }
        },
    };
    if any.type_url != type_url {
        return Decoded::Refused {
            name,
            reason: format!("type URL {} is not the response's {type_url}", any.type_url),
        };
    }
    let version = if version.is_empty() {
        version_info.to_string()
    } else {
        version
    };
    Decoded::Resource(Resource {
        name,
        version,
        value: any.value.into(),
    })
}

impl Sotw {
    /// The request that tells the server the subscription, with the type's version and nonce.
    fn request(&mut self, subscription: &Subscription) -> DiscoveryRequest {
        let state = self.types.entry(subscription.type_url.clone()).or_default();
        let mut names = Vec::new();
        if subscription.wildcard && (state.named || !subscription.names.is_empty()) {
            names.push(WILDCARD.to_string());
        }
        names.extend(subscription.names.iter().cloned());
        state.sent = true;
        state.named |= !names.is_empty();
        DiscoveryRequest {
            version_info: state.progress.acked_version.clone(),
            resource_names: names,
            type_url: subscription.type_url.clone(),
            response_nonce: state.progress.nonce.clone(),
            ..Default::default()
        }
    }
}

impl Protocol for Sotw {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;

    async fn open(
        channel: Channel,
        service: Service,
        requests: UnboundedReceiverStream<DiscoveryRequest>,
    ) -> Result<Streaming<DiscoveryResponse>, tonic::Status> {
        Ok(match service {
            Service::Aggregated => {
                ads_client(channel)
                    .stream_aggregated_resources(requests)
                    .await?
            }
            Service::Secret => sds_client(channel).stream_secrets(requests).await?,
        }
        .into_inner())
    }

    fn new_stream(&mut self, subscriptions: &Subscriptions) -> Vec<DiscoveryRequest> {
        for state in self.types.values_mut() {
            state.progress.nonce.clear();
            state.sent = false;
            state.named = false;
        }
        subscriptions
            .iter()
            .filter(|subscription| !subscription.is_empty())
            .map(|subscription| self.request(subscription))
            .collect()
    }

    fn changed(&mut self, now: &Subscription, _before: &Subscription) -> Option<DiscoveryRequest> {
        let sent = self.types.get(&now.type_url).is_some_and(|s| s.sent);
        // An empty first request would mean wildcard: with nothing asked yet, there is
        // nothing to unsubscribe.
        if now.is_empty() && !sent {
            return None;
        }
        Some(self.request(now))
    }

    fn respond(
        &mut self,
        response: DiscoveryResponse,
        subscriptions: &Subscriptions,
        handler: &dyn Handler,
    ) -> Option<Answer<DiscoveryRequest>> {
        let subscription = subscriptions.get(&response.type_url)?;
        let at = SystemTime::now();
        let type_url = response.type_url;
        let mut resources = Vec::new();
        let mut refused = Vec::new();
        let mut present = BTreeSet::new();
        for (index, any) in response.resources.into_iter().enumerate() {
            match decode(index, any, &type_url, &response.version_info) {
                Decoded::Resource(resource) => {
                    present.insert(resource.name.clone());
                    resources.push(resource);
                }
                Decoded::Refused { name, reason } => {
                    present.insert(name.clone());
                    refused.push(Rejected { name, reason });
                }
            }
        }
        let full_state = is_full_state(&type_url);
        let state = self.types.entry(type_url.clone()).or_default();
        let removed = if full_state {
            state.known.difference(&present).cloned().collect()
        } else {
            Vec::new()
        };
        let outcome = deliver(
            Incoming {
                type_url,
                version_info: response.version_info,
                nonce: response.nonce,
                resources,
                refused,
                removed,
                at,
            },
            handler,
            &mut state.progress,
        );
        if outcome.delivered && full_state {
            state.known = present;
        }
        let mut request = self.request(subscription);
        request.error_detail = outcome.error_detail();
        Some(Answer {
            request,
            push: outcome.push,
        })
    }

    fn progress(&self, type_url: &str) -> Option<&Progress> {
        self.types.get(type_url).map(|s| &s.progress)
    }
}
