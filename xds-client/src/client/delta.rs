//! Incremental xDS: `DeltaDiscoveryRequest`/`DeltaDiscoveryResponse` on
//! `DeltaAggregatedResources`.

use std::collections::{BTreeMap, HashMap};
use std::time::SystemTime;

use proto::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use proto::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use proto::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codec::Streaming;
use tonic::transport::Channel;
use tracing::debug;

use super::Service;
use super::deliver::{Incoming, deliver};
use super::protocol::{Answer, Progress, Protocol};
use super::subscriptions::{Subscription, Subscriptions, WILDCARD};
use crate::{Event, Handler, Rejected, Resource};

/// One type's Delta state.
#[derive(Debug, Default)]
struct TypeState {
    /// The resources applied, name -> version: `initial_resource_versions` on reconnect.
    held: BTreeMap<String, String>,
    /// The `system_version_info` ACKed and the nonce received.
    progress: Progress,
}

/// The Delta variant's state.
#[derive(Debug, Default)]
pub(super) struct Delta {
    types: HashMap<String, TypeState>,
}

impl Protocol for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;

    async fn open(
        channel: Channel,
        service: Service,
        requests: UnboundedReceiverStream<DeltaDiscoveryRequest>,
    ) -> Result<Streaming<DeltaDiscoveryResponse>, tonic::Status> {
        Ok(match service {
            Service::Aggregated => {
                AggregatedDiscoveryServiceClient::new(channel)
                    .max_decoding_message_size(usize::MAX)
                    .delta_aggregated_resources(requests)
                    .await?
            }
            Service::Secret => {
                SecretDiscoveryServiceClient::new(channel)
                    .max_decoding_message_size(usize::MAX)
                    .delta_secrets(requests)
                    .await?
            }
        }
        .into_inner())
    }

    fn forget(&mut self, type_url: &str, name: &str) {
        if let Some(state) = self.types.get_mut(type_url) {
            state.held.remove(name);
        }
    }

    fn new_stream(&mut self, subscriptions: &Subscriptions) -> Vec<DeltaDiscoveryRequest> {
        for state in self.types.values_mut() {
            state.progress.nonce.clear();
        }
        // An empty subscribe list on a type's first request would mean wildcard (legacy):
        // types with nothing to ask for are left out.
        subscriptions
            .iter()
            .filter(|subscription| !subscription.is_empty())
            .map(|subscription| {
                let mut subscribe = Vec::new();
                if subscription.wildcard {
                    subscribe.push(WILDCARD.to_string());
                }
                subscribe.extend(subscription.names.iter().cloned());
                let held = self
                    .types
                    .get(&subscription.type_url)
                    .map(|s| s.held.clone())
                    .unwrap_or_default();
                DeltaDiscoveryRequest {
                    type_url: subscription.type_url.clone(),
                    resource_names_subscribe: subscribe,
                    initial_resource_versions: held.into_iter().collect(),
                    ..Default::default()
                }
            })
            .collect()
    }

    fn changed(
        &mut self,
        now: &Subscription,
        before: &Subscription,
    ) -> Option<DeltaDiscoveryRequest> {
        let mut subscribe = Vec::new();
        if now.wildcard && !before.wildcard {
            subscribe.push(WILDCARD.to_string());
        }
        subscribe.extend(now.names.difference(&before.names).cloned());
        let unsubscribe: Vec<String> = before.names.difference(&now.names).cloned().collect();
        if subscribe.is_empty() && unsubscribe.is_empty() {
            return None;
        }
        let state = self.types.entry(now.type_url.clone()).or_default();
        if !now.wildcard {
            for name in &unsubscribe {
                state.held.remove(name);
            }
        }
        Some(DeltaDiscoveryRequest {
            type_url: now.type_url.clone(),
            resource_names_subscribe: subscribe,
            resource_names_unsubscribe: unsubscribe,
            ..Default::default()
        })
    }

    fn respond(
        &mut self,
        response: DeltaDiscoveryResponse,
        subscriptions: &Subscriptions,
        handler: &dyn Handler,
    ) -> Option<Answer<DeltaDiscoveryRequest>> {
        if let Some(control_plane) = &response.control_plane {
            handler.event(Event::Identified(control_plane.identifier.clone()));
        }
        subscriptions.get(&response.type_url)?;
        let at = SystemTime::now();
        let type_url = response.type_url;
        let mut resources = Vec::new();
        let mut refused = Vec::new();
        for resource in response.resources {
            let name = match resource.resource_name {
                Some(resource_name) if resource.name.is_empty() => resource_name.name,
                _ => resource.name,
            };
            let Some(any) = resource.resource else {
                // A resource without a body is a TTL heartbeat: the held one stays.
                debug!(%type_url, %name, "delta resource without a body (TTL heartbeat)");
                continue;
            };
            if name.is_empty() {
                refused.push(Rejected {
                    name: format!("resources[{}]", resources.len() + refused.len()),
                    reason: "the resource has no name".to_string(),
                });
            } else if any.type_url != type_url {
                refused.push(Rejected {
                    name,
                    reason: format!("type URL {} is not the response's {type_url}", any.type_url),
                });
            } else {
                resources.push(Resource {
                    name,
                    version: resource.version,
                    value: any.value.into(),
                });
            }
        }
        let mut removed = response.removed_resources;
        removed.extend(response.removed_resource_names.into_iter().map(|n| n.name));
        let state = self.types.entry(type_url.clone()).or_default();
        let outcome = deliver(
            Incoming {
                type_url: type_url.clone(),
                version_info: response.system_version_info,
                nonce: response.nonce.clone(),
                resources,
                refused,
                removed: removed.clone(),
                at,
            },
            handler,
            &mut state.progress,
        );
        if outcome.delivered {
            for name in &removed {
                state.held.remove(name);
            }
            state.held.extend(outcome.applied.iter().cloned());
        }
        Some(Answer {
            request: DeltaDiscoveryRequest {
                type_url,
                response_nonce: response.nonce,
                error_detail: outcome.error_detail(),
                ..Default::default()
            },
            push: outcome.push,
        })
    }

    fn progress(&self, type_url: &str) -> Option<&Progress> {
        self.types.get(type_url).map(|s| &s.progress)
    }
}

#[cfg(test)]
mod tests {
    use proto::pb::envoy::service::discovery::v3::Resource as DeltaResource;
    use proto::pb::google::protobuf::Any;

    use super::super::AcceptAll;
    use super::super::subscriptions::Change;
    use super::*;
    use crate::LISTENER_TYPE_URL;

    /// The `initial_resource_versions` a new stream sends for listeners.
    fn claimed(delta: &mut Delta, subscriptions: &Subscriptions) -> Vec<String> {
        let requests = delta.new_stream(subscriptions);
        let mut names: Vec<String> = requests
            .iter()
            .flat_map(|r| r.initial_resource_versions.keys().cloned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_forgotten_resource_is_not_claimed_on_a_new_stream() {
        let mut subscriptions = Subscriptions::default();
        subscriptions.apply(Change::Wildcard(LISTENER_TYPE_URL.into()));
        let mut delta = Delta::default();
        let listener = |name: &str| DeltaResource {
            name: name.into(),
            version: "v1".into(),
            resource: Some(Any {
                type_url: LISTENER_TYPE_URL.into(),
                value: Vec::new(),
            }),
            ..Default::default()
        };
        let response = DeltaDiscoveryResponse {
            type_url: LISTENER_TYPE_URL.into(),
            nonce: "n1".into(),
            resources: vec![listener("a"), listener("b")],
            ..Default::default()
        };
        delta
            .respond(response, &subscriptions, &AcceptAll)
            .expect("an answer");
        assert_eq!(claimed(&mut delta, &subscriptions), ["a", "b"]);
        delta.forget(LISTENER_TYPE_URL, "b");
        assert_eq!(claimed(&mut delta, &subscriptions), ["a"]);
    }
}
