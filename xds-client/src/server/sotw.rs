//! State-of-the-world ADS streams: per type, what the client subscribed to and holds; a
//! response whenever a request or a snapshot changes what the client should have.
//!
//! Listener and Cluster responses carry the full state (a resource left out is removed). The
//! other types (RDS, EDS, SDS) are named, not full-state: the client keeps what a response
//! leaves out, so a response carries only the subscribed resources the client does not hold
//! at their current version on this stream (changed ones, newly subscribed names, everything
//! after a reconnect).

use std::collections::{BTreeMap, BTreeSet};

use proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

use super::log::{EventLog, Protocol};
use super::peer::{LastResponse, NonceCheck, Peer};
use super::snapshot::{Snapshot, SnapshotResource};
use super::stream::AdsStream;
use crate::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, is_full_state};

/// One SotW stream's state.
pub(crate) struct SotwStream {
    peer: Peer,
    types: BTreeMap<String, TypeState>,
}

/// One type's subscription on a stream.
#[derive(Default)]
struct TypeState {
    /// Subscribed to every resource ("*", or the legacy empty list).
    wildcard: bool,
    /// Subscribed by the legacy form: an empty list on the first request, kept while the
    /// lists stay empty.
    legacy_wildcard: bool,
    /// Names subscribed to.
    names: BTreeSet<String>,
    /// The last response sent.
    last: Option<LastResponse>,
    /// Name -> version of what the client got on this stream: for a full-state type, the
    /// last response's resources; for the others, every resource sent since the client
    /// subscribed to its name.
    held: BTreeMap<String, String>,
}

impl AdsStream for SotwStream {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;

    fn new() -> Self {
        SotwStream {
            peer: Peer::new(Protocol::Sotw),
            types: BTreeMap::new(),
        }
    }

    fn peer(&self) -> &Peer {
        &self.peer
    }

    fn on_request(
        &mut self,
        req: DiscoveryRequest,
        snapshot: Option<&Snapshot>,
        log: &EventLog,
    ) -> Vec<DiscoveryResponse> {
        if !self.peer.admit(req.node.as_ref(), &req.type_url) {
            return Vec::new();
        }
        let node_id = &self.peer.node_id;
        tracing::debug!(node = %node_id, type_url = %req.type_url,
            version = %req.version_info, nonce = %req.response_nonce,
            names = ?req.resource_names, nack = req.error_detail.is_some(), "SotW request");
        let first = !self.types.contains_key(&req.type_url);
        let ts = self.types.entry(req.type_url.clone()).or_default();
        let check = self.peer.check_nonce(
            &req.type_url,
            &req.response_nonce,
            req.error_detail.as_ref(),
            ts.last.as_mut(),
            log,
        );
        // A nonce of an earlier stream (nothing sent on this one yet) is not stale.
        if check == NonceCheck::Stale {
            tracing::debug!(node = %node_id, type_url = %req.type_url,
                nonce = %req.response_nonce, "stale nonce: request ignored");
            return Vec::new();
        }
        let mut names: BTreeSet<String> = req.resource_names.into_iter().collect();
        let star = names.remove("*");
        ts.legacy_wildcard = !star && names.is_empty() && (first || ts.legacy_wildcard);
        ts.wildcard = star || ts.legacy_wildcard;
        ts.names = names;
        // A name unsubscribed from is sent again if subscribed to later, changed or not.
        if !is_full_state(&req.type_url) && !ts.wildcard {
            let names = &ts.names;
            ts.held.retain(|n, _| names.contains(n));
        }
        self.respond_to_request(&req.type_url, snapshot)
    }

    fn type_urls(&self) -> impl Iterator<Item = &str> {
        self.types.keys().map(String::as_str)
    }

    /// Adds the response `type_url` needs to `out`; after a CDS response in which clusters
    /// the client holds the endpoints of were added or changed, their ClusterLoadAssignments
    /// again, even if unchanged (Envoy keeps an updated cluster warming until it gets one).
    fn respond_type(
        &mut self,
        type_url: &str,
        snapshot: &Snapshot,
        out: &mut Vec<DiscoveryResponse>,
    ) {
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        let Some((response, changed)) = respond(type_url, ts, snapshot, &mut self.peer) else {
            return;
        };
        out.push(response);
        if type_url != CLUSTER_TYPE_URL {
            return;
        }
        let Some(eds) = self.types.get_mut(ENDPOINT_TYPE_URL) else {
            return;
        };
        let mut forced = false;
        for name in changed {
            forced |= eds.held.remove(&name).is_some();
        }
        if forced {
            self.respond_type(ENDPOINT_TYPE_URL, snapshot, out);
        }
    }

    fn log_response(&self, response: &DiscoveryResponse) {
        tracing::debug!(node = %self.peer.node_id, type_url = %response.type_url,
            version = %response.version_info, nonce = %response.nonce,
            resources = response.resources.len(), "SotW response");
    }
}

/// The response `ts` needs, if any, with the names of the resources it carries that the
/// client did not hold at that version. A full-state type's response carries every resource
/// subscribed to and goes out when that set differs from the last one sent; another type's
/// carries only the resources the client does not hold. The first response of a type goes out
/// even when empty for full-state and wildcard subscriptions (the client waits for it to
/// finish initializing); named types wait until a resource exists.
fn respond(
    type_url: &str,
    ts: &mut TypeState,
    snapshot: &Snapshot,
    peer: &mut Peer,
) -> Option<(DiscoveryResponse, Vec<String>)> {
    let all = snapshot.resources(type_url);
    let subscribed: Vec<(&String, &SnapshotResource)> = if ts.wildcard {
        all.iter().collect()
    } else {
        ts.names
            .iter()
            .filter_map(|n| all.get_key_value(n))
            .collect()
    };
    let new: Vec<(&String, &SnapshotResource)> = subscribed
        .iter()
        .filter(|(n, r)| ts.held.get(*n) != Some(&r.version))
        .copied()
        .collect();
    let full_state = is_full_state(type_url);
    let send = match ts.last {
        Some(_) if full_state => !new.is_empty() || ts.held.len() != subscribed.len(),
        Some(_) => !new.is_empty(),
        None => full_state || ts.wildcard || !new.is_empty(),
    };
    if !send {
        return None;
    }
    let changed: Vec<String> = new.iter().map(|(n, _)| (*n).clone()).collect();
    let chosen = if full_state {
        ts.held.clear();
        subscribed
    } else {
        new
    };
    ts.held.extend(
        chosen
            .iter()
            .map(|(n, r)| ((*n).clone(), r.version.clone())),
    );
    let nonce = peer.next_nonce();
    ts.last = Some(LastResponse::new(
        snapshot.version().to_owned(),
        nonce.clone(),
    ));
    let response = DiscoveryResponse {
        version_info: snapshot.version().to_owned(),
        resources: chosen.iter().map(|(_, r)| (*r.any).clone()).collect(),
        type_url: type_url.to_owned(),
        nonce,
        ..Default::default()
    };
    Some((response, changed))
}
