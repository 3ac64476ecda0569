//! The one writer of what the data path reads: the bootstrap's static resources and every xDS
//! update go through here. It owns the listener sockets (one [`Slot`] per listener name, kept
//! across updates), publishes the active listeners ([`ActiveListeners`]) and the [`Snapshot`]
//! of RDS route tables, and answers per resource, so callers can turn its answers into ACKs
//! and NACKs. Until the workers start (the server's first LIVE, after the initial xDS fetch),
//! listener sockets are bound but not listening, so a client is refused, as by Envoy, whose
//! workers take their listeners only then.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::config::listener::ListenerConfig;
use crate::listener::{ActiveListeners, Listener, Slot, accept_loop, listen};
use crate::route::RouteTable;
use crate::shared::Shared;
use crate::snapshot::Snapshot;

/// What applying a listener did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerChange {
    /// A new listener name: its sockets were bound.
    Added,
    /// An existing listener on the same address: its sockets were kept, new connections get
    /// the new configuration, and connections of chains it changed or removed close at their
    /// next response.
    InPlace,
    /// An existing listener moved to another address: new sockets, the old ones closed.
    Rebound,
}

/// Why a listener could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// Another listener already listens on the address.
    #[error("error adding listener '{name}': listener '{other}' already listens on {address}")]
    DuplicateAddress {
        /// The listener.
        name: String,
        /// The one holding the address.
        other: String,
        /// The address.
        address: std::net::SocketAddr,
    },
    /// The address could not be bound.
    #[error("cannot bind listener '{name}' to {address}: {source}")]
    Bind {
        /// The listener.
        name: String,
        /// The address.
        address: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A bound socket waiting for the workers to start: its slot, and the worker whose accept loop
/// will own it.
struct Unstarted {
    slot: Arc<Slot>,
    socket: socket2::Socket,
    worker: usize,
}

/// The applier's state: listener slots by name (in the order listeners were added), the RDS
/// route tables, and, until the workers start, the sockets not listening yet.
#[derive(Default)]
struct State {
    slots: Vec<(String, Arc<Slot>)>,
    routes: HashMap<String, Arc<RouteTable>>,
    workers_started: bool,
    unstarted: Vec<Unstarted>,
}

impl State {
    /// Drops the not-yet-listening sockets of `slot` (a listener removed or moved before the
    /// workers started).
    fn forget_unstarted(&mut self, slot: &Arc<Slot>) {
        self.unstarted.retain(|u| !Arc::ptr_eq(&u.slot, slot));
    }
}

/// Applies configuration changes and publishes them. One per process, in
/// [`crate::process::Process`].
pub struct Applier {
    /// What the listeners it builds serve with, and where it publishes route tables.
    shared: Arc<Shared>,
    /// `--drain-time-s`: how long a retired chain's TCP connections may go on.
    drain_time: Duration,
    /// The active listeners, as last published.
    listeners: Arc<ActiveListeners>,
    state: Mutex<State>,
    /// The token buckets network rate limits share by `share_key`.
    buckets: crate::limits::SharedBuckets,
    workers: OnceLock<Vec<tokio::runtime::Handle>>,
}

impl Applier {
    /// An applier with no listener or route table yet.
    pub fn new(shared: Arc<Shared>, drain_time: Duration) -> Applier {
        Applier {
            shared,
            drain_time,
            listeners: Arc::default(),
            state: Mutex::default(),
            buckets: crate::limits::SharedBuckets::default(),
            workers: OnceLock::new(),
        }
    }

    /// The active listeners.
    pub fn listeners(&self) -> Arc<Vec<Arc<Listener>>> {
        self.listeners.load_full()
    }

    /// Records the worker runtimes that accept loops run on (before any listener is applied).
    pub fn set_workers(&self, workers: Vec<tokio::runtime::Handle>) {
        let _ = self.workers.set(workers);
    }

    /// Adds or replaces the listener named `config.name`.
    pub fn upsert_listener(&self, config: ListenerConfig) -> Result<ListenerChange, ListenerError> {
        let mut state = self.state.lock().expect("applier state");
        let name = config.name.clone();
        let existing = state
            .slots
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s.clone());
        // Envoy's duplicate-address rule: another listener with the same address is a
        // duplicate unless the new one binds port 0 (the kernel picks a port per socket); a
        // listener that does not bind (`bind_to_port: false`, used through `use_original_dst`)
        // must not share its address either, or which one gets the connections is ambiguous.
        if (!config.bind_to_port || config.address.port() != 0)
            && let Some((other, _)) = state
                .slots
                .iter()
                .find(|(n, s)| *n != name && s.current().config().address == config.address)
        {
            return Err(ListenerError::DuplicateAddress {
                name,
                other: other.clone(),
                address: config.address,
            });
        }
        let previous = existing.as_ref().map(|s| s.current());
        let listener = Arc::new(Listener::new(
            Arc::new(config),
            &self.shared.stats,
            &self.shared.secrets,
            &self.buckets,
            previous.as_deref(),
        ));
        let change = match (&existing, &previous) {
            (Some(slot), Some(old))
                if old.config().address == listener.config().address
                    && old.config().bind_to_port == listener.config().bind_to_port
                    && old.config().transparent == listener.config().transparent =>
            {
                let old = slot.replace(listener.clone());
                old.retire(Some(&listener), self.drain_time);
                ListenerChange::InPlace
            }
            _ => {
                let slot = Slot::new(listener.clone());
                self.bind(&mut state, &slot, &listener)?;
                match existing.zip(previous) {
                    Some((old_slot, old)) => {
                        old_slot.stop();
                        state.forget_unstarted(&old_slot);
                        old.retire(None, self.drain_time);
                        let entry = state
                            .slots
                            .iter_mut()
                            .find(|(n, _)| *n == name)
                            .expect("slot exists");
                        entry.1 = slot;
                        ListenerChange::Rebound
                    }
                    None => {
                        state.slots.push((name, slot));
                        ListenerChange::Added
                    }
                }
            }
        };
        self.publish_listeners(&state);
        Ok(change)
    }

    /// Removes the listener named `name`: it stops accepting and its connections close at
    /// their next response. Returns whether it existed.
    pub fn remove_listener(&self, name: &str) -> bool {
        let mut state = self.state.lock().expect("applier state");
        let Some(i) = state.slots.iter().position(|(n, _)| n == name) else {
            return false;
        };
        let (_, slot) = state.slots.remove(i);
        slot.stop();
        state.forget_unstarted(&slot);
        slot.current().retire(None, self.drain_time);
        self.publish_listeners(&state);
        true
    }

    /// Adds or replaces the RDS route table named by `table`.
    pub fn upsert_route(&self, table: RouteTable) {
        let mut state = self.state.lock().expect("applier state");
        state
            .routes
            .insert(table.name().to_owned(), Arc::new(table));
        self.publish_routes(&state);
    }

    /// Removes the RDS route table `name`; requests that used it get 404 (no route).
    pub fn remove_route(&self, name: &str) -> bool {
        let mut state = self.state.lock().expect("applier state");
        let existed = state.routes.remove(name).is_some();
        if existed {
            self.publish_routes(&state);
        }
        existed
    }

    /// Stops accepting on every listener, or only on inbound ones (`/drain_listeners`, quit).
    pub fn stop_listeners(&self, inbound_only: bool) {
        let mut state = self.state.lock().expect("applier state");
        let stopped: Vec<_> = state
            .slots
            .iter()
            .filter(|(_, slot)| !inbound_only || slot.current().config().inbound)
            .map(|(_, slot)| slot.clone())
            .collect();
        for slot in &stopped {
            slot.stop();
            state.forget_unstarted(slot);
        }
    }

    /// The workers start (the server's first LIVE): every listener bound so far starts
    /// listening and accepting, and later ones do at once.
    pub fn start_workers(&self) {
        let mut state = self.state.lock().expect("applier state");
        state.workers_started = true;
        for u in std::mem::take(&mut state.unstarted) {
            self.accept(&u.slot, u.socket, u.worker);
        }
    }

    /// The address listener `name`'s socket is bound to (the kernel's port for a configured
    /// port 0); `None` when it has no socket.
    pub fn local_address(&self, name: &str) -> Option<std::net::SocketAddr> {
        let state = self.state.lock().expect("applier state");
        state
            .slots
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, s)| s.local_address())
    }

    /// The stat prefix (`listener.<stats name>`) of the active listener `name`.
    pub fn stat_prefix_of(&self, name: &str) -> Option<String> {
        let state = self.state.lock().expect("applier state");
        state
            .slots
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.current().config().stat_prefix())
    }

    /// Binds `listener`'s address on every worker (one socket when the port is ephemeral: it
    /// would differ per socket) and starts their accept loops, or keeps the sockets in `state`
    /// until the workers start.
    fn bind(
        &self,
        state: &mut State,
        slot: &Arc<Slot>,
        listener: &Listener,
    ) -> Result<(), ListenerError> {
        let cfg = listener.config();
        if !cfg.bind_to_port {
            return Ok(());
        }
        let workers = self.workers.get().map(Vec::as_slice).unwrap_or_default();
        let count = if cfg.address.port() == 0 {
            1
        } else {
            workers.len()
        };
        let mut sockets = Vec::with_capacity(count);
        for _ in 0..count.min(workers.len()) {
            let socket = listener
                .bind(count > 1)
                .map_err(|source| ListenerError::Bind {
                    name: cfg.name.clone(),
                    address: cfg.address,
                    source,
                })?;
            if let Some(local) = socket.local_addr().ok().and_then(|a| a.as_socket()) {
                slot.set_local_address(local);
            }
            sockets.push(socket);
        }
        for (worker, socket) in sockets.into_iter().enumerate() {
            if state.workers_started {
                self.accept(slot, socket, worker);
            } else {
                state.unstarted.push(Unstarted {
                    slot: slot.clone(),
                    socket,
                    worker,
                });
            }
        }
        Ok(())
    }

    /// Starts listening on `socket` and accepting on worker `worker`.
    fn accept(&self, slot: &Arc<Slot>, socket: socket2::Socket, worker: usize) {
        let Some(rt) = self.workers.get().and_then(|w| w.get(worker)) else {
            return;
        };
        let _guard = rt.enter();
        let socket = match listen(socket) {
            Ok(socket) => socket,
            Err(e) => {
                tracing::error!(listener = %slot.current().config().name, error = %e, "cannot listen");
                return;
            }
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&socket);
        let task = rt.spawn(accept_loop(
            slot.clone(),
            socket,
            self.shared.clone(),
            self.listeners.clone(),
            worker,
        ));
        slot.add_accept_task(task.abort_handle(), fd);
    }

    /// Publishes the active listeners.
    fn publish_listeners(&self, state: &State) {
        self.listeners
            .store(state.slots.iter().map(|(_, s)| s.current()).collect());
        self.shared
            .stats
            .gauge("listener_manager.total_listeners_active")
            .set(state.slots.len() as u64);
    }

    /// Publishes the RDS route tables as the new snapshot, and has every worker refresh its
    /// cached copy at once, so an idle worker does not keep removed tables alive.
    fn publish_routes(&self, state: &State) {
        self.shared.snapshot.store(Snapshot {
            routes: state.routes.clone(),
        });
        for rt in self.workers.get().into_iter().flatten() {
            let shared = self.shared.clone();
            rt.spawn(async move { shared.snapshot.with(|_| ()) });
        }
    }
}
