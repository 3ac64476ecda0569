//! The cluster manager: clusters by name, their hosts (static, DNS, original destination),
//! load balancing, connection pools and stats.
//!
//! The data path calls [`ClusterManager::handle`] then [`Cluster::request`] (HTTP) or
//! [`Cluster::connect`] (TCP). Config updates call [`ClusterManager::update`] (the bootstrap) and [`ClusterManager::apply`] (CDS, EDS); a cluster whose
//! configuration did not change keeps its hosts, pools and DNS task.

mod cluster;
pub mod dns;
mod error;
pub mod grpc;
mod h1;
mod h2_wire;
mod host;
mod io;
mod lb;
mod pool;
mod render;
mod response;
mod stats;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::config::cluster::ClusterConfig;
use crate::stats::Store;
use crate::thread_handles::{Local, ThreadHandles};
use crate::tls::SecretStore;

/// Where the pool notes an attempt's host (an access-log type: [`LbContext`] carries it).
pub use crate::access_log::AttemptTarget;
pub use cluster::{Cluster, UpstreamConnection};
pub use error::{ResetReason, UpstreamError};
pub use host::{Host, HostStats, HostTransport};
pub use io::UpstreamIo;
pub use lb::{HostSet, LbContext, RequestAlpn};
pub use pool::{ActiveConnection, UpstreamHost};
pub use response::UpstreamBody;
pub use stats::ClusterStats;

/// All clusters by name. Cheap to clone; lookups never lock.
#[derive(Clone, Debug)]
pub struct ClusterManager {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    secrets: Arc<SecretStore>,
    clusters: ArcSwap<HashMap<String, Arc<Cluster>>>,
    /// The workers' handles on `clusters`, cleared after every swap.
    handles: ThreadHandles<Cluster>,
    updating: Mutex<()>,
}

impl ClusterManager {
    /// An empty cluster manager charging stats into `stats`, its TLS contexts reading
    /// `secrets`.
    pub fn new(stats: Store, secrets: Arc<SecretStore>) -> Self {
        ClusterManager {
            inner: Arc::new(Inner {
                store: stats,
                secrets,
                clusters: ArcSwap::from_pointee(HashMap::new()),
                handles: ThreadHandles::default(),
                updating: Mutex::new(()),
            }),
        }
    }

    /// Replaces the whole cluster set: new clusters are added, changed ones replaced, missing
    /// ones removed; unchanged ones keep their state. DNS clusters start resolving, so this
    /// must run inside a tokio runtime.
    pub fn update(&self, clusters: Vec<ClusterConfig>) {
        let _guard = self.inner.updating.lock().expect("cluster update lock");
        let current = self.inner.clusters.load_full();
        let next: HashMap<String, Arc<Cluster>> = clusters
            .into_iter()
            .map(|cfg| (cfg.name.clone(), self.reuse_or_build(&current, cfg)))
            .collect();
        self.store(next);
    }

    /// Adds or replaces `upserts` and removes `removals` in one swap (a CDS or EDS response):
    /// the cost is one copy of the map, whatever the number of clusters changed.
    pub fn apply(&self, upserts: Vec<ClusterConfig>, removals: &[String]) {
        if upserts.is_empty() && removals.is_empty() {
            return;
        }
        let _guard = self.inner.updating.lock().expect("cluster update lock");
        let current = self.inner.clusters.load_full();
        let mut next = (*current).clone();
        let mut retired = Vec::new();
        for name in removals {
            retired.extend(next.remove(name));
        }
        for cfg in upserts {
            let cluster = self.reuse_or_build(&current, cfg);
            retired.extend(
                next.insert(cluster.name().to_owned(), cluster.clone())
                    .filter(|old| !Arc::ptr_eq(old, &cluster)),
            );
        }
        self.store(next);
        for old in retired {
            old.retire();
        }
    }

    fn store(&self, next: HashMap<String, Arc<Cluster>>) {
        self.inner.clusters.store(Arc::new(next));
        self.inner.handles.clear();
    }

    fn reuse_or_build(
        &self,
        current: &HashMap<String, Arc<Cluster>>,
        cfg: ClusterConfig,
    ) -> Arc<Cluster> {
        if let Some(old) = current.get(&cfg.name).filter(|c| c.config().same_as(&cfg)) {
            return old.clone();
        }
        let uses_dns = cfg.discovery.uses_dns();
        let cluster = Cluster::new(cfg, &self.inner.store, &self.inner.secrets);
        if uses_dns {
            dns::start(&cluster);
        }
        cluster
    }

    /// The cluster named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        self.inner.clusters.load().get(name).cloned()
    }

    /// This worker's handle on the cluster named `name`, for the data path: holding it for a
    /// request or connection writes no reference count another worker writes.
    pub fn handle(&self, name: &str) -> Option<Arc<Local<Cluster>>> {
        self.inner.handles.get(name, || self.get(name))
    }

    /// How many clusters there are.
    pub fn len(&self) -> usize {
        self.inner.clusters.load().len()
    }

    /// Whether there is no cluster.
    pub fn is_empty(&self) -> bool {
        self.inner.clusters.load().is_empty()
    }

    /// Every cluster, sorted by name.
    pub fn clusters(&self) -> Vec<Arc<Cluster>> {
        let mut v: Vec<_> = self.inner.clusters.load().values().cloned().collect();
        v.sort_by(|a, b| a.name().cmp(b.name()));
        v
    }

    /// Waits until every current cluster has its first host list (DNS resolved once).
    pub async fn wait_initialized(&self) {
        for c in self.clusters() {
            c.wait_initialized().await;
        }
    }

    /// Envoy's `/clusters` text output.
    pub fn render_text(&self) -> String {
        self.render_text_matching(None)
    }

    /// Envoy's `/clusters?format=json` output (`envoy.admin.v3.Clusters`).
    pub fn render_json(&self) -> serde_json::Value {
        self.render_json_matching(None)
    }

    /// Envoy's `/clusters` text output, of the clusters whose name `filter` matches (all
    /// without one).
    pub fn render_text_matching(&self, filter: Option<&regex::Regex>) -> String {
        let mut out = String::new();
        for c in self.clusters() {
            if filter.is_none_or(|f| f.is_match(c.name())) {
                render::text(&mut out, &c);
            }
        }
        out
    }

    /// Envoy's `/clusters?format=json` output (`envoy.admin.v3.Clusters`), of the clusters
    /// whose name `filter` matches (all without one).
    pub fn render_json_matching(&self, filter: Option<&regex::Regex>) -> serde_json::Value {
        let statuses: Vec<_> = self
            .clusters()
            .iter()
            .filter(|c| filter.is_none_or(|f| f.is_match(c.name())))
            .map(|c| render::json(c))
            .collect();
        // Proto JSON leaves an empty repeated field out.
        if statuses.is_empty() {
            return serde_json::json!({});
        }
        serde_json::json!({ "cluster_statuses": statuses })
    }

    /// Each cluster's hosts as an assignment (`/config_dump?include_eds`, see
    /// [`render::assignment`]), with whether the cluster came over xDS, by cluster name.
    pub fn assignments(
        &self,
    ) -> Vec<(
        bool,
        proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment,
    )> {
        self.clusters()
            .iter()
            .map(|c| (c.config().added_via_api, render::assignment(c)))
            .collect()
    }
}
