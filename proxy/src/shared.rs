//! The process-wide state the data path, admin and xDS share: stats, clusters, the published
//! snapshot and its one writer, the bootstrap, the lifecycle. It holds handles only; the
//! wiring that starts threads and sockets is `server.rs`, which nothing but `main` imports.

use std::sync::Arc;
use std::time::Instant;

use crate::apply::Applier;
use crate::cli::Options;
use crate::config::bootstrap::BootstrapConfig;
use crate::drain::Drain;
use crate::lifecycle::Lifecycle;
use crate::route::RouteTable;
use crate::snapshot::Published;
use crate::stats::Store;
use crate::upstream::ClusterManager;

/// Process-wide state shared by the data path and the admin API.
pub struct Shared {
    /// All stats.
    pub stats: Store,
    /// Clusters by name.
    pub clusters: ClusterManager,
    /// The secrets TLS contexts use (static, SDS), as live values.
    pub secrets: Arc<crate::tls::SecretStore>,
    /// The listeners and RDS route tables the data path reads; only [`Shared::applier`] stores.
    pub snapshot: Published,
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
    /// The xDS client's state, when the bootstrap has `dynamic_resources` (for `/xds` and
    /// `/config_dump`).
    pub xds: std::sync::OnceLock<crate::xds::Xds>,
    /// The tracers connection managers report spans to.
    pub tracers: crate::trace::Tracers,
}

impl Shared {
    /// The drain state connections consult.
    pub fn drain(&self) -> &crate::drain::Drain {
        &self.lifecycle.drain
    }

    /// `/drain_listeners`: starts draining every listener (or only the inbound ones), so their
    /// connections are told to close; stops them accepting at once, after `--drain-time-s`
    /// when `graceful`, or never when `skip_exit` (Envoy 1.40's behaviour, which leaves
    /// `/ready` and `server.state` as they are).
    pub fn drain_listeners(self: &Arc<Self>, inbound_only: bool, graceful: bool, skip_exit: bool) {
        self.lifecycle.drain.start(inbound_only);
        if skip_exit {
            return;
        }
        if graceful {
            let shared = self.clone();
            let delay = std::time::Duration::from_secs(self.options.drain_time_s);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                shared.applier.stop_listeners(inbound_only);
            });
        } else {
            self.applier.stop_listeners(inbound_only);
        }
    }

    /// Every route table: inline ones of the listeners' connection managers, then RDS ones.
    pub fn route_tables(&self) -> Vec<Arc<RouteTable>> {
        use crate::config::hcm::Routes;
        use crate::config::listener::Terminal;
        let snapshot = self.snapshot.load_full();
        let mut out = Vec::new();
        for l in &snapshot.listeners {
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
    crate::trace::LocalInfo {
        node_id: pick(&options.service_node, node.id),
        cluster: pick(&options.service_cluster, node.cluster),
        zone: pick(
            &options.service_zone,
            node.locality.map(|l| l.zone).unwrap_or_default(),
        ),
        address: crate::http::forwarding::machine_address(),
    }
}

/// Builds the shared state for a compiled bootstrap (no sockets yet).
pub fn build_shared(bootstrap: BootstrapConfig, options: Options) -> Shared {
    let stats = Store::new();
    stats.set_bucket_settings(crate::stats::BucketSettings::new(
        bootstrap.histogram_buckets.clone(),
    ));
    let drain = Drain::new(
        options.drain_strategy,
        std::time::Duration::from_secs(options.drain_time_s),
    );
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
    Shared {
        tracers,
        clusters,
        secrets,
        snapshot: Published::default(),
        applier: Applier::default(),
        bootstrap,
        options,
        started: Instant::now(),
        lifecycle: Lifecycle::new(&stats, drain),
        xds: std::sync::OnceLock::new(),
        stats,
    }
}
