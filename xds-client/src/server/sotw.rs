//! State-of-the-world ADS streams: per type, what the client subscribed to and what it was
//! last sent; a response whenever a request or a snapshot changes what the client should have.

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
    sent: Option<Sent>,
    /// Send the next response even if its content is unchanged (EDS after a cluster changed:
    /// Envoy warms an updated cluster only on a ClusterLoadAssignment response).
    force: bool,
}

/// What the last response of a type carried.
struct Sent {
    /// Its version and nonce, and whether the client answered it.
    response: LastResponse,
    /// Name -> resource version.
    content: BTreeMap<String, String>,
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
        let last = ts.sent.as_mut().map(|sent| &mut sent.response);
        let check = self.peer.check_nonce(
            &req.type_url,
            &req.response_nonce,
            req.error_detail.as_ref(),
            last,
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
        self.respond_to_request(&req.type_url, snapshot)
    }

    fn type_urls(&self) -> impl Iterator<Item = &str> {
        self.types.keys().map(String::as_str)
    }

    /// Adds the response `type_url` needs to `out`; after a CDS response in which clusters
    /// the client also watches in EDS were added or changed, the EDS response too, even if the
    /// endpoints did not change (Envoy keeps an updated cluster warming until it gets one).
    fn respond_type(
        &mut self,
        type_url: &str,
        snapshot: &Snapshot,
        out: &mut Vec<DiscoveryResponse>,
    ) {
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        let before = ts
            .sent
            .as_ref()
            .map(|s| s.content.clone())
            .unwrap_or_default();
        let Some(response) = respond(type_url, ts, snapshot, &mut self.peer) else {
            return;
        };
        out.push(response);
        if type_url != CLUSTER_TYPE_URL {
            return;
        }
        let after = ts.sent.as_ref().map(|s| &s.content);
        let changed: Vec<String> = after
            .into_iter()
            .flatten()
            .filter(|(n, v)| before.get(*n) != Some(*v))
            .map(|(n, _)| n.clone())
            .collect();
        let Some(eds) = self.types.get(ENDPOINT_TYPE_URL) else {
            return;
        };
        let watched = |n: &String| eds.wildcard || eds.names.contains(n);
        if eds.sent.is_some() && changed.iter().any(watched) {
            if let Some(eds) = self.types.get_mut(ENDPOINT_TYPE_URL) {
                eds.force = true;
            }
            self.respond_type(ENDPOINT_TYPE_URL, snapshot, out);
        }
    }

    fn log_response(&self, response: &DiscoveryResponse) {
        tracing::debug!(node = %self.peer.node_id, type_url = %response.type_url,
            version = %response.version_info, nonce = %response.nonce,
            resources = response.resources.len(), "SotW response");
    }
}

/// The response `ts` needs, if its content differs from the last one sent. The first response
/// of a type goes out even when empty for full-state and wildcard subscriptions (the client
/// waits for it to finish initializing); named types wait until a resource exists.
fn respond(
    type_url: &str,
    ts: &mut TypeState,
    snapshot: &Snapshot,
    peer: &mut Peer,
) -> Option<DiscoveryResponse> {
    let all = snapshot.resources(type_url);
    let chosen: Vec<(&String, &SnapshotResource)> = if ts.wildcard {
        all.iter().collect()
    } else {
        ts.names
            .iter()
            .filter_map(|n| all.get_key_value(n))
            .collect()
    };
    let content: BTreeMap<String, String> = chosen
        .iter()
        .map(|(n, r)| ((*n).clone(), r.version.clone()))
        .collect();
    let send = match &ts.sent {
        Some(sent) => sent.content != content || ts.force,
        None => is_full_state(type_url) || ts.wildcard || !content.is_empty(),
    };
    if !send {
        return None;
    }
    let nonce = peer.next_nonce();
    ts.force = false;
    ts.sent = Some(Sent {
        response: LastResponse::new(snapshot.version().to_owned(), nonce.clone()),
        content,
    });
    Some(DiscoveryResponse {
        version_info: snapshot.version().to_owned(),
        resources: chosen.iter().map(|(_, r)| (*r.any).clone()).collect(),
        type_url: type_url.to_owned(),
        nonce,
        ..Default::default()
    })
}
