//! A listener's sockets, owned apart from its configuration: the accept loops of one listener
//! name keep their sockets across updates and read the listener's current configuration for
//! each new connection, so an update refuses no connection and loses no backlog.

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

use super::{ActiveListeners, Listener};
use crate::shared::Shared;
use crate::stats::Connections;

/// One listener name's current configuration and the accept loops serving it.
pub struct Slot {
    current: ArcSwap<Listener>,
    /// Each accept loop and the descriptor of the socket it owns.
    accept_tasks: Mutex<Vec<(AbortHandle, RawFd)>>,
    local_address: Mutex<Option<std::net::SocketAddr>>,
}

impl Slot {
    /// A slot serving `listener`, with no socket yet.
    pub fn new(listener: Arc<Listener>) -> Arc<Slot> {
        Arc::new(Slot {
            current: ArcSwap::new(listener),
            accept_tasks: Mutex::new(Vec::new()),
            local_address: Mutex::new(None),
        })
    }

    /// Records the address the slot's socket is bound to (the port the kernel chose when the
    /// configured port is 0).
    pub fn set_local_address(&self, address: std::net::SocketAddr) {
        *self.local_address.lock().expect("local address") = Some(address);
    }

    /// The address the slot's socket is bound to, once bound.
    pub fn local_address(&self) -> Option<std::net::SocketAddr> {
        *self.local_address.lock().expect("local address")
    }

    /// The configuration new connections get.
    pub fn current(&self) -> Arc<Listener> {
        self.current.load_full()
    }

    /// Makes `next` the configuration of new connections; returns the one it replaces.
    pub fn replace(&self, next: Arc<Listener>) -> Arc<Listener> {
        self.current.swap(next)
    }

    /// Records an accept loop and its socket's descriptor, so [`Slot::stop`] can end them.
    pub fn add_accept_task(&self, task: AbortHandle, socket: RawFd) {
        self.accept_tasks
            .lock()
            .expect("accept tasks")
            .push((task, socket));
    }

    /// Stops accepting before it returns: each socket stops listening at once (a connection
    /// after this is refused, not accepted and then dropped), then its accept loop ends,
    /// closing it. Accepted connections go on.
    pub fn stop(&self) {
        for (task, socket) in self.accept_tasks.lock().expect("accept tasks").drain(..) {
            // SAFETY: the descriptor is still open: its accept loop owns it until aborted,
            // which happens only below. shutdown(2) on a listening socket ends its listening.
            unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
            task.abort();
        }
    }
}

/// Accepts connections forever on worker `worker`'s socket of `slot`, each served on its own
/// task with the slot's configuration at the moment it was accepted (`listeners`: where a
/// `use_original_dst` listener hands connections off).
pub async fn accept_loop(
    slot: Arc<Slot>,
    socket: TcpListener,
    shared: Arc<Shared>,
    listeners: Arc<ActiveListeners>,
    worker: usize,
) {
    // Envoy's per-handler listener stats, `listener.<address>.worker_<n>.*`.
    let listener_prefix = slot.current().config().stat_prefix();
    let prefix = format!("{listener_prefix}.worker_{worker}");
    let stats = Connections::new(&shared.stats, &prefix);
    // revoy takes one connection per accept, each its own event here.
    let per_event = shared.stats.histogram(&format!(
        "{listener_prefix}.connections_accepted_per_socket_event"
    ));
    loop {
        match socket.accept().await {
            Ok((stream, peer)) => {
                per_event.record(1);
                let listener = slot.current();
                let shared = shared.clone();
                let listeners = listeners.clone();
                let stats = stats.clone();
                tokio::spawn(async move {
                    listener.serve(stream, peer, shared, listeners, stats).await
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
