//! The one writer of what the data path reads: the bootstrap's static resources and every xDS
//! update go through here. It owns the listener sockets (one [`Slot`] per listener name, kept
//! across updates), publishes the active listeners ([`ActiveListeners`]) and the [`Snapshot`]
//! of RDS route tables, and answers per resource, so callers can turn its answers into ACKs
//! and NACKs. Until the workers start (the server's first LIVE, after the initial xDS fetch),
//! listener sockets are bound but not listening, so a client is refused, as by Envoy, whose
//! workers take their listeners only then.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::config::listener::{ListenAddress, ListenerConfig};
use crate::listener::{ActiveListeners, Listener, Slot, accept_loop, listen};
use crate::route::RouteTable;
use crate::shared::Shared;
use crate::snapshot::Snapshot;

/// How soon a drained listener's stats that closing connections still held are first tried
/// again (the connections the drain closes at its end let go of them within a few
/// milliseconds); each later try waits twice as long as the one before, up to
/// [`RELEASE_RETRY_MAX`].
const RELEASE_RETRY: Duration = Duration::from_millis(25);

/// The longest wait between two tries of a drained listener's stats.
const RELEASE_RETRY_MAX: Duration = Duration::from_millis(250);

/// How many times a drained listener's stats are tried (about 10 s in all) before those still
/// held (by something that outlives its connections) are left listed, as Envoy lists a stat
/// another scope holds.
const RELEASE_TRIES: u32 = 44;

/// What applying a listener did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerChange {
    /// A new listener name: its sockets were bound.
    Added,
    /// An existing listener on the same addresses: its sockets were kept, new connections
    /// get the new configuration, and connections of chains it changed or removed close at
    /// their next response.
    InPlace,
    /// An existing listener whose addresses changed (its `address` or additional ones): as
    /// in place, and each address it gained was bound and each it lost closed, the sockets
    /// of the addresses it kept accepting throughout (an address whose `ipv4_compat` alone
    /// changed keeps its socket as bound, as in Envoy); or one whose binding changed
    /// (`bind_to_port`, `transparent`): all new sockets, the old ones closed.
    Rebound,
}

/// Why a listener could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// Another listener already listens on the address.
    #[error(
        "error adding listener: '{name}' has duplicate address '{address}' as existing listener '{other}'"
    )]
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

/// A bound socket of one of a listener's addresses, not listening yet: its slot, the worker
/// whose accept loop will own it, and where it is bound.
struct Unstarted {
    slot: Arc<Slot>,
    address: ListenAddress,
    bound: std::net::SocketAddr,
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

    /// Drops the not-yet-listening sockets of `slot` for `address` alone (an additional
    /// address an update removed before the workers started).
    fn forget_unstarted_address(&mut self, slot: &Arc<Slot>, address: ListenAddress) {
        self.unstarted
            .retain(|u| !(Arc::ptr_eq(&u.slot, slot) && u.address.same_socket(&address)));
    }
}

/// Applies configuration changes and publishes them. One per process, in
/// [`crate::process::Process`].
pub struct Applier {
    /// What the listeners it builds serve with, and where it publishes route tables.
    shared: Arc<Shared>,
    /// `--drain-time-s`: how long a retired chain's connections may go on.
    drain_time: Duration,
    /// The active listeners, as last published.
    listeners: Arc<ActiveListeners>,
    state: Mutex<State>,
    /// The token buckets network rate limits share by `share_key`.
    buckets: crate::limits::SharedBuckets,
    workers: OnceLock<Vec<tokio::runtime::Handle>>,
    /// The listeners removed, replaced whole or updated in place (dropping chains) whose drain
    /// time has not ended.
    draining: Arc<Mutex<Vec<Arc<Listener>>>>,
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
            draining: Arc::default(),
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

    /// How many workers serve the listeners (0 before they are set).
    pub fn worker_count(&self) -> usize {
        self.workers.get().map_or(0, Vec::len)
    }

    /// Whether `config` could be applied now: no other listener has one of its addresses,
    /// and each address its listener does not hold yet can be bound (tried and let go), as
    /// Envoy binds a listener when it comes, before it warms.
    pub fn check_listener(&self, config: &ListenerConfig) -> Result<(), ListenerError> {
        let state = self.state.lock().expect("applier state");
        duplicate_of_active(&state, config)?;
        if !config.bind_to_port {
            return Ok(());
        }
        // The sockets an update keeps (the same binding and transparency).
        let held: Vec<ListenAddress> = state
            .slots
            .iter()
            .find(|(n, _)| *n == config.name)
            .map(|(_, s)| s.current())
            .filter(|old| {
                old.config().bind_to_port && old.config().transparent == config.transparent
            })
            .map(|old| addresses(old.config()))
            .unwrap_or_default();
        for address in addresses(config) {
            if address.address.port() == 0 || held.iter().any(|h| h.same_socket(&address)) {
                continue;
            }
            crate::listener::bind_socket(address, config.transparent).map_err(|source| {
                ListenerError::Bind {
                    name: config.name.clone(),
                    address: address.address,
                    source,
                }
            })?;
        }
        Ok(())
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
        duplicate_of_active(&state, &config)?;
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
                if old.config().bind_to_port == listener.config().bind_to_port
                    && old.config().transparent == listener.config().transparent =>
            {
                let before = addresses(old.config());
                let after = addresses(listener.config());
                let kept =
                    |a: &ListenAddress, by: &[ListenAddress]| by.iter().any(|b| b.same_socket(a));
                let added: Vec<_> = after.iter().filter(|a| !kept(a, &before)).collect();
                let mut sockets = Vec::new();
                for address in added {
                    sockets.extend(self.bind_address(slot, &listener, *address)?);
                }
                let old = slot.replace(listener.clone());
                self.drain(old, Some(&listener));
                for address in before.iter().filter(|a| !kept(a, &after)) {
                    slot.stop_address(*address);
                    state.forget_unstarted_address(slot, *address);
                }
                self.start(&mut state, sockets);
                if before.len() == after.len() && before.iter().all(|a| after.contains(a)) {
                    ListenerChange::InPlace
                } else {
                    ListenerChange::Rebound
                }
            }
            _ => {
                let slot = Slot::new(listener.clone());
                let mut sockets = Vec::new();
                for address in addresses(listener.config()) {
                    sockets.extend(self.bind_address(&slot, &listener, address)?);
                }
                self.start(&mut state, sockets);
                match existing.zip(previous) {
                    Some((old_slot, old)) => {
                        old_slot.stop();
                        state.forget_unstarted(&old_slot);
                        self.drain(old, None);
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

    /// Removes the listener named `name`: it stops accepting, its connections close at their
    /// next response, and those left when the drain time ends are closed. Returns whether it
    /// existed.
    pub fn remove_listener(&self, name: &str) -> bool {
        let mut state = self.state.lock().expect("applier state");
        let Some(i) = state.slots.iter().position(|(n, _)| n == name) else {
            return false;
        };
        let (_, slot) = state.slots.remove(i);
        slot.stop();
        state.forget_unstarted(&slot);
        self.publish_listeners(&state);
        self.drain(slot.current(), None);
        true
    }

    /// Drains the chains of `old` that `next` (the listener updating it in place, if any)
    /// does not keep, and keeps `old` until the drain time ends, as Envoy keeps a draining
    /// listener or filter chain and the stats made in its scopes; then drops its stats
    /// ([`ListenerConfig::stat_prefixes`]) that no active or draining listener makes (for an
    /// update in place, those of the chains it dropped), trying again after [`RELEASE_RETRY`],
    /// then less often (at most [`RELEASE_TRIES`] times) while closing connections still hold
    /// some. Called on a tokio runtime (xDS's), whose timer ends it.
    fn drain(&self, old: Arc<Listener>, next: Option<&Listener>) {
        old.retire(next, self.drain_time);
        let mut prefixes = old.config().stat_prefixes();
        if let Some(next) = next {
            let made = next.config().stat_prefixes();
            prefixes.retain(|p| !made.contains(p));
            if prefixes.is_empty() {
                return;
            }
        }
        self.draining
            .lock()
            .expect("draining listeners")
            .push(old.clone());
        let draining = self.draining.clone();
        let active = self.listeners.clone();
        let stats = self.shared.stats.clone();
        let drain_time = self.drain_time;
        tokio::spawn(async move {
            tokio::time::sleep(drain_time).await;
            draining
                .lock()
                .expect("draining listeners")
                .retain(|l| !Arc::ptr_eq(l, &old));
            drop(old);
            let mut wait = RELEASE_RETRY;
            for _ in 0..RELEASE_TRIES {
                let mut kept = draining.lock().expect("draining listeners").clone();
                kept.extend(active.load_full().iter().cloned());
                let in_use: BTreeSet<String> = kept
                    .iter()
                    .flat_map(|l| l.config().stat_prefixes())
                    .collect();
                drop(kept);
                prefixes.retain(|p| !in_use.contains(p) && stats.release(p));
                if prefixes.is_empty() {
                    return;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RELEASE_RETRY_MAX);
            }
        });
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

    /// Stops accepting on every listener, or only on inbound ones (`/drain_listeners`, quit);
    /// how many listeners it stopped.
    pub fn stop_listeners(&self, inbound_only: bool) -> usize {
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
        stopped.len()
    }

    /// The workers start (the server's first LIVE): every listener bound so far starts
    /// listening and accepting, and later ones do at once.
    pub fn start_workers(&self) {
        let mut state = self.state.lock().expect("applier state");
        state.workers_started = true;
        for u in std::mem::take(&mut state.unstarted) {
            self.accept(u);
        }
    }

    /// Where listener `name` listens: its `address`, then its additional addresses, each
    /// where its socket is bound (the kernel's port for a configured port 0), or as
    /// configured when it has no socket (`bind_to_port: false`). Empty for no such listener.
    pub fn local_addresses(&self, name: &str) -> Vec<std::net::SocketAddr> {
        let state = self.state.lock().expect("applier state");
        let Some((_, slot)) = state.slots.iter().find(|(n, _)| n == name) else {
            return Vec::new();
        };
        slot.current()
            .config()
            .addresses()
            .map(|a| slot.local_address(a).unwrap_or(a.address))
            .collect()
    }

    /// Binds `address`, one of `listener`'s addresses, on every worker (one socket when the
    /// port is ephemeral: it would differ per socket), not listening yet: [`Applier::start`]
    /// starts them. Nothing when the listener does not bind.
    fn bind_address(
        &self,
        slot: &Arc<Slot>,
        listener: &Listener,
        address: ListenAddress,
    ) -> Result<Vec<Unstarted>, ListenerError> {
        let cfg = listener.config();
        if !cfg.bind_to_port {
            return Ok(Vec::new());
        }
        let workers = self.workers.get().map(Vec::as_slice).unwrap_or_default();
        let count = if address.address.port() == 0 {
            1
        } else {
            workers.len()
        };
        let mut sockets = Vec::with_capacity(count);
        for worker in 0..count.min(workers.len()) {
            let socket = listener
                .bind(address)
                .map_err(|source| ListenerError::Bind {
                    name: cfg.name.clone(),
                    address: address.address,
                    source,
                })?;
            let bound = socket
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .unwrap_or(address.address);
            slot.set_local_address(address, bound);
            sockets.push(Unstarted {
                slot: slot.clone(),
                address,
                bound,
                socket,
                worker,
            });
        }
        Ok(sockets)
    }

    /// Starts accepting on freshly bound sockets, or keeps them in `state` until the workers
    /// start.
    fn start(&self, state: &mut State, sockets: Vec<Unstarted>) {
        if state.workers_started {
            for u in sockets {
                self.accept(u);
            }
        } else {
            state.unstarted.extend(sockets);
        }
    }

    /// Starts listening on a bound socket and accepting on its worker.
    fn accept(&self, u: Unstarted) {
        let Some(rt) = self.workers.get().and_then(|w| w.get(u.worker)) else {
            return;
        };
        let _guard = rt.enter();
        let socket = match listen(u.socket) {
            Ok(socket) => socket,
            Err(e) => {
                tracing::error!(listener = %u.slot.current().config().name, address = %u.bound, error = %e, "cannot listen");
                return;
            }
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&socket);
        let task = rt.spawn(accept_loop(
            u.slot.clone(),
            u.bound,
            socket,
            self.shared.clone(),
            self.listeners.clone(),
            u.worker,
        ));
        u.slot.add_accept_task(u.address, task.abort_handle(), fd);
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

    /// Publishes the RDS route tables as the new snapshot (which drops the workers' handles
    /// on the old one's tables).
    fn publish_routes(&self, state: &State) {
        self.shared.snapshot.store(Snapshot {
            routes: state.routes.clone(),
        });
    }
}

/// The active listeners' configs, against [`duplicate_address`].
fn duplicate_of_active(state: &State, config: &ListenerConfig) -> Result<(), ListenerError> {
    let active: Vec<Arc<Listener>> = state.slots.iter().map(|(_, s)| s.current()).collect();
    duplicate_address(config, active.iter().map(|l| &**l.config()))
}

/// Envoy's duplicate-address rule, over every address of each listener: another of `others`
/// (listeners of other names) with one of `config`'s addresses is a duplicate unless `config`
/// binds it with port 0 (the kernel picks a port per socket); a listener that does not bind
/// (`bind_to_port: false`, used through `use_original_dst`) must not share an address either,
/// or which one gets the connections is ambiguous.
pub fn duplicate_address<'a>(
    config: &ListenerConfig,
    others: impl IntoIterator<Item = &'a ListenerConfig>,
) -> Result<(), ListenerError> {
    let fixed: Vec<std::net::SocketAddr> = config
        .addresses()
        .map(|a| a.address)
        .filter(|a| !config.bind_to_port || a.port() != 0)
        .collect();
    for other in others.into_iter().filter(|o| o.name != config.name) {
        if let Some(address) = fixed
            .iter()
            .find(|address| other.addresses().any(|a| a.address == **address))
        {
            return Err(ListenerError::DuplicateAddress {
                name: config.name.clone(),
                other: other.name.clone(),
                address: *address,
            });
        }
    }
    Ok(())
}

/// A listener's addresses, each once: the same address configured twice is bound once (Envoy
/// binds it twice, with SO_REUSEPORT, which serves the same).
fn addresses(config: &ListenerConfig) -> Vec<ListenAddress> {
    let mut all: Vec<ListenAddress> = Vec::new();
    for a in config.addresses() {
        if !all.contains(&a) {
            all.push(a);
        }
    }
    all
}
