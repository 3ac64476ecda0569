//! xDS v3 for revoy: a generic ADS client ([`client`]), SotW and Delta, that knows type URLs but
//! not what a Listener means, and a snapshot ADS server ([`server`]) for edge users and tests.
//!
//! The client hands each response's decoded resources to a [`Handler`], which applies the
//! valid ones and names the rejected ones; any rejection becomes a NACK whose `error_detail`
//! lists them (Envoy's per-resource semantics).

use std::time::{Duration, SystemTime};

pub mod client;
pub mod server;

/// Type URL of `envoy.config.listener.v3.Listener` resources (LDS).
pub const LISTENER_TYPE_URL: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of `envoy.config.cluster.v3.Cluster` resources (CDS).
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of `envoy.config.route.v3.RouteConfiguration` resources (RDS).
pub const ROUTE_TYPE_URL: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// Type URL of `envoy.config.endpoint.v3.ClusterLoadAssignment` resources (EDS).
pub const ENDPOINT_TYPE_URL: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Type URL of `envoy.extensions.transport_sockets.tls.v3.Secret` resources (SDS).
pub const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// Whether absence from a SotW response removes a resource of this type (LDS, CDS: the
/// response is the full state) or not (RDS, EDS, SDS: resources are named).
pub fn is_full_state(type_url: &str) -> bool {
    type_url == LISTENER_TYPE_URL || type_url == CLUSTER_TYPE_URL
}

/// One resource of a response, still encoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// The resource's name (decoded from the resource itself in SotW, `Resource.name` in Delta).
    pub name: String,
    /// Its version: the response's `version_info` in SotW, `Resource.version` in Delta.
    pub version: String,
    /// The resource (`Any.value`, of the update's type URL).
    pub value: bytes::Bytes,
}

/// What one response asks the handler to apply, for one type.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    /// The type URL.
    pub type_url: String,
    /// `version_info` (SotW) or `system_version_info` (Delta).
    pub version_info: String,
    /// Resources added or changed.
    pub resources: Vec<Resource>,
    /// Names removed: Delta's `removed_resources`, or for SotW full-state types the names
    /// known before and absent now.
    pub removed: Vec<String>,
}

/// A resource the handler refused, and why (becomes part of the NACK's `error_detail`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The resource's name.
    pub name: String,
    /// What is wrong, with the field path.
    pub reason: String,
}

/// The handler's answer to an [`Update`]: the resources it rejected (none means ACK), and of
/// those it applied, which were new and which replaced another version (the push log's
/// added and changed; the rest were identical to what it held).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Rejected resources; the others were applied.
    pub rejected: Vec<Rejected>,
    /// Resources applied that the handler held no version of.
    pub added: Vec<String>,
    /// Resources applied that replaced a different version the handler held.
    pub changed: Vec<String>,
}

impl Applied {
    /// An answer that rejects `rejected` and says nothing of what changed.
    pub fn rejecting(rejected: Vec<Rejected>) -> Applied {
        Applied {
            rejected,
            ..Applied::default()
        }
    }
}

/// Events the proxy turns into stats (`control_plane.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A stream to the control plane is up.
    Connected,
    /// The stream ended; the client backs off and reconnects.
    Disconnected,
    /// The rate limit held a request back (counted at each attempt to send that found no
    /// token, as Envoy's `rate_limit_enforced`).
    RateLimited,
    /// How many requests wait for the rate limit, reported when that number changes
    /// (Envoy's `pending_requests`).
    Queued(usize),
    /// A response named its control plane (its `control_plane.identifier`, which Envoy shows
    /// as the `control_plane.identifier` text readout).
    Identified(String),
}

/// Applies the resources the client receives. Called on the client's task, one update at a
/// time.
pub trait Handler: Send + Sync + 'static {
    /// Applies `update`; answers which resources were rejected.
    fn apply(&self, update: Update) -> Applied;
    /// `update` was refused whole for `reason` (it names a resource twice) and NACKed without
    /// being applied: what waited for it may go on.
    fn refused(&self, _update: &Update, _reason: &str) {}
    /// A stream or rate-limit event.
    fn event(&self, _event: Event) {}
}

/// An ACK or NACK the client sent, or a response it received, for `/xds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every resource applied.
    Ack,
    /// The reason sent in `error_detail`.
    Nack(String),
}

/// How many resource names a [`Push`] keeps of each list: a 10,000-cluster push logged whole,
/// 64 times over, would hold tens of megabytes of names.
pub const PUSH_NAMES: usize = 100;

/// Some resource names, counted: the first [`PUSH_NAMES`] of them and how many there were.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Names {
    /// The first [`PUSH_NAMES`] names.
    pub first: Vec<String>,
    /// How many there were.
    pub count: usize,
}

impl Names {
    /// Keeps the first [`PUSH_NAMES`] of `names` and counts them all.
    pub fn of<'a>(names: impl IntoIterator<Item = &'a String>) -> Names {
        let mut kept = Names::default();
        for name in names {
            if kept.count < PUSH_NAMES {
                kept.first.push(name.clone());
            }
            kept.count += 1;
        }
        kept
    }
}

/// One response received and how it was answered (the push log, newest first in [`Status`]).
#[derive(Debug, Clone)]
pub struct Push {
    /// When it arrived.
    pub at: SystemTime,
    /// Its type URL.
    pub type_url: String,
    /// `version_info` / `system_version_info`.
    pub version: String,
    /// Its nonce.
    pub nonce: String,
    /// The resources it carried.
    pub resources: Names,
    /// Those applied that were new.
    pub added: Names,
    /// Those applied as a new version of a resource already held.
    pub changed: Names,
    /// How many were identical to the version held (a SotW response repeats every resource
    /// of a full-state type).
    pub unchanged: usize,
    /// The names it removed (Delta, or absent from a SotW full-state response), none when
    /// the response was refused whole.
    pub removed: Names,
    /// The resources rejected, each with its reason (the first [`PUSH_NAMES`]).
    pub rejected: Vec<Rejected>,
    /// How many were rejected.
    pub rejected_count: usize,
    /// The answer.
    pub verdict: Verdict,
    /// How long the handler took.
    pub apply_time: Duration,
}

/// Where one type's subscription stands.
#[derive(Debug, Clone, Default)]
pub struct TypeStatus {
    /// The type URL.
    pub type_url: String,
    /// Subscribed to every resource of the type.
    pub wildcard: bool,
    /// Names subscribed to (besides the wildcard; the first [`PUSH_NAMES`]).
    pub names: Vec<String>,
    /// How many names are subscribed to.
    pub name_count: usize,
    /// The last version ACKed.
    pub acked_version: String,
    /// The last nonce received.
    pub nonce: String,
    /// Whether a request was sent and no response arrived since.
    pub pending: bool,
}

/// The client's state for `/xds`.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Whether a stream is up.
    pub connected: bool,
    /// Streams opened since start.
    pub streams: u64,
    /// Per type, in subscription order.
    pub types: Vec<TypeStatus>,
    /// The last pushes, newest first.
    pub pushes: Vec<Push>,
}
