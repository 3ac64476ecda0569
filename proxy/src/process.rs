//! The running process as the control side sees it: the data path's [`Shared`] state plus what
//! only the wiring, xDS and admin use (the applier, the bootstrap, the options, the lifecycle).
//! The data path never imports this module; the wiring that starts threads and sockets is
//! `server.rs`, which nothing but `main` imports.

use std::sync::Arc;
use std::time::Instant;

use crate::apply::Applier;
use crate::cli::Options;
use crate::config::bootstrap::BootstrapConfig;
use crate::drain::Drain;
use crate::lifecycle::Lifecycle;
use crate::route::RouteTable;
use crate::shared::Shared;
use crate::stats::Store;
use crate::upstream::ClusterManager;

/// What the wiring, xDS and admin share.
pub struct Process {
    /// What the data path reads.
    pub shared: Arc<Shared>,
    /// The one writer of listeners, route tables and their sockets.
    pub applier: Applier,
    /// The compiled bootstrap.
    pub bootstrap: BootstrapConfig,
    /// Command-line options.
    pub options: Options,
    /// When the process started.
    pub started: Instant,
    /// `server.state`, health checks, drains, quit.
    pub lifecycle: Lifecycle,
}

impl Process {
    /// `/drain_listeners`: starts draining every listener (or only the inbound ones), so their
    /// connections drain from their next response; stops them accepting at once, after
    /// `--drain-time-s` when `graceful`, or never when `skip_exit`, counting each listener
    /// stopped in `listener_manager.listener_stopped` (Envoy 1.40's behaviour, which leaves
    /// `/ready` and `server.state` as they are).
    pub fn drain_listeners(self: &Arc<Self>, inbound_only: bool, graceful: bool, skip_exit: bool) {
        self.lifecycle.drain.start(inbound_only);
        if skip_exit {
            return;
        }
        if graceful {
            let process = self.clone();
            let delay = std::time::Duration::from_secs(self.options.drain_time_s);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                process.stop_listeners(inbound_only);
            });
        } else {
            self.stop_listeners(inbound_only);
        }
    }

    fn stop_listeners(&self, inbound_only: bool) {
        let stopped = self.applier.stop_listeners(inbound_only);
        self.shared
            .stats
            .counter("listener_manager.listener_stopped")
            .add(stopped as u64);
    }

    /// Every route table: inline ones of the listeners' connection managers, then RDS ones.
    pub fn route_tables(&self) -> Vec<Arc<RouteTable>> {
        use crate::config::hcm::Routes;
        use crate::config::listener::Terminal;
        let mut out = Vec::new();
        for l in self.applier.listeners().iter() {
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
        let snapshot = self.shared.snapshot.load_full();
        let mut rds: Vec<_> = snapshot.routes.values().cloned().collect();
        rds.sort_by(|a, b| a.name().cmp(b.name()));
        out.extend(rds);
        out
    }
}

/// The proxy as spans describe it: the bootstrap's `node`, overridden by `--service-node`,
/// `--service-cluster` and `--service-zone`.
fn local_info(bootstrap: &BootstrapConfig, options: &Options) -> crate::trace::LocalInfo {
    let node = bootstrap.proto.decode().node.unwrap_or_default();
    let pick = |flag: &Option<String>, node: String| flag.clone().unwrap_or(node);
    let node_id = pick(&options.service_node, node.id);
    let cluster = pick(&options.service_cluster, node.cluster);
    crate::trace::LocalInfo {
        cluster_header: http::HeaderValue::from_str(&cluster).ok(),
        node_header: (!node_id.is_empty())
            .then(|| http::HeaderValue::from_str(&node_id).ok())
            .flatten(),
        node_id,
        cluster,
        zone: pick(
            &options.service_zone,
            node.locality.map(|l| l.zone).unwrap_or_default(),
        ),
        address: crate::http::forwarding::machine_address(),
    }
}

/// Builds the process's state for a compiled bootstrap (no sockets yet).
pub fn build_process(bootstrap: BootstrapConfig, options: Options) -> Process {
    let stats = Store::new();
    stats.set_bucket_settings(crate::stats::BucketSettings::new(
        bootstrap.histogram_buckets.clone(),
    ));
    let drain_time = std::time::Duration::from_secs(options.drain_time_s);
    let drain = Arc::new(Drain::new(options.drain_strategy, drain_time));
    let secrets = Arc::new(crate::tls::SecretStore::new());
    for s in &bootstrap.secrets {
        secrets.set(
            &s.proto.name,
            &crate::config::tls::sds::SecretSource::Static,
            crate::tls::secrets::Delivered {
                value: s.value.clone(),
                version: String::new(),
                updated: std::time::SystemTime::now(),
                proto: s.proto.clone(),
            },
        );
    }
    let clusters = ClusterManager::new(stats.clone(), secrets.clone());
    let tracers = crate::trace::Tracers::new(
        local_info(&bootstrap, &options),
        bootstrap.tracer.clone(),
        bootstrap.trace_flush,
        stats.clone(),
        clusters.clone(),
    );
    let lifecycle = Lifecycle::new(&stats, drain.clone());
    let node = crate::load::effective_node(bootstrap.proto.decode().node.as_ref(), &options);
    let local_workload = crate::config::istio::workload::LocalWorkload::from_node(&node);
    let runtime = Arc::new(crate::runtime::LiveRuntime::new(
        &bootstrap.runtime,
        &node.cluster,
        &stats,
    ));
    runtime.watch_disk_layers();
    let shared = Arc::new(Shared::new(
        stats,
        clusters,
        secrets,
        tracers,
        drain,
        local_workload,
        runtime,
    ));
    Process {
        applier: Applier::new(shared.clone(), drain_time),
        shared,
        bootstrap,
        options,
        started: Instant::now(),
        lifecycle,
    }
}
