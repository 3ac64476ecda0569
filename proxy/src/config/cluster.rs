//! Cluster protos -> [`ClusterConfig`]: discovery type, endpoints, load balancing, upstream
//! protocol and connection settings, validated with Envoy's rules.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use proto::pb::envoy::config::cluster::v3::{Cluster, cluster};
use proto::pb::envoy::config::core::v3 as core;
use proto::pb::envoy::config::core::v3::transport_socket;
use proto::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use proto::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use proto::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
};

use super::ConfigError;
use super::Context;
use super::upstream_transport::UpstreamTransport;

pub mod addresses;

pub use addresses::{BootstrapBind, HappyEyeballs, SourceAddresses};

/// The key of the upstream HTTP protocol options in `typed_extension_protocol_options`.
pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_DNS_REFRESH_RATE: Duration = Duration::from_secs(5);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// A compiled cluster: everything the cluster manager needs, plus the proto for config_dump.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// `name`.
    pub name: String,
    /// `alt_stat_name`, or the name: the `observability_name` in /clusters.
    pub observability_name: String,
    /// How hosts are found.
    pub discovery: Discovery,
    /// Endpoints from `load_assignment`, in configuration order.
    pub endpoints: Vec<EndpointConfig>,
    /// Endpoints revoy accepts but cannot connect to yet (unix `pipe`s, internal listeners),
    /// described as `pipe:<path>` / `internal:<listener>`; the server logs them at start-up.
    pub unreachable_endpoints: Vec<String>,
    /// Which hosts are connected to in plaintext, which over TLS, and why any are refused.
    pub transport: UpstreamTransport,
    /// How a host is picked.
    pub lb_policy: LbPolicy,
    /// `connect_timeout` (default 5 s).
    pub connect_timeout: Duration,
    /// `dns_refresh_rate` (default 5 s).
    pub dns_refresh_rate: Duration,
    /// `dns_lookup_family`.
    pub dns_lookup_family: DnsLookupFamily,
    /// The HTTP protocol spoken to the hosts.
    pub protocol: UpstreamProtocol,
    /// `common_http_protocol_options.max_stream_duration`: each upstream stream's time limit
    /// (`UMSDR` when reached); `None` when unset or 0.
    pub max_stream_duration: Option<Duration>,
    /// `common_http_protocol_options.idle_timeout` (default 1 h; `None` when set to 0).
    pub idle_timeout: Option<Duration>,
    /// `max_requests_per_connection`, if limited.
    pub max_requests_per_connection: Option<u32>,
    /// `http_protocol_options.enable_trailers`: an HTTP/1.1 upstream's response trailers are
    /// forwarded (Envoy's HTTP/1 codec drops them by default).
    pub http1_trailers: bool,
    /// `upstream_http_protocol_options` `auto_sni` / `auto_san_validation`: the server name of
    /// each TLS connection comes from the request it is made for.
    pub auto_sni: Option<AutoSni>,
    /// `upstream_bind_config`'s source addresses.
    pub source: SourceAddresses,
    /// The order an endpoint's addresses are tried in
    /// (`upstream_connection_options.happy_eyeballs_config`).
    pub happy_eyeballs: HappyEyeballs,
    /// Circuit breaker thresholds: `[default, high]` priority.
    pub circuit_breakers: [Thresholds; 2],
    /// `common_lb_config.healthy_panic_threshold` in percent (default 50).
    pub panic_threshold: f64,
    /// Whether the cluster came from CDS (set by the caller; shown by /clusters).
    pub added_via_api: bool,
    /// Its `istio` filter metadata as Istio's filters read it (the destination service,
    /// whether metadata exchange skips it).
    pub istio: Option<std::sync::Arc<crate::config::istio::IstioCluster>>,
    /// Its `envoy.filters.network.upstream.metadata_exchange` filter (`filters`).
    pub metadata_exchange: Option<Arc<crate::config::istio::metadata_exchange::TcpExchange>>,
    /// The original proto, for `/config_dump` and change detection.
    pub proto: proto::Encoded<Cluster>,
}

impl ClusterConfig {
    /// Whether `other` describes the same cluster (same proto, same origin): its runtime state
    /// can be kept.
    pub fn same_as(&self, other: &ClusterConfig) -> bool {
        self.added_via_api == other.added_via_api && self.proto == other.proto
    }
}

/// How a cluster's hosts are discovered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// Fixed IP endpoints.
    Static,
    /// Every address of every endpoint name, re-resolved on `dns_refresh_rate`.
    StrictDns,
    /// The first address of the single endpoint name, as one logical host.
    LogicalDns,
    /// Endpoints arrive by EDS under `service_name` (the cluster name when empty).
    Eds {
        /// `eds_cluster_config.service_name` or the cluster name.
        service_name: String,
    },
    /// The connection's original destination (or a request header) is the host.
    OriginalDst {
        /// `original_dst_lb_config.use_http_header`.
        use_http_header: bool,
        /// The header holding `host:port` (default `x-envoy-original-dst-host`).
        header_name: String,
        /// `original_dst_lb_config.upstream_port_override`.
        port_override: Option<u16>,
    },
}

impl Discovery {
    /// Envoy's name for the type (`STATIC`, `STRICT_DNS`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Discovery::Static => "STATIC",
            Discovery::StrictDns => "STRICT_DNS",
            Discovery::LogicalDns => "LOGICAL_DNS",
            Discovery::Eds { .. } => "EDS",
            Discovery::OriginalDst { .. } => "ORIGINAL_DST",
        }
    }

    /// Whether endpoint addresses are names to resolve.
    pub fn uses_dns(&self) -> bool {
        matches!(self, Discovery::StrictDns | Discovery::LogicalDns)
    }
}

/// Where an endpoint is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointAddress {
    /// An IP address and port.
    Ip(SocketAddr),
    /// A DNS name and port (DNS clusters only).
    Dns {
        /// The name to resolve.
        host: String,
        /// The port.
        port: u16,
    },
}

/// `envoy.config.core.v3.Locality`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Locality {
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
    /// Sub-zone.
    pub sub_zone: String,
}

/// A host's health as EDS (or the static config) says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HealthStatus {
    /// UNKNOWN or HEALTHY.
    #[default]
    Healthy,
    /// DEGRADED: used only when no healthy host is left.
    Degraded,
    /// UNHEALTHY or TIMEOUT.
    Unhealthy,
    /// DRAINING.
    Draining,
}

impl HealthStatus {
    /// From the proto enum value.
    pub fn from_proto(v: i32) -> Self {
        match core::HealthStatus::try_from(v) {
            Ok(core::HealthStatus::Unhealthy | core::HealthStatus::Timeout) => Self::Unhealthy,
            Ok(core::HealthStatus::Draining) => Self::Draining,
            Ok(core::HealthStatus::Degraded) => Self::Degraded,
            _ => Self::Healthy,
        }
    }

    /// Envoy's `eds_health_status` name.
    pub fn eds_name(self) -> &'static str {
        match self {
            Self::Healthy => "HEALTHY",
            Self::Degraded => "DEGRADED",
            Self::Unhealthy => "UNHEALTHY",
            Self::Draining => "DRAINING",
        }
    }
}

/// One `lb_endpoint` with its locality's priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Address (IP or name).
    pub address: EndpointAddress,
    /// `endpoint.additional_addresses` (IP endpoints of STATIC and EDS clusters; empty
    /// otherwise): connections race `address` and these (Happy Eyeballs).
    pub additional: Box<[SocketAddr]>,
    /// `load_balancing_weight` (default 1).
    pub weight: u32,
    /// The locality's `priority`.
    pub priority: u32,
    /// The locality, shared by the endpoints of one `LocalityLbEndpoints` (and their hosts).
    pub locality: Arc<Locality>,
    /// `health_status`.
    pub health: HealthStatus,
    /// `endpoint.hostname`.
    pub hostname: String,
    /// Its transport socket: an index into the cluster's [`UpstreamTransport::sockets`].
    pub socket: usize,
}

/// Load balancing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbPolicy {
    /// Weighted round robin.
    RoundRobin,
    /// The host with the fewest active requests among `choices` picked at random (with
    /// replacement, as Envoy's N_CHOICES; `least_request_lb_config.choice_count`, default 2).
    LeastRequest {
        /// How many random hosts are compared.
        choices: u32,
    },
    /// Weighted random.
    Random,
    /// RING_HASH or MAGLEV: consistent on the request hash.
    ConsistentHash,
    /// CLUSTER_PROVIDED (original destination).
    ClusterProvided,
}

/// `dns_lookup_family`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsLookupFamily {
    /// IPv6 addresses if any, else IPv4.
    Auto,
    /// IPv4 only.
    V4Only,
    /// IPv6 only.
    V6Only,
    /// IPv4 addresses if any, else IPv6.
    V4Preferred,
    /// Both families.
    All,
}

/// The HTTP protocol used towards the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 (the default).
    Http1,
    /// HTTP/2 with prior knowledge.
    Http2,
    /// The downstream connection's protocol.
    UseDownstream,
    /// `auto_config`: HTTP/2 or HTTP/1.1 as a TLS host's ALPN decides (HTTP/1.1 in plaintext).
    Auto,
}

/// Circuit breaker thresholds for one routing priority.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// `max_connections` (default 1024).
    pub max_connections: u32,
    /// `max_pending_requests` (default 1024).
    pub max_pending_requests: u32,
    /// `max_requests` (default 1024).
    pub max_requests: u32,
    /// `max_retries` (default 3).
    pub max_retries: u32,
    /// `retry_budget`, which replaces `max_retries` when set.
    pub retry_budget: Option<RetryBudget>,
    /// `track_remaining`: the `remaining_*` gauges are listed.
    pub track_remaining: bool,
}

/// A retry budget: concurrent retries as a share of the requests active or pending.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudget {
    /// `budget_percent` (default 20).
    pub percent: f64,
    /// `min_retry_concurrency` (default 3): retries always allowed, whatever the share.
    pub min_concurrency: u32,
}

impl Thresholds {
    /// How many retries may be in flight at once, with `active` requests sent and `pending`
    /// waiting for a connection: the retry budget's share (at least its floor), else
    /// `max_retries`.
    pub fn retry_limit(&self, active: u64, pending: u64) -> u64 {
        match self.retry_budget {
            Some(b) => {
                let share = (b.percent / 100.0 * (active + pending) as f64) as u64;
                share.max(u64::from(b.min_concurrency))
            }
            None => u64::from(self.max_retries),
        }
    }
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            max_connections: 1024,
            max_pending_requests: 1024,
            max_requests: 1024,
            max_retries: 3,
            retry_budget: None,
            track_remaining: false,
        }
    }
}

/// Records the cluster's settings that revoy does not act on (`path`: the cluster's field
/// path). None of them has a security effect; the transport socket, which has, is refused
/// instead (see [`UpstreamTransport`]).
#[allow(deprecated)] // dns_resolvers and friends are still what Envoy configs use.
pub fn skipped_features(c: &Cluster, path: &str, warnings: &mut super::Warnings) {
    const SYSTEM_RESOLVER: &str = "revoy resolves names with the system resolver (getaddrinfo: /etc/hosts, then the servers of /etc/resolv.conf); this resolver setting has no effect";
    #[allow(deprecated)]
    let common = typed_http_options(c)
        .ok()
        .flatten()
        .and_then(|t| t.common_http_protocol_options)
        .or(c.common_http_protocol_options);
    let common = common.as_ref();
    let skipped = [
        (
            c.typed_dns_resolver_config.is_some(),
            "typed_dns_resolver_config",
            SYSTEM_RESOLVER,
        ),
        (
            !c.dns_resolvers.is_empty(),
            "dns_resolvers",
            SYSTEM_RESOLVER,
        ),
        (
            c.dns_resolution_config.is_some(),
            "dns_resolution_config",
            SYSTEM_RESOLVER,
        ),
        (
            c.use_tcp_for_dns_lookups,
            "use_tcp_for_dns_lookups",
            SYSTEM_RESOLVER,
        ),
        (
            !c.health_checks.is_empty(),
            "health_checks",
            "active health checks are not implemented by revoy; every host counts as healthy",
        ),
        (
            c.outlier_detection.is_some(),
            "outlier_detection",
            "outlier detection is not implemented by revoy; no host is ejected",
        ),
        (
            c.lb_subset_config.is_some(),
            "lb_subset_config",
            "load-balancer subsets are not implemented by revoy; a route's metadata_match picks from every host",
        ),
        (
            c.load_balancing_policy.is_some(),
            "load_balancing_policy",
            "the load-balancing policy extensions are not implemented by revoy; lb_policy applies",
        ),
        (
            c.upstream_bind_config
                .as_ref()
                .is_some_and(SourceAddresses::has_unapplied),
            "upstream_bind_config",
            SourceAddresses::UNAPPLIED,
        ),
        (
            c.upstream_connection_options.as_ref().is_some_and(|o| {
                o.tcp_keepalive.is_some() || o.set_local_interface_name_on_upstream_connections
            }),
            "upstream_connection_options",
            "upstream socket options (TCP keep-alive, the local interface name) are not set by revoy; only happy_eyeballs_config is applied",
        ),
        (
            c.upstream_config.is_some(),
            "upstream_config",
            "custom connection pools are not implemented by revoy; its own pool is used",
        ),
        (
            c.preconnect_policy.is_some(),
            "preconnect_policy",
            "revoy connects when a request needs a connection, never ahead",
        ),
        (
            c.connection_pool_per_downstream_connection,
            "connection_pool_per_downstream_connection",
            "revoy's pools are shared by every downstream connection",
        ),
        (
            c.respect_dns_ttl || c.dns_jitter.is_some() || c.dns_failure_refresh_rate.is_some(),
            "respect_dns_ttl",
            "names are resolved again every dns_refresh_rate, whatever their TTL or a failure",
        ),
        (
            c.lrs_server.is_some() || !c.lrs_report_endpoint_metrics.is_empty(),
            "lrs_server",
            "load reports are not implemented by revoy; none is sent",
        ),
        (
            c.track_timeout_budgets || c.track_cluster_stats.is_some(),
            "track_cluster_stats",
            "these optional cluster stats are not kept by revoy",
        ),
        (
            c.wait_for_warm_on_init.is_some_and(|b| !b.value),
            "wait_for_warm_on_init",
            "start-up waits for every cluster to warm, as by default",
        ),
        (
            c.close_connections_on_host_health_failure || c.ignore_health_on_host_removal,
            "close_connections_on_host_health_failure",
            "revoy has no health checking for these to act on",
        ),
        (
            c.cleanup_interval.is_some(),
            "cleanup_interval",
            "ORIGINAL_DST hosts are cleaned up on revoy's own schedule",
        ),
        (
            common.is_some_and(|o| o.max_connection_duration.is_some()),
            "common_http_protocol_options.max_connection_duration",
            "upstream connections are not drained after a duration by revoy",
        ),
        (
            common.is_some_and(|o| {
                o.max_headers_count.is_some() || o.max_response_headers_kb.is_some()
            }),
            "common_http_protocol_options.max_headers_count",
            "upstream response heads are held to Envoy's default limits (100 headers, 60 KiB)",
        ),
        (
            common.is_some_and(|o| o.headers_with_underscores_action != 0),
            "common_http_protocol_options.headers_with_underscores_action",
            "upstream response headers with underscores are allowed, as by default",
        ),
    ];
    for (_, field, what) in skipped.iter().filter(|(set, _, _)| *set) {
        warnings.skipped(format!("{path}.{field}"), *what);
    }
    if discovery(c).is_ok_and(|d| d.uses_dns()) {
        let lles = c.load_assignment.iter().flat_map(|la| la.endpoints.iter());
        for (i, lle) in lles.enumerate() {
            for (j, lbe) in lle.lb_endpoints.iter().enumerate() {
                if let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &lbe.host_identifier
                    && !ep.additional_addresses.is_empty()
                {
                    warnings.skipped(
                        format!("{path}.load_assignment.endpoints[{i}].lb_endpoints[{j}].endpoint.additional_addresses"),
                        "a DNS cluster connects to the addresses its names resolve to: as in Envoy, additional_addresses are not used",
                    );
                }
            }
        }
    }
    let sockets = c
        .transport_socket
        .iter()
        .map(|t| ("transport_socket".to_owned(), t))
        .chain(
            c.transport_socket_matches
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let at = format!("transport_socket_matches[{i}].transport_socket");
                    m.transport_socket.as_ref().map(|t| (at, t))
                }),
        );
    for (at, socket) in sockets {
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            continue;
        };
        let Ok(tls) = proto::unpack::<UpstreamTlsContext>(any) else {
            continue;
        };
        for (field, what) in super::tls::unacted::upstream(&tls) {
            warnings.skipped(format!("{path}.{at}.typed_config.{field}"), what);
        }
        let Some(params) = tls.common_tls_context.and_then(|c| c.tls_params) else {
            continue;
        };
        for (i, name) in super::tls::provider::left_out_suites(&params) {
            warnings.skipped(
                format!(
                    "{path}.{at}.typed_config.common_tls_context.tls_params.cipher_suites[{i}]"
                ),
                super::tls::provider::left_out_message(&name),
            );
        }
    }
    let thresholds = c.circuit_breakers.iter().flat_map(|cb| &cb.thresholds);
    for (i, t) in thresholds.enumerate() {
        if t.retry_budget
            .as_ref()
            .and_then(|b| b.budget_interval.as_ref())
            .is_some_and(|d| d.seconds > 0 || d.nanos > 0)
        {
            warnings.skipped(
                format!("{path}.circuit_breakers.thresholds[{i}].retry_budget.budget_interval"),
                "a retry budget interval is not implemented by revoy; the budget counts the requests active now",
            );
        }
    }
}

/// Converts a proto Duration, rejecting negative or out-of-range values.
pub(crate) fn duration(
    d: &proto::pb::google::protobuf::Duration,
    path: &str,
) -> Result<Duration, ConfigError> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(ConfigError::new(path, "invalid duration"));
    }
    Ok(Duration::new(d.seconds as u64, d.nanos as u32))
}

/// Compiles one Cluster; `bootstrap_source` is the bootstrap's
/// `cluster_manager.upstream_bind_config`, which a cluster without its own
/// `upstream_bind_config` uses. Errors name the field path relative to the cluster.
#[allow(deprecated)] // dns_refresh_rate and friends are still what Envoy configs use.
pub fn compile_cluster(
    ctx: &Context<'_>,
    c: &Cluster,
    bootstrap_source: SourceAddresses,
) -> Result<ClusterConfig, ConfigError> {
    if c.name.is_empty() {
        return Err(ConfigError::new(
            "name",
            "value length must be at least 1 characters",
        ));
    }
    let discovery = discovery(c)?;
    let lb_policy = lb_policy(c, &discovery)?;
    let transport = UpstreamTransport::compile(ctx, c)?;
    let (endpoints, unreachable_endpoints) = match &c.load_assignment {
        Some(la) => {
            endpoints(la, &discovery, &transport).map_err(|e| e.within("load_assignment"))?
        }
        None => (Vec::new(), Vec::new()),
    };
    if discovery == Discovery::LogicalDns && endpoints.len() + unreachable_endpoints.len() != 1 {
        return Err(ConfigError::new(
            "load_assignment",
            "LOGICAL_DNS clusters must have a single locality_lb_endpoint and a single lb_endpoint",
        ));
    }
    if matches!(discovery, Discovery::OriginalDst { .. }) && !endpoints.is_empty() {
        return Err(ConfigError::new(
            "load_assignment",
            "ORIGINAL_DST clusters must have no load assignment configured",
        ));
    }
    let connect_timeout = opt_duration(c.connect_timeout.as_ref(), "connect_timeout")?
        .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    let dns_refresh_rate = match opt_duration(c.dns_refresh_rate.as_ref(), "dns_refresh_rate")? {
        Some(d) if d < Duration::from_millis(1) => {
            return Err(ConfigError::new(
                "dns_refresh_rate",
                "value must be greater than 1ms",
            ));
        }
        Some(d) => d,
        None => DEFAULT_DNS_REFRESH_RATE,
    };
    let dns_lookup_family = match cluster::DnsLookupFamily::try_from(c.dns_lookup_family) {
        Ok(cluster::DnsLookupFamily::V4Only) => DnsLookupFamily::V4Only,
        Ok(cluster::DnsLookupFamily::V6Only) => DnsLookupFamily::V6Only,
        Ok(cluster::DnsLookupFamily::V4Preferred) => DnsLookupFamily::V4Preferred,
        Ok(cluster::DnsLookupFamily::All) => DnsLookupFamily::All,
        Ok(cluster::DnsLookupFamily::Auto) => DnsLookupFamily::Auto,
        Err(_) => {
            return Err(ConfigError::new(
                "dns_lookup_family",
                "value must be one of the defined enum values",
            ));
        }
    };
    let http = http_options(c)?;
    let source = SourceAddresses::compile(c, bootstrap_source)?;
    let happy_eyeballs = HappyEyeballs::compile(c)?;
    let panic_threshold = c
        .common_lb_config
        .as_ref()
        .and_then(|l| l.healthy_panic_threshold.as_ref())
        .map_or(50.0, |p| p.value);
    Ok(ClusterConfig {
        name: c.name.clone(),
        unreachable_endpoints,
        observability_name: if c.alt_stat_name.is_empty() {
            c.name.clone()
        } else {
            c.alt_stat_name.clone()
        },
        discovery,
        endpoints,
        transport,
        lb_policy,
        connect_timeout,
        dns_refresh_rate,
        dns_lookup_family,
        protocol: http.protocol,
        idle_timeout: http.idle_timeout,
        max_stream_duration: http.max_stream_duration,
        max_requests_per_connection: http.max_requests_per_connection,
        http1_trailers: http.http1_trailers,
        auto_sni: http.auto_sni,
        source,
        happy_eyeballs,
        circuit_breakers: circuit_breakers(c),
        panic_threshold,
        added_via_api: false,
        istio: c
            .metadata
            .as_ref()
            .and_then(|m| m.filter_metadata.get("istio"))
            .map(|m| std::sync::Arc::new(crate::config::istio::IstioCluster::from_metadata(m))),
        metadata_exchange: upstream_exchange(c)?,
        proto: proto::Encoded::new(c),
    })
}

/// The cluster's upstream `istio.metadata_exchange` filter, from `filters` (the only
/// upstream network filter revoy runs; istiod adds no other).
fn upstream_exchange(
    c: &Cluster,
) -> Result<Option<Arc<crate::config::istio::metadata_exchange::TcpExchange>>, ConfigError> {
    use crate::config::istio::{Fields, metadata_exchange};
    for (i, f) in c.filters.iter().enumerate() {
        if let Some(fields) = f
            .typed_config
            .as_ref()
            .and_then(|any| Fields::of(any, metadata_exchange::CONFIG))
        {
            return metadata_exchange::compile(fields)
                .map(|x| Some(Arc::new(x)))
                .map_err(|e| e.within(&format!("filters[{i}].typed_config")));
        }
    }
    Ok(None)
}

/// Compiles an EDS `ClusterLoadAssignment` into `cluster`'s endpoints (the cluster's
/// transport sockets decide which hosts are refused). Endpoints revoy cannot connect to (pipes,
/// internal listeners) are left out.
pub fn compile_assignment(
    la: &ClusterLoadAssignment,
    cluster: &ClusterConfig,
) -> Result<Vec<EndpointConfig>, ConfigError> {
    endpoints(la, &cluster.discovery, &cluster.transport).map(|(eps, _)| eps)
}

fn opt_duration(
    d: Option<&proto::pb::google::protobuf::Duration>,
    path: &str,
) -> Result<Option<Duration>, ConfigError> {
    d.map(|d| duration(d, path)).transpose()
}

fn discovery(c: &Cluster) -> Result<Discovery, ConfigError> {
    let ty = match &c.cluster_discovery_type {
        None => cluster::DiscoveryType::Static,
        Some(cluster::ClusterDiscoveryType::Type(t)) => cluster::DiscoveryType::try_from(*t)
            .map_err(|_| ConfigError::new("type", format!("unknown discovery type {t}")))?,
        Some(cluster::ClusterDiscoveryType::ClusterType(ct)) => {
            return Err(ConfigError::new(
                "cluster_type",
                format!("custom cluster type '{}' is not supported", ct.name),
            ));
        }
    };
    Ok(match ty {
        cluster::DiscoveryType::Static => Discovery::Static,
        cluster::DiscoveryType::StrictDns => Discovery::StrictDns,
        cluster::DiscoveryType::LogicalDns => Discovery::LogicalDns,
        cluster::DiscoveryType::Eds => Discovery::Eds {
            service_name: c
                .eds_cluster_config
                .as_ref()
                .map(|e| e.service_name.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| c.name.clone()),
        },
        cluster::DiscoveryType::OriginalDst => {
            let odc = match &c.lb_config {
                Some(cluster::LbConfig::OriginalDstLbConfig(o)) => Some(o),
                _ => None,
            };
            Discovery::OriginalDst {
                use_http_header: odc.is_some_and(|o| o.use_http_header),
                header_name: odc
                    .map(|o| o.http_header_name.clone())
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "x-envoy-original-dst-host".to_owned()),
                port_override: match odc.and_then(|o| o.upstream_port_override.as_ref()) {
                    Some(p) => Some(u16::try_from(p.value).map_err(|_| {
                        ConfigError::new(
                            "original_dst_lb_config.upstream_port_override",
                            "value must be less than or equal to 65535",
                        )
                    })?),
                    None => None,
                },
            }
        }
    })
}

fn lb_policy(c: &Cluster, discovery: &Discovery) -> Result<LbPolicy, ConfigError> {
    let p = cluster::LbPolicy::try_from(c.lb_policy)
        .map_err(|_| ConfigError::new("lb_policy", format!("unknown lb policy {}", c.lb_policy)))?;
    let policy = match p {
        cluster::LbPolicy::RoundRobin => LbPolicy::RoundRobin,
        cluster::LbPolicy::LeastRequest => LbPolicy::LeastRequest {
            choices: least_request_choices(c)?,
        },
        cluster::LbPolicy::Random => LbPolicy::Random,
        cluster::LbPolicy::RingHash | cluster::LbPolicy::Maglev => LbPolicy::ConsistentHash,
        cluster::LbPolicy::ClusterProvided => LbPolicy::ClusterProvided,
        cluster::LbPolicy::LoadBalancingPolicyConfig => LbPolicy::RoundRobin,
    };
    let original_dst = matches!(discovery, Discovery::OriginalDst { .. });
    if original_dst && policy != LbPolicy::ClusterProvided {
        return Err(ConfigError::new(
            "lb_policy",
            format!(
                "cluster: LB policy {} is not valid for Cluster type ORIGINAL_DST. Only 'CLUSTER_PROVIDED' is allowed with cluster type 'ORIGINAL_DST'",
                p.as_str_name()
            ),
        ));
    }
    if !original_dst && policy == LbPolicy::ClusterProvided {
        return Err(ConfigError::new(
            "lb_policy",
            format!(
                "cluster manager: cluster provided LB specified but cluster '{}' did not provide one. Check cluster documentation.",
                c.name
            ),
        ));
    }
    Ok(policy)
}

/// `least_request_lb_config.choice_count`: 2 when unset; Envoy refuses fewer than 2.
fn least_request_choices(c: &Cluster) -> Result<u32, ConfigError> {
    let count = match &c.lb_config {
        Some(cluster::LbConfig::LeastRequestLbConfig(l)) => l.choice_count.map(|v| v.value),
        _ => None,
    };
    match count {
        None => Ok(2),
        Some(n) if n >= 2 => Ok(n),
        Some(_) => Err(ConfigError::new(
            "least_request_lb_config.choice_count",
            "value must be greater than or equal to 2",
        )),
    }
}

/// The endpoints of a load assignment, each with its transport.
fn endpoints(
    la: &ClusterLoadAssignment,
    discovery: &Discovery,
    transport: &UpstreamTransport,
) -> Result<(Vec<EndpointConfig>, Vec<String>), ConfigError> {
    let mut out = Vec::new();
    let mut unreachable = Vec::new();
    for (i, lle) in la.endpoints.iter().enumerate() {
        let locality =
            Arc::new(
                lle.locality
                    .as_ref()
                    .map_or_else(Locality::default, |l| Locality {
                        region: l.region.clone(),
                        zone: l.zone.clone(),
                        sub_zone: l.sub_zone.clone(),
                    }),
            );
        for (j, lbe) in lle.lb_endpoints.iter().enumerate() {
            let path = format!("endpoints[{i}].lb_endpoints[{j}]");
            let ep = match &lbe.host_identifier {
                Some(lb_endpoint::HostIdentifier::Endpoint(ep)) => ep,
                Some(lb_endpoint::HostIdentifier::EndpointName(_)) => {
                    return Err(ConfigError::new(
                        format!("{path}.endpoint_name"),
                        "named endpoints are not supported",
                    ));
                }
                None => {
                    return Err(ConfigError::new(
                        format!("{path}.endpoint"),
                        "endpoint is required",
                    ));
                }
            };
            let weight = lbe.load_balancing_weight.as_ref().map_or(1, |w| w.value);
            if weight == 0 {
                return Err(ConfigError::new(
                    format!("{path}.load_balancing_weight"),
                    "value must be greater than or equal to 1",
                ));
            }
            let address = match endpoint_address(ep.address.as_ref(), discovery)
                .map_err(|e| e.within(&format!("{path}.endpoint.address")))?
            {
                Reachable::Yes(a) => a,
                Reachable::No(desc) => {
                    unreachable.push(desc);
                    continue;
                }
            };
            let additional = match &address {
                EndpointAddress::Ip(_) => addresses::additional_addresses(ep)
                    .map_err(|e| e.within(&format!("{path}.endpoint")))?,
                EndpointAddress::Dns { .. } => Box::default(),
            };
            out.push(EndpointConfig {
                address,
                additional,
                weight,
                priority: lle.priority,
                locality: locality.clone(),
                health: HealthStatus::from_proto(lbe.health_status),
                hostname: ep.hostname.clone(),
                socket: transport.socket_for(lbe.metadata.as_ref(), lle.metadata.as_ref()),
            });
        }
    }
    // Kept for the cluster's life: no spare capacity.
    out.shrink_to_fit();
    Ok((out, unreachable))
}

/// An endpoint address revoy can connect to, or a description of one it cannot yet.
enum Reachable {
    Yes(EndpointAddress),
    No(String),
}

fn endpoint_address(
    a: Option<&core::Address>,
    discovery: &Discovery,
) -> Result<Reachable, ConfigError> {
    let sa = match a.and_then(|a| a.address.as_ref()) {
        Some(core::address::Address::SocketAddress(sa)) => sa,
        Some(core::address::Address::Pipe(p)) => {
            if p.path.is_empty() {
                return Err(ConfigError::new(
                    "pipe.path",
                    "value length must be at least 1 characters",
                ));
            }
            return Ok(Reachable::No(format!("pipe:{}", p.path)));
        }
        Some(core::address::Address::EnvoyInternalAddress(ia)) => {
            let name = match &ia.address_name_specifier {
                Some(core::envoy_internal_address::AddressNameSpecifier::ServerListenerName(n)) => {
                    n.clone()
                }
                None => String::new(),
            };
            return Ok(Reachable::No(format!("internal:{name}")));
        }
        None => return Err(ConfigError::new("", "address is required")),
    };
    let port = port(sa)?;
    match sa.address.parse::<IpAddr>() {
        Ok(ip) => Ok(Reachable::Yes(EndpointAddress::Ip(SocketAddr::new(
            ip, port,
        )))),
        Err(_) if discovery.uses_dns() => Ok(Reachable::Yes(EndpointAddress::Dns {
            host: sa.address.clone(),
            port,
        })),
        Err(_) => Err(ConfigError::new(
            "socket_address.address",
            format!(
                "malformed IP address: {}. Consider setting resolver_name or setting cluster type to 'STRICT_DNS' or 'LOGICAL_DNS'",
                sa.address
            ),
        )),
    }
}

fn port(sa: &core::SocketAddress) -> Result<u16, ConfigError> {
    match &sa.port_specifier {
        Some(core::socket_address::PortSpecifier::PortValue(p)) => {
            u16::try_from(*p).map_err(|_| {
                ConfigError::new(
                    "socket_address.port_value",
                    "value must be less than or equal to 65535",
                )
            })
        }
        Some(core::socket_address::PortSpecifier::NamedPort(_)) => Err(ConfigError::new(
            "socket_address.named_port",
            "named ports are not supported",
        )),
        None => Ok(0),
    }
}

fn socket_address(sa: &core::SocketAddress) -> Result<SocketAddr, ConfigError> {
    let ip: IpAddr = sa.address.parse().map_err(|_| {
        ConfigError::new("address", format!("malformed IP address: {}", sa.address))
    })?;
    Ok(SocketAddr::new(ip, port(sa)?))
}

struct HttpSettings {
    protocol: UpstreamProtocol,
    idle_timeout: Option<Duration>,
    max_stream_duration: Option<Duration>,
    max_requests_per_connection: Option<u32>,
    http1_trailers: bool,
    auto_sni: Option<AutoSni>,
}

/// A cluster whose upstream TLS connections take their server name from the request each is
/// opened for (Envoy's `auto_sni`): the `Host` header's host, or the header
/// `override_auto_sni_header` names when the request has it. Connections are pooled per name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoSni {
    /// `override_auto_sni_header`.
    pub header: Option<http::HeaderName>,
    /// `auto_san_validation`: the server's certificate must carry a SAN for that name too.
    pub san_validation: bool,
}

/// A cluster's `typed_extension_protocol_options` HTTP options, if it has them.
pub(crate) fn typed_http_options(c: &Cluster) -> Result<Option<HttpProtocolOptions>, ConfigError> {
    c.typed_extension_protocol_options
        .get(HTTP_PROTOCOL_OPTIONS)
        .map(|any| {
            proto::unpack::<HttpProtocolOptions>(any).map_err(|e| {
                ConfigError::new(
                    format!("typed_extension_protocol_options[\"{HTTP_PROTOCOL_OPTIONS}\"]"),
                    e.to_string(),
                )
            })
        })
        .transpose()
}

#[allow(deprecated)]
fn http_options(c: &Cluster) -> Result<HttpSettings, ConfigError> {
    let typed = typed_http_options(c)?;
    let upstream_options = typed
        .as_ref()
        .and_then(|t| t.upstream_http_protocol_options.as_ref());
    let (upstream_options, at) = match upstream_options {
        Some(o) => (
            Some(o),
            format!(
                "typed_extension_protocol_options[\"{HTTP_PROTOCOL_OPTIONS}\"].upstream_http_protocol_options"
            ),
        ),
        None => (
            c.upstream_http_protocol_options.as_ref(),
            "upstream_http_protocol_options".to_owned(),
        ),
    };
    let auto_sni = match upstream_options {
        Some(o) if o.auto_sni => Some(AutoSni {
            header: match o.override_auto_sni_header.as_str() {
                "" => None,
                name => Some(http::HeaderName::try_from(name).map_err(|_| {
                    ConfigError::new(
                        format!("{at}.override_auto_sni_header"),
                        format!("'{name}' is not a header name"),
                    )
                })?),
            },
            san_validation: o.auto_san_validation,
        }),
        // Envoy checks the certificate against the request's host then too, but sends the
        // configured SNI; revoy's TLS connections check the name they send.
        Some(o) if o.auto_san_validation => {
            return Err(ConfigError::new(
                format!("{at}.auto_san_validation"),
                "auto_san_validation without auto_sni is not implemented by revoy",
            ));
        }
        _ => None,
    };
    let protocol = match typed
        .as_ref()
        .and_then(|t| t.upstream_protocol_options.as_ref())
    {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(e)) => match e.protocol_config {
            Some(ProtocolConfig::Http2ProtocolOptions(_)) => UpstreamProtocol::Http2,
            Some(ProtocolConfig::Http3ProtocolOptions(_)) => {
                return Err(ConfigError::new(
                    format!(
                        "typed_extension_protocol_options[\"{HTTP_PROTOCOL_OPTIONS}\"].explicit_http_config.http3_protocol_options"
                    ),
                    "HTTP/3 upstreams are not supported",
                ));
            }
            _ => UpstreamProtocol::Http1,
        },
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_)) => {
            UpstreamProtocol::UseDownstream
        }
        Some(UpstreamProtocolOptions::AutoConfig(_)) => UpstreamProtocol::Auto,
        None if c.http2_protocol_options.is_some() => {
            if c.protocol_selection
                == cluster::ClusterProtocolSelection::UseDownstreamProtocol as i32
            {
                UpstreamProtocol::UseDownstream
            } else {
                UpstreamProtocol::Http2
            }
        }
        None => UpstreamProtocol::Http1,
    };
    let common = typed
        .as_ref()
        .and_then(|t| t.common_http_protocol_options.as_ref())
        .or(c.common_http_protocol_options.as_ref());
    let idle_timeout = match common.and_then(|o| o.idle_timeout.as_ref()) {
        Some(d) => {
            let d = duration(d, "common_http_protocol_options.idle_timeout")?;
            (!d.is_zero()).then_some(d)
        }
        None => Some(DEFAULT_IDLE_TIMEOUT),
    };
    let max_stream_duration = match common.and_then(|o| o.max_stream_duration.as_ref()) {
        Some(d) => {
            let d = duration(d, "common_http_protocol_options.max_stream_duration")?;
            (!d.is_zero()).then_some(d)
        }
        None => None,
    };
    let max_requests_per_connection = common
        .and_then(|o| o.max_requests_per_connection.as_ref())
        .or(c.max_requests_per_connection.as_ref())
        .map(|v| v.value)
        .filter(|v| *v > 0);
    let http1 = match typed
        .as_ref()
        .and_then(|t| t.upstream_protocol_options.as_ref())
    {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(e)) => match &e.protocol_config {
            Some(ProtocolConfig::HttpProtocolOptions(h1)) => Some(h1),
            _ => None,
        },
        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(d)) => {
            d.http_protocol_options.as_ref()
        }
        Some(UpstreamProtocolOptions::AutoConfig(a)) => a.http_protocol_options.as_ref(),
        None => c.http_protocol_options.as_ref(),
    };
    Ok(HttpSettings {
        protocol,
        idle_timeout,
        max_stream_duration,
        max_requests_per_connection,
        http1_trailers: http1.is_some_and(|o| o.enable_trailers),
        auto_sni,
    })
}

fn circuit_breakers(c: &Cluster) -> [Thresholds; 2] {
    let mut out = [Thresholds::default(); 2];
    for t in c.circuit_breakers.iter().flat_map(|cb| &cb.thresholds) {
        let slot = &mut out[usize::from(t.priority == core::RoutingPriority::High as i32)];
        if let Some(v) = &t.max_connections {
            slot.max_connections = v.value;
        }
        if let Some(v) = &t.max_pending_requests {
            slot.max_pending_requests = v.value;
        }
        if let Some(v) = &t.max_requests {
            slot.max_requests = v.value;
        }
        if let Some(v) = &t.max_retries {
            slot.max_retries = v.value;
        }
        slot.track_remaining = t.track_remaining;
        if let Some(b) = &t.retry_budget {
            slot.retry_budget = Some(RetryBudget {
                percent: b.budget_percent.as_ref().map_or(20.0, |p| p.value),
                min_concurrency: b.min_retry_concurrency.as_ref().map_or(3, |v| v.value),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn pipe_and_internal_endpoints_are_kept_aside() {
        let yaml = r#"
name: xds-grpc
type: STATIC
load_assignment:
  cluster_name: xds-grpc
  endpoints:
  - lb_endpoints:
    - endpoint: {address: {pipe: {path: ./etc/istio/proxy/XDS}}}
    - endpoint: {address: {envoy_internal_address: {server_listener_name: inner}}}
    - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: 15012}}}
"#;
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        let c: Cluster = proto::Codec::new().decode(value, false).unwrap().message;
        let cfg = compile_cluster(
            &Context::new(&crate::config::FakeIo::new()),
            &c,
            SourceAddresses::NONE,
        )
        .unwrap();
        assert_eq!(cfg.endpoints.len(), 1);
        assert_eq!(
            cfg.unreachable_endpoints,
            vec!["pipe:./etc/istio/proxy/XDS", "internal:inner"]
        );
    }
    use super::*;

    fn cluster(yaml: &str) -> Cluster {
        let codec = proto::Codec::new();
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        codec.decode::<Cluster>(value, false).unwrap().message
    }

    fn compile(yaml: &str) -> Result<ClusterConfig, ConfigError> {
        compile_cluster(
            &Context::new(&crate::config::FakeIo::new()),
            &cluster(yaml),
            SourceAddresses::NONE,
        )
    }

    #[test]
    fn resolver_settings_are_reported_as_skipped() {
        let c = cluster(
            "name: c\ntype: STRICT_DNS\ndns_resolvers: [{socket_address: {address: 127.0.0.1, port_value: 53}}]\ntyped_dns_resolver_config: {name: envoy.network.dns_resolver.cares, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig}}\n",
        );
        let mut warnings = crate::config::Warnings::new();
        skipped_features(&c, "static_resources.clusters[0]", &mut warnings);
        let found: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with(
            "not implemented (skipped): static_resources.clusters[0].typed_dns_resolver_config: revoy resolves names with the system resolver"
        ));
        assert!(
            found[1].contains("clusters[0].dns_resolvers: "),
            "{found:?}"
        );
    }

    #[test]
    fn an_upstream_max_stream_duration_is_read_from_the_typed_options_first() {
        let both = "name: c\ncommon_http_protocol_options: {max_stream_duration: 1s}\ntyped_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, common_http_protocol_options: {max_stream_duration: 2s}}}\n";
        let http = http_options(&cluster(both)).unwrap();
        assert_eq!(http.max_stream_duration, Some(Duration::from_secs(2)));
        let deprecated = "name: c\ncommon_http_protocol_options: {max_stream_duration: 1s}\n";
        let http = http_options(&cluster(deprecated)).unwrap();
        assert_eq!(http.max_stream_duration, Some(Duration::from_secs(1)));
        let zero = "name: c\ncommon_http_protocol_options: {max_stream_duration: 0s}\n";
        assert_eq!(
            http_options(&cluster(zero)).unwrap().max_stream_duration,
            None
        );
        let mut warnings = crate::config::Warnings::new();
        skipped_features(&cluster(both), "clusters[0]", &mut warnings);
        assert!(warnings.is_empty(), "it is enforced");
    }

    #[test]
    fn extra_source_addresses_apply_and_only_what_is_not_is_named_as_skipped() {
        let yaml = "name: c\nupstream_bind_config: {source_address: {address: 127.0.0.6, port_value: 0}, extra_source_addresses: [{address: {address: '::6', port_value: 0}}]}\nupstream_connection_options: {happy_eyeballs_config: {first_address_family_version: V6, first_address_family_count: 2}}\n";
        let mut warnings = crate::config::Warnings::new();
        skipped_features(&cluster(yaml), "clusters[0]", &mut warnings);
        assert_eq!(warnings.iter().count(), 0);
        let c = compile(yaml).unwrap();
        assert_eq!(c.source.first, Some("127.0.0.6:0".parse().unwrap()));
        assert_eq!(c.source.other, Some("[::6]:0".parse().unwrap()));
        assert_eq!(
            c.happy_eyeballs,
            HappyEyeballs {
                first_family: addresses::FirstFamily::V6,
                first_count: 2
            }
        );
        let freebind = cluster(
            "name: c\nupstream_bind_config: {source_address: {address: 127.0.0.6, port_value: 0}, freebind: true}\nupstream_connection_options: {tcp_keepalive: {}}\n",
        );
        let mut warnings = crate::config::Warnings::new();
        skipped_features(&freebind, "clusters[0]", &mut warnings);
        let paths: Vec<&str> = warnings.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "clusters[0].upstream_bind_config",
                "clusters[0].upstream_connection_options"
            ]
        );
    }

    #[test]
    fn a_cluster_without_a_bind_config_of_its_own_takes_the_bootstrap_s() {
        let bootstrap = SourceAddresses {
            first: Some("127.0.0.3:0".parse().unwrap()),
            other: None,
        };
        let with = |yaml: &str| {
            compile_cluster(
                &Context::new(&crate::config::FakeIo::new()),
                &cluster(yaml),
                bootstrap,
            )
            .unwrap()
            .source
        };
        assert_eq!(with("name: c\n"), bootstrap);
        assert_eq!(
            with("name: c\nupstream_bind_config: {source_address: {address: 127.0.0.4, port_value: 0}}\n").first,
            Some("127.0.0.4:0".parse().unwrap())
        );
        // One without source_address replaces the bootstrap's too (Envoy takes it whole).
        assert_eq!(
            with("name: c\nupstream_bind_config: {}\n"),
            SourceAddresses::NONE
        );
    }

    #[test]
    fn bind_configs_envoy_refuses_are_refused_with_its_words() {
        let bind = |b: &str| compile(&format!("name: c\nupstream_bind_config: {b}\n")).unwrap_err();
        let two_v4 = bind(
            "{source_address: {address: 127.0.0.6, port_value: 0}, extra_source_addresses: [{address: {address: 127.0.0.7, port_value: 0}}]}",
        );
        assert_eq!(
            two_v4.path,
            "upstream_bind_config.extra_source_addresses[0].address"
        );
        assert!(
            two_v4.message.starts_with(
                "Cluster c's upstream binding config has two same IP version source addresses."
            ),
            "{two_v4}"
        );
        let no_source =
            bind("{extra_source_addresses: [{address: {address: '::6', port_value: 0}}]}");
        assert!(
            no_source.message.contains("but no source_address"),
            "{no_source}"
        );
        let both = bind(
            "{source_address: {address: 127.0.0.6, port_value: 0}, extra_source_addresses: [{address: {address: '::6', port_value: 0}}], additional_source_addresses: [{address: '::7', port_value: 0}]}",
        );
        assert!(both.message.starts_with("Can't specify both"), "{both}");
        let two = bind(
            "{source_address: {address: 127.0.0.6, port_value: 0}, additional_source_addresses: [{address: '::6', port_value: 0}, {address: '::7', port_value: 0}]}",
        );
        assert!(
            two.message.contains("more than one extra/additional"),
            "{two}"
        );
    }

    #[test]
    fn additional_addresses_are_ips_of_static_endpoints_and_ignored_for_dns() {
        let endpoint = |ty: &str, host: &str, extra: &str| {
            format!(
                "name: c\ntype: {ty}\nload_assignment: {{endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: {host}, port_value: 80}}}}, additional_addresses: [{{address: {extra}}}]}}}}]}}]}}\n"
            )
        };
        let c = compile(&endpoint(
            "STATIC",
            "127.0.0.1",
            "{socket_address: {address: '::1', port_value: 81}}",
        ))
        .unwrap();
        assert_eq!(&*c.endpoints[0].additional, ["[::1]:81".parse().unwrap()]);
        let e = compile(&endpoint(
            "STATIC",
            "127.0.0.1",
            "{socket_address: {address: localhost, port_value: 81}}",
        ))
        .unwrap_err();
        assert_eq!(
            e.path,
            "load_assignment.endpoints[0].lb_endpoints[0].endpoint.additional_addresses[0].address.socket_address.address"
        );
        assert!(
            e.message.starts_with("malformed IP address: localhost."),
            "{e}"
        );
        let pipe = compile(&endpoint("STATIC", "127.0.0.1", "{pipe: {path: /tmp/p}}")).unwrap_err();
        assert!(
            pipe.path.ends_with("additional_addresses[0].address"),
            "{pipe}"
        );
        let dns = endpoint(
            "STRICT_DNS",
            "backend",
            "{socket_address: {address: '::1', port_value: 81}}",
        );
        assert!(compile(&dns).unwrap().endpoints[0].additional.is_empty());
        let mut warnings = crate::config::Warnings::new();
        skipped_features(&cluster(&dns), "clusters[0]", &mut warnings);
        let paths: Vec<&str> = warnings.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "clusters[0].load_assignment.endpoints[0].lb_endpoints[0].endpoint.additional_addresses"
            ]
        );
    }

    #[test]
    fn static_cluster_with_priorities_weights_and_defaults() {
        let c = compile(
            r#"
name: web
load_assignment:
  endpoints:
  - locality: {region: r, zone: z}
    lb_endpoints:
    - endpoint: {address: {socket_address: {address: 127.0.0.2, port_value: 80}}}
      load_balancing_weight: 3
  - priority: 1
    lb_endpoints:
    - endpoint: {address: {socket_address: {address: "::1", port_value: 81}}}
      health_status: UNHEALTHY
"#,
        )
        .unwrap();
        assert_eq!(c.discovery, Discovery::Static);
        assert_eq!(c.lb_policy, LbPolicy::RoundRobin);
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(c.protocol, UpstreamProtocol::Http1);
        assert_eq!(c.idle_timeout, Some(Duration::from_secs(3600)));
        assert_eq!(c.endpoints.len(), 2);
        assert_eq!(c.endpoints[0].weight, 3);
        assert_eq!(c.endpoints[0].locality.zone, "z");
        assert_eq!(
            c.endpoints[1].address,
            EndpointAddress::Ip("[::1]:81".parse().unwrap())
        );
        assert_eq!(c.endpoints[1].priority, 1);
        assert_eq!(c.endpoints[1].health, HealthStatus::Unhealthy);
        assert_eq!(c.circuit_breakers[0], Thresholds::default());
    }

    #[test]
    fn dns_cluster_settings() {
        let c = compile(
            r#"
name: api
type: STRICT_DNS
lb_policy: LEAST_REQUEST
connect_timeout: 0.25s
dns_refresh_rate: 10s
dns_lookup_family: V4_ONLY
load_assignment:
  endpoints:
  - lb_endpoints:
    - endpoint: {address: {socket_address: {address: api.example.com, port_value: 443}}}
"#,
        )
        .unwrap();
        assert_eq!(c.discovery, Discovery::StrictDns);
        assert_eq!(c.lb_policy, LbPolicy::LeastRequest { choices: 2 });
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.dns_refresh_rate, Duration::from_secs(10));
        assert_eq!(c.dns_lookup_family, DnsLookupFamily::V4Only);
        let unknown = Cluster {
            name: "api".into(),
            dns_lookup_family: 9,
            ..Default::default()
        };
        let e = compile_cluster(
            &Context::new(&crate::config::FakeIo::new()),
            &unknown,
            SourceAddresses::NONE,
        )
        .unwrap_err();
        assert_eq!(e.path, "dns_lookup_family");
        assert_eq!(
            c.endpoints[0].address,
            EndpointAddress::Dns {
                host: "api.example.com".into(),
                port: 443
            }
        );
    }

    #[test]
    fn least_request_choice_count() {
        let config = |count: u32| {
            format!(
                "name: c\nlb_policy: LEAST_REQUEST\nleast_request_lb_config: {{choice_count: {count}}}\nload_assignment: {{endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 80}}}}}}}}]}}]}}\n"
            )
        };
        let c = compile(&config(5)).unwrap();
        assert_eq!(c.lb_policy, LbPolicy::LeastRequest { choices: 5 });
        let err = compile(&config(1)).unwrap_err();
        assert_eq!(err.path, "least_request_lb_config.choice_count");
    }
    #[test]
    fn http2_from_typed_options_deprecated_field_or_downstream() {
        let explicit = compile(
            r#"
name: grpc
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    common_http_protocol_options: {idle_timeout: 30s}
    explicit_http_config: {http2_protocol_options: {}}
"#,
        )
        .unwrap();
        assert_eq!(explicit.protocol, UpstreamProtocol::Http2);
        assert_eq!(explicit.idle_timeout, Some(Duration::from_secs(30)));
        let deprecated = compile("name: g\nhttp2_protocol_options: {}\n").unwrap();
        assert_eq!(deprecated.protocol, UpstreamProtocol::Http2);
        let downstream = compile(
            r#"
name: d
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    use_downstream_protocol_config: {}
"#,
        )
        .unwrap();
        assert_eq!(downstream.protocol, UpstreamProtocol::UseDownstream);
    }

    #[test]
    fn auto_sni_takes_its_header_and_refuses_san_validation_alone() {
        let typed = |options: &str| {
            compile(&format!(
                r#"
name: a
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    upstream_http_protocol_options: {options}
    explicit_http_config: {{http_protocol_options: {{}}}}
"#
            ))
        };
        let auto =
            typed("{auto_sni: true, auto_san_validation: true, override_auto_sni_header: x-sni}")
                .unwrap()
                .auto_sni
                .expect("auto_sni");
        assert_eq!(auto.header.as_ref().map(|h| h.as_str()), Some("x-sni"));
        assert!(auto.san_validation);
        assert_eq!(typed("{}").unwrap().auto_sni, None);
        let alone = typed("{auto_san_validation: true}").unwrap_err();
        assert!(
            alone
                .path
                .ends_with("upstream_http_protocol_options.auto_san_validation")
        );
        let bad = typed("{auto_sni: true, override_auto_sni_header: \"a b\"}").unwrap_err();
        assert!(
            bad.path.ends_with(".override_auto_sni_header"),
            "{}",
            bad.path
        );
        let deprecated = compile("name: d\nupstream_http_protocol_options: {auto_sni: true}\n")
            .unwrap()
            .auto_sni
            .expect("auto_sni from the deprecated field");
        assert!(!deprecated.san_validation);
    }

    #[test]
    fn http1_trailers_only_when_enabled() {
        assert!(!compile("name: plain\n").unwrap().http1_trailers);
        let typed = compile(
            r#"
name: t
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {http_protocol_options: {enable_trailers: true}}
"#,
        )
        .unwrap();
        assert!(typed.http1_trailers);
        let deprecated =
            compile("name: d\nhttp_protocol_options: {enable_trailers: true}\n").unwrap();
        assert!(deprecated.http1_trailers);
    }

    #[test]
    fn original_dst_eds_bind_and_circuit_breakers() {
        let c = compile(
            r#"
name: passthrough
type: ORIGINAL_DST
lb_policy: CLUSTER_PROVIDED
original_dst_lb_config: {use_http_header: true}
upstream_bind_config: {source_address: {address: 127.0.0.6, port_value: 0}}
circuit_breakers:
  thresholds:
  - {max_connections: 10, max_requests: 20}
  - {priority: HIGH, max_retries: 7}
"#,
        )
        .unwrap();
        assert_eq!(
            c.discovery,
            Discovery::OriginalDst {
                use_http_header: true,
                header_name: "x-envoy-original-dst-host".into(),
                port_override: None
            }
        );
        assert_eq!(c.source.first, Some("127.0.0.6:0".parse().unwrap()));
        assert_eq!(c.source.other, None);
        assert_eq!(c.circuit_breakers[0].max_connections, 10);
        assert_eq!(c.circuit_breakers[0].max_requests, 20);
        assert_eq!(c.circuit_breakers[0].max_pending_requests, 1024);
        assert_eq!(c.circuit_breakers[1].max_retries, 7);
        let eds = compile(
            "name: outbound|80||svc\ntype: EDS\neds_cluster_config: {eds_config: {ads: {}}}\n",
        )
        .unwrap();
        assert_eq!(
            eds.discovery,
            Discovery::Eds {
                service_name: "outbound|80||svc".into()
            }
        );
        assert!(eds.endpoints.is_empty());
    }

    #[test]
    fn errors_name_the_field_and_use_envoys_words() {
        let e = compile(
            "name: c\nload_assignment: {endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: localhost, port_value: 80}}}}]}]}\n",
        )
        .unwrap_err();
        assert_eq!(
            e.path,
            "load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address"
        );
        assert!(
            e.message.starts_with("malformed IP address: localhost."),
            "{e}"
        );

        let e = compile("name: c\ntype: ORIGINAL_DST\n").unwrap_err();
        assert_eq!(e.path, "lb_policy");
        assert!(
            e.message
                .contains("ROUND_ROBIN is not valid for Cluster type ORIGINAL_DST")
        );

        let e = compile(
            "name: c\ntype: LOGICAL_DNS\nload_assignment: {endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: a, port_value: 1}}}}, {endpoint: {address: {socket_address: {address: b, port_value: 1}}}}]}]}\n",
        )
        .unwrap_err();
        assert_eq!(e.path, "load_assignment");

        let e = compile(
            "name: c\nload_assignment: {endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 203.0.113.4, port_value: 1}}}}, {load_balancing_weight: 0, endpoint: {address: {socket_address: {address: 203.0.113.4, port_value: 2}}}}]}]}\n",
        )
        .unwrap_err();
        assert_eq!(
            e.path,
            "load_assignment.endpoints[0].lb_endpoints[1].load_balancing_weight"
        );

        assert_eq!(compile("connect_timeout: 1s\n").unwrap_err().path, "name");
    }

    #[test]
    fn same_proto_means_same_cluster() {
        let a = compile("name: a\n").unwrap();
        let b = compile("name: a\n").unwrap();
        let c = compile("name: a\nconnect_timeout: 2s\n").unwrap();
        assert!(a.same_as(&b));
        assert!(!a.same_as(&c));
    }
}
