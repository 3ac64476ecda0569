//! Wiring: starts the worker threads, applies the bootstrap's static resources through the
//! applier, starts the admin server and xDS, and waits for quit. Only `main` imports it.

use std::sync::Arc;

use crate::cli::Options;
use crate::config::bootstrap::BootstrapConfig;
use crate::lifecycle::ServerState;
use crate::process::build_process;

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
    /// A listener could not be prepared (e.g. its TLS certificates do not load).
    #[error("{0}")]
    Listener(String),
    /// The runtime could not be built.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
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
    let flush = crate::access_log::file::FlushPolicy {
        interval: options
            .file_flush_interval_msec
            .filter(|ms| *ms > 0)
            .map_or(
                std::time::Duration::from_secs(10),
                std::time::Duration::from_millis,
            ),
        min_size: options
            .file_flush_min_size_kb
            .map_or(64 * 1024, |kb| kb as usize * 1024),
    };
    let process = Arc::new(build_process(bootstrap, options));
    crate::access_log::file::init(flush, &process.shared.stats);
    process.shared.stats.set_workers(workers);
    // With `dynamic_resources` the server stays PRE_INITIALIZING while its RTDS layers, CDS
    // and the clusters' endpoints come, as Envoy's while its cluster manager initializes (the
    // xDS handler moves it on).
    if process.bootstrap.dynamic.is_none() {
        process.lifecycle.set_state(ServerState::Initializing);
    }
    // Listeners are bound from here on, and listen once the workers start (the first LIVE).
    let weak = Arc::downgrade(&process);
    process.lifecycle.on_workers_start(move || {
        if let Some(process) = weak.upgrade() {
            process.applier.start_workers();
        }
    });
    process
        .applier
        .set_workers(runtimes.iter().map(|rt| rt.handle().clone()).collect());
    {
        let _guard = runtimes[0].enter();
        process
            .shared
            .clusters
            .update(process.bootstrap.clusters.clone());
    }
    let first_resolution = runtimes[0].block_on(async {
        let wait = process.shared.clusters.wait_initialized();
        tokio::time::timeout(std::time::Duration::from_secs(10), wait).await
    });
    if first_resolution.is_err() {
        tracing::warn!("some clusters have no hosts after 10 s of DNS resolution; starting anyway");
    }
    // A static listener whose SDS secrets have not arrived warms: it is bound once they have
    // (or their initial_fetch_timeout passed), never serving without its certificate.
    let (ready, warming): (Vec<_>, Vec<_>) = process
        .bootstrap
        .listeners
        .iter()
        .partition(|l| static_secrets_ready(&process, l));
    for cfg in ready {
        process
            .applier
            .upsert_listener(cfg.clone())
            .map_err(|e| match e {
                crate::apply::ListenerError::Bind {
                    name,
                    address,
                    source,
                } => StartError::Bind {
                    what: format!("listener '{name}'"),
                    addr: address,
                    source,
                },
                other => StartError::Listener(other.to_string()),
            })?;
    }
    let xds = Arc::new(std::sync::OnceLock::new());
    let (quit_tx, quit_rx) = std::sync::mpsc::channel::<i32>();
    process.lifecycle.on_quit(quit_tx.clone());
    if let Some(addr) = process.bootstrap.admin {
        let std_listener =
            std::net::TcpListener::bind(addr).map_err(|source| StartError::Bind {
                what: "admin".into(),
                addr,
                source,
            })?;
        crate::admin::spawn(std_listener, process.clone(), xds.clone());
    }
    // SIGUSR1 reopens the access log files, as in Envoy.
    runtimes[0].spawn(async {
        let Ok(mut usr1) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        else {
            return;
        };
        while usr1.recv().await.is_some() {
            crate::access_log::file::reopen_all();
        }
    });
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
            .spawn(move || {
                crate::stats::histogram::enter_worker(i);
                rt.block_on(crate::timer_anchor::hold())
            })
            .map_err(StartError::Runtime)?;
    }
    if let crate::config::stats_flush::StatsFlush::Interval(every) = process.bootstrap.stats_flush {
        let stats = process.shared.stats.clone();
        std::thread::Builder::new()
            .name("revoy-stats-flush".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    stats.flush_histograms();
                    crate::memory::publish_gauges(&stats);
                }
            })
            .map_err(StartError::Runtime)?;
    }
    let stats = &process.shared.stats;
    stats.gauge("server.concurrency").set(workers as u64);
    crate::process_stats::publish(
        stats,
        process.bootstrap.clusters.len(),
        process.bootstrap.listeners.len(),
        workers,
        process.bootstrap.dynamic.is_some(),
    );
    let warming: Vec<_> = warming.into_iter().cloned().collect();
    // LIVE once the static listeners' and clusters' secrets and, with `dynamic_resources`,
    // the initial xDS configuration are in, as after Envoy's init manager.
    process.lifecycle.await_part();
    if process.bootstrap.dynamic.is_some() {
        process.lifecycle.await_part();
    }
    if let Err(e) = crate::xds::start(&process, xds) {
        return Err(StartError::Listener(format!("dynamic_resources: {e}")));
    }
    let static_secrets =
        !warming.is_empty() || !crate::xds::sds::static_cluster_secrets(&process).is_empty();
    if static_secrets {
        warm_static_listeners(&process, warming);
        tracing::info!(
            workers,
            "listeners started but those waiting for SDS secrets"
        );
    } else {
        process.lifecycle.part_done();
        tracing::info!(workers, "static listeners started");
    }
    crate::memory::now_serving();
    crate::memory::publish_gauges(&process.shared.stats);
    let code = quit_rx.recv().unwrap_or(0);
    process.applier.stop_listeners(false);
    Ok(code)
}

/// Whether every SDS secret a static listener's TLS chains use has arrived (asking for one
/// subscribes to it).
fn static_secrets_ready(
    process: &crate::process::Process,
    l: &crate::config::listener::ListenerConfig,
) -> bool {
    l.chains
        .iter()
        .chain(&l.default_chain)
        .filter_map(|c| c.tls.as_ref())
        .flat_map(|t| t.common.secrets())
        .all(|r| process.shared.secrets.cell(r).is_ready())
}

/// Binds each static listener in `warming` once its secrets have arrived, and never before:
/// one start-up part, done when every listener has its secrets or its shortest
/// `initial_fetch_timeout` has passed and the static clusters' secrets have come (or timed
/// out). A listener whose secrets are late stays unbound after that (connections to its port
/// are refused) until they arrive, unlike Envoy (#47309), which binds it and closes each
/// connection unanswered.
fn warm_static_listeners(
    process: &Arc<crate::process::Process>,
    warming: Vec<crate::config::listener::ListenerConfig>,
) {
    let process = process.clone();
    std::thread::Builder::new()
        .name("revoy-warming".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot wait for the static listeners' secrets");
                    return;
                }
            };
            rt.block_on(async {
                let start = tokio::time::Instant::now();
                let mut pending = Vec::new();
                for cfg in warming {
                    let refs: Vec<_> = cfg
                        .chains
                        .iter()
                        .chain(&cfg.default_chain)
                        .filter_map(|c| c.tls.as_ref())
                        .flat_map(|t| t.common.secrets().into_iter().cloned())
                        .collect();
                    let timeout = refs.iter().filter_map(|r| r.initial_fetch_timeout).min();
                    let cells: Vec<_> = refs.iter().map(|r| process.shared.secrets.cell(r)).collect();
                    let name = cfg.name.clone();
                    let process = process.clone();
                    let bound = tokio::spawn(async move {
                        for cell in &cells {
                            cell.ready().await;
                        }
                        let name = cfg.name.clone();
                        if let Err(e) = process.applier.upsert_listener(cfg) {
                            tracing::error!(listener = %name, error = %e, "a warmed static listener could not be started");
                        }
                    });
                    pending.push((name, bound, timeout));
                }
                for (name, bound, timeout) in &mut pending {
                    match timeout {
                        Some(t) => {
                            if tokio::time::timeout_at(start + *t, bound).await.is_err() {
                                tracing::warn!(listener = %name, "initial_fetch_timeout: SDS secrets did not come; the listener is bound once they do");
                            }
                        }
                        None => {
                            let _ = bound.await;
                        }
                    }
                }
                let clusters = crate::xds::sds::static_cluster_secrets(&process);
                crate::xds::sds::secrets_arrived(&process, &clusters).await;
                process.lifecycle.part_done();
                tracing::info!("the static listeners' and clusters' secrets arrived or timed out");
                for (_, bound, _) in pending {
                    if !bound.is_finished() {
                        let _ = bound.await;
                    }
                }
            });
        })
        .map_err(|e| tracing::error!(error = %e, "cannot start the warming thread"))
        .ok();
}
