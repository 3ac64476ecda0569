//! `Listener` -> [`ListenerConfig`]: bind address, listener filters, filter chains.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{
    Address, address, socket_address::PortSpecifier, transport_socket,
};
use proto::pb::envoy::config::listener::v3::{FilterChain, Listener, filter, listener_filter};
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use proto::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy as TcpProxyProto;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;

use super::filter_chain_match::ChainMatch;
use super::filter_disabled::FilterDisabled;
use super::hcm::{HcmConfig, compile_hcm};
pub use super::listen_address::ListenAddress;
use super::listen_address::{compile_addresses, is_udp};
use super::tcp_proxy::TcpProxyConfig;
use super::{ConfigError, Context, Warnings};

/// The filter that terminates a chain: what the connection is used for.
#[derive(Debug, Clone)]
pub enum Terminal {
    /// HTTP connection manager.
    Http(Arc<HcmConfig>),
    /// tcp_proxy.
    Tcp(Arc<TcpProxyConfig>),
}

/// A compiled filter chain.
#[derive(Debug, Clone)]
pub struct ChainConfig {
    /// `name`, or `filter_chains[i]` when unnamed.
    pub name: String,
    /// Its `filter_chain_match`.
    pub matcher: ChainMatch,
    /// The terminal network filter.
    pub terminal: Terminal,
    /// The network filters before it that may close a new connection, in chain order.
    pub limits: Vec<super::network_limits::NetworkLimit>,
    /// The `envoy.filters.network.rbac` filters before it, in order.
    pub rbac: Vec<Arc<super::rbac::NetworkRbacConfig>>,
    /// Whether it has Istio's `istio_authn` filter (the connection's SPIFFE principals
    /// become filter state, see `crate::filter_state`).
    pub istio_authn: bool,
    /// Its `istio.metadata_exchange` filter (a TCP chain's), if it has one.
    pub metadata_exchange: Option<Arc<super::istio::metadata_exchange::TcpExchange>>,
    /// Its `istio.stats` network filter (a TCP chain's), if it has one.
    pub istio_stats: Option<Arc<super::istio::stats::IstioStatsConfig>>,
    /// The compiled `DownstreamTlsContext` of the `transport_socket`, when the chain
    /// terminates TLS and serves (a refused chain's context is not compiled).
    pub tls: Option<Arc<super::tls::downstream::ServerTls>>,
    /// Why every connection this chain is chosen for is closed at once: it needs a feature
    /// revoy does not implement and that must not be skipped (a network filter that controls
    /// access, TLS versions before 1.2 only).
    pub refused: Option<Arc<str>>,
    /// A digest of the chain's `FilterChain` proto: an update that leaves it unchanged keeps
    /// the chain's runtime state and connections.
    pub fingerprint: u64,
}

/// Listener filters revoy implements.
#[derive(Debug, Clone, Default)]
pub struct ListenerFilters {
    /// `envoy.filters.listener.local_ratelimit`: a token per accepted socket.
    pub rate_limit: Option<super::network_limits::ListenerRateLimit>,
    /// Whether the rate limit comes before the inspecting filters (else it runs once they
    /// have read what they need, as Envoy runs listener filters in order).
    pub rate_limit_first: bool,
    /// `envoy.filters.listener.original_dst`: use SO_ORIGINAL_DST as the local address.
    pub original_dst: bool,
    /// `envoy.filters.listener.tls_inspector`: read SNI/ALPN from the ClientHello.
    pub tls_inspector: bool,
    /// `envoy.filters.listener.http_inspector`: detect HTTP/1.x vs h2c.
    pub http_inspector: bool,
    /// `listener_filters_timeout` (15 s unless set; `None` when set to 0): how long the
    /// inspecting filters may wait for the bytes they need.
    pub timeout: Option<std::time::Duration>,
    /// `continue_on_listener_filters_timeout`: at the timeout, pick a chain with what is known
    /// (else the connection is closed).
    pub continue_on_timeout: bool,
    /// Each filter's `filter_disabled`: the connections it skips.
    pub disabled: DisabledOn,
}

/// The `filter_disabled` of each listener filter revoy runs (`None`: it runs on every
/// connection).
#[derive(Debug, Clone, Default)]
pub struct DisabledOn {
    /// `original_dst`'s (matched against the port the connection came to).
    pub original_dst: Option<FilterDisabled>,
    /// `tls_inspector`'s (against the original destination's port, after `original_dst`).
    pub tls_inspector: Option<FilterDisabled>,
    /// `http_inspector`'s.
    pub http_inspector: Option<FilterDisabled>,
    /// `local_ratelimit`'s.
    pub rate_limit: Option<FilterDisabled>,
}

/// A compiled listener.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Listener name (defaults to its address, like Envoy).
    pub name: String,
    /// Where it listens (the address that names it in stats and admin).
    pub address: SocketAddr,
    /// `address`'s `ipv4_compat`.
    pub ipv4_compat: bool,
    /// `additional_addresses`: more addresses it listens on, each with its own sockets, all
    /// feeding the same filter chains.
    pub additional_addresses: Vec<ListenAddress>,
    /// `bind_to_port` (false: only reachable through a `use_original_dst` hand-off).
    pub bind_to_port: bool,
    /// Hand connections to the listener bound to their original destination.
    pub use_original_dst: bool,
    /// `transparent`: the socket is bound with `IP_TRANSPARENT` (`IPV6_TRANSPARENT`), so it
    /// accepts connections iptables TPROXY diverts to it (Istio's TPROXY interception);
    /// `None` leaves the socket option alone, as Envoy does.
    pub transparent: Option<bool>,
    /// Listener filters.
    pub filters: ListenerFilters,
    /// Filter chains in configuration order.
    pub chains: Vec<ChainConfig>,
    /// `default_filter_chain`.
    pub default_chain: Option<ChainConfig>,
    /// `traffic_direction` is INBOUND (`/drain_listeners?inboundonly`).
    pub inbound: bool,
    /// `drain_type: MODIFY_ONLY`: `/healthcheck/fail` does not drain the listener.
    pub drain_modify_only: bool,
    /// What names the listener's stats: its `stat_prefix`, else its address with `:` made `_`
    /// as Envoy sanitizes stat names (`127.0.0.1_10000`, `[__]_80`).
    pub stats_name: String,
    /// `access_log`: written for connections no filter chain took.
    pub access_logs: crate::access_log::AccessLogs,
}

impl ListenerConfig {
    /// Every address it listens on: `address` first, then the additional ones in order.
    pub fn addresses(&self) -> impl Iterator<Item = ListenAddress> + '_ {
        let main = ListenAddress {
            address: self.address,
            ipv4_compat: self.ipv4_compat,
        };
        std::iter::once(main).chain(self.additional_addresses.iter().copied())
    }

    /// Stats prefix `listener.<stats_name>`.
    pub fn stat_prefix(&self) -> String {
        format!("listener.{}", self.stats_name)
    }

    /// The prefixes of the stats Envoy makes in the listener's own scopes, which go with the
    /// listener once nothing else makes them: `listener.<stats_name>.`, its listener rate
    /// limit's, and each chain's ([`ChainConfig::stat_prefixes`]).
    pub fn stat_prefixes(&self) -> BTreeSet<String> {
        let listener = format!("{}.", self.stat_prefix());
        let rate_limit = self
            .filters
            .rate_limit
            .as_ref()
            .map(|r| format!("listener_local_ratelimit.{}.", r.stat_prefix));
        let chains = self.chains.iter().chain(&self.default_chain);
        let chains: Vec<String> = chains.flat_map(|c| c.stat_prefixes(&listener)).collect();
        std::iter::once(listener)
            .chain(rate_limit)
            .chain(chains)
            .collect()
    }
}

impl ChainConfig {
    /// The prefixes of the stats Envoy makes in the chain's scope, which go with the chain
    /// (when an update drops it, after its drain) once nothing else makes them: its network
    /// filters' (`<stat_prefix>rbac.`, `local_rate_limit.<p>.`, `connection_limit.<p>.`,
    /// `ratelimit.<p>.`) and its terminal's: `tcp.<stat_prefix>.`, or a connection manager's
    /// `http.<stat_prefix>.` and its copy under `listener` (`listener.<stats_name>.`).
    pub fn stat_prefixes(&self, listener: &str) -> Vec<String> {
        use super::network_limits::NetworkLimit;
        let mut prefixes: Vec<String> = self
            .rbac
            .iter()
            .map(|r| format!("{}rbac.", r.stat_prefix))
            .collect();
        prefixes.extend(self.limits.iter().map(|l| match l {
            NetworkLimit::RateLimit(r) => format!("local_rate_limit.{}.", r.stat_prefix),
            NetworkLimit::ConnectionLimit(c) => format!("connection_limit.{}.", c.stat_prefix),
            NetworkLimit::Service(s) => format!("ratelimit.{}.", s.stat_prefix),
        }));
        match &self.terminal {
            Terminal::Http(h) => {
                prefixes.push(format!("http.{}.", h.stat_prefix));
                prefixes.push(format!("{listener}http.{}.", h.stat_prefix));
            }
            Terminal::Tcp(t) => prefixes.push(format!("tcp.{}.", t.stat_prefix)),
        }
        prefixes
    }
}

/// A socket address as an `Address` proto (what admin and ext_authz report).
pub fn address_proto(addr: SocketAddr) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(
            proto::pb::envoy::config::core::v3::SocketAddress {
                address: addr.ip().to_string(),
                port_specifier: Some(PortSpecifier::PortValue(u32::from(addr.port()))),
                ..Default::default()
            },
        )),
    }
}

/// Resolves a listener `Address` to a socket address (IP literals only, like Envoy).
pub fn socket_addr(addr: Option<&Address>, path: &str) -> Result<SocketAddr, ConfigError> {
    let Some(address::Address::SocketAddress(sa)) = addr.and_then(|a| a.address.as_ref()) else {
        return Err(ConfigError::new(
            path,
            "only socket_address listener addresses are supported by revoy",
        ));
    };
    let ip: IpAddr = sa.address.parse().map_err(|_| {
        ConfigError::new(
            format!("{path}.socket_address.address"),
            format!("malformed IP address: {}", sa.address),
        )
    })?;
    let port = match &sa.port_specifier {
        Some(PortSpecifier::PortValue(p)) => u16::try_from(*p).map_err(|_| {
            ConfigError::new(
                format!("{path}.socket_address.port_value"),
                format!("invalid port {p}"),
            )
        })?,
        Some(PortSpecifier::NamedPort(n)) => {
            return Err(ConfigError::new(
                format!("{path}.socket_address.named_port"),
                format!("named port '{n}' is not supported"),
            ));
        }
        None => 0,
    };
    Ok(SocketAddr::new(ip, port))
}

const DOWNSTREAM_TLS: &str = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const HCM: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TCP_PROXY: &str = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const NETWORK_RBAC: &str = "envoy.extensions.filters.network.rbac.v3.RBAC";

/// Compiles a filter chain, all but its TLS context, which is returned to be built by
/// [`build_tls`] once the chain is known to serve.
fn compile_chain(
    ctx: &Context<'_>,
    chain: &FilterChain,
    path: &str,
    clusters: Option<&dyn Fn(&str) -> bool>,
    skipped_listener_filter: Option<&str>,
    warnings: &mut Warnings,
) -> Result<(ChainConfig, Option<DownstreamTlsContext>), ConfigError> {
    let matcher = ChainMatch::compile(
        chain.filter_chain_match.as_ref(),
        &format!("{path}.filter_chain_match"),
    )?;
    let tls = match &chain.transport_socket {
        None => None,
        Some(ts) => match &ts.config_type {
            Some(transport_socket::ConfigType::TypedConfig(any))
                if proto::type_name_of(&any.type_url) == DOWNSTREAM_TLS =>
            {
                Some(proto::unpack::<DownstreamTlsContext>(any).map_err(|e| {
                    ConfigError::new(
                        format!("{path}.transport_socket.typed_config"),
                        e.to_string(),
                    )
                })?)
            }
            Some(transport_socket::ConfigType::TypedConfig(any))
                if any.type_url.ends_with("raw_buffer.v3.RawBuffer") =>
            {
                None
            }
            _ => {
                return Err(ConfigError::new(
                    format!("{path}.transport_socket"),
                    format!("transport socket '{}' is not supported by revoy", ts.name),
                ));
            }
        },
    };
    let mut terminal = None;
    let mut limits = Vec::new();
    let mut rbac = Vec::new();
    let mut metadata_exchange = None;
    let mut istio_authn = false;
    let mut istio_stats = None;
    let mut refused: Option<String> = None;
    // The first listener or network filter revoy skips: what it may set (dynamic metadata,
    // filter state) is unknown to later RBAC rules.
    let mut skipped: Option<String> = skipped_listener_filter.map(str::to_owned);
    for (i, f) in chain.filters.iter().enumerate() {
        let fpath = format!("{path}.filters[{i}]");
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            return Err(ConfigError::new(
                fpath,
                format!("filter '{}' has no typed_config", f.name),
            ));
        };
        let at = |e: proto::UnpackError| {
            ConfigError::new(format!("{fpath}.typed_config"), e.to_string())
        };
        let mut wasm_stats = wasm_stats(any, &fpath, warnings)?;
        match proto::type_name_of(&any.type_url) {
            HCM => {
                let hcm: HttpConnectionManager = proto::unpack(any).map_err(at)?;
                let before = warnings.len();
                let compiled = compile_hcm(ctx, &hcm, clusters, warnings);
                warnings.prefix_since(before, &format!("{fpath}.typed_config"));
                let mut compiled =
                    compiled.map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                if let Some(s) = &skipped {
                    compiled.filters.after_skipped_network_filter(
                        s,
                        &format!("{fpath}.typed_config"),
                        warnings,
                    );
                }
                terminal = Some(Terminal::Http(Arc::new(compiled)));
            }
            TCP_PROXY => {
                let tcp: TcpProxyProto = proto::unpack(any).map_err(at)?;
                let before = warnings.len();
                let compiled = super::tcp_proxy::compile_tcp_proxy(ctx, &tcp, warnings);
                warnings.prefix_since(before, &format!("{fpath}.typed_config"));
                let compiled = compiled.map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                terminal = Some(Terminal::Tcp(Arc::new(compiled)));
            }
            super::network_limits::LOCAL_RATE_LIMIT => {
                let p = proto::unpack(any).map_err(at)?;
                let compiled = super::network_limits::compile_rate_limit(&p)
                    .map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                limits.push(super::network_limits::NetworkLimit::RateLimit(compiled));
            }
            super::network_limits::RATE_LIMIT_SERVICE => {
                let p = proto::unpack(any).map_err(at)?;
                let compiled = super::network_limits::compile_rate_limit_service(ctx, &p)
                    .map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                limits.push(super::network_limits::NetworkLimit::Service(compiled));
            }
            super::network_limits::CONNECTION_LIMIT => {
                let p = proto::unpack(any).map_err(at)?;
                let compiled = super::network_limits::compile_connection_limit(&p)
                    .map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                limits.push(super::network_limits::NetworkLimit::ConnectionLimit(
                    compiled,
                ));
            }
            NETWORK_RBAC => {
                let proto: proto::pb::envoy::extensions::filters::network::rbac::v3::Rbac =
                    proto::unpack(any).map_err(at)?;
                let before = warnings.len();
                let compiled = super::rbac::compile_network(ctx, &proto, warnings);
                warnings.prefix_since(before, &format!("{fpath}.typed_config"));
                let compiled = compiled.map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                if let Some(s) = skipped
                    .as_deref()
                    .filter(|_| compiled.engines.enforced_reads_metadata())
                {
                    let what = format!(
                        "network filter '{}': {}",
                        f.name,
                        super::rbac::unknown_metadata(s)
                    );
                    warnings.fails_closed(
                        fpath.clone(),
                        format!("{what}; connections on this chain are refused"),
                    );
                    refused.get_or_insert(what);
                }
                rbac.push(Arc::new(compiled));
            }
            _ if super::istio::Fields::of(any, super::istio::authn::CONFIG).is_some() => {
                let fields = super::istio::Fields::of(any, super::istio::authn::CONFIG)
                    .expect("checked above");
                super::istio::authn::compile(fields)
                    .map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                istio_authn = true;
            }
            _ if super::istio::Fields::of(any, super::istio::metadata_exchange::CONFIG)
                .is_some() =>
            {
                let fields = super::istio::Fields::of(any, super::istio::metadata_exchange::CONFIG)
                    .expect("checked above");
                let compiled = super::istio::metadata_exchange::compile(fields)
                    .map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                metadata_exchange = Some(Arc::new(compiled));
                // The peer metadata it reads is not offered to RBAC rules (Istio's filter
                // keeps it in filter state): rules after it that read metadata fail closed.
                skipped.get_or_insert_with(|| f.name.clone());
            }
            _ if super::istio::Fields::of(any, super::istio::stats::PLUGIN_CONFIG).is_some() => {
                let fields = super::istio::Fields::of(any, super::istio::stats::PLUGIN_CONFIG)
                    .expect("checked above");
                let before = warnings.len();
                let compiled = super::istio::stats::compile(fields, warnings);
                warnings.prefix_since(before, &format!("{fpath}.typed_config"));
                istio_stats = Some(Arc::new(
                    compiled.map_err(|e| e.within(&format!("{fpath}.typed_config")))?,
                ));
            }
            _ if wasm_stats.is_some() => istio_stats = wasm_stats.take().map(Arc::new),
            other
                if super::fail_closed::filter_fails_closed(
                    &f.name,
                    &proto::extension_type(any),
                ) =>
            {
                let what = format!(
                    "network filter '{}' ({other}) is not implemented by revoy",
                    f.name
                );
                warnings.fails_closed(
                    fpath,
                    format!("{what}; connections on this chain are refused"),
                );
                refused.get_or_insert(what);
            }
            other => {
                warnings.skipped(
                    fpath,
                    format!(
                        "network filter '{}' ({other}) is not implemented by revoy; skipped",
                        f.name
                    ),
                );
                skipped.get_or_insert_with(|| f.name.clone());
            }
        }
    }
    let terminal = terminal.ok_or_else(|| {
        ConfigError::new(
            format!("{path}.filters"),
            "no terminal filter (http_connection_manager or tcp_proxy) that revoy implements",
        )
    })?;
    if let Some(ctx) = &tls {
        let at = format!("{path}.transport_socket.typed_config");
        if ignored_client_certificate_requirement(ctx) {
            warnings.note(
                format!("{at}.require_client_certificate"),
                "has no effect without validation_context.trusted_ca (as in Envoy): client \
                 certificates are neither required nor verified",
            );
        }
        if let Some((min, max)) = inverted_tls_versions(ctx) {
            let what = format!(
                "tls_minimum_protocol_version {min} is above tls_maximum_protocol_version \
                 {max}: no handshake can succeed (Envoy closes these connections too)"
            );
            warnings.note(
                format!("{at}.common_tls_context.tls_params"),
                format!("{what}; connections on this chain are refused"),
            );
            refused.get_or_insert(what);
        }
        if let Some(params) = ctx
            .common_tls_context
            .as_ref()
            .and_then(|c| c.tls_params.as_ref())
        {
            for (i, name) in super::tls::provider::left_out_suites(params) {
                warnings.skipped(
                    format!("{at}.common_tls_context.tls_params.cipher_suites[{i}]"),
                    super::tls::provider::left_out_message(&name),
                );
            }
        }
        for (field, what) in super::tls::unacted::downstream(ctx) {
            warnings.skipped(format!("{at}.{field}"), what);
        }
        for (field, what) in tls_unimplemented(ctx) {
            warnings.fails_closed(
                format!("{path}.transport_socket.typed_config.{field}"),
                format!("{what}; connections on this chain are refused"),
            );
            refused.get_or_insert(what);
        }
    }
    let compiled = ChainConfig {
        tls: None,
        refused: refused.map(Arc::from),
        name: if chain.name.is_empty() {
            path.rsplit('.').next().unwrap_or(path).to_owned()
        } else {
            chain.name.clone()
        },
        matcher,
        terminal,
        limits,
        rbac,
        istio_authn,
        metadata_exchange,
        istio_stats,
        fingerprint: fingerprint(chain),
    };
    Ok((compiled, tls))
}

/// Builds the TLS context of a chain (at `path`) that serves; a refused chain's is left
/// unbuilt, as it never accepts a connection (SDS certificates, for one, never arrive).
fn build_tls(
    ctx: &Context<'_>,
    (mut chain, tls): (ChainConfig, Option<DownstreamTlsContext>),
    path: &str,
) -> Result<ChainConfig, ConfigError> {
    if let Some(tls) = tls.filter(|_| chain.refused.is_none()) {
        let built = super::tls::downstream::compile(ctx, &tls)
            .map_err(|e| e.within(&format!("{path}.transport_socket.typed_config")))?;
        chain.tls = Some(Arc::new(built));
    }
    Ok(chain)
}

/// A digest of a filter chain's encoding (prost encodes equal messages alike).
fn fingerprint(chain: &FilterChain) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    prost::Message::encode_to_vec(chain).hash(&mut h);
    h.finish()
}

/// The TLS versions a context allows, as Envoy's `TlsProtocol` numbers (1.0 is 1, 1.3 is 4),
/// with Envoy's server defaults for `TLS_AUTO` (1.2 to 1.3).
fn tls_version_range(ctx: &DownstreamTlsContext) -> (i32, i32) {
    let params = ctx
        .common_tls_context
        .as_ref()
        .and_then(|c| c.tls_params.as_ref());
    let or = |v: i32, auto: i32| if v == 0 { auto } else { v };
    (
        or(params.map_or(0, |p| p.tls_minimum_protocol_version), 3),
        or(params.map_or(0, |p| p.tls_maximum_protocol_version), 4),
    )
}

/// The version names of a context whose minimum is above its maximum (explicit or Envoy's
/// default), where Envoy closes every connection.
fn inverted_tls_versions(ctx: &DownstreamTlsContext) -> Option<(&'static str, &'static str)> {
    const NAMES: [&str; 5] = ["TLS_AUTO", "TLSv1_0", "TLSv1_1", "TLSv1_2", "TLSv1_3"];
    let name = |v: i32| usize::try_from(v).ok().and_then(|v| NAMES.get(v).copied());
    let (min, max) = tls_version_range(ctx);
    (min > max)
        .then(|| Some((name(min)?, name(max)?)))
        .flatten()
}

/// Whether `require_client_certificate` is set where Envoy ignores it: without a
/// `validation_context` that has a `trusted_ca` (a combined context always has an SDS part,
/// which fails closed).
fn ignored_client_certificate_requirement(ctx: &DownstreamTlsContext) -> bool {
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
    let validation = ctx
        .common_tls_context
        .as_ref()
        .and_then(|c| c.validation_context_type.as_ref());
    ctx.require_client_certificate.is_some_and(|b| b.value)
        && match validation {
            None => true,
            Some(ValidationContextType::ValidationContext(v)) => v.trusted_ca.is_none(),
            Some(_) => false,
        }
}

/// What a `DownstreamTlsContext` asks for that revoy cannot do, by field: TLS versions
/// before 1.2 only. The chain refuses every connection instead.
fn tls_unimplemented(ctx: &DownstreamTlsContext) -> Vec<(String, String)> {
    let (min, max) = tls_version_range(ctx);
    if min <= max && max < 3 {
        return vec![(
            "common_tls_context.tls_params.tls_maximum_protocol_version".to_owned(),
            "TLS 1.0 and 1.1 are not implemented by revoy".to_owned(),
        )];
    }
    Vec::new()
}

/// The listener filters revoy runs, why the listener's connections are all refused when one
/// it lacks controls access (a filter from ECDS, a vendor's rate limit, ...), and the first
/// one it skips.
fn compile_listener_filters(
    l: &Listener,
    warnings: &mut Warnings,
) -> Result<(ListenerFilters, Option<String>, Option<String>), ConfigError> {
    let mut out = ListenerFilters {
        timeout: match &l.listener_filters_timeout {
            None => Some(std::time::Duration::from_secs(15)),
            Some(d) => {
                let d = super::cluster::duration(d, "listener_filters_timeout")?;
                (!d.is_zero()).then_some(d)
            }
        },
        continue_on_timeout: l.continue_on_listener_filters_timeout,
        ..ListenerFilters::default()
    };
    let mut refused = None;
    let mut skipped = None;
    for (i, f) in l.listener_filters.iter().enumerate() {
        let typed = match &f.config_type {
            Some(listener_filter::ConfigType::TypedConfig(any)) => Some(any),
            _ => None,
        };
        let extension = typed.map(proto::extension_type).unwrap_or_default();
        let type_name = extension.as_str();
        let disabled = f
            .filter_disabled
            .as_ref()
            .map(|p| FilterDisabled::compile(p, &format!("listener_filters[{i}].filter_disabled")))
            .transpose()?;
        if let Some(any) =
            typed.filter(|_| type_name == super::network_limits::LISTENER_LOCAL_RATE_LIMIT)
        {
            let at = format!("listener_filters[{i}].typed_config");
            let p = proto::unpack(any).map_err(|e| ConfigError::new(&at, e.to_string()))?;
            let compiled = super::network_limits::compile_listener_rate_limit(&p)
                .map_err(|e| e.within(&at))?;
            out.rate_limit_first = !(out.tls_inspector || out.http_inspector);
            out.rate_limit = Some(compiled);
            out.disabled.rate_limit = disabled;
            continue;
        }
        let from_ecds = matches!(
            f.config_type,
            Some(listener_filter::ConfigType::ConfigDiscovery(_))
        );
        match (type_name, f.name.as_str()) {
            (t, n)
                if t.ends_with("original_dst.v3.OriginalDst")
                    || n == "envoy.filters.listener.original_dst" =>
            {
                out.original_dst = true;
                out.disabled.original_dst = disabled;
            }
            (t, n)
                if t.ends_with("tls_inspector.v3.TlsInspector")
                    || n == "envoy.filters.listener.tls_inspector" =>
            {
                out.tls_inspector = true;
                out.disabled.tls_inspector = disabled;
            }
            (t, n)
                if t.ends_with("http_inspector.v3.HttpInspector")
                    || n == "envoy.filters.listener.http_inspector" =>
            {
                out.http_inspector = true;
                out.disabled.http_inspector = disabled;
            }
            _ if from_ecds || super::fail_closed::filter_fails_closed(&f.name, type_name) => {
                let what = format!(
                    "listener filter '{}' ({type_name}) is not implemented by revoy",
                    f.name
                );
                warnings.fails_closed(
                    format!("listener_filters[{i}]"),
                    format!("{what}; every connection to this listener is refused"),
                );
                refused.get_or_insert(what);
            }
            _ => {
                warnings.skipped(
                    format!("listener_filters[{i}]"),
                    format!(
                        "listener filter '{}' ({type_name}) is not implemented by revoy; skipped",
                        f.name
                    ),
                );
                skipped.get_or_insert_with(|| f.name.clone());
            }
        }
    }
    Ok((out, refused, skipped))
}

/// A UDP listener (`protocol: UDP`: `udp_proxy`, DNS, QUIC/HTTP/3) is refused: revoy serves
/// TCP only. Envoy serves it; without this the listener failed later with a misleading "no
/// filter chains specified". `udp_listener_config` on a TCP address is ignored, as in Envoy.
fn refuse_udp(l: &Listener) -> Result<(), ConfigError> {
    if is_udp(l.address.as_ref()) {
        return Err(ConfigError::new(
            "address.socket_address.protocol",
            format!(
                "listener '{}': UDP listeners (udp_proxy, QUIC/HTTP/3) are not supported by revoy",
                l.name
            ),
        ));
    }
    Ok(())
}

/// The listener fields revoy does not act on: those that decide which filter chain a
/// connection gets, or where chains come from, are errors (ignoring them could hand a
/// connection to a chain without the policy meant for it); the rest are skipped with a
/// warning naming what revoy does instead.
fn unimplemented_fields(l: &Listener, warnings: &mut Warnings) -> Result<(), ConfigError> {
    let refused = [
        (
            l.filter_chain_matcher.is_some(),
            "filter_chain_matcher",
            "the matcher API for choosing filter chains is not implemented by revoy (filter_chain_match is)",
        ),
        (
            l.fcds_config.is_some(),
            "fcds_config",
            "filter chain discovery is not implemented by revoy",
        ),
        (
            l.api_listener.is_some(),
            "api_listener",
            "API listeners are not implemented by revoy",
        ),
    ];
    if let Some((_, field, why)) = refused.iter().find(|(set, _, _)| *set) {
        return Err(ConfigError::new(
            *field,
            format!("listener '{}': {why}", l.name),
        ));
    }
    let skipped = [
        (
            l.stats_matcher.is_some(),
            "stats_matcher",
            "a listener's own stats matcher is not implemented by revoy; its stats are kept",
        ),
        (
            l.per_connection_buffer_limit_bytes.is_some(),
            "per_connection_buffer_limit_bytes",
            "revoy's connections use its own buffer sizes",
        ),
        (
            l.per_connection_buffer_high_watermark_timeout.is_some(),
            "per_connection_buffer_high_watermark_timeout",
            "not implemented by revoy; no connection is closed for it",
        ),
        (
            l.freebind.is_some_and(|b| b.value),
            "freebind",
            "IP_FREEBIND is not set by revoy; binding a non-local address fails",
        ),
        (
            !l.socket_options.is_empty(),
            "socket_options",
            "listener socket options are not applied by revoy",
        ),
        (
            l.tcp_fast_open_queue_length.is_some(),
            "tcp_fast_open_queue_length",
            "TCP Fast Open is not enabled by revoy",
        ),
        (
            l.connection_balance_config.is_some(),
            "connection_balance_config",
            "revoy balances connections by SO_REUSEPORT, one socket per worker",
        ),
        (
            l.enable_reuse_port.is_some_and(|b| !b.value),
            "enable_reuse_port",
            "revoy binds one SO_REUSEPORT socket per worker whatever this says",
        ),
        (
            l.tcp_backlog_size.is_some(),
            "tcp_backlog_size",
            "revoy uses its own listen backlog",
        ),
        (
            l.max_connections_to_accept_per_socket_event.is_some(),
            "max_connections_to_accept_per_socket_event",
            "revoy accepts as its runtime wakes it",
        ),
        (
            l.enable_mptcp,
            "enable_mptcp",
            "MPTCP is not enabled by revoy; the listener takes plain TCP",
        ),
        (
            l.tcp_keepalive.is_some(),
            "tcp_keepalive",
            "TCP keep-alive is not set on accepted connections by revoy",
        ),
        (
            l.ignore_global_conn_limit,
            "ignore_global_conn_limit",
            "revoy has no global connection limit, so nothing to ignore",
        ),
        (
            l.bypass_overload_manager,
            "bypass_overload_manager",
            "revoy has no overload manager, so nothing to bypass",
        ),
    ];
    for (_, field, why) in skipped.iter().filter(|(set, _, _)| *set) {
        warnings.skipped(*field, *why);
    }
    Ok(())
}

/// An OUTBOUND listener's connection manager traces egress: its spans are `egress <host>`,
/// CLIENT spans.
fn egress_tracing(terminal: &mut Terminal) {
    if let Terminal::Http(hcm) = terminal
        && hcm.tracing.is_some()
    {
        let hcm = Arc::make_mut(hcm);
        if let Some(t) = hcm.tracing.as_mut() {
            Arc::make_mut(t).egress = true;
        }
    }
}

/// `istio.stats` from a network Wasm filter running Istio's null-VM stats plugin (see
/// [`super::istio::wasm`]); `None` for any other filter (another Wasm filter fails closed).
fn wasm_stats(
    any: &proto::pb::google::protobuf::Any,
    fpath: &str,
    warnings: &mut Warnings,
) -> Result<Option<super::istio::stats::IstioStatsConfig>, ConfigError> {
    use super::istio::wasm;
    let at = format!("{fpath}.typed_config");
    let before = warnings.len();
    let compiled = wasm::compile(any, wasm::NETWORK_WASM, warnings);
    warnings.prefix_since(before, &at);
    Ok(match compiled.map_err(|e| e.within(&at))? {
        Some(wasm::NullPlugin::Stats(c)) => Some(*c),
        _ => None,
    })
}

/// Resolves the Wasm metadata exchange's propagation by the listener's direction (see
/// [`PeerMetadataConfig::by_listener_direction`](super::istio::peer_metadata::PeerMetadataConfig::by_listener_direction)):
/// nothing sent upstream from an inbound listener, nothing answered downstream on an outbound one.
fn wasm_exchange_direction(terminal: &mut Terminal, direction: i32) {
    use super::http_filter::FilterKind;
    use proto::pb::envoy::config::core::v3::TrafficDirection;
    let Terminal::Http(hcm) = terminal else {
        return;
    };
    let wasm = |f: &super::http_filter::HttpFilter| matches!(&f.kind, FilterKind::PeerMetadata(c) if c.by_listener_direction);
    if !hcm.filters.filters.iter().any(wasm) {
        return;
    }
    for f in &mut Arc::make_mut(hcm).filters.filters {
        if let FilterKind::PeerMetadata(c) = &mut f.kind
            && c.by_listener_direction
        {
            let c = Arc::make_mut(c);
            if direction == TrafficDirection::Inbound as i32 {
                c.upstream_propagation = None;
            } else if direction == TrafficDirection::Outbound as i32 {
                c.downstream_propagation = None;
            }
        }
    }
}

/// Compiles one listener. `path` is its location (`static_resources.listeners[0]`).
pub fn compile_listener(
    ctx: &Context<'_>,
    l: &Listener,
    clusters: Option<&dyn Fn(&str) -> bool>,
    warnings: &mut Warnings,
) -> Result<ListenerConfig, ConfigError> {
    refuse_udp(l)?;
    unimplemented_fields(l, warnings)?;
    let (main, additional_addresses) = compile_addresses(l, warnings)?;
    let address = main.address;
    let (filters, refused, skipped) = compile_listener_filters(l, warnings)?;
    let skipped = skipped.as_deref();
    let mut chains = l
        .filter_chains
        .iter()
        .enumerate()
        .map(|(i, c)| {
            compile_chain(
                ctx,
                c,
                &format!("filter_chains[{i}]"),
                clusters,
                skipped,
                warnings,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (i, (c, _)) in chains.iter().enumerate() {
        if let Some(j) = chains[..i]
            .iter()
            .position(|(o, _)| o.matcher.signature() == c.matcher.signature())
        {
            return Err(ConfigError::new(
                format!("filter_chains[{i}]"),
                format!(
                    "error adding listener '{}': filter chain '{}' has a duplicate matcher (same as filter_chains[{j}])",
                    l.name, c.name
                ),
            ));
        }
    }
    let mut default_chain = l
        .default_filter_chain
        .as_ref()
        .map(|c| compile_chain(ctx, c, "default_filter_chain", clusters, skipped, warnings))
        .transpose()?;
    if l.traffic_direction == proto::pb::envoy::config::core::v3::TrafficDirection::Outbound as i32
    {
        for (c, _) in chains.iter_mut().chain(default_chain.iter_mut()) {
            egress_tracing(&mut c.terminal);
        }
    }
    for (c, _) in chains.iter_mut().chain(default_chain.iter_mut()) {
        wasm_exchange_direction(&mut c.terminal, l.traffic_direction);
    }
    if chains.is_empty() && default_chain.is_none() {
        return Err(ConfigError::new(
            "filter_chains",
            format!(
                "error adding listener '{}': no filter chains specified",
                l.name
            ),
        ));
    }
    if let Some(why) = refused {
        let why: Arc<str> = Arc::from(why);
        for (c, _) in chains.iter_mut().chain(default_chain.iter_mut()) {
            c.refused.get_or_insert_with(|| why.clone());
        }
    }
    let chains = chains
        .into_iter()
        .enumerate()
        .map(|(i, c)| build_tls(ctx, c, &format!("filter_chains[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let default_chain = default_chain
        .map(|c| build_tls(ctx, c, "default_filter_chain"))
        .transpose()?;
    let before = warnings.len();
    let access_logs = super::access_log::compile_access_logs(ctx, &l.access_log, warnings);
    warnings.prefix_since(before, "access_log");
    let access_logs = access_logs.map_err(|e| e.within("access_log"))?;
    Ok(ListenerConfig {
        access_logs,
        name: if l.name.is_empty() {
            address.to_string()
        } else {
            l.name.clone()
        },
        address,
        ipv4_compat: main.ipv4_compat,
        additional_addresses,
        bind_to_port: l.bind_to_port.is_none_or(|b| b.value),
        use_original_dst: l.use_original_dst.is_some_and(|b| b.value),
        transparent: l.transparent.map(|b| b.value),
        filters,
        chains,
        default_chain,
        inbound: l.traffic_direction
            == proto::pb::envoy::config::core::v3::TrafficDirection::Inbound as i32,
        drain_modify_only: l.drain_type
            == proto::pb::envoy::config::listener::v3::listener::DrainType::ModifyOnly as i32,
        stats_name: if l.stat_prefix.is_empty() {
            address.to_string().replace(':', "_")
        } else {
            l.stat_prefix.clone()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Severity;
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, CommonTlsContext, common_tls_context::ValidationContextType,
    };

    fn requiring(validation: Option<CertificateValidationContext>) -> DownstreamTlsContext {
        DownstreamTlsContext {
            require_client_certificate: Some(proto::pb::google::protobuf::BoolValue {
                value: true,
            }),
            common_tls_context: Some(CommonTlsContext {
                validation_context_type: validation.map(ValidationContextType::ValidationContext),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn tls_before_1_2_only_fails_closed() {
        let mut tls = requiring(None);
        tls.common_tls_context.as_mut().unwrap().tls_params = Some(
            proto::pb::envoy::extensions::transport_sockets::tls::v3::TlsParameters {
                tls_minimum_protocol_version: 1,
                tls_maximum_protocol_version: 2,
                ..Default::default()
            },
        );
        let fields: Vec<String> = tls_unimplemented(&tls)
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        assert_eq!(
            fields,
            ["common_tls_context.tls_params.tls_maximum_protocol_version"]
        );
        assert!(tls_unimplemented(&requiring(None)).is_empty());
    }

    /// A listener with one HTTP chain terminating TLS with `common_tls_context`.
    fn tls_listener(common_tls_context: &str) -> Listener {
        let yaml = format!(
            r#"name: l
address: {{socket_address: {{address: 127.0.0.1, port_value: 10443}}}}
filter_chains:
- transport_socket:
    name: envoy.transport_sockets.tls
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
      common_tls_context: {common_tls_context}
  filters:
  - name: envoy.filters.network.http_connection_manager
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
      stat_prefix: h
      route_config: {{virtual_hosts: [{{name: v, domains: ['*'], routes: [{{match: {{prefix: /}}, direct_response: {{status: 200}}}}]}}]}}
      http_filters: [{{name: envoy.filters.http.router, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
"#
        );
        let codec = proto::Codec::new();
        let value = proto::Codec::parse_text(&yaml, proto::Format::Yaml).unwrap();
        codec.decode::<Listener>(value, false).unwrap().message
    }

    fn compile_with(
        io: &crate::config::FakeIo,
        l: &Listener,
    ) -> Result<ListenerConfig, ConfigError> {
        compile_listener(&Context::new(io), l, None, &mut Warnings::new())
    }

    #[test]
    fn transparent_is_kept_unset_on_or_off() {
        let yaml = r#"name: l
address: {socket_address: {address: 0.0.0.0, port_value: 15006}}
filter_chains:
- filters:
  - name: envoy.filters.network.tcp_proxy
    typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t, cluster: c}
"#;
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        let mut l: Listener = proto::Codec::new().decode(value, false).unwrap().message;
        let io = crate::config::FakeIo::new();
        let compiled = |l: &Listener| compile_with(&io, l).unwrap().transparent;
        assert_eq!(compiled(&l), None);
        for on in [true, false] {
            l.transparent = Some(proto::pb::google::protobuf::BoolValue { value: on });
            assert_eq!(compiled(&l), Some(on));
        }
    }

    #[test]
    fn fields_revoy_does_not_act_on_are_named() {
        let yaml = |extra: &str| {
            format!(
                r#"name: l
address: {{socket_address: {{address: 0.0.0.0, port_value: 15006}}}}
{extra}
filter_chains:
- filters:
  - name: envoy.filters.network.tcp_proxy
    typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t, cluster: c}}
"#
            )
        };
        let decode = |extra: &str| -> Listener {
            let value = proto::Codec::parse_text(&yaml(extra), proto::Format::Yaml).unwrap();
            proto::Codec::new().decode(value, false).unwrap().message
        };
        let io = crate::config::FakeIo::new();
        let l = decode("per_connection_buffer_limit_bytes: 1024\ntcp_keepalive: {}");
        let mut warnings = Warnings::new();
        compile_listener(&Context::new(&io), &l, None, &mut warnings).unwrap();
        let paths: Vec<&str> = warnings.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(
            paths,
            ["per_connection_buffer_limit_bytes", "tcp_keepalive"]
        );
        let l = decode(
            "filter_chain_matcher: {on_no_match: {action: {name: a, typed_config: {'@type': type.googleapis.com/google.protobuf.StringValue, value: x}}}}",
        );
        let e = compile_with(&io, &l).unwrap_err();
        assert_eq!(e.path, "filter_chain_matcher", "{e}");
    }

    #[test]
    fn tls_contexts_are_built_at_compile_and_bad_ones_named_by_field() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/differential/certs");
        let read = |name: &str| std::fs::read(format!("{dir}/{name}")).unwrap();
        let io = crate::config::FakeIo::new()
            .with_file("/certs/server.pem", read("server.pem"))
            .with_file("/certs/server.key", read("server.key"));
        let certs = |chain: &str| {
            format!(
                "{{tls_certificates: [{{certificate_chain: {{filename: {chain}}}, private_key: {{filename: /certs/server.key}}}}]}}"
            )
        };
        let compiled = compile_with(&io, &tls_listener(&certs("/certs/server.pem"))).unwrap();
        assert!(compiled.chains[0].tls.is_some());
        let e = compile_with(&io, &tls_listener(&certs("/certs/gone.pem"))).unwrap_err();
        assert_eq!(
            e.path,
            "filter_chains[0].transport_socket.typed_config.common_tls_context.tls_certificates[0].certificate_chain"
        );
        assert!(
            e.message.starts_with("failed to read file /certs/gone.pem"),
            "{e}"
        );
        let e = compile_with(&io, &tls_listener(&certs("/certs/server.key"))).unwrap_err();
        assert!(e.message.contains("no certificate found"), "{e}");
    }

    #[test]
    fn sds_certificates_are_named_for_the_secret_store() {
        let l = tls_listener(
            "{tls_certificate_sds_secret_configs: [{name: default, sds_config: {ads: {}}}]}",
        );
        let compiled = compile_with(&crate::config::FakeIo::new(), &l).unwrap();
        let chain = &compiled.chains[0];
        assert!(chain.refused.is_none());
        let tls = chain.tls.as_ref().unwrap();
        let names: Vec<&str> = tls
            .common
            .secrets()
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(names, ["default"]);
    }

    #[test]
    fn a_required_client_certificate_without_trusted_ca_is_noted() {
        assert!(ignored_client_certificate_requirement(&requiring(None)));
        assert!(ignored_client_certificate_requirement(&requiring(Some(
            CertificateValidationContext::default()
        ))));
        let with_ca = CertificateValidationContext {
            trusted_ca: Some(Default::default()),
            ..Default::default()
        };
        assert!(!ignored_client_certificate_requirement(&requiring(Some(
            with_ca
        ))));
    }

    /// The listener local_ratelimit and the network ratelimit compile in place (the former
    /// noting whether it runs before the inspecting filters); their errors name their path.
    #[test]
    fn limiting_filters_compile_in_place_and_their_errors_name_their_path() {
        let compile = |listener_filters: &str, filters: &str| {
            let yaml = format!(
                r#"name: l
address: {{socket_address: {{address: 127.0.0.1, port_value: 10080}}}}
listener_filters: [{listener_filters}]
filter_chains:
- filters: [{filters}{{name: tcp, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t, cluster: c}}}}]
"#
            );
            let codec = proto::Codec::new();
            let value = proto::Codec::parse_text(&yaml, proto::Format::Yaml).unwrap();
            let l = codec.decode::<Listener>(value, false).unwrap().message;
            let io = crate::config::FakeIo::new();
            compile_listener(&Context::new(&io), &l, None, &mut Warnings::new())
        };
        let bucket = r#"{name: rl, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.listener.local_ratelimit.v3.LocalRateLimit, stat_prefix: s, token_bucket: {max_tokens: 1, fill_interval: 1s}}}"#;
        let inspector = r#"{name: envoy.filters.listener.tls_inspector, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}}"#;
        let first = compile(bucket, "").unwrap();
        assert!(first.filters.rate_limit.is_some() && first.filters.rate_limit_first);
        assert!(first.chains[0].refused.is_none());
        let after = compile(&format!("{inspector}, {bucket}"), "").unwrap();
        assert!(after.filters.rate_limit.is_some() && !after.filters.rate_limit_first);
        let e = compile(&bucket.replace("stat_prefix: s, ", ""), "").unwrap_err();
        assert_eq!(e.path, "listener_filters[0].typed_config.stat_prefix");

        let service = r#"{name: envoy.filters.network.ratelimit, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.network.ratelimit.v3.RateLimit, stat_prefix: 'n', domain: d, descriptors: [{entries: [{key: k, value: v}]}], rate_limit_service: {transport_api_version: V3, grpc_service: {envoy_grpc: {cluster_name: rls}}}}}, "#;
        let l = compile("", service).unwrap();
        assert!(matches!(
            l.chains[0].limits.as_slice(),
            [super::super::network_limits::NetworkLimit::Service(s)] if s.domain == "d"
        ));
        let e = compile(
            "",
            &service.replace(
                "envoy_grpc: {cluster_name: rls}",
                "google_grpc: {target_uri: x, stat_prefix: 'y'}",
            ),
        )
        .unwrap_err();
        assert_eq!(
            e.path,
            "filter_chains[0].filters[0].typed_config.rate_limit_service.grpc_service.google_grpc"
        );
    }

    /// Access loggers revoy lacks (on the listener, a connection manager and a tcp_proxy) and
    /// a route's metadata custom tag are skipped, each warned of at its full path.
    #[test]
    fn what_observability_leaves_out_is_named_by_its_path() {
        let otel = r#"{name: otel, typed_config: {"@type": type.googleapis.com/envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig}}"#;
        let yaml = format!(
            r#"name: l
address: {{socket_address: {{address: 127.0.0.1, port_value: 10080}}}}
access_log: [{otel}]
filter_chains:
- filter_chain_match: {{destination_port: 80}}
  filters:
  - name: envoy.filters.network.http_connection_manager
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
      stat_prefix: h
      access_log: [{otel}]
      route_config:
        virtual_hosts:
        - name: v
          domains: ['*']
          routes:
          - match: {{prefix: /a}}
            direct_response: {{status: 200}}
          - match: {{prefix: /}}
            direct_response: {{status: 200}}
            tracing: {{custom_tags: [{{tag: lit, literal: {{value: x}}}}, {{tag: md, metadata: {{kind: {{route: {{}}}}, metadata_key: {{key: k, path: [{{key: p}}]}}}}}}]}}
      http_filters: [{{name: envoy.filters.http.router, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
- filter_chain_match: {{destination_port: 81}}
  filters:
  - name: envoy.filters.network.tcp_proxy
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
      stat_prefix: t
      cluster: c
      access_log: [{otel}]
"#
        );
        let codec = proto::Codec::new();
        let value = proto::Codec::parse_text(&yaml, proto::Format::Yaml).unwrap();
        let l = codec.decode::<Listener>(value, false).unwrap().message;
        let mut warnings = Warnings::new();
        let io = crate::config::FakeIo::new();
        let compiled = compile_listener(&Context::new(&io), &l, None, &mut warnings).unwrap();
        assert!(compiled.access_logs.logs().is_empty());
        let paths: Vec<(&str, Severity)> = warnings
            .iter()
            .map(|w| (w.path.as_str(), w.severity))
            .collect();
        assert_eq!(
            paths,
            [
                (
                    "filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[1].tracing.custom_tags[1].metadata",
                    Severity::Skipped
                ),
                (
                    "filter_chains[0].filters[0].typed_config.access_log[0].typed_config",
                    Severity::Skipped
                ),
                (
                    "filter_chains[1].filters[0].typed_config.access_log[0].typed_config",
                    Severity::Skipped
                ),
                ("access_log[0].typed_config", Severity::Skipped),
            ]
        );
        assert!(
            warnings.iter().next().unwrap().message.contains("'md'"),
            "{warnings:?}"
        );
    }
}
