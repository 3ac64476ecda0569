//! Incremental (Delta) ADS streams: per type, the subscriptions and the resource versions the
//! client holds; responses carry what was added or changed and what was removed.

use std::collections::{BTreeMap, BTreeSet};

use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};

use super::log::{EventLog, Protocol};
use super::peer::{LastResponse, NonceCheck, Peer};
use super::snapshot::Snapshot;
use super::stream::AdsStream;
use crate::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, is_full_state};

/// One Delta stream's state.
pub(crate) struct DeltaStream {
    peer: Peer,
    types: BTreeMap<String, TypeState>,
}

/// One type's subscription on a stream.
#[derive(Default)]
struct TypeState {
    /// Subscribed to every resource.
    wildcard: bool,
    /// Names subscribed to explicitly.
    names: BTreeSet<String>,
    /// Name -> version the client holds (from `initial_resource_versions` and what was sent).
    known: BTreeMap<String, String>,
    /// Whether a response of this type went out on this stream.
    responded: bool,
    /// The last response sent.
    last: Option<LastResponse>,
}

impl AdsStream for DeltaStream {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;

    fn new() -> Self {
        DeltaStream {
            peer: Peer::new(Protocol::Delta),
            types: BTreeMap::new(),
        }
    }

    fn peer(&self) -> &Peer {
        &self.peer
    }

    fn on_request(
        &mut self,
        req: DeltaDiscoveryRequest,
        snapshot: Option<&Snapshot>,
        log: &EventLog,
    ) -> Vec<DeltaDiscoveryResponse> {
        if !self.peer.admit(req.node.as_ref(), &req.type_url) {
            return Vec::new();
        }
        let node_id = &self.peer.node_id;
        tracing::debug!(node = %node_id, type_url = %req.type_url,
            nonce = %req.response_nonce, subscribe = ?req.resource_names_subscribe,
            unsubscribe = ?req.resource_names_unsubscribe,
            initial = req.initial_resource_versions.len(), nack = req.error_detail.is_some(),
            "Delta request");
        let first = !self.types.contains_key(&req.type_url);
        let ts = self.types.entry(req.type_url.clone()).or_default();
        if first {
            ts.known = req.initial_resource_versions.into_iter().collect();
            ts.wildcard = is_full_state(&req.type_url) && req.resource_names_subscribe.is_empty();
        }
        for name in req.resource_names_subscribe {
            if name == "*" {
                ts.wildcard = true;
            } else {
                ts.names.insert(name);
            }
        }
        for name in req.resource_names_unsubscribe {
            if name == "*" {
                ts.wildcard = false;
                let names = &ts.names;
                ts.known.retain(|n, _| names.contains(n));
            } else {
                ts.names.remove(&name);
                if !ts.wildcard {
                    ts.known.remove(&name);
                }
            }
        }
        let check = self.peer.check_nonce(
            &req.type_url,
            &req.response_nonce,
            req.error_detail.as_ref(),
            ts.last.as_mut(),
            log,
        );
        if matches!(check, NonceCheck::NothingSent | NonceCheck::Stale) {
            tracing::debug!(node = %node_id, type_url = %req.type_url,
                nonce = %req.response_nonce, "stale nonce: not an ACK or NACK");
        }
        self.respond_to_request(&req.type_url, snapshot)
    }

    fn type_urls(&self) -> impl Iterator<Item = &str> {
        self.types.keys().map(String::as_str)
    }

    /// Adds the response `type_url` needs to `out`; after a CDS response that added or
    /// changed clusters the client also watches in EDS, their ClusterLoadAssignments again,
    /// even if unchanged (Envoy keeps an updated cluster warming until it gets one).
    fn respond_type(
        &mut self,
        type_url: &str,
        snapshot: &Snapshot,
        out: &mut Vec<DeltaDiscoveryResponse>,
    ) {
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        let Some(response) = respond(type_url, ts, snapshot, &mut self.peer) else {
            return;
        };
        let changed: Vec<String> = if type_url == CLUSTER_TYPE_URL {
            response.resources.iter().map(|r| r.name.clone()).collect()
        } else {
            Vec::new()
        };
        out.push(response);
        let Some(eds) = self.types.get_mut(ENDPOINT_TYPE_URL) else {
            return;
        };
        let mut forced = false;
        for name in changed {
            forced |= eds.known.remove(&name).is_some();
        }
        if forced {
            self.respond_type(ENDPOINT_TYPE_URL, snapshot, out);
        }
    }

    fn log_response(&self, response: &DeltaDiscoveryResponse) {
        tracing::debug!(node = %self.peer.node_id, type_url = %response.type_url,
            version = %response.system_version_info, nonce = %response.nonce,
            resources = response.resources.len(), removed = response.removed_resources.len(),
            "Delta response");
    }
}

/// The response bringing the client of `ts` up to `snapshot`, if anything differs. A wildcard
/// subscription's first response goes out even when empty (the client waits for it).
fn respond(
    type_url: &str,
    ts: &mut TypeState,
    snapshot: &Snapshot,
    peer: &mut Peer,
) -> Option<DeltaDiscoveryResponse> {
    let all = snapshot.resources(type_url);
    let wanted = |name: &str| all.contains_key(name) && (ts.wildcard || ts.names.contains(name));
    let removed: Vec<String> = ts.known.keys().filter(|n| !wanted(n)).cloned().collect();
    let resources: Vec<Resource> = all
        .iter()
        .filter(|(n, r)| wanted(n) && ts.known.get(*n) != Some(&r.version))
        .map(|(n, r)| Resource {
            name: n.clone(),
            version: r.version.clone(),
            resource: Some((*r.any).clone()),
            ..Default::default()
        })
        .collect();
    if resources.is_empty() && removed.is_empty() && (ts.responded || !ts.wildcard) {
        return None;
    }
    for name in &removed {
        ts.known.remove(name);
    }
    for r in &resources {
        ts.known.insert(r.name.clone(), r.version.clone());
    }
    let nonce = peer.next_nonce();
    ts.responded = true;
    ts.last = Some(LastResponse::new(
        snapshot.version().to_owned(),
        nonce.clone(),
    ));
    Some(DeltaDiscoveryResponse {
        system_version_info: snapshot.version().to_owned(),
        resources,
        type_url: type_url.to_owned(),
        removed_resources: removed,
        nonce,
        ..Default::default()
    })
}
