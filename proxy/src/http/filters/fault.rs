//! `envoy.filters.http.fault`: injected delays and aborts.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Response, StatusCode};

use super::{Encoder, Encoders, FilterRequest};
use crate::access_log::ResponseFlag;
use crate::body::Body;
use crate::config::http_filter::fault::{AbortError, DelaySource, FaultConfig, FaultKeys};
use crate::http::local_reply::{local_reply, local_reply_with_grpc_status};
use crate::route::matcher::{FractionalPercent, Runtime};
use crate::runtime::LiveRuntime;
use crate::stats::keyed::Keyed;
use crate::stats::{Counter, Gauge, Store};

static DELAY_REQUEST: HeaderName = HeaderName::from_static("x-envoy-fault-delay-request");
static DELAY_PERCENTAGE: HeaderName =
    HeaderName::from_static("x-envoy-fault-delay-request-percentage");
static ABORT_REQUEST: HeaderName = HeaderName::from_static("x-envoy-fault-abort-request");
static ABORT_GRPC_REQUEST: HeaderName = HeaderName::from_static("x-envoy-fault-abort-grpc-request");
static ABORT_PERCENTAGE: HeaderName =
    HeaderName::from_static("x-envoy-fault-abort-request-percentage");
static DOWNSTREAM_NODE: HeaderName = HeaderName::from_static("x-envoy-downstream-service-node");
static DOWNSTREAM_CLUSTER: HeaderName =
    HeaderName::from_static("x-envoy-downstream-service-cluster");

/// The fault filter of one connection manager.
#[derive(Debug)]
pub(super) struct Fault {
    config: Arc<FaultConfig>,
    stats: Stats,
}

/// `http.<prefix>.fault.*`.
#[derive(Debug, Clone)]
struct Stats {
    delays_injected: Counter,
    aborts_injected: Counter,
    faults_overflow: Counter,
    active_faults: Gauge,
    store: Store,
    prefix: String,
    /// `<downstream cluster>.delays_injected` and `.aborts_injected`, by downstream cluster
    /// (held: the store frees a metric nothing holds).
    by_downstream: Arc<Keyed<[Counter; 2]>>,
}

/// A request's injected fault, counted in `active_faults` until it is dropped.
#[derive(Debug)]
pub(super) struct ActiveFault(Gauge);

impl Drop for ActiveFault {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Fault {
    /// The filter with `config`, its stats under `http.<stat_prefix>.fault.`.
    pub(super) fn new(config: &Arc<FaultConfig>, store: &Store, stat_prefix: &str) -> Fault {
        let prefix = format!("http.{stat_prefix}.fault.");
        let stats = Stats {
            delays_injected: store.counter(&format!("{prefix}delays_injected")),
            aborts_injected: store.counter(&format!("{prefix}aborts_injected")),
            faults_overflow: store.counter(&format!("{prefix}faults_overflow")),
            active_faults: store.gauge(&format!("{prefix}active_faults")),
            store: store.clone(),
            prefix,
            by_downstream: Arc::default(),
        };
        // Envoy registers the response rate limit's counter with the others.
        let _ = store.counter(&format!("{}response_rl_injected", stats.prefix));
        Fault {
            config: config.clone(),
            stats,
        }
    }

    /// Delays and/or aborts `req` as its settings (the route's, else the filter's) say. As
    /// Envoy, `max_active_faults` is checked only when a fault is about to be injected (each
    /// fault refused counts in `faults_overflow`), and a delay not followed by an abort stops
    /// counting as active once it ends.
    pub(super) async fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        route_settings: Option<&FaultConfig>,
        encoders: &mut Encoders,
    ) -> Option<Response<Body>> {
        let config = route_settings.unwrap_or(&*self.config);
        if !applies(config, req) {
            return None;
        }
        let rt = Overrides(&req.conn.shared.runtime, &config.keys);
        let downstream_cluster = req
            .headers
            .get(&DOWNSTREAM_CLUSTER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        if let Some(delay) = delay_of(config, req.headers, &rt)
            && let Some(guard) = self.try_activate(config, &rt)
        {
            self.count(config, true, downstream_cluster.as_deref());
            req.note(ResponseFlag::DelayInjected, None);
            tracing::debug!(ms = delay.as_millis() as u64, "fault: delaying request");
            tokio::time::sleep(delay).await;
            // Without an abort to follow, the guard drops here: the delay's fault has ended.
            let abort = abort_of(config, req.headers, &rt)?;
            return Some(self.abort(config, req, abort, guard, encoders, downstream_cluster));
        }
        let abort = abort_of(config, req.headers, &rt)?;
        let guard = self.try_activate(config, &rt)?;
        Some(self.abort(config, req, abort, guard, encoders, downstream_cluster))
    }

    /// The abort's local reply, counted; the request's active fault (`guard`) is held until
    /// the request ends.
    fn abort(
        &self,
        config: &FaultConfig,
        req: &mut FilterRequest<'_>,
        (status, grpc): (StatusCode, Option<u16>),
        guard: ActiveFault,
        encoders: &mut Encoders,
        downstream_cluster: Option<String>,
    ) -> Response<Body> {
        self.count(config, false, downstream_cluster.as_deref());
        encoders.0.push(Encoder::ActiveFault { _guard: guard });
        req.note(ResponseFlag::FaultInjected, Some("fault_filter_abort"));
        match grpc {
            Some(g) => local_reply_with_grpc_status(status, "fault filter abort", g),
            None => local_reply(status, "fault filter abort"),
        }
    }

    /// Counts one injected fault (`delay`, else an abort), and under the downstream cluster's
    /// name too unless the filter disables those stats.
    fn count(&self, config: &FaultConfig, delay: bool, downstream_cluster: Option<&str>) {
        let i = usize::from(!delay);
        [&self.stats.delays_injected, &self.stats.aborts_injected][i].inc();
        let Some(c) = downstream_cluster.filter(|_| !config.disable_downstream_cluster_stats)
        else {
            return;
        };
        let counters = self.stats.by_downstream.get(c, || {
            ["delays_injected", "aborts_injected"].map(|n| {
                self.stats
                    .store
                    .counter(&format!("{}{c}.{n}", self.stats.prefix))
            })
        });
        counters[i].inc();
    }

    /// Counts the request in `active_faults` until the returned guard drops, unless the
    /// filter already has `max_active_faults` active (then counts `faults_overflow`).
    fn try_activate(&self, config: &FaultConfig, rt: &Overrides<'_>) -> Option<ActiveFault> {
        let max = config.max_active_faults;
        if let Some(max) = rt.integer(&rt.1.max_active_faults).or(max)
            && self.stats.active_faults.value() >= max
        {
            self.stats.faults_overflow.inc();
            return None;
        }
        self.stats.active_faults.inc();
        Some(ActiveFault(self.stats.active_faults.clone()))
    }
}

/// Whether the request is one `config`'s faults apply to: its cluster, downstream node and
/// headers.
fn applies(config: &FaultConfig, req: &FilterRequest<'_>) -> bool {
    if !config.upstream_cluster.is_empty() {
        let cluster = req
            .route
            .and_then(|s| s.route.forward())
            .and_then(|f| match &f.cluster {
                crate::route::action::ClusterSpecifier::Name(n) => Some(n.as_str()),
                _ => None,
            });
        if cluster != Some(config.upstream_cluster.as_str()) {
            return false;
        }
    }
    if !config.downstream_nodes.is_empty() {
        let node = req
            .headers
            .get(&DOWNSTREAM_NODE)
            .and_then(|v| v.to_str().ok());
        if !node.is_some_and(|n| config.downstream_nodes.iter().any(|d| d == n)) {
            return false;
        }
    }
    let route_req = req.route_request();
    config.headers.iter().all(|h| h.matches(&route_req))
}

/// The runtime and the keys of the request's fault settings.
struct Overrides<'a>(&'a LiveRuntime, &'a FaultKeys);

impl Overrides<'_> {
    /// Envoy's `getInteger(key, default)`, without the default.
    fn integer(&self, key: &str) -> Option<u64> {
        self.0.integer(key)
    }

    /// Envoy's `featureEnabled(key, percentage)`: the key's value, else `percentage`.
    fn sampled(&self, key: &str, percentage: FractionalPercent) -> bool {
        self.0.feature_enabled(key, percentage, rand::random())
    }
}

/// The delay to inject, if any: enabled by its percentage and longer than 0 ms, the runtime's
/// values overriding the settings' (and the request's headers').
fn delay_of(config: &FaultConfig, headers: &HeaderMap, rt: &Overrides<'_>) -> Option<Duration> {
    let delay = config.delay.as_ref()?;
    let (duration, percentage) = match delay.duration {
        DelaySource::Fixed(d) => (Some(d), delay.percentage),
        DelaySource::Header => (
            first_number(headers, &DELAY_REQUEST).map(Duration::from_millis),
            from_header(delay.percentage, headers, &DELAY_PERCENTAGE),
        ),
    };
    if !rt.sampled(&rt.1.delay_percent, percentage) {
        return None;
    }
    let duration = duration.map(|d| {
        rt.integer(&rt.1.delay_duration)
            .map_or(d, Duration::from_millis)
    });
    duration.filter(|d| d.as_millis() > 0)
}

/// The abort to inject, if any: its HTTP status, and the gRPC status for gRPC requests.
fn abort_of(
    config: &FaultConfig,
    headers: &HeaderMap,
    rt: &Overrides<'_>,
) -> Option<(StatusCode, Option<u16>)> {
    let abort = config.abort.as_ref()?;
    let (http, grpc, percentage) = match abort.error {
        AbortError::Http(s) => (Some(s), None, abort.percentage),
        AbortError::Grpc(g) => (None, Some(g), abort.percentage),
        AbortError::Header => (
            first_number(headers, &ABORT_REQUEST)
                .filter(|c| (200..600).contains(c))
                .map(|c| c as u16),
            first_number(headers, &ABORT_GRPC_REQUEST).and_then(|g| u32::try_from(g).ok()),
            from_header(abort.percentage, headers, &ABORT_PERCENTAGE),
        ),
    };
    if !rt.sampled(&rt.1.abort_percent, percentage) {
        return None;
    }
    let http = http.map(|s| {
        rt.integer(&rt.1.abort_http_status)
            .filter(|s| (200..600).contains(s))
            .map_or(s, |s| s as u16)
    });
    let grpc = grpc.map(|g| {
        rt.integer(&rt.1.abort_grpc_status)
            .and_then(|g| u32::try_from(g).ok())
            .unwrap_or(g)
    });
    let grpc = grpc.map(|g| g.min(u32::from(u16::MAX)) as u16);
    match (http, grpc) {
        (Some(s), g) => Some((StatusCode::from_u16(s).ok()?, g)),
        (None, Some(g)) => Some((StatusCode::OK, Some(g))),
        (None, None) => None,
    }
}

/// The first value of header `name` as a number (only the first: the header is untrusted).
fn first_number(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

/// A header-controlled fault's percentage: the header's numerator capped at the configured
/// one, over the configured denominator.
fn from_header(
    configured: FractionalPercent,
    headers: &HeaderMap,
    name: &HeaderName,
) -> FractionalPercent {
    match first_number(headers, name).and_then(|n| u32::try_from(n).ok()) {
        Some(n) => FractionalPercent {
            numerator: n.min(configured.numerator),
            denominator: configured.denominator,
        },
        None => configured,
    }
}
