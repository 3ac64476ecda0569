//! Incremental (Delta) ADS streams: per type, the subscriptions and the resource versions the
//! client holds; responses carry what was added or changed and what was removed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use proto::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};

use super::log::{ClientEvent, EventLog, Protocol};
use super::snapshot::{Snapshot, push_order};
use crate::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, Verdict, is_full_state};

/// One Delta stream's state.
#[derive(Default)]
pub(crate) struct DeltaStream {
    node_id: String,
    types: BTreeMap<String, TypeState>,
    nonces: u64,
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
    /// The last response's nonce and version, and whether the client answered it.
    last: Option<(String, String, bool)>,
}

impl DeltaStream {
    /// Handles a request; answers the responses to send (none or one).
    pub(crate) fn on_request(
        &mut self,
        req: DeltaDiscoveryRequest,
        snapshot: Option<&Snapshot>,
        log: &EventLog,
    ) -> Vec<DeltaDiscoveryResponse> {
        if let Some(node) = &req.node
            && self.node_id.is_empty()
        {
            self.node_id.clone_from(&node.id);
            tracing::info!(node = %self.node_id, "Delta stream: node identified");
        }
        if req.type_url.is_empty() {
            tracing::warn!(node = %self.node_id, "Delta request without a type_url ignored");
            return Vec::new();
        }
        tracing::debug!(node = %self.node_id, type_url = %req.type_url,
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
        if !req.response_nonce.is_empty() {
            match &mut ts.last {
                Some((nonce, _, true)) if *nonce == req.response_nonce => {}
                Some((nonce, version, answered)) if *nonce == req.response_nonce => {
                    *answered = true;
                    let verdict = match &req.error_detail {
                        Some(status) => Verdict::Nack(status.message.clone()),
                        None => Verdict::Ack,
                    };
                    log.record(ClientEvent {
                        node_id: self.node_id.clone(),
                        protocol: Protocol::Delta,
                        type_url: req.type_url.clone(),
                        version: version.clone(),
                        nonce: nonce.clone(),
                        verdict,
                        at: SystemTime::now(),
                    });
                }
                _ => tracing::debug!(node = %self.node_id, type_url = %req.type_url,
                    nonce = %req.response_nonce, "stale nonce: not an ACK or NACK"),
            }
        }
        let Some(snapshot) = snapshot else {
            return Vec::new();
        };
        let mut out = Vec::new();
        self.respond_type(&req.type_url, snapshot, &mut out);
        out
    }

    /// Handles a new snapshot: a response for each subscribed type that has something new for
    /// this client, in push order.
    pub(crate) fn on_snapshot(&mut self, snapshot: &Snapshot) -> Vec<DeltaDiscoveryResponse> {
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
        let Some(response) = respond(type_url, ts, snapshot, &mut self.nonces) else {
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
}

/// The response bringing the client of `ts` up to `snapshot`, if anything differs. A wildcard
/// subscription's first response goes out even when empty (the client waits for it).
fn respond(
    type_url: &str,
    ts: &mut TypeState,
    snapshot: &Snapshot,
    nonces: &mut u64,
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
    *nonces += 1;
    let nonce = nonces.to_string();
    ts.responded = true;
    ts.last = Some((nonce.clone(), snapshot.version().to_owned(), false));
    Some(DeltaDiscoveryResponse {
        system_version_info: snapshot.version().to_owned(),
        resources,
        type_url: type_url.to_owned(),
        removed_resources: removed,
        nonce,
        ..Default::default()
    })
}

/// Runs one stream: requests in, responses out, until either side ends.
pub(crate) async fn run(
    shared: Arc<super::Shared>,
    mut requests: tonic::Streaming<DeltaDiscoveryRequest>,
    out: tokio::sync::mpsc::Sender<Result<DeltaDiscoveryResponse, tonic::Status>>,
) {
    let mut stream = DeltaStream::default();
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
                    tracing::debug!(node = %stream.node_id, %status, "Delta stream error");
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
                version = %response.system_version_info, nonce = %response.nonce,
                resources = response.resources.len(), removed = response.removed_resources.len(),
                "Delta response");
            if out.send(Ok(response)).await.is_err() {
                return;
            }
        }
    }
    tracing::info!(node = %stream.node_id, "Delta stream closed");
}
