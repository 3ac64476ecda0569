//! The proxy's answer to xDS updates: decode each resource, compile it (pure `config/`), hand
//! what compiled to the applier, warm what waits for other resources, and name what was
//! rejected. One update at a time, on the xDS thread.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use proto::pb::envoy::config::cluster::v3::Cluster as ClusterProto;
use proto::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use proto::pb::envoy::config::listener::v3::Listener as ListenerProto;
use proto::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use proto::pb::envoy::config::route::v3::RouteConfiguration;
use xds_client::client::Client;
use xds_client::{
    Applied, CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, Event, Handler, LISTENER_TYPE_URL,
    ROUTE_TYPE_URL, Rejected, Resource, SECRET_TYPE_URL, Update,
};

use super::draining::{self, Draining};
use super::records::{Changes, Records, Serving, Status};
use super::stats::{Reloads, UpdateStats, XdsStats};
use super::waiting::Waiting;
use crate::apply::{ListenerChange, ListenerError};
use crate::config::cluster::{
    ClusterConfig, Discovery, EndpointConfig, compile_assignment, compile_cluster,
};
use crate::config::dynamic::{DynamicConfig, Source, initial_fetch_timeout};
use crate::config::hcm::Routes;
use crate::config::listener::{ListenerConfig, Terminal, compile_listener};
use crate::config::tls::sds::{SecretRef, SecretSource};
use crate::config::upstream_transport::Socket;
use crate::config::{ConfigError, ConfigIo, Context, Severity, SystemIo, Warnings};
use crate::process::Process;

/// Resources in an update from which its freed heap is handed back to the OS soon after.
const LARGE_UPDATE: usize = 64;

/// How often the stats of removed resources still held at their removal are looked at again.
const STATS_SWEEP: std::time::Duration = std::time::Duration::from_secs(1);

/// Where start-up stands (Envoy's init order: the runtime's RTDS layers, then clusters and
/// their endpoints, then listeners and their route configurations, then LIVE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the first answer for each RTDS layer.
    Runtime,
    /// Waiting for the first CDS response and the endpoints of the clusters it named.
    Clusters,
    /// Waiting for the first LDS response and the route configurations its listeners name.
    Listeners,
    /// Initialised: LIVE.
    Done,
}

/// Everything received, by type, and what waits for what.
#[derive(Default)]
pub struct State {
    /// Listener records.
    pub listeners: Records,
    /// Cluster records.
    pub clusters: Records,
    /// Route configuration records.
    pub routes: Records,
    /// Endpoint assignment records, by service name.
    pub endpoints: Records,
    /// RTDS layer records.
    pub runtimes: Records,
    /// The RTDS layers start-up still waits for.
    rtds_pending: BTreeSet<String>,
    /// Old versions of listeners replaced whole or removed, while they drain.
    pub draining_listeners: Draining,
    /// Listeners waiting for their route configurations.
    warming_listeners: Waiting<ListenerConfig>,
    /// RDS names each dynamic listener's latest version (active or warming) uses.
    listener_routes: BTreeMap<String, Vec<String>>,
    /// RDS names the serving version of each dynamic listener uses (while an update warms,
    /// the version it replaces still serves with them).
    serving_routes: BTreeMap<String, Vec<String>>,
    /// Route configurations no listener uses any longer, each with the number of the drop
    /// that ends it once the drain time has passed (the versions and chains that used them
    /// have drained by then, as Envoy drops a route configuration, and its subscription, with
    /// the last connection manager that holds it); one used again leaves the map, which
    /// cancels its drop.
    unused_routes: BTreeMap<String, u64>,
    /// The number the next drop of unused route configurations gets.
    next_route_drop: u64,
    /// Listeners whose warming ended (their route configurations came or timed out, or the
    /// LDS phase timed out) still waiting for their SDS secrets: never active without them.
    listeners_awaiting_secrets: BTreeMap<String, ListenerConfig>,
    /// Clusters waiting for their endpoints.
    warming_clusters: Waiting<ClusterConfig>,
    /// Clusters (endpoints in hand) waiting for the SDS secrets of their TLS contexts.
    clusters_awaiting_secrets: Waiting<ClusterConfig>,
    /// The SDS secrets (name, source) a wait is running for.
    secret_waits: BTreeSet<(String, SecretSource)>,
    /// EDS clusters by service name.
    eds_users: HashMap<String, Users>,
    /// The service name each EDS cluster uses.
    eds_service_of: HashMap<String, String>,
    /// Stat prefixes of removed clusters, dropped once nothing holds them (a removed
    /// listener's go when its drain ends: `crate::apply`).
    stats_to_release: BTreeSet<String>,
    /// The RDS subscriptions started: route configuration name -> the stat prefix
    /// (`http.<prefix>.rds.<name>`) of the connection manager that asked first (Envoy shares
    /// one subscription per name, its stats under that manager's prefix).
    rds_started: BTreeMap<String, String>,
    /// The `version_info` of the last CDS response applied whole.
    pub cds_version: String,
    /// The `version_info` of the last LDS response applied whole.
    pub lds_version: String,
    cds_received: bool,
    lds_received: bool,
    phase: Option<Phase>,
}

impl State {
    /// Names of the listeners waiting for route configurations or secrets.
    pub fn warming_listener_names(&self) -> impl Iterator<Item = &String> {
        self.warming_listeners
            .keys()
            .chain(self.listeners_awaiting_secrets.keys())
    }

    /// Whether listener `name` has a version waiting for route configurations or secrets.
    pub fn listener_warms(&self, name: &str) -> bool {
        self.warming_listeners.contains_key(name)
            || self.listeners_awaiting_secrets.contains_key(name)
    }

    /// Names of the clusters waiting for endpoints or secrets.
    pub fn warming_cluster_names(&self) -> impl Iterator<Item = &String> {
        self.warming_clusters
            .keys()
            .chain(self.clusters_awaiting_secrets.keys())
    }

    /// Where start-up stands.
    pub fn phase(&self) -> Option<Phase> {
        self.phase
    }

    /// The RTDS layers start-up still waits for.
    pub fn pending_rtds_names(&self) -> impl Iterator<Item = &String> {
        self.rtds_pending.iter()
    }
}

/// Applies xDS updates to the proxy.
pub struct ProxyHandler {
    process: Weak<Process>,
    /// This handler, for the timers and waits it starts.
    me: Weak<ProxyHandler>,
    /// Files, environment and host name, for what the resources read (direct_response
    /// bodies, formatters, certificates).
    io: Box<dyn ConfigIo + Send + Sync>,
    config: DynamicConfig,
    client: OnceLock<Client>,
    state: Mutex<State>,
    stats: XdsStats,
}

impl ProxyHandler {
    /// A handler for `process`'s proxy; [`ProxyHandler::set_client`] follows.
    pub fn new(process: &Arc<Process>, config: DynamicConfig) -> Arc<ProxyHandler> {
        Arc::new_cyclic(|me| ProxyHandler {
            stats: XdsStats::new(&process.shared.stats),
            process: Arc::downgrade(process),
            me: me.clone(),
            io: Box::new(SystemIo),
            config,
            client: OnceLock::new(),
            state: Mutex::new(State::default()),
        })
    }

    /// The client the handler subscribes through.
    pub fn set_client(&self, client: Client) {
        let _ = self.client.set(client);
    }

    /// Runs `f` on the received state (admin).
    pub fn with_state<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.state.lock().expect("xds state"))
    }

    /// Starts the initial fetch (the runtime's RTDS layers first, then clusters when CDS is
    /// dynamic, else listeners), and the sweep that drops the stats of removed resources once
    /// nothing holds them.
    pub fn begin(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(STATS_SWEEP);
            loop {
                tick.tick().await;
                let Some(me) = me.upgrade() else { return };
                let Some(process) = me.process.upgrade() else {
                    return;
                };
                release_stats(&process, &mut me.state.lock().expect("xds state"));
            }
        });
        let mut st = self.state.lock().expect("xds state");
        let rtds: Vec<(String, Option<Duration>)> = self
            .process
            .upgrade()
            .map(|p| {
                p.shared
                    .runtime
                    .rtds_layers()
                    .iter()
                    .map(|l| (l.name.clone(), l.initial_fetch_timeout))
                    .collect()
            })
            .unwrap_or_default();
        if rtds.is_empty() {
            self.start_clusters(&mut st);
        } else {
            // Envoy waits for RTDS while its cluster manager initializes, before its init
            // manager starts: the server stays PRE_INITIALIZING until then.
            st.phase = Some(Phase::Runtime);
            st.rtds_pending = rtds.iter().map(|(name, _)| name.clone()).collect();
            self.for_each_rtds(UpdateStats::started);
            self.subscribe(
                super::rtds::RUNTIME_TYPE_URL,
                rtds.iter().map(|(name, _)| name.clone()).collect(),
            );
            // Each layer is its own init target in Envoy: start-up waits for the slowest.
            let timeout = rtds
                .iter()
                .map(|(_, t)| *t)
                .reduce(|a, b| a.zip(b).map(|(a, b)| a.max(b)))
                .flatten();
            self.arm_timeout(Phase::Runtime, timeout);
        }
        self.advance(&mut st);
    }

    /// Counts `count` in the RTDS subscriptions' stats, once per RTDS layer.
    fn for_each_rtds(&self, count: impl Fn(&UpdateStats)) {
        if let Some(process) = self.process.upgrade() {
            let stats = super::rtds::stats(&process.shared.stats);
            for _ in process.shared.runtime.rtds_layers() {
                count(&stats);
            }
        }
    }

    /// Sets the server's state (`server.state`, `/ready`), while the process runs.
    fn set_server_state(&self, state: crate::lifecycle::ServerState) {
        if let Some(process) = self.process.upgrade() {
            process.lifecycle.set_state(state);
        }
    }

    /// Starts the clusters' phase: CDS subscribed when it is dynamic.
    fn start_clusters(&self, st: &mut State) {
        st.phase = Some(Phase::Clusters);
        match &self.config.cds {
            Some(sub) => {
                self.stats.cds.started();
                if sub.source == Source::Ads {
                    self.subscribe_wildcard(CLUSTER_TYPE_URL);
                }
                if let Some(me) = self.me() {
                    me.arm_timeout(Phase::Clusters, sub.initial_fetch_timeout);
                }
            }
            None => st.cds_received = true,
        }
    }

    fn subscribe_wildcard(&self, type_url: &str) {
        if let Some(c) = self.client.get() {
            c.subscribe_wildcard(type_url);
        }
    }

    fn subscribe(&self, type_url: &str, names: Vec<String>) {
        if let Some(c) = self.client.get() {
            c.subscribe(type_url, names);
        }
    }

    /// After `timeout`, stops start-up waiting in `phase` (what still warms is used as it is).
    fn arm_timeout(self: &Arc<Self>, phase: Phase, timeout: Option<std::time::Duration>) {
        let Some(timeout) = timeout else {
            return;
        };
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(me) = me.upgrade() {
                me.fetch_timed_out(phase);
            }
        });
    }

    fn fetch_timed_out(&self, phase: Phase) {
        let Some(process) = self.process.upgrade() else {
            return;
        };
        let mut st = self.state.lock().expect("xds state");
        // Like Envoy's subscriptions, the CDS and LDS timers end at the first response: what
        // it named warms on its own EDS, RDS and SDS timeouts.
        let answered = match phase {
            Phase::Clusters => st.cds_received,
            Phase::Listeners => st.lds_received,
            Phase::Runtime | Phase::Done => false,
        };
        if st.phase != Some(phase) || answered {
            return;
        }
        tracing::warn!(
            ?phase,
            "initial_fetch_timeout: going on with what has arrived"
        );
        match phase {
            Phase::Runtime => {
                let stats = super::rtds::stats(&process.shared.stats);
                for _ in std::mem::take(&mut st.rtds_pending) {
                    stats.timed_out();
                }
            }
            // Nothing warms before the first response: start-up goes on without.
            Phase::Clusters => {
                self.stats.cds.timed_out();
                st.cds_received = true;
            }
            Phase::Listeners => {
                self.stats.lds.timed_out();
                st.lds_received = true;
            }
            Phase::Done => {}
        }
        self.advance(&mut st);
    }

    /// Moves start-up on when its phase's resources have arrived and warmed.
    fn advance(&self, st: &mut State) {
        if st.phase == Some(Phase::Runtime) && st.rtds_pending.is_empty() {
            self.start_clusters(st);
        }
        if st.phase == Some(Phase::Clusters)
            && st.cds_received
            && st.warming_clusters.is_empty()
            && st.clusters_awaiting_secrets.is_empty()
        {
            st.phase = Some(Phase::Listeners);
            // Envoy's init manager starts once its cluster manager has initialized.
            self.set_server_state(crate::lifecycle::ServerState::Initializing);
            match &self.config.lds {
                Some(sub) => {
                    self.stats.lds.started();
                    if sub.source == Source::Ads {
                        self.subscribe_wildcard(LISTENER_TYPE_URL);
                    }
                    if let Some(timeout) = sub.initial_fetch_timeout
                        && let Some(me) = self.me()
                    {
                        me.arm_timeout(Phase::Listeners, Some(timeout));
                    }
                }
                None => st.lds_received = true,
            }
        }
        if st.phase == Some(Phase::Listeners) && st.lds_received && st.warming_listeners.is_empty()
        {
            st.phase = Some(Phase::Done);
            if let Some(process) = self.process.upgrade() {
                process.lifecycle.part_done();
                tracing::info!("initial xDS configuration applied");
            }
        }
    }

    /// An `Arc` of this handler (for timers), while the proxy runs.
    fn me(&self) -> Option<Arc<ProxyHandler>> {
        self.process.upgrade().and(self.me.upgrade())
    }

    fn apply_clusters(&self, process: &Arc<Process>, st: &mut State, u: Update) -> Applied {
        let since = Instant::now();
        let mut rejected = Vec::new();
        let mut changes = Changes::default();
        let mut changed = 0;
        let mut upserts = Vec::new();
        for r in u.resources {
            if st.clusters.unchanged(&r.name, &r.value) {
                continue;
            }
            match self.compile_cluster(process, &r) {
                Err(reason) => reject(&mut st.clusters, &mut rejected, r, reason),
                Ok((cfg, eds_timeout)) => {
                    let name = cfg.name.clone();
                    let existed = st.clusters.get(&name).is_some_and(|c| c.value.is_some());
                    forget_eds_user(st, &name, false);
                    changed += 1;
                    let status = match cfg.discovery.clone() {
                        Discovery::Eds { service_name } => {
                            // Each version of an EDS cluster starts its own subscription.
                            UpdateStats::of_cluster(&process.shared.stats, &cfg.observability_name)
                                .started();
                            st.eds_users
                                .entry(service_name.clone())
                                .or_default()
                                .insert(&name);
                            st.eds_service_of.insert(name.clone(), service_name.clone());
                            // Like Envoy, every version warms until an EDS response names its
                            // service (control planes send the assignment again after a
                            // cluster change), while the version before it serves: a new
                            // version's TLS settings never meet the old endpoints. Only if
                            // none comes in time is the assignment held used (Envoy's EDS
                            // cache).
                            st.warming_clusters.insert(name.clone(), cfg);
                            if let Some(timer) = self.arm_warming_timeout(
                                Warming::Cluster,
                                &name,
                                &r.version,
                                eds_timeout,
                            ) {
                                st.warming_clusters.set_timer(&name, timer);
                            }
                            Status::Warming
                        }
                        _ => {
                            st.warming_clusters.remove(&name);
                            self.use_or_await_secrets(process, st, cfg, &mut upserts)
                        }
                    };
                    changes.note(&st.clusters, &name);
                    st.clusters.accept(&name, &r.version, r.value, status);
                    if existed {
                        self.stats.cluster_modified.inc();
                    } else {
                        self.stats.cluster_added.inc();
                    }
                }
            }
        }
        let mut removals = Vec::new();
        for name in u.removed {
            if process.bootstrap.clusters.iter().any(|c| c.name == name) {
                continue;
            }
            // The versions serving and warming (whose subscription stats exist already).
            let mut versions: Vec<String> = process
                .shared
                .clusters
                .get(&name)
                .map(|c| c.config().observability_name.clone())
                .into_iter()
                .collect();
            versions.extend(
                st.warming_clusters
                    .remove(&name)
                    .map(|c| c.observability_name),
            );
            versions.extend(
                st.clusters_awaiting_secrets
                    .remove(&name)
                    .map(|c| c.observability_name),
            );
            for stat_name in versions {
                st.stats_to_release.insert(format!("cluster.{stat_name}."));
            }
            forget_eds_user(st, &name, true);
            if st.clusters.remove(&name) {
                self.stats.cluster_removed.inc();
            }
            removals.push(name);
        }
        for cfg in &upserts {
            st.stats_to_release
                .remove(&format!("cluster.{}.", cfg.observability_name));
        }
        process.shared.clusters.apply(upserts, &removals);
        release_stats(process, st);
        st.cds_received = true;
        let services: Vec<String> = st.eds_users.keys().cloned().collect();
        self.subscribe(ENDPOINT_TYPE_URL, services);
        let delta = self.over_delta(self.config.cds.as_ref());
        self.stats
            .cds
            .finish(&u.version_info, rejected.is_empty(), delta, since);
        if rejected.is_empty() {
            if changed > 0 {
                self.stats.cds_reloads.reloaded();
            }
            st.cds_version = u.version_info;
        }
        self.publish_cluster_gauges(process, st);
        changes.answer(rejected)
    }

    /// Compiles a cluster; answers it with its EDS `initial_fetch_timeout` (how long it may warm).
    fn compile_cluster(
        &self,
        process: &Process,
        r: &Resource,
    ) -> Result<(ClusterConfig, Option<Duration>), String> {
        let c: ClusterProto = decode(r, "cluster")?;
        if process.bootstrap.clusters.iter().any(|s| s.name == c.name) {
            return Err(format!(
                "cluster '{}': a static cluster of that name exists (static clusters cannot be changed by CDS)",
                c.name
            ));
        }
        let mut warnings = Warnings::new();
        crate::config::cluster::skipped_features(&c, "", &mut warnings);
        log_warnings("cluster", &c.name, &warnings);
        let source = process
            .bootstrap
            .upstream_bind
            .fallback(&c)
            .map_err(|e| located("cluster", &c.name, e))?;
        let mut cfg = compile_cluster(&Context::new(&*self.io), &c, source)
            .map_err(|e| located("cluster", &c.name, e))?;
        cfg.added_via_api = true;
        // The record keeps these bytes too: one buffer for both.
        cfg.proto = proto::Encoded::from_encoded(r.value.clone());
        let eds_source = c
            .eds_cluster_config
            .as_ref()
            .and_then(|e| e.eds_config.as_ref());
        let timeout = eds_source.map_or(DEFAULT_FETCH_TIMEOUT, initial_fetch_timeout);
        Ok((cfg, timeout))
    }

    fn publish_cluster_gauges(&self, process: &Process, st: &State) {
        self.stats
            .warming_clusters
            .set((st.warming_clusters.len() + st.clusters_awaiting_secrets.len()) as u64);
        self.stats
            .active_clusters
            .set(process.shared.clusters.len() as u64);
    }

    fn apply_endpoints(&self, process: &Arc<Process>, st: &mut State, u: Update) -> Applied {
        let mut rejected = Vec::new();
        let mut changes = Changes::default();
        let mut warmed = Vec::new();
        for r in u.resources {
            let since = Instant::now();
            let users: Vec<String> = st
                .eds_users
                .get(&r.name)
                .map(|u| u.iter().cloned().collect())
                .unwrap_or_default();
            // Each user cluster's EDS stats (`cluster.<name>.update_*`).
            let counted: Vec<String> = users
                .iter()
                .filter_map(|u| eds_stat_name(process, st, u))
                .collect();
            // An unchanged assignment still ends its clusters' warming (a cluster's new
            // version waits for the control plane to send it again).
            let unchanged = st.endpoints.unchanged(&r.name, &r.value);
            if unchanged {
                st.endpoints.resent(&r.name);
            }
            if unchanged && !users.iter().any(|u| st.warming_clusters.contains_key(u)) {
                for name in &counted {
                    UpdateStats::eds_unchanged(&process.shared.stats, name, &u.version_info, since);
                }
                continue;
            }
            let cla: ClusterLoadAssignment = match decode(&r, "cluster load assignment") {
                Ok(cla) => cla,
                Err(reason) => {
                    for name in &counted {
                        UpdateStats::of_cluster(&process.shared.stats, name)
                            .rejected(self.ads_delta());
                    }
                    reject(&mut st.endpoints, &mut rejected, r, reason);
                    self.assignment_rejected(process, st, &users, &mut warmed);
                    continue;
                }
            };
            let mut compiled = Vec::new();
            let mut failure = None;
            for (user, target, cfg) in assignment_targets(process, st, &r.name, &users, unchanged) {
                match compile_assignment(&cla, &cfg) {
                    Ok(eps) => compiled.push((user, target, cfg, eps)),
                    Err(e) => {
                        failure = Some(located("cluster load assignment", &r.name, e));
                        break;
                    }
                }
            }
            if let Some(reason) = failure {
                for name in &counted {
                    UpdateStats::of_cluster(&process.shared.stats, name).rejected(self.ads_delta());
                }
                reject(&mut st.endpoints, &mut rejected, r, reason);
                self.assignment_rejected(process, st, &users, &mut warmed);
                continue;
            }
            for (user, target, mut cfg, eps) in compiled {
                match target {
                    Target::Warming => {
                        st.warming_clusters.remove(&user);
                        cfg.endpoints = eps;
                        let status = self.use_or_await_secrets(process, st, cfg, &mut warmed);
                        st.clusters.set_status(&user, status);
                    }
                    Target::AwaitingSecrets => {
                        if let Some(waiting) = st.clusters_awaiting_secrets.get_mut(&user) {
                            waiting.endpoints = eps;
                        }
                    }
                    Target::Serving => {
                        if let Some(cluster) = process.shared.clusters.get(&user) {
                            cluster.set_endpoints(&eps);
                        }
                    }
                }
            }
            if !unchanged {
                changes.note(&st.endpoints, &r.name);
            }
            st.endpoints
                .accept(&r.name, &r.version, r.value, Status::Acked);
            for name in &counted {
                if unchanged {
                    UpdateStats::eds_unchanged(&process.shared.stats, name, &u.version_info, since);
                } else {
                    UpdateStats::of_cluster(&process.shared.stats, name)
                        .accepted(&u.version_info, since);
                }
            }
        }
        process.shared.clusters.apply(warmed, &[]);
        for name in u.removed {
            // Envoy's EDS takes the removal of an assignment its clusters use as an update
            // without it (`update_empty`): their hosts stay.
            let users: Vec<String> = st
                .eds_users
                .get(&name)
                .map(|u| u.iter().cloned().collect())
                .unwrap_or_default();
            if users.is_empty() {
                st.endpoints.remove(&name);
                continue;
            }
            tracing::warn!(service = %name, "the server removed an endpoint assignment still in use; its clusters keep their hosts, as in Envoy");
            for user in &users {
                if let Some(cluster) = process.shared.clusters.get(user) {
                    let stat_name = &cluster.config().observability_name;
                    UpdateStats::eds_empty(
                        &process.shared.stats,
                        stat_name,
                        &u.version_info,
                        Instant::now(),
                    );
                }
            }
            st.endpoints.set_status(&name, Status::DoesNotExist);
        }
        self.publish_cluster_gauges(process, st);
        changes.answer(rejected)
    }

    /// An endpoint assignment of `users` was rejected: as Envoy's EDS lets start-up go on
    /// after a rejected update, those of them warming for it end their warming with the
    /// assignment held, if any (into `warmed` when their secrets are in), rather than wait for
    /// ever (`initial_fetch_timeout: 0s`).
    fn assignment_rejected(
        &self,
        process: &Arc<Process>,
        st: &mut State,
        users: &[String],
        warmed: &mut Vec<ClusterConfig>,
    ) {
        for user in users {
            if let Some(mut cfg) = st.warming_clusters.remove(user) {
                if let Some(endpoints) = held_assignment(st, &cfg) {
                    cfg.endpoints = endpoints;
                }
                tracing::warn!(cluster = %user, "its endpoint assignment was rejected; the cluster is used with the assignment held, if any");
                let status = self.use_or_await_secrets(process, st, cfg, warmed);
                st.clusters.set_status(user, status);
            }
        }
    }

    /// A response refused whole (it names a resource twice): nothing of it applies, and, as
    /// Envoy's mux tells every subscription of the type (`onConfigUpdateFailed`, before any
    /// update was attempted: one attempt, one rejection each), it is counted as rejected and
    /// what waited for it goes on: start-up past the RTDS layers, CDS or LDS; listeners past
    /// the route configurations it names, clusters past the endpoints it names.
    fn refused_whole(&self, process: &Arc<Process>, st: &mut State, u: &Update, reason: &str) {
        match u.type_url.as_str() {
            CLUSTER_TYPE_URL => {
                self.stats.cds.rejected(false);
                st.cds_received = true;
            }
            LISTENER_TYPE_URL => {
                self.stats.lds.rejected(false);
                st.lds_received = true;
            }
            super::rtds::RUNTIME_TYPE_URL => {
                let stats = super::rtds::stats(&process.shared.stats);
                for _ in process.shared.runtime.rtds_layers() {
                    stats.rejected(false);
                }
                st.rtds_pending.clear();
            }
            ROUTE_TYPE_URL => {
                for prefix in st.rds_started.values() {
                    UpdateStats::new(&process.shared.stats, prefix).rejected(false);
                }
                for r in &u.resources {
                    if !route_answered(st, &r.name) {
                        st.routes
                            .reject(&r.name, &r.version, r.value.clone(), reason);
                    }
                }
                self.activate_ready_listeners(process, st);
            }
            ENDPOINT_TYPE_URL => {
                for cluster in st.eds_service_of.keys() {
                    if let Some(stat_name) = eds_stat_name(process, st, cluster) {
                        UpdateStats::of_cluster(&process.shared.stats, &stat_name).rejected(false);
                    }
                }
                let mut warmed = Vec::new();
                for r in &u.resources {
                    let users: Vec<String> = st
                        .eds_users
                        .get(&r.name)
                        .map(|u| u.iter().cloned().collect())
                        .unwrap_or_default();
                    if st.endpoints.get(&r.name).is_none() {
                        st.endpoints
                            .reject(&r.name, &r.version, r.value.clone(), reason);
                    }
                    self.assignment_rejected(process, st, &users, &mut warmed);
                }
                process.shared.clusters.apply(warmed, &[]);
                self.publish_cluster_gauges(process, st);
            }
            _ => {}
        }
        self.advance(st);
    }

    fn apply_listeners(
        &self,
        ctx: &Context<'_>,
        process: &Arc<Process>,
        st: &mut State,
        u: Update,
    ) -> Applied {
        let since = Instant::now();
        let mut rejected = Vec::new();
        let mut changes = Changes::default();
        // Removals first, as Envoy's LDS applies them: a listener of this update may take the
        // address of one it removes.
        for name in u.removed {
            if process.bootstrap.listeners.iter().any(|l| l.name == name) {
                continue;
            }
            st.warming_listeners.remove(&name);
            st.listeners_awaiting_secrets.remove(&name);
            st.listener_routes.remove(&name);
            st.serving_routes.remove(&name);
            let old = st.listeners.get(&name).and_then(|r| r.active());
            let was_active = process.applier.remove_listener(&name);
            if let Some(old) = old.filter(|_| was_active) {
                self.drain_listener(process, st, &name, old);
            }
            if st.listeners.remove(&name) || was_active {
                self.stats.listener_removed.inc();
            }
        }
        for r in u.resources {
            if st.listeners.unchanged(&r.name, &r.value) {
                continue;
            }
            match self.compile_listener(ctx, process, st, &r) {
                Err(reason) => reject(&mut st.listeners, &mut rejected, r, reason),
                Ok((cfg, timeout)) => {
                    let name = cfg.name.clone();
                    let routes = rds_names(&cfg);
                    let secrets = listener_secrets(&cfg);
                    let secrets_in = secrets_ready(process, &secrets);
                    let ready = secrets_in && routes.iter().all(|n| route_answered(st, n));
                    let old = st.listeners.get(&name).and_then(|r| r.active());
                    // Bound as it comes, as Envoy binds a listener before it warms: one that
                    // cannot be is rejected, and what was there before it stays.
                    let taken = match warming_duplicate(st, &cfg) {
                        Some(e) => Err(e),
                        None if ready => process.applier.upsert_listener(cfg).map(Taken::Active),
                        None => {
                            let checked = process.applier.check_listener(&cfg);
                            checked.map(|()| Taken::Warming(Box::new(cfg)))
                        }
                    };
                    let taken = match taken {
                        Ok(taken) => taken,
                        Err(e) => {
                            reject(
                                &mut st.listeners,
                                &mut rejected,
                                r,
                                listener_error(&name, &e),
                            );
                            continue;
                        }
                    };
                    st.listeners_awaiting_secrets.remove(&name);
                    st.listener_routes.insert(name.clone(), routes.clone());
                    if !secrets_in {
                        self.await_secrets(process, st, &secrets);
                    }
                    match taken {
                        Taken::Active(change) => {
                            st.warming_listeners.remove(&name);
                            st.serving_routes.insert(name.clone(), routes);
                            self.listener_changed(process, st, &name, change, old, &r.value);
                            changes.note(&st.listeners, &name);
                            st.listeners
                                .accept(&name, &r.version, r.value, Status::Acked);
                        }
                        Taken::Warming(cfg) => {
                            st.warming_listeners.insert(name.clone(), *cfg);
                            if let Some(timer) = self.arm_warming_timeout(
                                Warming::Listener,
                                &name,
                                &r.version,
                                timeout,
                            ) {
                                st.warming_listeners.set_timer(&name, timer);
                            }
                            changes.note(&st.listeners, &name);
                            st.listeners.accept_warming(&name, &r.version, r.value);
                        }
                    }
                }
            }
        }
        st.lds_received = true;
        release_stats(process, st);
        self.resubscribe_routes(process, st);
        let delta = self.over_delta(self.config.lds.as_ref());
        self.stats
            .lds
            .finish(&u.version_info, rejected.is_empty(), delta, since);
        if rejected.is_empty() {
            st.lds_version = u.version_info;
        }
        self.publish_warming_listeners(st);
        changes.answer(rejected)
    }

    fn compile_listener(
        &self,
        ctx: &Context<'_>,
        process: &Process,
        st: &State,
        r: &Resource,
    ) -> Result<(ListenerConfig, Option<Duration>), String> {
        let l: ListenerProto = decode(r, "listener")?;
        if process.bootstrap.listeners.iter().any(|s| s.name == l.name) {
            return Err(format!(
                "error adding listener '{}': a static listener of that name exists",
                l.name
            ));
        }
        let known = |name: &str| {
            process.shared.clusters.get(name).is_some() || st.warming_clusters.contains_key(name)
        };
        let mut warnings = Warnings::new();
        let cfg = compile_listener(ctx, &l, Some(&known), &mut warnings)
            .map_err(|e| located("listener", &l.name, e))?;
        log_warnings("listener", &l.name, &warnings);
        let timeout = warming_timeout(process, &l, &cfg);
        Ok((cfg, timeout))
    }

    /// After `timeout`, uses the cluster or listener `name` as it is if it still warms at
    /// `version` (Envoy's `initial_fetch_timeout` of the EDS or RDS config source: a cluster
    /// without endpoints, a listener whose missing route configurations answer 404).
    fn arm_warming_timeout(
        &self,
        kind: Warming,
        name: &str,
        version: &str,
        timeout: Option<Duration>,
    ) -> Option<tokio::task::AbortHandle> {
        let (name, version) = (name.to_owned(), version.to_owned());
        self.after(timeout, move |me| {
            me.warming_timed_out(kind, &name, &version)
        })
    }

    /// Runs `then` on this handler once `timeout` has passed (`None`: never), if the proxy
    /// still runs; the handle cancels it.
    fn after(
        &self,
        timeout: Option<Duration>,
        then: impl FnOnce(&ProxyHandler) + Send + 'static,
    ) -> Option<tokio::task::AbortHandle> {
        let (Some(timeout), Some(me)) = (timeout, self.me()) else {
            return None;
        };
        let me = Arc::downgrade(&me);
        let task = tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(me) = me.upgrade() {
                then(&me);
            }
        });
        Some(task.abort_handle())
    }

    fn warming_timed_out(&self, kind: Warming, name: &str, version: &str) {
        let Some(process) = self.process.upgrade() else {
            return;
        };
        let mut st = self.state.lock().expect("xds state");
        let st = &mut *st;
        let records = match kind {
            Warming::Cluster => &st.clusters,
            Warming::Listener => &st.listeners,
        };
        if records.get(name).is_none_or(|r| *r.version != *version) {
            return;
        }
        match kind {
            Warming::Cluster => {
                let Some(mut cfg) = st.warming_clusters.remove(name) else {
                    return;
                };
                UpdateStats::of_cluster(&process.shared.stats, &cfg.observability_name).timed_out();
                match held_assignment(st, &cfg) {
                    Some(endpoints) => {
                        cfg.endpoints = endpoints;
                        tracing::warn!(cluster = %name, "initial_fetch_timeout: no endpoints came; the cluster is used with the assignment held");
                    }
                    None => {
                        tracing::warn!(cluster = %name, "initial_fetch_timeout: no endpoints came; the cluster is used without")
                    }
                }
                process.shared.clusters.apply(vec![cfg], &[]);
                st.clusters.set_status(name, Status::Acked);
                self.publish_cluster_gauges(&process, st);
            }
            Warming::Listener => {
                let Some(cfg) = st.warming_listeners.remove(name) else {
                    return;
                };
                for route in rds_names(&cfg) {
                    if st.routes.get(&route).is_none_or(|r| r.value.is_none())
                        && let Some(prefix) = st.rds_started.get(&route)
                    {
                        UpdateStats::new(&process.shared.stats, prefix).timed_out();
                    }
                }
                tracing::warn!(listener = %name, "initial_fetch_timeout: route configurations or SDS secrets did not come; the listener starts without the routes");
                self.activate_with_secrets(&process, st, name, cfg);
                self.resubscribe_routes(&process, st);
                self.publish_warming_listeners(st);
            }
        }
        self.advance(st);
    }

    /// Counts how listener `name` was updated from `old` (the version serving until then) to
    /// `new`, and starts the drain of `old` when the update replaced it whole. The applier
    /// keeps a listener's sockets whenever its addresses stay; Envoy updates in place only
    /// when the filter chains alone changed ([`draining::in_place`]), so that decides.
    fn listener_changed(
        &self,
        process: &Arc<Process>,
        st: &mut State,
        name: &str,
        change: ListenerChange,
        old: Option<Serving>,
        new: &Bytes,
    ) {
        let change = match (&old, change) {
            (Some(old), ListenerChange::InPlace) if !draining::in_place(&old.value, new) => {
                ListenerChange::Rebound
            }
            _ => change,
        };
        self.count_listener_change(change);
        // Envoy creates the listener on every worker (an in-place update too).
        self.stats
            .listener_create_success
            .add(process.applier.worker_count() as u64);
        if let (Some(old), ListenerChange::Rebound) = (old, change) {
            self.drain_listener(process, st, name, old);
        }
    }

    /// Keeps `old`, a version of listener `name` replaced whole or removed, as draining for
    /// the drain time (`--drain-time-s`), as Envoy keeps its draining listeners.
    fn drain_listener(&self, process: &Arc<Process>, st: &mut State, name: &str, old: Serving) {
        let id = st.draining_listeners.add(name, old);
        self.stats
            .draining_listeners
            .set(st.draining_listeners.count() as u64);
        let Some(me) = self.me() else {
            return;
        };
        let me = Arc::downgrade(&me);
        let drain_time = Duration::from_secs(process.options.drain_time_s);
        tokio::spawn(async move {
            tokio::time::sleep(drain_time).await;
            if let Some(me) = me.upgrade() {
                let mut st = me.state.lock().expect("xds state");
                st.draining_listeners.end(id);
                me.stats
                    .draining_listeners
                    .set(st.draining_listeners.count() as u64);
            }
        });
    }

    fn count_listener_change(&self, change: ListenerChange) {
        match change {
            ListenerChange::Added => self.stats.listener_added.inc(),
            ListenerChange::InPlace => {
                self.stats.listener_modified.inc();
                self.stats.listener_in_place_updated.inc();
            }
            ListenerChange::Rebound => self.stats.listener_modified.inc(),
        }
    }

    /// Activates `cfg` once its secrets have arrived: now, or when they do (held in
    /// `listeners_awaiting_secrets` meanwhile), so a listener whose warming timed out is never
    /// active without its certificates (unlike Envoy's, #47309).
    fn activate_with_secrets(
        &self,
        process: &Arc<Process>,
        st: &mut State,
        name: &str,
        cfg: ListenerConfig,
    ) {
        if secrets_ready(process, &listener_secrets(&cfg)) {
            self.activate_listener(process, st, name, cfg);
        } else {
            tracing::warn!(listener = %name, "SDS secrets have not come; the listener is active once they do");
            st.listeners_awaiting_secrets.insert(name.to_owned(), cfg);
        }
    }

    /// Sets `listener_manager.total_listeners_warming`: the listeners waiting for route
    /// configurations or secrets.
    fn publish_warming_listeners(&self, st: &State) {
        self.stats
            .warming_listeners
            .set((st.warming_listeners.len() + st.listeners_awaiting_secrets.len()) as u64);
    }

    fn activate_listener(
        &self,
        process: &Arc<Process>,
        st: &mut State,
        name: &str,
        cfg: ListenerConfig,
    ) {
        let old = st
            .listeners
            .get(name)
            .and_then(|r| r.serving.as_deref().cloned());
        let routes = rds_names(&cfg);
        match process.applier.upsert_listener(cfg) {
            Ok(change) => {
                st.serving_routes.insert(name.to_owned(), routes);
                if let Some(new) = st.listeners.get(name).and_then(|r| r.value.clone()) {
                    self.listener_changed(process, st, name, change, old, &new);
                }
                st.listeners.set_status(name, Status::Acked);
            }
            Err(e) => {
                // Its address was taken while it warmed (it was bound when it came).
                tracing::error!(listener = %name, error = %e, "a warmed listener could not be applied; the version before it, if any, serves on");
                st.listeners.failed(name, &listener_error(name, &e));
                // Nor is it held: a new Delta stream gets it again.
                if let Some(client) = self.client.get() {
                    client.forget(LISTENER_TYPE_URL, name);
                }
                match st.serving_routes.get(name).cloned() {
                    Some(routes) => st.listener_routes.insert(name.to_owned(), routes),
                    None => st.listener_routes.remove(name),
                };
            }
        }
    }

    /// Subscribes to every route configuration a listener uses (static ones too).
    /// Whether the ADS stream speaks Delta (RDS and EDS always come over it).
    fn ads_delta(&self) -> bool {
        self.config.ads.as_ref().is_some_and(|a| a.delta)
    }

    /// Whether the subscription `sub` (LDS or CDS) comes over a Delta ADS stream.
    fn over_delta(&self, sub: Option<&crate::config::dynamic::Subscription>) -> bool {
        sub.is_some_and(|s| s.source == Source::Ads) && self.ads_delta()
    }

    /// The route configurations in use: those the static listeners, and the serving and the
    /// latest version of each dynamic listener, name.
    fn routes_in_use(&self, process: &Process, st: &State) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = st
            .listener_routes
            .values()
            .chain(st.serving_routes.values())
            .flatten()
            .cloned()
            .collect();
        for l in &process.bootstrap.listeners {
            names.extend(rds_names(l));
        }
        names
    }

    /// Subscribes to the route configurations in use (starting the stats of those new since
    /// the last call), and drops those no longer in use once the drain time has passed.
    fn resubscribe_routes(&self, process: &Process, st: &mut State) {
        let in_use = self.routes_in_use(process, st);
        st.unused_routes.retain(|name, _| !in_use.contains(name));
        let unused: Vec<String> = st
            .routes
            .iter()
            .map(|(name, _)| name)
            .filter(|name| !in_use.contains(*name) && !st.unused_routes.contains_key(*name))
            .cloned()
            .collect();
        if !unused.is_empty() {
            let drop = st.next_route_drop;
            st.next_route_drop += 1;
            st.unused_routes
                .extend(unused.iter().map(|name| (name.clone(), drop)));
            let drain_time = Duration::from_secs(process.options.drain_time_s);
            self.after(Some(drain_time), move |me| me.drop_unused_routes(drop));
        }
        // Those awaiting their drop stay subscribed until then.
        let mut names = in_use.clone();
        names.extend(st.unused_routes.keys().cloned());
        st.rds_started.retain(|name, _| names.contains(name));
        for name in &in_use {
            if st.rds_started.contains_key(name) {
                continue;
            }
            let Some(prefix) = rds_stat_prefixes(process, st, name).into_iter().next() else {
                continue;
            };
            UpdateStats::new(&process.shared.stats, &prefix).started();
            // Its `config_reload*` stats exist from the start, as Envoy's.
            Reloads::new(&process.shared.stats, &prefix);
            // Envoy's RDS keeps `update_empty` for SotW responses without its configuration,
            // which its mux (and revoy's) never delivers to an RDS subscription.
            process
                .shared
                .stats
                .counter(&format!("{prefix}.update_empty"));
            st.rds_started.insert(name.clone(), prefix);
        }
        self.subscribe(ROUTE_TYPE_URL, names.into_iter().collect());
    }

    fn apply_routes(
        &self,
        ctx: &Context<'_>,
        process: &Arc<Process>,
        st: &mut State,
        u: Update,
    ) -> Applied {
        let mut rejected = Vec::new();
        let mut changes = Changes::default();
        for r in u.resources {
            let since = Instant::now();
            let prefixes: Vec<String> = st.rds_started.get(&r.name).cloned().into_iter().collect();
            if st.routes.unchanged(&r.name, &r.value) {
                st.routes.resent(&r.name);
                for p in &prefixes {
                    UpdateStats::new(&process.shared.stats, p).accepted(&u.version_info, since);
                }
                continue;
            }
            let compiled = decode::<RouteConfiguration>(&r, "route configuration").and_then(|rc| {
                let known = |name: &str| {
                    process.shared.clusters.get(name).is_some()
                        || st.warming_clusters.contains_key(name)
                };
                // RDS validates clusters only when asked (`validate_clusters: true`).
                let check: Option<&dyn Fn(&str) -> bool> = rc
                    .validate_clusters
                    .is_some_and(|v| v.value)
                    .then_some(&known);
                let mut warnings = Warnings::new();
                let table =
                    crate::config::route::compile_route_config(ctx, &rc, check, &mut warnings)
                        .map_err(|e| located("route configuration", &rc.name, e))?;
                log_warnings("route configuration", &rc.name, &warnings);
                Ok(table)
            });
            let accepted = compiled.is_ok();
            match compiled {
                Err(reason) => reject(&mut st.routes, &mut rejected, r, reason),
                Ok(table) => {
                    process.applier.upsert_route(table);
                    changes.note(&st.routes, &r.name);
                    st.routes
                        .accept(&r.name, &r.version, r.value, Status::Acked);
                }
            }
            for p in &prefixes {
                UpdateStats::new(&process.shared.stats, p).finish(
                    &u.version_info,
                    accepted,
                    self.ads_delta(),
                    since,
                );
                if accepted {
                    Reloads::new(&process.shared.stats, p).reloaded();
                }
            }
        }
        for name in u.removed {
            // Envoy's RDS ignores a removal of a configuration it subscribes to (the table
            // keeps serving) and counts the update as applied.
            if let Some(prefix) = st.rds_started.get(&name) {
                tracing::warn!(route_config = %name, "the server removed a route configuration still in use; it keeps serving, as in Envoy");
                UpdateStats::new(&process.shared.stats, prefix)
                    .accepted(&u.version_info, Instant::now());
                st.routes.set_status(&name, Status::DoesNotExist);
                continue;
            }
            process.applier.remove_route(&name);
            st.routes.remove(&name);
        }
        self.activate_ready_listeners(process, st);
        changes.answer(rejected)
    }

    /// Activates the warming listeners whose route configurations have been answered and whose
    /// secrets have arrived. A route configuration is answered once a version of it was
    /// accepted, or rejected: as Envoy's RDS lets start-up go on after a rejected update, its
    /// listener starts without it (404 until a good one comes) rather than wait for ever.
    fn activate_ready_listeners(&self, process: &Arc<Process>, st: &mut State) {
        let ready: Vec<String> = st
            .warming_listeners
            .keys()
            .filter(|l| {
                st.listener_routes
                    .get(*l)
                    .is_none_or(|names| names.iter().all(|n| route_answered(st, n)))
                    && st
                        .warming_listeners
                        .get(l)
                        .is_none_or(|cfg| secrets_ready(process, &listener_secrets(cfg)))
            })
            .cloned()
            .collect();
        let held: Vec<String> = st
            .listeners_awaiting_secrets
            .iter()
            .filter(|(_, cfg)| secrets_ready(process, &listener_secrets(cfg)))
            .map(|(name, _)| name.clone())
            .collect();
        let activated = !ready.is_empty() || !held.is_empty();
        for name in ready {
            if let Some(cfg) = st.warming_listeners.remove(&name) {
                self.activate_listener(process, st, &name, cfg);
            }
        }
        for name in held {
            if let Some(cfg) = st.listeners_awaiting_secrets.remove(&name) {
                self.activate_listener(process, st, &name, cfg);
            }
        }
        if activated {
            // The versions they replace no longer hold their route configurations.
            self.resubscribe_routes(process, st);
        }
        self.publish_warming_listeners(st);
    }

    /// Drops the route configurations of drop `drop` still unused: their tables, records
    /// (`/config_dump`) and subscriptions.
    fn drop_unused_routes(&self, drop: u64) {
        let Some(process) = self.process.upgrade() else {
            return;
        };
        let mut st = self.state.lock().expect("xds state");
        let st = &mut *st;
        let ended: Vec<String> = st
            .unused_routes
            .iter()
            .filter(|(_, d)| **d == drop)
            .map(|(name, _)| name.clone())
            .collect();
        if ended.is_empty() {
            return;
        }
        for name in &ended {
            st.unused_routes.remove(name);
            process.applier.remove_route(name);
            st.routes.remove(name);
        }
        self.resubscribe_routes(&process, st);
    }

    /// Adds `cfg` to `ready` when the secrets of its TLS contexts have arrived (answering
    /// `Acked`); else it waits for them (`Warming`), as Envoy warms such a cluster.
    fn use_or_await_secrets(
        &self,
        process: &Arc<Process>,
        st: &mut State,
        cfg: ClusterConfig,
        ready: &mut Vec<ClusterConfig>,
    ) -> Status {
        let secrets = cluster_secrets(&cfg);
        if secrets_ready(process, &secrets) {
            st.clusters_awaiting_secrets.remove(&cfg.name);
            ready.push(cfg);
            Status::Acked
        } else {
            self.await_secrets(process, st, &secrets);
            let name = cfg.name.clone();
            st.clusters_awaiting_secrets.insert(name.clone(), cfg);
            let timeout = secrets_timeout(process, &secrets);
            let waited = name.clone();
            if let Some(timer) =
                self.after(timeout, move |me| me.cluster_secrets_timed_out(&waited))
            {
                st.clusters_awaiting_secrets.set_timer(&name, timer);
            }
            Status::Warming
        }
    }

    /// Uses cluster `name` without the secrets it still awaits, its wait over: as Envoy's
    /// cluster warming ends on its SDS subscriptions' `initial_fetch_timeout`, its connections
    /// then fail closed until they come ([`crate::tls::ClientContext::may_handshake`]). A new
    /// version of the cluster, or its secrets coming, cancels the timer that calls it.
    fn cluster_secrets_timed_out(&self, name: &str) {
        let Some(process) = self.process.upgrade() else {
            return;
        };
        let mut st = self.state.lock().expect("xds state");
        let st = &mut *st;
        let Some(cfg) = st.clusters_awaiting_secrets.remove(name) else {
            return;
        };
        tracing::warn!(cluster = %name, "initial_fetch_timeout: SDS secrets did not come; the cluster is used, its connections refused until they do");
        st.clusters.set_status(name, Status::Acked);
        process.shared.clusters.apply(vec![cfg], &[]);
        self.publish_cluster_gauges(&process, st);
        self.activate_ready_listeners(&process, st);
        self.advance(st);
    }

    /// Looks at what warms again as each of `secrets` not there yet arrives: one wait per
    /// secret, however many listeners and clusters (and versions of them) await it.
    fn await_secrets(&self, process: &Process, st: &mut State, secrets: &[SecretRef]) {
        let Some(me) = self.me() else {
            return;
        };
        for r in secrets {
            let cell = process.shared.secrets.cell(r);
            let key = (r.name.clone(), r.source.clone());
            if cell.is_ready() || !st.secret_waits.insert(key.clone()) {
                continue;
            }
            let me = Arc::downgrade(&me);
            tokio::spawn(async move {
                cell.ready().await;
                if let Some(me) = me.upgrade() {
                    me.state
                        .lock()
                        .expect("xds state")
                        .secret_waits
                        .remove(&key);
                    me.secrets_arrived();
                }
            });
        }
    }

    /// Uses the listeners and clusters whose secrets have all arrived.
    fn secrets_arrived(&self) {
        let Some(process) = self.process.upgrade() else {
            return;
        };
        let mut st = self.state.lock().expect("xds state");
        let st = &mut *st;
        let ready: Vec<String> = st
            .clusters_awaiting_secrets
            .keys()
            .filter(|name| {
                st.clusters_awaiting_secrets
                    .get(name)
                    .is_some_and(|cfg| secrets_ready(&process, &cluster_secrets(cfg)))
            })
            .cloned()
            .collect();
        let mut warmed = Vec::new();
        for name in ready {
            if let Some(cfg) = st.clusters_awaiting_secrets.remove(&name) {
                st.clusters.set_status(&name, Status::Acked);
                warmed.push(cfg);
            }
        }
        process.shared.clusters.apply(warmed, &[]);
        self.publish_cluster_gauges(&process, st);
        self.activate_ready_listeners(&process, st);
        self.advance(st);
    }
}

/// The SDS secrets a listener's TLS chains use.
fn listener_secrets(cfg: &ListenerConfig) -> Vec<SecretRef> {
    cfg.chains
        .iter()
        .chain(&cfg.default_chain)
        .filter_map(|c| c.tls.as_ref())
        .flat_map(|t| t.common.secrets().into_iter().cloned())
        .collect()
}

/// The SDS secrets a cluster's TLS transport sockets use.
pub(crate) fn cluster_secrets(cfg: &ClusterConfig) -> Vec<SecretRef> {
    cfg.transport
        .sockets()
        .iter()
        .filter_map(|s| match s {
            Socket::Tls(t) => Some(t),
            _ => None,
        })
        .flat_map(|t| t.common.secrets().into_iter().cloned())
        .collect()
}

/// How long a cluster waits for the ones of `secrets` that have not arrived: the longest of
/// their `initial_fetch_timeout`s (`None`, for ever, when one has none).
fn secrets_timeout(process: &Process, secrets: &[SecretRef]) -> Option<Duration> {
    secrets
        .iter()
        .filter(|r| !process.shared.secrets.cell(r).is_ready())
        .try_fold(Duration::ZERO, |longest, r| {
            r.initial_fetch_timeout.map(|t| longest.max(t))
        })
}

/// Whether every one of `secrets` has arrived (asking subscribes to it).
fn secrets_ready(process: &Process, secrets: &[SecretRef]) -> bool {
    secrets
        .iter()
        .all(|r| process.shared.secrets.cell(r).is_ready())
}

impl Handler for ProxyHandler {
    fn refused(&self, update: &Update, reason: &str) {
        let Some(process) = self.process.upgrade() else {
            return;
        };
        let mut st = self.state.lock().expect("xds state");
        self.refused_whole(&process, &mut st, update, reason);
    }

    fn apply(&self, update: Update) -> Applied {
        let Some(process) = self.process.upgrade() else {
            return Applied::default();
        };
        let mut st = self.state.lock().expect("xds state");
        let ctx = Context::new(&*self.io);
        let size = update.resources.len() + update.removed.len();
        let applied = match update.type_url.as_str() {
            CLUSTER_TYPE_URL => self.apply_clusters(&process, &mut st, update),
            ENDPOINT_TYPE_URL => self.apply_endpoints(&process, &mut st, update),
            LISTENER_TYPE_URL => self.apply_listeners(&ctx, &process, &mut st, update),
            ROUTE_TYPE_URL => self.apply_routes(&ctx, &process, &mut st, update),
            SECRET_TYPE_URL => {
                super::sds::SecretHandler::new(process.shared.secrets.clone(), SecretSource::Ads)
                    .apply(update)
            }
            super::rtds::RUNTIME_TYPE_URL => {
                let st = &mut *st;
                super::rtds::apply(
                    &process.shared.runtime,
                    &mut st.runtimes,
                    &mut st.rtds_pending,
                    (&super::rtds::stats(&process.shared.stats), self.ads_delta()),
                    update,
                )
            }
            other => Applied::rejecting(
                update
                    .resources
                    .iter()
                    .map(|r| Rejected {
                        name: r.name.clone(),
                        reason: format!("revoy does not handle resources of type {other}"),
                    })
                    .collect(),
            ),
        };
        self.advance(&mut st);
        // Only a large update frees enough to be worth a pass over the xDS thread's heap (which
        // grows with the config: after every one-endpoint change it cost O(clusters) CPU).
        if size >= LARGE_UPDATE {
            crate::memory::release_free_heap_soon();
        }
        crate::memory::release_code_pages_soon();
        applied
    }

    fn event(&self, event: Event) {
        match event {
            Event::Connected => self.stats.connected_state.set(1),
            Event::Disconnected => {
                self.stats.connected_state.set(0);
                for (sub, stats) in [
                    (&self.config.cds, &self.stats.cds),
                    (&self.config.lds, &self.stats.lds),
                ] {
                    if sub.as_ref().is_some_and(|s| s.source == Source::Ads) {
                        stats.disconnected();
                    }
                }
                self.count_rds_and_eds_disconnected();
                self.for_each_rtds(UpdateStats::disconnected);
            }
            Event::RateLimited => self.stats.rate_limit_enforced.inc(),
            Event::Queued(queued) => self.stats.pending_requests.set(queued as u64),
            Event::Identified(identifier) => self.stats.identifier.set(&identifier),
        }
    }
}

impl ProxyHandler {
    /// Every RDS and EDS subscription (all over ADS) counts the lost stream.
    fn count_rds_and_eds_disconnected(&self) {
        let Some(process) = self.process.upgrade() else {
            return;
        };
        let st = self.state.lock().expect("xds state");
        for prefix in st.rds_started.values() {
            UpdateStats::new(&process.shared.stats, prefix).disconnected();
        }
        for cluster in st.eds_service_of.keys() {
            let name = st
                .warming_clusters
                .get(cluster)
                .map(|c| c.observability_name.clone())
                .or_else(|| {
                    process
                        .shared
                        .clusters
                        .get(cluster)
                        .map(|c| c.config().observability_name.clone())
                });
            if let Some(name) = name {
                UpdateStats::of_cluster(&process.shared.stats, &name).disconnected();
            }
        }
    }
}

/// Drops the stats of removed clusters that nothing holds any more; those still held (by
/// requests or connections in flight) are tried again at the next sweep.
fn release_stats(process: &Process, st: &mut State) {
    st.stats_to_release
        .retain(|prefix| process.shared.stats.release(prefix));
}

/// What warms: a cluster waiting for its endpoints, a listener for its route configurations.
#[derive(Debug, Clone, Copy)]
enum Warming {
    Cluster,
    Listener,
}

/// Envoy's default `initial_fetch_timeout`.
const DEFAULT_FETCH_TIMEOUT: Option<Duration> = Some(Duration::from_secs(15));

/// How long listener `cfg` (compiled from `l`) warms at most, as Envoy's listener init
/// manager waits for its targets: the longest `initial_fetch_timeout` of its RDS
/// subscriptions and of the SDS secrets it still lacks (`None`: for ever, as any of them
/// without one waits). After it the listener is used once its secrets are in.
fn warming_timeout(process: &Process, l: &ListenerProto, cfg: &ListenerConfig) -> Option<Duration> {
    listener_secrets(cfg)
        .iter()
        .filter(|r| !process.shared.secrets.cell(r).is_ready())
        .fold(rds_fetch_timeout(l), |longest, r| {
            longest.zip(r.initial_fetch_timeout).map(|(a, b)| a.max(b))
        })
}

/// How long listener `l` may warm waiting for its route configurations: the longest
/// `initial_fetch_timeout` of its RDS config sources (`None`, for ever, if one is 0).
fn rds_fetch_timeout(l: &ListenerProto) -> Option<Duration> {
    let mut longest = Some(Duration::ZERO);
    for chain in l.filter_chains.iter().chain(&l.default_filter_chain) {
        for f in &chain.filters {
            let Some(FilterConfig::TypedConfig(any)) = &f.config_type else {
                continue;
            };
            let Ok(hcm) = proto::unpack::<HttpConnectionManager>(any) else {
                continue;
            };
            if let Some(RouteSpecifier::Rds(rds)) = &hcm.route_specifier {
                let timeout = rds
                    .config_source
                    .as_ref()
                    .map_or(DEFAULT_FETCH_TIMEOUT, initial_fetch_timeout);
                longest = longest.zip(timeout).map(|(a, b)| a.max(b));
            }
        }
    }
    longest
}

/// Decodes resource `r`, a `kind` (for the error).
fn decode<T: Message + Default>(r: &Resource, kind: &str) -> Result<T, String> {
    T::decode(r.value.clone()).map_err(|e| format!("{kind} '{}': cannot decode: {e}", r.name))
}

/// Records a rejection and adds it to the answer.
fn reject(records: &mut Records, rejected: &mut Vec<Rejected>, r: Resource, reason: String) {
    tracing::warn!(resource = %r.name, version = %r.version, "rejected: {reason}");
    records.reject(&r.name, &r.version, r.value, &reason);
    rejected.push(Rejected {
        name: r.name,
        reason,
    });
}

/// Whether route configuration `name` was answered: a version of it accepted, or rejected (a
/// listener waiting for it then starts, see `activate_ready_listeners`).
fn route_answered(st: &State, name: &str) -> bool {
    st.routes
        .get(name)
        .is_some_and(|r| r.value.is_some() || r.error.is_some())
}

/// A compile error of the resource `kind` `name`, with its field path.
fn located(kind: &str, name: &str, e: ConfigError) -> String {
    format!("{kind} '{name}': {e}")
}

/// Logs a resource's compile findings (what fails closed at error level).
fn log_warnings(kind: &str, name: &str, warnings: &Warnings) {
    for w in warnings {
        match w.severity {
            Severity::FailsClosed => tracing::error!("{kind} '{name}': {w}"),
            Severity::Skipped => tracing::warn!("{kind} '{name}': {w}"),
            Severity::Note => tracing::info!("{kind} '{name}': {w}"),
        }
    }
}

/// `http.<stat_prefix>.rds.<route_config>` of every connection manager (of an active or
/// warming listener) that uses route configuration `name`, sorted.
fn rds_stat_prefixes(process: &Process, st: &State, name: &str) -> Vec<String> {
    let active = process.applier.listeners();
    let configs = active
        .iter()
        .map(|l| &**l.config())
        .chain(st.warming_listeners.values())
        .chain(st.listeners_awaiting_secrets.values());
    let prefixes: BTreeSet<String> = configs.flat_map(|l| rds_prefixes_of(l, name)).collect();
    prefixes.into_iter().collect()
}

/// The RDS stat prefixes (`http.<stat_prefix>.rds.<name>`) of the connection managers of
/// listener `l` that use the route configuration `name`.
fn rds_prefixes_of(l: &ListenerConfig, name: &str) -> Vec<String> {
    l.chains
        .iter()
        .chain(&l.default_chain)
        .filter_map(|c| match &c.terminal {
            Terminal::Http(h) if matches!(&h.routes, Routes::Rds(n) if n == name) => {
                Some(format!("http.{}.rds.{name}", h.stat_prefix))
            }
            _ => None,
        })
        .collect()
}

/// The RDS route configuration names a listener's connection managers use.
fn rds_names(l: &ListenerConfig) -> Vec<String> {
    l.chains
        .iter()
        .chain(&l.default_chain)
        .filter_map(|c| match &c.terminal {
            Terminal::Http(h) => match &h.routes {
                Routes::Rds(name) => Some(name.clone()),
                Routes::Static(_) => None,
            },
            Terminal::Tcp(_) => None,
        })
        .collect()
}

/// Why listener `name` could not be added, in Envoy's words where it has them.
fn listener_error(name: &str, e: &ListenerError) -> String {
    match e {
        ListenerError::DuplicateAddress { .. } => e.to_string(),
        _ => format!("error adding listener '{name}': {e}"),
    }
}

/// Envoy's duplicate-address rule ([`crate::apply::duplicate_address`]) against the listeners
/// waiting for their route configurations or secrets (the applier checks the active ones).
fn warming_duplicate(st: &State, cfg: &ListenerConfig) -> Option<ListenerError> {
    let waiting = st
        .warming_listeners
        .values()
        .chain(st.listeners_awaiting_secrets.values());
    crate::apply::duplicate_address(cfg, waiting).err()
}

/// The name EDS cluster `cluster`'s subscription stats go under (`cluster.<name>.update_*`):
/// its version warming, else the one serving.
fn eds_stat_name(process: &Process, st: &State, cluster: &str) -> Option<String> {
    st.warming_clusters
        .get(cluster)
        .map(|c| c.observability_name.clone())
        .or_else(|| {
            process
                .shared
                .clusters
                .get(cluster)
                .map(|c| c.config().observability_name.clone())
        })
}

/// How an accepted listener was taken.
enum Taken {
    /// Applied: it serves.
    Active(ListenerChange),
    /// It warms (its route configurations or secrets have not all come).
    Warming(Box<ListenerConfig>),
}

/// Which version of an EDS cluster an endpoint assignment goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The version waiting for its endpoints: they end its warming.
    Warming,
    /// The version with endpoints in hand waiting for its SDS secrets: they replace those.
    AwaitingSecrets,
    /// The version serving: its hosts change now.
    Serving,
}

/// The versions of `users` (the clusters of EDS service `service`) an endpoint assignment
/// goes to, each with the config it is compiled against: the new version (warming or
/// awaiting its secrets) and the one serving, those of them subscribed to `service`, as each
/// of Envoy's cluster versions has its own EDS subscription (a version of another service, or
/// not of EDS, never takes it: the plaintext version serving while one with TLS awaits its
/// secrets is not pointed at the new endpoints). An `unchanged` assignment only ends warming.
fn assignment_targets(
    process: &Process,
    st: &State,
    service: &str,
    users: &[String],
    unchanged: bool,
) -> Vec<(String, Target, ClusterConfig)> {
    let of_service = |cfg: &ClusterConfig| matches!(&cfg.discovery, Discovery::Eds { service_name } if service_name == service);
    let mut targets = Vec::new();
    for user in users {
        if let Some(cfg) = st.warming_clusters.get(user).filter(|c| of_service(c)) {
            targets.push((user.clone(), Target::Warming, cfg.clone()));
        }
        if unchanged {
            continue;
        }
        if let Some(cfg) = st
            .clusters_awaiting_secrets
            .get(user)
            .filter(|c| of_service(c))
        {
            targets.push((user.clone(), Target::AwaitingSecrets, cfg.clone()));
        }
        if let Some(c) = process
            .shared
            .clusters
            .get(user)
            .filter(|c| of_service(c.config()))
        {
            targets.push((user.clone(), Target::Serving, c.config().clone()));
        }
    }
    targets
}

/// The endpoints of the assignment held for `cfg`'s EDS service, compiled for it (what a
/// cluster that waited in vain for its endpoints starts with, as Envoy's EDS cache).
fn held_assignment(st: &State, cfg: &ClusterConfig) -> Option<Vec<EndpointConfig>> {
    let Discovery::Eds { service_name } = &cfg.discovery else {
        return None;
    };
    let held = st.endpoints.get(service_name)?.value.as_ref()?;
    let cla = ClusterLoadAssignment::decode(held.clone()).ok()?;
    compile_assignment(&cla, cfg).ok()
}

/// Removes `cluster` from the users of the service name it used, if any. When the cluster was
/// `removed` and was the service's last user, its assignment is forgotten too (the
/// subscription ends; a cluster added again waits for a fresh one, as in Envoy).
fn forget_eds_user(st: &mut State, cluster: &str, removed: bool) {
    let Some(service) = st.eds_service_of.remove(cluster) else {
        return;
    };
    if let Some(users) = st.eds_users.get_mut(&service) {
        users.remove(cluster);
        if users.is_empty() {
            st.eds_users.remove(&service);
            if removed {
                st.endpoints.remove(&service);
            }
        }
    }
}

/// The clusters that use one EDS service name, sorted: nearly always one, so a vector (a
/// set's first node is some 300 bytes).
#[derive(Debug, Default)]
struct Users(Vec<String>);

impl Users {
    fn insert(&mut self, cluster: &str) {
        if let Err(at) = self.0.binary_search_by(|u| u.as_str().cmp(cluster)) {
            self.0.reserve_exact(1);
            self.0.insert(at, cluster.to_owned());
        }
    }

    fn remove(&mut self, cluster: &str) {
        if let Ok(at) = self.0.binary_search_by(|u| u.as_str().cmp(cluster)) {
            self.0.remove(at);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn iter(&self) -> std::slice::Iter<'_, String> {
        self.0.iter()
    }
}

/// Makes the bytes of a record's value an `Any` of `type_url` (for `/config_dump`).
pub fn any(type_url: &str, value: &Bytes) -> proto::pb::google::protobuf::Any {
    proto::pb::google::protobuf::Any {
        type_url: type_url.to_owned(),
        value: value.to_vec(),
    }
}
