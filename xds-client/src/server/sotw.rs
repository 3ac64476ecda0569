//! State-of-the-world ADS streams: per type, what the client subscribed to and what it was
//! last sent; a response whenever a request or a snapshot changes what the client should have.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use proto::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

use super::log::{ClientEvent, EventLog, Protocol};
use super::snapshot::{Snapshot, SnapshotResource, push_order};
use crate::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, Verdict, is_full_state};

/// One SotW stream's state.
#[derive(Default)]
pub(crate) struct SotwStream {
    node_id: String,
    types: BTreeMap<String, TypeState>,
    nonces: u64,
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
    version: String,
    nonce: String,
    /// Whether the client answered it (later requests with its nonce only update the
    /// subscription).
    answered: bool,
    /// Name -> resource version.
    content: BTreeMap<String, String>,
}

impl SotwStream {
    /// Handles a request; answers the responses to send (none or one). `snapshot` is `None`
    /// until the server has one: the subscription is kept and answered once it comes.
    pub(crate) fn on_request(
        &mut self,
        req: DiscoveryRequest,
        snapshot: Option<&Snapshot>,
        log: &EventLog,
    ) -> Vec<DiscoveryResponse> {
        if let Some(node) = &req.node
            && self.node_id.is_empty()
        {
            self.node_id.clone_from(&node.id);
            tracing::info!(node = %self.node_id, "SotW stream: node identified");
        }
        if req.type_url.is_empty() {
            tracing::warn!(node = %self.node_id, "SotW request without a type_url ignored");
            return Vec::new();
        }
        tracing::debug!(node = %self.node_id, type_url = %req.type_url,
            version = %req.version_info, nonce = %req.response_nonce,
            names = ?req.resource_names, nack = req.error_detail.is_some(), "SotW request");
        let first = !self.types.contains_key(&req.type_url);
        let ts = self.types.entry(req.type_url.clone()).or_default();
        if !req.response_nonce.is_empty() {
            match &mut ts.sent {
                Some(sent) if sent.nonce == req.response_nonce && sent.answered => {}
                Some(sent) if sent.nonce == req.response_nonce => {
                    sent.answered = true;
                    let verdict = match &req.error_detail {
                        Some(status) => Verdict::Nack(status.message.clone()),
                        None => Verdict::Ack,
                    };
                    log.record(ClientEvent {
                        node_id: self.node_id.clone(),
                        protocol: Protocol::Sotw,
                        type_url: req.type_url.clone(),
                        version: sent.version.clone(),
                        nonce: sent.nonce.clone(),
                        verdict,
                        at: SystemTime::now(),
                    });
                }
                // Nothing sent on this stream yet: a nonce of an earlier stream, not stale.
                None => {}
                Some(_) => {
                    tracing::debug!(node = %self.node_id, type_url = %req.type_url,
                        nonce = %req.response_nonce, "stale nonce: request ignored");
                    return Vec::new();
                }
            }
        }
        let mut names: BTreeSet<String> = req.resource_names.into_iter().collect();
        let star = names.remove("*");
        ts.legacy_wildcard = !star && names.is_empty() && (first || ts.legacy_wildcard);
        ts.wildcard = star || ts.legacy_wildcard;
        ts.names = names;
        let Some(snapshot) = snapshot else {
            return Vec::new();
        };
        let mut out = Vec::new();
        self.respond_type(&req.type_url, snapshot, &mut out);
        out
    }

    /// Handles a new snapshot: a response for each subscribed type whose content for this
    /// client changed, in push order.
    pub(crate) fn on_snapshot(&mut self, snapshot: &Snapshot) -> Vec<DiscoveryResponse> {
        let order: Vec<String> = push_order(self.types.keys().map(String::as_str))
            .into_iter()
            .map(str::to_owned)
            .collect();
        let mut out = Vec::new();
        for type_url in order {
            self.respond_type(&type_url, snapshot, &mut out);
        }
        out
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
        let Some(response) = respond(type_url, ts, snapshot, &mut self.nonces) else {
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
}

/// The response `ts` needs, if its content differs from the last one sent. The first response
/// of a type goes out even when empty for full-state and wildcard subscriptions (the client
/// waits for it to finish initializing); named types wait until a resource exists.
fn respond(
    type_url: &str,
    ts: &mut TypeState,
    snapshot: &Snapshot,
    nonces: &mut u64,
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
    *nonces += 1;
    let nonce = nonces.to_string();
    ts.force = false;
    ts.sent = Some(Sent {
        version: snapshot.version().to_owned(),
        nonce: nonce.clone(),
        answered: false,
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

/// Runs one stream: requests in, responses out, until either side ends.
pub(crate) async fn run(
    shared: Arc<super::Shared>,
    mut requests: tonic::Streaming<DiscoveryRequest>,
    out: tokio::sync::mpsc::Sender<Result<DiscoveryResponse, tonic::Status>>,
) {
    let mut stream = SotwStream::default();
    let mut snapshots = shared.snapshot.subscribe();
    loop {
        let responses = tokio::select! {
            req = requests.message() => match req {
                Ok(Some(req)) => {
                    let snapshot = snapshots.borrow().clone();
                    stream.on_request(req, snapshot.as_deref(), &shared.log)
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(node = %stream.node_id, %status, "SotW stream error");
                    break;
                }
            },
            changed = snapshots.changed() => {
                if changed.is_err() {
                    break;
                }
                let snapshot = snapshots.borrow_and_update().clone();
                match snapshot {
                    Some(s) => stream.on_snapshot(&s),
                    None => Vec::new(),
                }
            }
        };
        for response in responses {
            tracing::debug!(node = %stream.node_id, type_url = %response.type_url,
                version = %response.version_info, nonce = %response.nonce,
                resources = response.resources.len(), "SotW response");
            if out.send(Ok(response)).await.is_err() {
                return;
            }
        }
    }
    tracing::info!(node = %stream.node_id, "SotW stream closed");
}
