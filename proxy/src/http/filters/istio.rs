//! Istio's HTTP filters at run time (compiled in `config::istio`): `istio.metadata_exchange`
//! (peer metadata in `x-envoy-peer-metadata` headers) and `istio.stats` (Istio's standard
//! request metrics, labelled with what is known of both peers). What the exchange learns of a
//! request's peers is kept in its [`Peers`], which the stats filter reads when the request
//! ends: with its response, or, for an upgraded (WebSocket) request, when its tunnel closes.
//! A gRPC call's message counts are reported while it is open too (see [`Ticker`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, Response, header};

use super::grpc_stats::MessageCounts;
use super::peer_cache::PeerCache;
use super::{Encoder, Encoders, FilterRequest};
use http_body_util::BodyExt;

use crate::access_log::record::Settled;
use crate::access_log::{AtTunnelEnd, AttemptTarget, FlagsOut, Record};
use crate::body::Body;
use crate::config::istio::peer_metadata::{Discovery, PeerMetadataConfig, Propagation};
use crate::config::istio::stats::IstioStatsConfig;
use crate::config::istio::workload::{LocalWorkload, Workload};
use crate::istio_metrics::{self as metrics, Ends, HttpMetrics};
use crate::route::action::ClusterSpecifier;
use crate::route::{Action, Selected};
use crate::stats::Store;
use crate::stats::keyed::Keyed;

/// Metric labels (name, value) in the order Istio adds them.
type Labels = Vec<(&'static str, String)>;

/// `x-envoy-peer-metadata-id`: the sender's node id.
pub static PEER_ID: HeaderName = HeaderName::from_static("x-envoy-peer-metadata-id");
/// `x-envoy-peer-metadata`: the sender's workload, a base64 Struct.
pub static PEER_METADATA: HeaderName = HeaderName::from_static("x-envoy-peer-metadata");

/// What is known of one request's peers.
#[derive(Debug, Default)]
pub struct Peers {
    /// The downstream peer, from the request.
    downstream: OnceLock<Arc<Workload>>,
    /// The upstream peer, from the response.
    upstream: OnceLock<Arc<Workload>>,
    /// Whether the request carried `x-envoy-peer-metadata-id` / `x-envoy-peer-metadata`
    /// (this proxy answers with its own only then).
    received_id: AtomicBool,
    received_metadata: AtomicBool,
}

impl FilterRequest<'_> {
    /// The request's [`Peers`], made on first use.
    fn peers(&mut self) -> Arc<Peers> {
        self.peers.get_or_insert_with(Arc::default).clone()
    }

    /// The name of the cluster the chosen route sends to, when the route names it (or a
    /// header does).
    fn route_cluster(&self) -> Option<&str> {
        cluster_of(self.route?, self.headers)
    }
}

/// The cluster `route` forwards to: its name, or the header naming it.
fn cluster_of<'r>(route: Selected<'r>, headers: &'r HeaderMap) -> Option<&'r str> {
    let Action::Forward(fwd) = &route.route.action else {
        return None;
    };
    match &fwd.cluster {
        ClusterSpecifier::Name(n) => Some(n),
        ClusterSpecifier::Header(h) => headers.get(h)?.to_str().ok(),
        ClusterSpecifier::Weighted(_) => None,
    }
}

/// `istio.metadata_exchange`.
#[derive(Debug)]
pub(super) struct PeerMetadata {
    config: Arc<PeerMetadataConfig>,
    /// The peers its requests and responses described, decoded.
    known: Arc<PeerCache>,
}

impl PeerMetadata {
    /// The filter for `config`.
    pub(super) fn new(config: &Arc<PeerMetadataConfig>) -> Self {
        PeerMetadata {
            config: config.clone(),
            known: Arc::default(),
        }
    }

    /// Discovers the downstream peer (removing its headers) and sends this proxy's metadata
    /// upstream; leaves an encoder for the response's side of both.
    pub(super) fn decode(&self, req: &mut FilterRequest<'_>, encoders: &mut Encoders) {
        let config = &self.config;
        let peers = req.peers();
        let local = req.conn.shared.local_workload.clone();
        if !config.downstream_discovery.is_empty() {
            peers
                .received_id
                .store(req.headers.contains_key(&PEER_ID), Ordering::Relaxed);
            peers
                .received_metadata
                .store(req.headers.contains_key(&PEER_METADATA), Ordering::Relaxed);
            discover(
                &config.downstream_discovery,
                req.headers,
                &self.known,
                &peers.downstream,
            );
        }
        let skip = skips_exchange(req);
        if let Some(p) = config.upstream_propagation
            && !(skip.external && p.skip_external_clusters || skip.disabled)
        {
            inject(&local, req.headers, true, true);
        }
        if !config.upstream_discovery.is_empty() || config.downstream_propagation.is_some() {
            encoders
                .0
                .push(Encoder::PeerMetadata(Box::new(PeerResponse {
                    config: config.clone(),
                    known: self.known.clone(),
                    peers,
                    local,
                    skip_external: skip.external,
                    skip_disabled: skip.disabled,
                })));
        }
    }
}

/// Whether the request's cluster is outside the mesh (`PassthroughCluster`, or marked
/// `external`) or has the exchange disabled (`disable_mx`), from its `istio` metadata.
struct Skip {
    external: bool,
    disabled: bool,
}

fn skips_exchange(req: &FilterRequest<'_>) -> Skip {
    let Some(name) = req.route_cluster() else {
        return Skip {
            external: false,
            disabled: false,
        };
    };
    let cluster = req.conn.shared.clusters.get(name);
    let istio = cluster.as_ref().and_then(|c| c.config().istio.clone());
    Skip {
        external: name == "PassthroughCluster" || istio.as_ref().is_some_and(|i| i.external),
        disabled: istio.as_ref().is_some_and(|i| i.disable_mx),
    }
}

/// Runs `methods` in order on `headers` until one finds the peer (into `peer`); the
/// exchange's headers are removed when one of the methods reads them.
fn discover(
    methods: &[Discovery],
    headers: &mut HeaderMap,
    known: &PeerCache,
    peer: &OnceLock<Arc<Workload>>,
) {
    for m in methods {
        if *m == Discovery::IstioHeaders
            && let Some(found) = headers
                .get(&PEER_METADATA)
                .and_then(|v| known.workload(v.as_bytes()))
        {
            let _ = peer.set(found);
            break;
        }
    }
    if methods.contains(&Discovery::IstioHeaders) {
        headers.remove(&PEER_ID);
        headers.remove(&PEER_METADATA);
    }
}

/// Sets this proxy's exchange headers (the id and the metadata, each when asked).
fn inject(local: &LocalWorkload, headers: &mut HeaderMap, id: bool, metadata: bool) {
    if id && let Some(v) = &local.id_header {
        headers.insert(PEER_ID.clone(), v.clone());
    }
    if metadata {
        headers.insert(PEER_METADATA.clone(), local.header.clone());
    }
}

/// The response side of `istio.metadata_exchange` for one request.
#[derive(Debug)]
pub(super) struct PeerResponse {
    config: Arc<PeerMetadataConfig>,
    known: Arc<PeerCache>,
    peers: Arc<Peers>,
    local: Arc<LocalWorkload>,
    skip_external: bool,
    skip_disabled: bool,
}

impl PeerResponse {
    /// Discovers the upstream peer from the response (removing its headers) and answers
    /// a downstream that sent its metadata with this proxy's.
    pub(super) fn encode(&self, resp: &mut Response<Body>) {
        discover(
            &self.config.upstream_discovery,
            resp.headers_mut(),
            &self.known,
            &self.peers.upstream,
        );
        if let Some(Propagation {
            skip_external_clusters,
        }) = self.config.downstream_propagation
            && !(self.skip_external && skip_external_clusters || self.skip_disabled)
        {
            inject(
                &self.local,
                resp.headers_mut(),
                self.peers.received_id.load(Ordering::Relaxed),
                self.peers.received_metadata.load(Ordering::Relaxed),
            );
        }
    }
}

/// `istio.stats`.
#[derive(Debug)]
pub(super) struct IstioStats {
    config: Arc<IstioStatsConfig>,
    store: Store,
    /// Metric handles by label set, shared by the filter's requests.
    metrics: Arc<Keyed<HttpMetrics>>,
}

impl IstioStats {
    /// The filter, its metrics in `store`.
    pub(super) fn new(config: &Arc<IstioStatsConfig>, store: &Store) -> Self {
        IstioStats {
            config: config.clone(),
            store: store.clone(),
            metrics: Arc::default(),
        }
    }

    /// Starts observing a request (before any filter runs, so a request another filter
    /// answers is counted too, as Envoy's stats filter counts it from the access log).
    pub(super) fn start(&self, req: &mut FilterRequest<'_>, encoders: &mut Encoders) {
        let peers = req.peers();
        let host = if self.config.disable_host_header_fallback {
            String::new()
        } else {
            req.headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or(req.authority)
                .to_owned()
        };
        let cluster = req.route_cluster();
        let istio = cluster
            .and_then(|c| req.conn.shared.clusters.get(c))
            .and_then(|c| c.config().istio.clone());
        let route_name = req.route.map(|r| r.route.name.as_str()).unwrap_or("");
        // A client's weighted route: the service is the picked cluster's, once picked.
        let weighted = (cluster.is_none() && req.route.is_some() && !req.conn.drain_scope.inbound)
            .then(|| Weighted {
                host: host.clone(),
                route_name: route_name.to_owned(),
                clusters: req.conn.shared.clusters.clone(),
            });
        let (service_host, service_name) =
            metrics::destination_service(host, cluster, route_name, istio.as_deref());
        let (peer_san, local_san) = match &req.conn.down.tls {
            Some(tls) => (
                tls.peer()
                    .and_then(|c| c.uri_sans().next().map(str::to_owned))
                    .unwrap_or_default(),
                tls.local_uri_sans().first().cloned().unwrap_or_default(),
            ),
            None => (String::new(), String::new()),
        };
        // A client's principals are its upstream connection's, which the router notes.
        let upstream = (!req.conn.drain_scope.inbound)
            .then(|| req.attempt_target.get_or_insert_with(Arc::default).clone());
        let grpc = req
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/grpc"));
        let messages = grpc.then(|| req.grpc_messages.get_or_insert_with(Arc::default).clone());
        let parties = Parties {
            local: req.conn.shared.local_workload.clone(),
            peers,
            server: req.conn.drain_scope.inbound,
            service_host,
            service_name,
            peer_san,
            local_san,
            upstream,
            weighted,
        };
        // An open gRPC call reports its messages every `tcp_reporting_duration`, as Istio's.
        let ticker = messages
            .as_ref()
            .zip(self.config.tcp_reporting)
            .map(|(counts, every)| {
                Ticker::start(
                    every,
                    parties.clone(),
                    counts.clone(),
                    self.config.clone(),
                    self.store.clone(),
                )
            });
        // The request's flags, published by its record once it is settled.
        let flags = req
            .record
            .as_deref_mut()
            .map(|r| r.flags_out.get_or_insert_with(Arc::default).clone());
        // An upgrade's stream ends when its tunnel closes: its record says how, then.
        let tunnel = match req.record.as_deref_mut() {
            Some(r) if req.tunnel => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                r.at_tunnel_end = Some(rx);
                Some(tx)
            }
            _ => None,
        };
        let observed = Observed {
            config: self.config.clone(),
            store: self.store.clone(),
            metrics: self.metrics.clone(),
            parties,
            grpc,
            trailer_status: Arc::default(),
            messages,
            ticker,
            flags,
            started: Instant::now(),
            response: None,
            tunnel,
        };
        encoders
            .0
            .push(Encoder::IstioStats(StatsRequest(Some(Box::new(observed)))));
    }
}

/// What a weighted route's `destination_service` is found from once the router has picked
/// its cluster: the Host header, the route's name, and the clusters.
#[derive(Debug, Clone)]
struct Weighted {
    host: String,
    route_name: String,
    clusters: crate::upstream::ClusterManager,
}

impl Weighted {
    /// `destination_service` and `destination_service_name` for the cluster `picked`.
    fn service(&self, picked: &str) -> (String, String) {
        let cluster = self.clusters.get(picked);
        let istio = cluster.as_ref().and_then(|c| c.config().istio.as_deref());
        metrics::destination_service(self.host.clone(), Some(picked), &self.route_name, istio)
    }
}

/// What the response said, for the labels.
#[derive(Debug)]
struct Answer {
    code: u16,
    grpc_status: Option<String>,
}

/// One request as `istio.stats` observes it, recorded when it ends: when dropped with the
/// response body (or with the request when it is cut short), or, for an upgrade, once its
/// tunnel closes.
#[derive(Debug)]
pub(super) struct StatsRequest(Option<Box<Observed>>);

impl StatsRequest {
    /// See [`Observed::encode`].
    pub(super) fn encode(&mut self, resp: &mut Response<Body>) {
        if let Some(o) = &mut self.0 {
            o.encode(resp);
        }
    }
}

impl Drop for StatsRequest {
    fn drop(&mut self) {
        let Some(mut observed) = self.0.take() else {
            return;
        };
        match observed.tunnel.take() {
            // The record, if it reached a tunnel, gives it back once the tunnel closes.
            Some(tunnel) => {
                if let Err(observed) = tunnel.send(observed) {
                    observed.ended(None);
                }
            }
            // Recorded once the request's flags are final, as Istio's proxy records from its
            // access-log hook: the record settles when the response has ended.
            None => match observed.flags.take() {
                Some(out) => out.when_settled(move |settled| observed.record(None, settled)),
                None => observed.record(None, None),
            },
        }
    }
}

/// What `istio.stats` learns of one request.
#[derive(Debug)]
struct Observed {
    config: Arc<IstioStatsConfig>,
    store: Store,
    /// The filter's metric handles by label set.
    metrics: Arc<Keyed<HttpMetrics>>,
    parties: Parties,
    grpc: bool,
    /// The `grpc-status` of the response's trailers.
    trailer_status: Arc<OnceLock<String>>,
    /// A gRPC call's message counts, as a grpc_stats filter leaves them.
    messages: Option<Arc<MessageCounts>>,
    /// An open gRPC call's periodic reports of them.
    ticker: Option<Ticker>,
    /// Where the request's record publishes its response flags and downstream wire bytes
    /// when it is settled.
    flags: Option<Arc<FlagsOut>>,
    started: Instant,
    response: Option<Answer>,
    /// An upgrade's: where it waits for its tunnel to close.
    tunnel: Option<tokio::sync::oneshot::Sender<Box<dyn AtTunnelEnd>>>,
}

impl AtTunnelEnd for Observed {
    fn ended(self: Box<Self>, rec: Option<&Record>) {
        self.record(rec, None);
    }
}

impl Observed {
    /// Notes the response's code, gRPC status and size; a gRPC response's trailers are
    /// read for its status as they pass.
    fn encode(&mut self, resp: &mut Response<Body>) {
        if self.grpc && !http_body::Body::is_end_stream(resp.body()) {
            let status = self.trailer_status.clone();
            let body = std::mem::replace(resp.body_mut(), crate::body::empty());
            *resp.body_mut() = body
                .map_frame(move |frame| {
                    if let Some(v) = frame
                        .trailers_ref()
                        .and_then(|t| t.get("grpc-status"))
                        .and_then(|v| v.to_str().ok())
                    {
                        let _ = status.set(v.to_owned());
                    }
                    frame
                })
                .boxed_unsync();
        }
        self.response = Some(Answer {
            code: resp.status().as_u16(),
            grpc_status: resp
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        });
    }

    /// Records the request in Istio's metrics; a gRPC call's messages too when a grpc_stats
    /// filter counted them (those not reported while it was open). `tunnel`: an upgrade's
    /// record, settled when its tunnel closed, whose flags, duration and bytes (the tunnel's
    /// both ways) describe the whole stream; else `settled`: what the request's record
    /// published when it settled.
    fn record(&self, tunnel: Option<&Record>, settled: Option<&Settled>) {
        let (flags, wire) = match tunnel {
            Some(rec) => (Some(&rec.flags), Some(rec.downstream_wire)),
            None => (settled.map(|s| &s.flags), settled.map(|s| s.wire)),
        };
        // The ends as labelled at the first periodic report, else as known now (Istio's
        // stats filter labels a stream's ends once).
        let (mut ends, mut reported) = match &self.ticker {
            Some(t) => t.stop(),
            None => (None, (0, 0)),
        };
        if let Some(m) = &self.messages {
            let ends = ends.get_or_insert_with(|| self.parties.ends());
            report_messages(m, &mut reported, ends, &self.store, &self.config);
        }
        let answer = self.response.as_ref();
        // A status's text from http's static table; 0 when no response came.
        let status = answer.and_then(|a| http::StatusCode::from_u16(a.code).ok());
        let code = status.as_ref().map_or("0", http::StatusCode::as_str);
        let grpc_status = match self.grpc {
            true => self
                .trailer_status
                .get()
                .map(String::as_str)
                .or_else(|| answer.and_then(|a| a.grpc_status.as_deref()))
                .unwrap_or_default(),
            false => "",
        };
        let flags = flags.map_or_else(|| "-".to_owned(), |f| f.render(false));
        // The labels in the order Istio's stats filter adds them: the reporter's and the
        // two ends' (see [`Parties::visit_ends`]), then the request's own.
        let labels = |f: &mut dyn FnMut(&'static str, &str)| {
            match &ends {
                Some(ends) => ends.iter().for_each(|(name, value)| f(name, value)),
                None => self.parties.visit_ends(f),
            }
            f("request_protocol", if self.grpc { "grpc" } else { "http" });
            f("response_code", code);
            f("grpc_response_status", grpc_status);
            f("response_flags", &flags);
            f("connection_security_policy", self.parties.security_policy());
        };
        // The stream's downstream wire bytes, as Istio's stats filter reads Envoy's bytes
        // meter (an upgrade's include its tunnel's).
        let wire = wire.unwrap_or_default();
        let duration = match tunnel {
            Some(rec) => rec.duration().unwrap_or_default(),
            None => self.started.elapsed(),
        };
        let values = [duration.as_millis() as u64, wire.received, wire.sent];
        metrics::record_http(&self.metrics, &self.store, &self.config, &labels, values);
    }
}

/// Who a request is between, as Istio's labels name them: what `istio.stats` learned when
/// the request started, and where the exchange and the router note what they learn later.
#[derive(Debug, Clone)]
struct Parties {
    local: Arc<LocalWorkload>,
    peers: Arc<Peers>,
    /// An inbound listener's request: reported by the destination.
    server: bool,
    service_host: String,
    service_name: String,
    /// The downstream's certificate's first URI SAN (inbound TLS).
    peer_san: String,
    /// This side's certificate's first URI SAN (inbound TLS).
    local_san: String,
    /// Where the router notes an outbound request's cluster and upstream connection.
    upstream: Option<Arc<AttemptTarget>>,
    /// Set for a route whose cluster the router picks (weighted).
    weighted: Option<Weighted>,
}

impl Parties {
    /// The peer, once the exchange has read it: the downstream for a server, the upstream
    /// for a client (Istio's `peerInfoRead`).
    fn peer(&self) -> Option<&Workload> {
        if self.server {
            self.peers.downstream.get().map(|w| &**w)
        } else {
            self.peers.upstream.get().map(|w| &**w)
        }
    }

    /// The reporter's and the two ends' labels, as known now: all that Istio's gRPC message
    /// counters carry, and the first of its request metrics' labels.
    fn ends(&self) -> Labels {
        self.with_ends(|ends| ends.labels())
    }

    /// Hands `f` the labels [`Parties::ends`] makes, without making them.
    fn visit_ends(&self, f: &mut dyn FnMut(&'static str, &str)) {
        self.with_ends(|ends| ends.visit(f));
    }

    /// Runs `g` on the two ends as known now.
    fn with_ends<R>(&self, g: impl FnOnce(&Ends<'_>) -> R) -> R {
        let upstream = self.upstream.as_ref().and_then(|t| t.sans());
        let picked = self
            .weighted
            .as_ref()
            .zip(self.upstream.as_ref().and_then(|t| t.cluster()))
            .map(|(w, cluster)| w.service(cluster));
        let (service_host, service_name) = match &picked {
            Some((host, name)) => (host.as_str(), name.as_str()),
            None => (self.service_host.as_str(), self.service_name.as_str()),
        };
        let (peer_san, local_san) = match &upstream {
            Some(sans) => (sans.peer.as_str(), sans.local.as_str()),
            None => (self.peer_san.as_str(), self.local_san.as_str()),
        };
        g(&Ends {
            server: self.server,
            local: &self.local.workload,
            peer: self.peer(),
            peer_san,
            local_san,
            service_host,
            service_name,
        })
    }

    /// `connection_security_policy`: a server's from its downstream's certificates, a
    /// client's `unknown`.
    fn security_policy(&self) -> &'static str {
        Ends {
            server: self.server,
            local: &self.local.workload,
            peer: None,
            peer_san: &self.peer_san,
            local_san: &self.local_san,
            service_host: "",
            service_name: "",
        }
        .security_policy()
    }
}

/// An open gRPC call's periodic message reports, as Istio's stats filter makes them
/// (istio/proxy `istio_stats.cc`: a timer armed for gRPC requests, `onReportTimer` ->
/// `reportHelper(false)`): every `tcp_reporting_duration`, once the exchange has read the
/// peer, the call's ends are labelled (once, for all its metrics) and the messages counted
/// since the report before are added; when the call ends the rest are (see
/// [`Observed::record`]), so nothing is counted twice.
#[derive(Debug)]
struct Ticker {
    reported: Arc<Mutex<Reported>>,
    task: tokio::task::AbortHandle,
}

/// What the periodic reports have done.
#[derive(Debug, Default)]
struct Reported {
    /// The ends' labels, once the peer was read at a report.
    ends: Option<Labels>,
    /// The request's and the response's messages reported so far.
    messages: (u64, u64),
    /// Set when the call ended: no report follows.
    ended: bool,
}

/// Adds the messages of `counts` since those `reported` to Istio's message counters with
/// `ends` (nothing unless a grpc_stats filter counts them, as Istio reads its filter state),
/// and notes them reported.
fn report_messages(
    counts: &MessageCounts,
    reported: &mut (u64, u64),
    ends: &[(&'static str, String)],
    store: &Store,
    config: &IstioStatsConfig,
) {
    if !counts.emitted.load(Ordering::Relaxed) {
        return;
    }
    let now = (
        counts.request.load(Ordering::Relaxed),
        counts.response.load(Ordering::Relaxed),
    );
    metrics::count(store, config, 4, ends, now.0 - reported.0);
    metrics::count(store, config, 5, ends, now.1 - reported.1);
    *reported = now;
}

impl Ticker {
    /// Reports the call of `parties` every `every` until it ends.
    fn start(
        every: Duration,
        parties: Parties,
        counts: Arc<MessageCounts>,
        config: Arc<IstioStatsConfig>,
        store: Store,
    ) -> Ticker {
        let reported = Arc::new(Mutex::new(Reported::default()));
        let shared = reported.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let mut guard = shared.lock().unwrap_or_else(PoisonError::into_inner);
                let r = &mut *guard;
                if r.ended {
                    return;
                }
                if r.ends.is_none() && parties.peer().is_some() {
                    r.ends = Some(parties.ends());
                }
                if let Some(ends) = &r.ends {
                    report_messages(&counts, &mut r.messages, ends, &store, &config);
                }
            }
        })
        .abort_handle();
        Ticker { reported, task }
    }

    /// Ends the reports; answers the ends' labels if a report made them, and the messages
    /// reported (the request's, the response's).
    fn stop(&self) -> (Option<Labels>, (u64, u64)) {
        let mut r = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        r.ended = true;
        (r.ends.take(), r.messages)
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.task.abort();
    }
}
