//! Wiring: owns the process-wide state (stats, clusters, listeners, route tables), starts the
//! data-path runtime and the admin server, and applies configuration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::cli::Options;
use crate::config::bootstrap::BootstrapConfig;
use crate::drain::Drain;
use crate::listener::Listener;
use crate::route::RouteTable;
use crate::stats::{Gauge, Store};
use crate::upstream::ClusterManager;

/// Envoy's `server.state` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    /// Serving.
    Live = 0,
    /// Draining listeners.
    Draining = 1,
    /// Before initialisation.
    PreInitializing = 2,
    /// Initialising (waiting for clusters/listeners).
    Initializing = 3,
}

/// Process-wide state shared by the data path and the admin API.
pub struct Shared {
    /// All stats.
    pub stats: Store,
    /// Clusters by name.
    pub clusters: ClusterManager,
    /// Route tables delivered by RDS, by name.
    pub rds: ArcSwap<HashMap<String, Arc<RouteTable>>>,
    /// Active listeners, in configuration order.
    pub listeners: ArcSwap<Vec<Arc<Listener>>>,
    /// The compiled bootstrap.
    pub bootstrap: BootstrapConfig,
    /// Command-line options.
    pub options: Options,
    /// When the process started.
    pub started: Instant,
    /// Health-check failure and listener drains, which tell connections to close.
    pub drain: Drain,
    /// The server's own state (`server.state` shows DRAINING instead while health checks
    /// fail).
    state: Mutex<ServerState>,
    /// `server.state`.
    state_gauge: Gauge,
    /// `server.live`: 1 while LIVE and passing health checks.
    live_gauge: Gauge,
    /// Accept loops of bound listeners and whether each is inbound, so a drain can stop them.
    pub(crate) accept_tasks: Mutex<Vec<(tokio::task::AbortHandle, bool)>>,
}

impl Shared {
    /// A named RDS route table.
    pub fn route_table(&self, name: &str) -> Option<Arc<RouteTable>> {
        self.rds.load().get(name).cloned()
    }

    /// Sets the server's state (`server.state`, `server.live`).
    pub fn set_state(&self, s: ServerState) {
        *self.state.lock().expect("server state") = s;
        self.publish_state();
    }

    /// The state `/ready`, `/server_info` and `server.state` report: DRAINING while health
    /// checks fail (`/healthcheck/fail`), as in Envoy.
    pub fn server_state(&self) -> ServerState {
        let own = *self.state.lock().expect("server state");
        if self.drain.health_failed() {
            ServerState::Draining
        } else {
            own
        }
    }

    /// `/healthcheck/fail` (`true`) or `/healthcheck/ok` (`false`).
    pub fn set_health_failed(&self, failed: bool) {
        self.drain.set_health_failed(failed);
        self.publish_state();
    }

    fn publish_state(&self) {
        let s = self.server_state();
        self.state_gauge.set(s as u64);
        self.live_gauge.set(u64::from(s == ServerState::Live));
    }

    /// `/drain_listeners`: starts draining every listener (or only the inbound ones), so their
    /// connections are told to close; stops them accepting at once, after `--drain-time-s`
    /// when `graceful`, or never when `skip_exit` (Envoy 1.40's behaviour, which leaves
    /// `/ready` and `server.state` as they are).
    pub fn drain_listeners(self: &Arc<Self>, inbound_only: bool, graceful: bool, skip_exit: bool) {
        self.drain.start(inbound_only);
        if skip_exit {
            return;
        }
        if graceful {
            let shared = self.clone();
            let delay = std::time::Duration::from_secs(self.options.drain_time_s);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                shared.stop_listeners(inbound_only);
            });
        } else {
            self.stop_listeners(inbound_only);
        }
    }

    /// Stops accepting on every listener, or only on inbound ones.
    pub fn stop_listeners(&self, inbound_only: bool) {
        self.accept_tasks
            .lock()
            .expect("accept tasks")
            .retain(|(task, inbound)| {
                let stop = !inbound_only || *inbound;
                if stop {
                    task.abort();
                }
                !stop
            });
    }

    /// Every route table: inline ones of the listeners' connection managers, then RDS ones.
    pub fn route_tables(&self) -> Vec<Arc<RouteTable>> {
        use crate::config::hcm::Routes;
        use crate::config::listener::Terminal;
        let mut out = Vec::new();
        for l in self.listeners.load().iter() {
            for c in l
                .config()
                .chains
                .iter()
                .chain(l.config().default_chain.iter())
            {
                if let Terminal::Http(h) = &c.terminal
                    && let Routes::Static(t) = &h.routes
                {
                    out.push(t.clone());
                }
            }
        }
        out.extend(self.rds.load().values().cloned());
        out
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener or the admin socket could not be bound.
    #[error("cannot bind {what} {addr}: {source}")]
    Bind {
        /// `listener '<name>'` or `admin`.
        what: String,
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The runtime could not be built.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

/// Builds the shared state for a compiled bootstrap (no sockets yet).
pub fn build_shared(bootstrap: BootstrapConfig, options: Options) -> Shared {
    let stats = Store::new();
    let state_gauge = stats.gauge("server.state");
    state_gauge.set(ServerState::PreInitializing as u64);
    let drain = Drain::new(
        options.drain_strategy,
        std::time::Duration::from_secs(options.drain_time_s),
    );
    Shared {
        clusters: ClusterManager::new(stats.clone()),
        rds: ArcSwap::from_pointee(HashMap::new()),
        listeners: ArcSwap::from_pointee(Vec::new()),
        bootstrap,
        options,
        started: Instant::now(),
        drain,
        state: Mutex::new(ServerState::PreInitializing),
        state_gauge,
        live_gauge: stats.gauge("server.live"),
        stats,
        accept_tasks: Mutex::new(Vec::new()),
    }
}

/// Runs the proxy until `/quitquitquit` or a termination signal. Returns the exit code.
///
/// Each worker is a thread with its own current-thread runtime and its own SO_REUSEPORT socket
/// per listener (like Envoy's workers): a connection lives on one thread from accept to close,
/// with no cross-thread scheduling on the hot path.
pub fn run(bootstrap: BootstrapConfig, options: Options) -> Result<i32, StartError> {
    let workers = options
        .concurrency
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let runtimes = (0..workers)
        .map(|_| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(StartError::Runtime)
        })
        .collect::<Result<Vec<_>, _>>()?;
    crate::http::forwarding::LOCAL_ADDRESS_V6.store(
        options.local_address_ip_version == "v6",
        std::sync::atomic::Ordering::Relaxed,
    );
    let shared = Arc::new(build_shared(bootstrap, options));
    shared.set_state(ServerState::Initializing);
    {
        let _guard = runtimes[0].enter();
        shared.clusters.update(shared.bootstrap.clusters.clone());
    }
    let first_resolution = runtimes[0].block_on(async {
        let wait = shared.clusters.wait_initialized();
        tokio::time::timeout(std::time::Duration::from_secs(10), wait).await
    });
    if first_resolution.is_err() {
        tracing::warn!("some clusters have no hosts after 10 s of DNS resolution; starting anyway");
    }
    let mut listeners = Vec::new();
    for cfg in &shared.bootstrap.listeners {
        let l = Arc::new(Listener::new(Arc::new(cfg.clone()), &shared));
        if cfg.bind_to_port {
            // An ephemeral port would differ per socket: such a listener gets one worker.
            let sockets = if cfg.address.port() == 0 { 1 } else { workers };
            for (worker, rt) in runtimes[..sockets].iter().enumerate() {
                let _guard = rt.enter();
                let sock = l.bind(sockets > 1).map_err(|source| StartError::Bind {
                    what: format!("listener '{}'", cfg.name),
                    addr: cfg.address,
                    source,
                })?;
                let task = rt.spawn(l.clone().run(sock, shared.clone(), worker));
                shared
                    .accept_tasks
                    .lock()
                    .expect("accept tasks")
                    .push((task.abort_handle(), cfg.inbound));
            }
        }
        listeners.push(l);
    }
    shared.listeners.store(Arc::new(listeners));
    let (quit_tx, quit_rx) = std::sync::mpsc::channel::<i32>();
    if let Some(addr) = shared.bootstrap.admin {
        let std_listener =
            std::net::TcpListener::bind(addr).map_err(|source| StartError::Bind {
                what: "admin".into(),
                addr,
                source,
            })?;
        crate::admin::spawn(std_listener, shared.clone(), quit_tx.clone());
    }
    let signal_tx = quit_tx;
    runtimes[0].spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {},
        }
        let _ = signal_tx.send(0);
    });
    for (i, rt) in runtimes.into_iter().enumerate() {
        std::thread::Builder::new()
            .name(format!("revoy-worker-{i}"))
            .spawn(move || rt.block_on(crate::timer_anchor::hold()))
            .map_err(StartError::Runtime)?;
    }
    let stats = &shared.stats;
    stats.gauge("listener_manager.workers_started").set(1);
    stats
        .gauge("listener_manager.total_listeners_active")
        .set(shared.listeners.load().len() as u64);
    stats.gauge("server.concurrency").set(workers as u64);
    let live = stats.gauge("server.live");
    match &shared.bootstrap.awaits_xds {
        Some(why) => tracing::error!(
            workers,
            "static listeners started, but dynamic_resources: {why}"
        ),
        None => {
            live.set(1);
            shared.set_state(ServerState::Live);
            tracing::info!(workers, "all listeners started; revoy is live");
        }
    }
    crate::memory::now_serving();
    let code = quit_rx.recv().unwrap_or(0);
    shared.stop_listeners(false);
    Ok(code)
}
