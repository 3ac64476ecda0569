//! The cluster manager: clusters by name, their hosts (static, DNS, original destination),
//! load balancing, connection pools and stats.
//!
//! The data path calls [`ClusterManager::get`] then [`Cluster::request`] (HTTP) or
//! [`Cluster::connect`] (TCP). Config updates call [`ClusterManager::update`]; a cluster whose
//! configuration did not change keeps its hosts, pools and DNS task.

mod cluster;
pub mod dns;
mod error;
mod h1;
mod host;
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

pub use cluster::{Cluster, UpstreamConnection};
pub use error::{ResetReason, UpstreamError};
pub use host::{Host, HostStats};
pub use lb::{HostSet, LbContext};
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
    clusters: ArcSwap<HashMap<String, Arc<Cluster>>>,
    updating: Mutex<()>,
}

impl ClusterManager {
    /// An empty cluster manager charging stats into `stats`.
    pub fn new(stats: Store) -> Self {
        ClusterManager {
            inner: Arc::new(Inner {
                store: stats,
                clusters: ArcSwap::from_pointee(HashMap::new()),
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
        self.inner.clusters.store(Arc::new(next));
    }

    /// Adds or replaces one cluster (CDS incremental updates).
    pub fn upsert(&self, cluster: ClusterConfig) {
        let _guard = self.inner.updating.lock().expect("cluster update lock");
        let current = self.inner.clusters.load_full();
        let mut next = (*current).clone();
        next.insert(cluster.name.clone(), self.reuse_or_build(&current, cluster));
        self.inner.clusters.store(Arc::new(next));
    }

    /// Adds or replaces many clusters at once: one copy of the map for the whole batch (a CDS
    /// response of 10,000 clusters, or the endpoints that warm them), where calling
    /// [`ClusterManager::upsert`] for each would copy it once per cluster.
    pub fn upsert_all(&self, clusters: Vec<ClusterConfig>) {
        if clusters.is_empty() {
            return;
        }
        let _guard = self.inner.updating.lock().expect("cluster update lock");
        let current = self.inner.clusters.load_full();
        let mut next = (*current).clone();
        for cluster in clusters {
            next.insert(cluster.name.clone(), self.reuse_or_build(&current, cluster));
        }
        self.inner.clusters.store(Arc::new(next));
    }

    /// Removes many clusters with one copy of the map; answers those that existed.
    pub fn remove_all(&self, names: &[String]) -> Vec<String> {
        let _guard = self.inner.updating.lock().expect("cluster update lock");
        let current = self.inner.clusters.load_full();
        let existed: Vec<String> = names
            .iter()
            .filter(|n| current.contains_key(n.as_str()))
            .cloned()
            .collect();
        if existed.is_empty() {
            return existed;
        }
        let mut next = (*current).clone();
        for name in &existed {
            next.remove(name);
        }
        self.inner.clusters.store(Arc::new(next));
        existed
    }

    /// Removes one cluster; returns whether it existed.
    pub fn remove(&self, name: &str) -> bool {
        let _guard = self.inner.updating.lock().expect("cluster update lock");
        let current = self.inner.clusters.load_full();
        if !current.contains_key(name) {
            return false;
        }
        let mut next = (*current).clone();
        next.remove(name);
        self.inner.clusters.store(Arc::new(next));
        true
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
        let cluster = Cluster::new(cfg, &self.inner.store);
        if uses_dns {
            dns::start(&cluster);
        }
        cluster
    }

    /// The cluster named `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Cluster>> {
        self.inner.clusters.load().get(name).cloned()
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
}
