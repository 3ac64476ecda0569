//! `Listener` -> [`ListenerConfig`]: bind address, listener filters, filter chains.

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
use super::hcm::{HcmConfig, compile_hcm};
use super::tcp_proxy::TcpProxyConfig;
use super::{ConfigError, Warnings};

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
    /// `transport_socket` as a `DownstreamTlsContext`, when the chain terminates TLS.
    pub tls: Option<DownstreamTlsContext>,
}

/// Listener filters revoy implements.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListenerFilters {
    /// `envoy.filters.listener.original_dst`: use SO_ORIGINAL_DST as the local address.
    pub original_dst: bool,
    /// `envoy.filters.listener.tls_inspector`: read SNI/ALPN from the ClientHello.
    pub tls_inspector: bool,
    /// `envoy.filters.listener.http_inspector`: detect HTTP/1.x vs h2c.
    pub http_inspector: bool,
}

/// A compiled listener.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Listener name (defaults to its address, like Envoy).
    pub name: String,
    /// Where it listens.
    pub address: SocketAddr,
    /// `bind_to_port` (false: only reachable through a `use_original_dst` hand-off).
    pub bind_to_port: bool,
    /// Hand connections to the listener bound to their original destination.
    pub use_original_dst: bool,
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
}

impl ListenerConfig {
    /// Stats prefix `listener.<stats_name>`.
    pub fn stat_prefix(&self) -> String {
        format!("listener.{}", self.stats_name)
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

fn compile_chain(
    chain: &FilterChain,
    path: &str,
    clusters: Option<&dyn Fn(&str) -> bool>,
    warnings: &mut Warnings,
) -> Result<ChainConfig, ConfigError> {
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
        match proto::type_name_of(&any.type_url) {
            HCM => {
                let hcm: HttpConnectionManager = proto::unpack(any).map_err(at)?;
                let before = warnings.len();
                let compiled = compile_hcm(&hcm, clusters, warnings);
                super::prefix_warnings(warnings, before, &format!("{fpath}.typed_config"));
                let compiled = compiled.map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                terminal = Some(Terminal::Http(Arc::new(compiled)));
            }
            TCP_PROXY => {
                let tcp: TcpProxyProto = proto::unpack(any).map_err(at)?;
                let compiled = super::tcp_proxy::compile_tcp_proxy(&tcp)
                    .map_err(|e| e.within(&format!("{fpath}.typed_config")))?;
                terminal = Some(Terminal::Tcp(Arc::new(compiled)));
            }
            other => warnings.push(format!(
                "{fpath}: network filter '{}' ({other}) is not implemented by revoy; skipped",
                f.name
            )),
        }
    }
    let terminal = terminal.ok_or_else(|| {
        ConfigError::new(
            format!("{path}.filters"),
            "no terminal filter (http_connection_manager or tcp_proxy) that revoy implements",
        )
    })?;
    if tls.is_some() && matches!(terminal, Terminal::Tcp(_)) {
        warnings.push(format!(
            "{path}.transport_socket: TLS termination in front of tcp_proxy is not implemented; connections on this chain are refused"
        ));
    }
    Ok(ChainConfig {
        tls,
        name: if chain.name.is_empty() {
            path.rsplit('.').next().unwrap_or(path).to_owned()
        } else {
            chain.name.clone()
        },
        matcher,
        terminal,
    })
}

fn compile_listener_filters(l: &Listener, warnings: &mut Warnings) -> ListenerFilters {
    let mut out = ListenerFilters::default();
    for (i, f) in l.listener_filters.iter().enumerate() {
        let type_name = match &f.config_type {
            Some(listener_filter::ConfigType::TypedConfig(any)) => {
                proto::type_name_of(&any.type_url)
            }
            _ => "",
        };
        match (type_name, f.name.as_str()) {
            (t, n) if t.ends_with("original_dst.v3.OriginalDst") || n == "envoy.filters.listener.original_dst" => {
                out.original_dst = true
            }
            (t, n) if t.ends_with("tls_inspector.v3.TlsInspector") || n == "envoy.filters.listener.tls_inspector" => {
                out.tls_inspector = true
            }
            (t, n) if t.ends_with("http_inspector.v3.HttpInspector") || n == "envoy.filters.listener.http_inspector" => {
                out.http_inspector = true
            }
            _ => warnings.push(format!(
                "listener_filters[{i}]: listener filter '{}' ({type_name}) is not implemented by revoy; skipped",
                f.name
            )),
        }
    }
    out
}

/// Compiles one listener. `path` is its location (`static_resources.listeners[0]`).
pub fn compile_listener(
    l: &Listener,
    clusters: Option<&dyn Fn(&str) -> bool>,
    warnings: &mut Warnings,
) -> Result<ListenerConfig, ConfigError> {
    let address = socket_addr(l.address.as_ref(), "address")?;
    let chains = l
        .filter_chains
        .iter()
        .enumerate()
        .map(|(i, c)| compile_chain(c, &format!("filter_chains[{i}]"), clusters, warnings))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, c) in chains.iter().enumerate() {
        if let Some(j) = chains[..i]
            .iter()
            .position(|o| o.matcher.signature() == c.matcher.signature())
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
    let default_chain = l
        .default_filter_chain
        .as_ref()
        .map(|c| compile_chain(c, "default_filter_chain", clusters, warnings))
        .transpose()?;
    if chains.is_empty() && default_chain.is_none() {
        return Err(ConfigError::new(
            "filter_chains",
            format!(
                "error adding listener '{}': no filter chains specified",
                l.name
            ),
        ));
    }
    let filters = compile_listener_filters(l, warnings);
    Ok(ListenerConfig {
        name: if l.name.is_empty() {
            address.to_string()
        } else {
            l.name.clone()
        },
        address,
        bind_to_port: l.bind_to_port.is_none_or(|b| b.value),
        use_original_dst: l.use_original_dst.is_some_and(|b| b.value),
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
