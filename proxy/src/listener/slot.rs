//! A listener's sockets, owned apart from its configuration: the accept loops of one listener
//! name keep their sockets across updates and read the listener's current configuration for
//! each new connection, so an update refuses no connection and loses no backlog.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

use super::{ActiveListeners, Listener};
use crate::config::listener::ListenAddress;
use crate::shared::Shared;
use crate::stats::Connections;

/// One listener name's current configuration and the accept loops serving it, keyed by the
/// address each socket is bound to (its `address` and each additional address; IP and port,
/// see [`ListenAddress::same_socket`]), so an update that adds or removes an address opens or
/// closes just that address's sockets.
pub struct Slot {
    current: ArcSwap<Listener>,
    /// Each accept loop, the address it serves and the descriptor of the socket it owns.
    accept_tasks: Mutex<Vec<(ListenAddress, AbortHandle, RawFd)>>,
    /// Where each configured address's socket is bound (the port the kernel chose for a
    /// configured port 0).
    local_addresses: Mutex<Vec<(ListenAddress, SocketAddr)>>,
}

impl Slot {
    /// A slot serving `listener`, with no socket yet.
    pub fn new(listener: Arc<Listener>) -> Arc<Slot> {
        Arc::new(Slot {
            current: ArcSwap::new(listener),
            accept_tasks: Mutex::new(Vec::new()),
            local_addresses: Mutex::new(Vec::new()),
        })
    }

    /// Records where the socket of the configured `address` is bound.
    pub fn set_local_address(&self, address: ListenAddress, local: SocketAddr) {
        let mut bound = self.local_addresses.lock().expect("local addresses");
        bound.retain(|(a, _)| !a.same_socket(&address));
        bound.push((address, local));
    }

    /// Where the socket of the configured `address` is bound, once bound.
    pub fn local_address(&self, address: ListenAddress) -> Option<SocketAddr> {
        let bound = self.local_addresses.lock().expect("local addresses");
        bound
            .iter()
            .find(|(a, _)| a.same_socket(&address))
            .map(|(_, l)| *l)
    }

    /// The configuration new connections get.
    pub fn current(&self) -> Arc<Listener> {
        self.current.load_full()
    }

    /// Makes `next` the configuration of new connections; returns the one it replaces.
    pub fn replace(&self, next: Arc<Listener>) -> Arc<Listener> {
        self.current.swap(next)
    }

    /// Records an accept loop serving `address` and its socket's descriptor, so
    /// [`Slot::stop`] and [`Slot::stop_address`] can end them.
    pub fn add_accept_task(&self, address: ListenAddress, task: AbortHandle, socket: RawFd) {
        self.accept_tasks
            .lock()
            .expect("accept tasks")
            .push((address, task, socket));
    }

    /// Stops accepting on every address before it returns: each socket stops listening at
    /// once (a connection after this is refused, not accepted and then dropped), then its
    /// accept loop ends, closing it. Accepted connections go on.
    pub fn stop(&self) {
        self.stop_matching(|_| true);
    }

    /// Stops accepting on `address` alone, as [`Slot::stop`] does; the other addresses'
    /// sockets go on accepting.
    pub fn stop_address(&self, address: ListenAddress) {
        self.stop_matching(|a| a.same_socket(&address));
        let mut bound = self.local_addresses.lock().expect("local addresses");
        bound.retain(|(a, _)| !a.same_socket(&address));
    }

    fn stop_matching(&self, stopped: impl Fn(&ListenAddress) -> bool) {
        let mut tasks = self.accept_tasks.lock().expect("accept tasks");
        for (_, task, socket) in tasks.extract_if(.., |(a, _, _)| stopped(a)) {
            // SAFETY: the descriptor is still open: its accept loop owns it until aborted,
            // which happens only below. shutdown(2) on a listening socket ends its listening.
            unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
            task.abort();
        }
    }
}

/// Accepts connections forever on worker `worker`'s socket of `slot` for `address`, each
/// served on its own task with the slot's configuration at the moment it was accepted
/// (`listeners`: where a `use_original_dst` listener hands connections off). Every address of
/// the listener counts in the same `listener.<address>.*` stats, named by its `address`.
pub async fn accept_loop(
    slot: Arc<Slot>,
    address: SocketAddr,
    socket: TcpListener,
    shared: Arc<Shared>,
    listeners: Arc<ActiveListeners>,
    worker: usize,
) {
    let mut stats = WorkerStats::new(&shared, &slot.current(), worker);
    // Every accepted connection's local address when the socket is bound to one (not a
    // wildcard address or an ephemeral port): no `getsockname(2)` per connection.
    let bound_local = (!address.ip().is_unspecified() && address.port() != 0).then_some(address);
    loop {
        match socket.accept().await {
            Ok((stream, peer)) => {
                let listener = slot.current();
                // An update that renamed the listener's stats (its `address` moved while an
                // additional one stayed, or its `stat_prefix` changed) counts under the new name.
                if listener.config().stats_name != stats.name {
                    stats = WorkerStats::new(&shared, &listener, worker);
                }
                stats.per_event.record(1);
                let shared = shared.clone();
                let listeners = listeners.clone();
                let connections = stats.connections.clone();
                tokio::spawn(async move {
                    listener
                        .serve(stream, peer, bound_local, shared, listeners, connections)
                        .await
                });
            }
            // The socket was shut down by `Slot::stop`; the loop is being aborted.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
            Err(e) => {
                tracing::warn!(listener = %slot.current().config().name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// An accept loop's own stats: Envoy's per-handler listener stats,
/// `listener.<address>.worker_<n>.*`, and the accepts per socket event.
struct WorkerStats {
    /// The listener's stats name they were made for.
    name: String,
    connections: Connections,
    per_event: crate::stats::Histogram,
}

impl WorkerStats {
    fn new(shared: &Shared, listener: &Listener, worker: usize) -> WorkerStats {
        let listener_prefix = listener.config().stat_prefix();
        WorkerStats {
            name: listener.config().stats_name.clone(),
            connections: Connections::new(
                &shared.stats,
                &format!("{listener_prefix}.worker_{worker}"),
            ),
            // revoy takes one connection per accept, each its own event here.
            per_event: shared.stats.histogram(&format!(
                "{listener_prefix}.connections_accepted_per_socket_event"
            )),
        }
    }
}
