//! The HCM's `http_filters` -> [`FilterChain`], and routes' `typed_per_filter_config` ->
//! [`PerFilterConfigs`]: which filters run, in order, with what configuration. The runtime of
//! each filter is in `crate::http::filters`.
//!
//! A filter revoy implements compiles to a [`FilterKind`]; one it lacks is skipped with a
//! warning, or, when it controls access (see [`super::fail_closed`]), compiles to
//! [`FilterKind::FailClosed`], which denies every request that reaches it.

pub mod buffer;
pub mod fault;
pub mod grpc_http1_bridge;
pub mod health_check;

use std::sync::Arc;

use proto::pb::envoy::config::route::v3::FilterConfig;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter as HttpFilterProto, http_filter,
};
use proto::pb::google::protobuf::Any;

use super::{ConfigError, Context, Warnings};
use crate::route::per_filter::{FilterRouteConfig, PerFilterConfigs, PerRoute};

const ROUTER: &str = "envoy.extensions.filters.http.router.v3.Router";
const FAULT: &str = "envoy.extensions.filters.http.fault.v3.HTTPFault";
const BUFFER: &str = "envoy.extensions.filters.http.buffer.v3.Buffer";
const HEALTH_CHECK: &str = "envoy.extensions.filters.http.health_check.v3.HealthCheck";
const GRPC_WEB: &str = "envoy.extensions.filters.http.grpc_web.v3.GrpcWeb";
const GRPC_HTTP1_BRIDGE: &str = "envoy.extensions.filters.http.grpc_http1_bridge.v3.Config";
const BUFFER_PER_ROUTE: &str = "envoy.extensions.filters.http.buffer.v3.BufferPerRoute";
const FILTER_CONFIG: &str = "envoy.config.route.v3.FilterConfig";

/// The compiled `http_filters` of a connection manager.
#[derive(Debug, Clone, Default)]
pub struct FilterChain {
    /// The filters before the router, in configuration order.
    pub filters: Vec<HttpFilter>,
    /// Whether the chain ends in the router (without it every request gets a 404).
    pub router: bool,
    /// The router's `suppress_envoy_headers`.
    pub suppress_envoy_headers: bool,
}

impl FilterChain {
    /// Whether some filter of the chain denies every request it sees (a filter revoy lacks
    /// that controls access).
    pub fn fails_closed(&self) -> bool {
        self.filters
            .iter()
            .any(|f| matches!(f.kind, FilterKind::FailClosed(_)))
    }
}

/// One filter of the chain.
#[derive(Debug, Clone)]
pub struct HttpFilter {
    /// Its name in `http_filters`: per-route configuration is keyed by it.
    pub name: Arc<str>,
    /// `disabled`: it runs only where a route or virtual host enables it.
    pub disabled: bool,
    /// What it does.
    pub kind: FilterKind,
}

/// What a filter of the chain is, with its filter-level configuration.
#[derive(Debug, Clone)]
pub enum FilterKind {
    /// A filter revoy lacks that controls access: every request reaching it is denied (403)
    /// with this reason.
    FailClosed(Arc<str>),
    /// `envoy.filters.http.fault`.
    Fault(Arc<fault::FaultConfig>),
    /// `envoy.filters.http.buffer`.
    Buffer(buffer::BufferConfig),
    /// `envoy.filters.http.health_check`.
    HealthCheck(Arc<health_check::HealthCheckConfig>),
    /// `envoy.filters.http.grpc_web`.
    GrpcWeb,
    /// `envoy.filters.http.grpc_http1_bridge`.
    GrpcHttp1Bridge,
}

/// Compiles `http_filters`. Filters revoy lacks are reported in `warnings` (skipped, or
/// failing closed).
pub fn compile_chain(
    ctx: &Context<'_>,
    filters: &[HttpFilterProto],
    warnings: &mut Warnings,
) -> Result<FilterChain, ConfigError> {
    let mut chain = FilterChain::default();
    for (i, f) in filters.iter().enumerate() {
        let at = format!("http_filters[{i}]");
        if chain.router {
            return Err(ConfigError::new(
                at,
                format!(
                    "Error: terminal filter named {} must be the last filter in the http filter chain.",
                    "envoy.filters.http.router"
                ),
            ));
        }
        let (any, from_ecds) = match &f.config_type {
            Some(http_filter::ConfigType::TypedConfig(any)) => (Some(any), false),
            Some(http_filter::ConfigType::ConfigDiscovery(_)) => (None, true),
            None => (None, false),
        };
        let type_name = any.map_or("", |a| proto::type_name_of(&a.type_url));
        // The type picks the filter, as in Envoy; the name only when there is no typed_config.
        let router_named = f.name == "envoy.filters.http.router" || f.name == "envoy.router";
        if type_name == ROUTER || (any.is_none() && !from_ecds && router_named) {
            if let Some(any) = any {
                let router: proto::pb::envoy::extensions::filters::http::router::v3::Router =
                    proto::unpack(any).map_err(|e| {
                        ConfigError::new(format!("{at}.typed_config"), e.to_string())
                    })?;
                chain.suppress_envoy_headers = router.suppress_envoy_headers;
            }
            chain.router = true;
            continue;
        }
        let kind = match any {
            Some(any) => {
                compile_kind(ctx, any).map_err(|e| e.within(&format!("{at}.typed_config")))?
            }
            None => None,
        };
        let kind = match kind {
            Some(kind) => kind,
            None => {
                let extension = any.map(proto::extension_type).unwrap_or_default();
                let what = format!(
                    "HTTP filter '{}' ({}) is not implemented by revoy",
                    f.name,
                    if from_ecds {
                        "config from ECDS"
                    } else if extension.is_empty() {
                        "no typed_config"
                    } else {
                        &extension
                    }
                );
                if !(from_ecds || super::fail_closed::filter_fails_closed(&f.name, &extension)) {
                    warnings.skipped(at, format!("{what}; requests pass through without it"));
                    continue;
                }
                warnings.fails_closed(
                    at,
                    format!("{what}; every request reaching it is denied (403)"),
                );
                FilterKind::FailClosed(Arc::from(format!("access denied: {what}")))
            }
        };
        chain.filters.push(HttpFilter {
            name: Arc::from(f.name.as_str()),
            disabled: f.disabled,
            kind,
        });
    }
    if !chain.router {
        warnings.note(
            "http_filters",
            "no router filter; requests get a 404 like Envoy without a terminal filter",
        );
    }
    Ok(chain)
}

/// The filter `any` configures, or `None` when revoy lacks it.
fn compile_kind(ctx: &Context<'_>, any: &Any) -> Result<Option<FilterKind>, ConfigError> {
    Ok(match proto::type_name_of(&any.type_url) {
        FAULT => Some(FilterKind::Fault(Arc::new(fault::compile(
            ctx,
            &unpack(any)?,
        )?))),
        BUFFER => Some(FilterKind::Buffer(buffer::compile(&unpack(any)?)?)),
        HEALTH_CHECK => Some(FilterKind::HealthCheck(Arc::new(health_check::compile(
            ctx,
            &unpack(any)?,
        )?))),
        GRPC_WEB => {
            unpack::<proto::pb::envoy::extensions::filters::http::grpc_web::v3::GrpcWeb>(any)?;
            Some(FilterKind::GrpcWeb)
        }
        GRPC_HTTP1_BRIDGE => {
            grpc_http1_bridge::compile(&unpack(any)?)?;
            Some(FilterKind::GrpcHttp1Bridge)
        }
        _ => None,
    })
}

/// Compiles a `typed_per_filter_config` map. Entries for filters revoy lacks are left out:
/// the filter itself is reported where the connection manager names it.
pub fn compile_per_filter(
    ctx: &Context<'_>,
    map: &std::collections::HashMap<String, Any>,
) -> Result<Option<Box<PerFilterConfigs>>, ConfigError> {
    let mut out = Vec::new();
    let mut names: Vec<&String> = map.keys().collect();
    names.sort();
    for name in names {
        let at = format!("typed_per_filter_config[{name}]");
        let mut any = &map[name];
        let wrapper;
        if proto::type_name_of(&any.type_url) == FILTER_CONFIG {
            wrapper = unpack::<FilterConfig>(any).map_err(|e| e.within(&at))?;
            if wrapper.disabled {
                out.push((Arc::from(name.as_str()), PerRoute::Disabled));
                continue;
            }
            match &wrapper.config {
                Some(inner) if proto::is_empty_any(inner) => {
                    out.push((Arc::from(name.as_str()), PerRoute::Enabled));
                    continue;
                }
                Some(inner) => any = inner,
                None => {
                    return Err(ConfigError::new(
                        at,
                        format!(
                            "Empty route/virtual host per filter configuration for {name} filter"
                        ),
                    ));
                }
            }
        }
        let kind = match proto::type_name_of(&any.type_url) {
            FAULT => Some(routed(fault::compile(
                ctx,
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            BUFFER_PER_ROUTE => Some(routed(buffer::compile_per_route(
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            _ => None,
        };
        if let Some(kind) = kind {
            out.push((
                Arc::from(name.as_str()),
                PerRoute::Config(kind.map_err(|e| e.within(&at))?),
            ));
        }
    }
    Ok((!out.is_empty()).then(|| Box::new(PerFilterConfigs(out))))
}

/// A compiled per-route configuration, as routes keep it.
fn routed<T: FilterRouteConfig>(
    compiled: Result<T, ConfigError>,
) -> Result<Arc<dyn FilterRouteConfig>, ConfigError> {
    compiled.map(|c| Arc::new(c) as Arc<dyn FilterRouteConfig>)
}

/// Decodes `any` as a `T`, its error a [`ConfigError`].
fn unpack<T: prost::Message + prost::Name + Default>(any: &Any) -> Result<T, ConfigError> {
    proto::unpack(any).map_err(|e| ConfigError::new("", e.to_string()))
}
