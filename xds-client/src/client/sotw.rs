//! State of the world: `DiscoveryRequest`/`DiscoveryResponse` on `StreamAggregatedResources`.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use prost::Message;
use proto::pb::envoy::service::discovery::v3::{DiscoveryResponse, Resource as WrappedResource};
use proto::pb::google::protobuf::Any;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codec::Streaming;
use tonic::transport::Channel;

use super::Service;
use super::deliver::{Incoming, deliver};
use super::protocol::{Answer, Progress, Protocol};
use super::resource_name::name_of;
use super::sotw_wire::{self, EncodedNames, SotwRequest};
use super::subscriptions::{Subscription, Subscriptions};
use crate::{Event, Handler, Rejected, Resource, is_full_state};

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
    /// The subscription's names, encoded, and the [`Subscription::revision`] they are of.
    names: (u64, EncodedNames),
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
    /// Its names are encoded only when the subscription changed since the last request.
    fn request(&mut self, subscription: &Subscription) -> SotwRequest {
        let state = self.types.entry(subscription.type_url.clone()).or_default();
        if state.names.0 != subscription.revision {
            let names = subscription.names.iter().map(String::as_str);
            state.names = (subscription.revision, EncodedNames::new(names));
        }
        let wildcard = subscription.wildcard && (state.named || !subscription.names.is_empty());
        state.sent = true;
        state.named |= wildcard || !subscription.names.is_empty();
        SotwRequest {
            version_info: state.progress.acked_version.clone(),
            wildcard,
            names: state.names.1.clone(),
            type_url: subscription.type_url.clone(),
            response_nonce: state.progress.nonce.clone(),
            ..Default::default()
        }
    }
}

impl Protocol for Sotw {
    type Request = SotwRequest;
    type Response = DiscoveryResponse;

    async fn open(
        channel: Channel,
        service: Service,
        requests: UnboundedReceiverStream<SotwRequest>,
    ) -> Result<Streaming<DiscoveryResponse>, tonic::Status> {
        sotw_wire::open(channel, service, requests).await
    }

    fn new_stream(&mut self, subscriptions: &Subscriptions) -> Vec<SotwRequest> {
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

    fn changed(&mut self, now: &Subscription, _before: &Subscription) -> Option<SotwRequest> {
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
    ) -> Option<Answer<SotwRequest>> {
        if let Some(control_plane) = &response.control_plane {
            handler.event(Event::Identified(control_plane.identifier.clone()));
        }
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

#[cfg(test)]
mod tests {
    use prost::Message;
    use proto::pb::envoy::service::discovery::v3::DiscoveryRequest;

    use super::super::AcceptAll;
    use super::super::subscriptions::Change;
    use super::*;
    use crate::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL};

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    /// Checks that `request` goes on the wire as prost encodes `expected`.
    fn assert_wire(request: SotwRequest, expected: DiscoveryRequest) {
        let bytes = request.into_message();
        assert_eq!(
            DiscoveryRequest::decode(bytes.as_slice()).unwrap(),
            expected
        );
        assert_eq!(bytes, expected.encode_to_vec());
    }

    fn expected(type_url: &str, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            type_url: type_url.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    /// Applies `change` and answers the request it sends.
    fn change(sotw: &mut Sotw, subscriptions: &mut Subscriptions, change: Change) -> SotwRequest {
        let before = subscriptions.apply(change).expect("a change");
        let now = subscriptions.get(&before.type_url).unwrap();
        sotw.changed(now, &before).expect("a request")
    }

    #[test]
    fn requests_carry_the_current_names_after_subscription_changes() {
        let mut sotw = Sotw::default();
        let mut subscriptions = Subscriptions::default();
        let eds = |list: &[&str]| Change::Names(ENDPOINT_TYPE_URL.into(), names(list));

        let request = change(&mut sotw, &mut subscriptions, eds(&["b", "a"]));
        assert_wire(request, expected(ENDPOINT_TYPE_URL, &["a", "b"], "", ""));

        // An ACK names the whole subscription, with the version and nonce it answers.
        let response = DiscoveryResponse {
            version_info: "v1".into(),
            type_url: ENDPOINT_TYPE_URL.into(),
            nonce: "n1".into(),
            ..Default::default()
        };
        let answer = sotw.respond(response, &subscriptions, &AcceptAll).unwrap();
        assert_wire(
            answer.request,
            expected(ENDPOINT_TYPE_URL, &["a", "b"], "v1", "n1"),
        );

        let request = change(&mut sotw, &mut subscriptions, eds(&["c", "b"]));
        assert_wire(
            request,
            expected(ENDPOINT_TYPE_URL, &["b", "c"], "v1", "n1"),
        );
        let request = change(&mut sotw, &mut subscriptions, eds(&[]));
        assert_wire(request, expected(ENDPOINT_TYPE_URL, &[], "v1", "n1"));

        // A wildcard subscription: empty on the stream's first request, then `*` once it
        // named anything.
        let wildcard = Change::Wildcard(CLUSTER_TYPE_URL.into());
        let request = change(&mut sotw, &mut subscriptions, wildcard);
        assert_wire(request, expected(CLUSTER_TYPE_URL, &[], "", ""));
        let cds = Change::Names(CLUSTER_TYPE_URL.into(), names(&["x"]));
        let request = change(&mut sotw, &mut subscriptions, cds);
        assert_wire(request, expected(CLUSTER_TYPE_URL, &["*", "x"], "", ""));
        let cds = Change::Names(CLUSTER_TYPE_URL.into(), names(&[]));
        let request = change(&mut sotw, &mut subscriptions, cds);
        assert_wire(request, expected(CLUSTER_TYPE_URL, &["*"], "", ""));

        // A new stream asks again with what is subscribed now.
        let requests = sotw.new_stream(&subscriptions);
        let [cds] = <[SotwRequest; 1]>::try_from(requests).unwrap();
        assert_wire(cds, expected(CLUSTER_TYPE_URL, &[], "", ""));
    }
}
