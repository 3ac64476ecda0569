//! The ADS client: one stream (SotW or Delta) to the control plane for every type, driven by
//! the subscriptions the proxy sets, answering each response with an ACK or a NACK from the
//! [`Handler`]'s verdict.
//!
//! [`start`] spawns the engine on the current tokio runtime; the [`Client`] it returns sets
//! subscriptions (through a channel, so it can be called from inside [`Handler::apply`]) and
//! reads the [`Status`].

mod backoff;
mod deliver;
mod delta;
mod engine;
mod protocol;
mod push_log;
mod rate_limit;
mod resource_name;
mod shared;
mod sotw;
mod sotw_wire;
mod subscriptions;
mod transport;

use std::collections::BTreeSet;
use std::sync::Arc;

use proto::pb::envoy::config::core::v3::Node;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio::task::AbortHandle;

pub use backoff::Backoff;
pub use rate_limit::RateLimit;
pub use resource_name::{NameError, name_of as resource_name};
pub use transport::{HandshakeObserver, KeepAlive, TlsConnect, Transport};

use engine::Engine;
use shared::Shared;
use subscriptions::Change;

use crate::{Handler, Status};

/// The xDS variant (`ads_config.api_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// State of the world (`GRPC`).
    Sotw,
    /// Incremental (`DELTA_GRPC`).
    Delta,
}

/// Which gRPC service the stream is opened on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Service {
    /// `AggregatedDiscoveryService`: every type on one stream (ADS).
    #[default]
    Aggregated,
    /// `SecretDiscoveryService`: secrets only (an `api_config_source` for SDS, such as Istio's
    /// `sds-grpc` cluster).
    Secret,
}

/// How to reach the control plane and what to tell it.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the control plane listens.
    pub transport: Transport,
    /// SotW or Delta.
    pub mode: Mode,
    /// The gRPC service of the stream.
    pub service: Service,
    /// The node sent to the control plane.
    pub node: Node,
    /// Send the node on the first request of a stream only (Envoy's
    /// `set_node_on_first_message_only`); otherwise on every request.
    pub set_node_on_first_message_only: bool,
    /// Rate limit of the requests sent; `None` for none.
    pub rate_limit: Option<RateLimit>,
    /// How many responses the push log keeps.
    pub push_log_len: usize,
    /// Back-off between streams.
    pub backoff: Backoff,
    /// HTTP/2 keep-alive on the channel; `None` sends no PINGs.
    pub keep_alive: Option<KeepAlive>,
}

impl Config {
    /// The push-log length [`Config::new`] picks.
    pub const DEFAULT_PUSH_LOG_LEN: usize = 32;

    /// A config with Envoy's defaults: the node on every request, no rate limit, back-off
    /// from 500 ms to 30 s; and revoy's default keep-alive ([`KeepAlive::default`]).
    pub fn new(transport: Transport, mode: Mode, node: Node) -> Self {
        Config {
            transport,
            mode,
            service: Service::Aggregated,
            node,
            set_node_on_first_message_only: false,
            rate_limit: None,
            push_log_len: Self::DEFAULT_PUSH_LOG_LEN,
            backoff: Backoff::default(),
            keep_alive: Some(KeepAlive::default()),
        }
    }
}

/// A handle on the running client; clones share it.
#[derive(Debug, Clone)]
pub struct Client {
    changes: UnboundedSender<Change>,
    shared: Arc<Shared>,
    task: AbortHandle,
}

/// Starts the client on the current tokio runtime (panics outside one).
pub fn start(config: Config, handler: Arc<dyn Handler>) -> Client {
    let (changes, receiver) = unbounded_channel();
    let shared = Arc::new(Shared::new(config.push_log_len));
    let task = match config.mode {
        Mode::Sotw => Engine::<sotw::Sotw>::spawn(config, handler, receiver, shared.clone()),
        Mode::Delta => Engine::<delta::Delta>::spawn(config, handler, receiver, shared.clone()),
    };
    Client {
        changes,
        shared,
        task,
    }
}

impl Client {
    /// Subscribes to every resource of a type (LDS, CDS).
    pub fn subscribe_wildcard(&self, type_url: &str) {
        // A send fails only once the engine stopped: there is nothing left to subscribe.
        let _ = self.changes.send(Change::Wildcard(type_url.to_string()));
    }

    /// Sets the whole name set of a type (RDS, EDS, SDS). A request goes out only when the
    /// set changed; an empty set unsubscribes every name (it never means wildcard).
    pub fn subscribe(&self, type_url: &str, names: Vec<String>) {
        let names: BTreeSet<String> = names.into_iter().collect();
        let _ = self
            .changes
            .send(Change::Names(type_url.to_string(), names));
    }

    /// Stops claiming to hold the applied version of resource `name` of `type_url` (the proxy
    /// could not put it in use after all), so that a new Delta stream gets it again.
    pub fn forget(&self, type_url: &str, name: &str) {
        let _ = self
            .changes
            .send(Change::Forget(type_url.to_string(), name.to_string()));
    }

    /// Connection state, per-type subscriptions and the push log (newest first).
    pub fn status(&self) -> Status {
        self.shared.status()
    }

    /// Ends the engine and its stream.
    pub fn stop(&self) {
        self.task.abort();
        self.shared.disconnected();
    }
}

/// A handler that applies everything it is given, for the protocols' tests.
#[cfg(test)]
struct AcceptAll;

#[cfg(test)]
impl crate::Handler for AcceptAll {
    fn apply(&self, _update: crate::Update) -> crate::Applied {
        crate::Applied::default()
    }
}
