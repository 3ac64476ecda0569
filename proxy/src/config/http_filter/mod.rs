//! The HCM's `http_filters` -> [`FilterChain`], and routes' `typed_per_filter_config` ->
//! [`PerFilterConfigs`]: which filters run, in order, with what configuration. The runtime of
//! each filter is in `crate::http::filters`.
//!
//! A filter revoy implements compiles to a [`FilterKind`]; one it lacks is skipped with a
//! warning, or, when it controls access (see [`super::fail_closed`]), compiles to
//! [`FilterKind::FailClosed`], which denies every request that reaches it.

pub mod basic_auth;
pub mod buffer;
pub mod compressor;
pub mod cors;
pub mod csrf;
pub mod decompressor;
pub mod ext_authz;
pub mod fault;
pub mod grpc_http1_bridge;
pub mod grpc_stats;
pub mod header_to_metadata;
pub mod health_check;
pub mod jwt_authn;
pub mod local_ratelimit;
pub mod lua;
pub mod matching;
pub mod ratelimit;

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
const GRPC_STATS: &str = "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig";
const BUFFER_PER_ROUTE: &str = "envoy.extensions.filters.http.buffer.v3.BufferPerRoute";
const EXT_AUTHZ: &str = "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz";
const EXT_AUTHZ_PER_ROUTE: &str = "envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute";
const BASIC_AUTH: &str = "envoy.extensions.filters.http.basic_auth.v3.BasicAuth";
const BASIC_AUTH_PER_ROUTE: &str = "envoy.extensions.filters.http.basic_auth.v3.BasicAuthPerRoute";
const JWT_AUTHN: &str = "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";
const JWT_AUTHN_PER_ROUTE: &str = "envoy.extensions.filters.http.jwt_authn.v3.PerRouteConfig";
const RBAC: &str = "envoy.extensions.filters.http.rbac.v3.RBAC";
const RBAC_PER_ROUTE: &str = "envoy.extensions.filters.http.rbac.v3.RBACPerRoute";
const CORS: &str = "envoy.extensions.filters.http.cors.v3.Cors";
const CORS_POLICY: &str = "envoy.extensions.filters.http.cors.v3.CorsPolicy";
const CSRF: &str = "envoy.extensions.filters.http.csrf.v3.CsrfPolicy";
const COMPRESSOR: &str = "envoy.extensions.filters.http.compressor.v3.Compressor";
const COMPRESSOR_PER_ROUTE: &str = "envoy.extensions.filters.http.compressor.v3.CompressorPerRoute";
const DECOMPRESSOR: &str = "envoy.extensions.filters.http.decompressor.v3.Decompressor";
const HEADER_TO_METADATA: &str = "envoy.extensions.filters.http.header_to_metadata.v3.Config";
const LUA: &str = "envoy.extensions.filters.http.lua.v3.Lua";
const LUA_PER_ROUTE: &str = "envoy.extensions.filters.http.lua.v3.LuaPerRoute";
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
    /// The matcher of an `ExtensionWithMatcher` around it: requests it ends in `SkipFilter`
    /// for do not run the filter.
    pub matcher: Option<Arc<crate::route::filter_matcher::Matcher>>,
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
    /// `envoy.filters.http.compressor`.
    Compressor(Arc<compressor::CompressorConfig>),
    /// `envoy.filters.http.decompressor`.
    Decompressor(Arc<decompressor::DecompressorConfig>),
    /// `envoy.filters.http.local_ratelimit`.
    LocalRateLimit(Arc<local_ratelimit::LocalRateLimitConfig>),
    /// `envoy.filters.http.ratelimit`.
    RateLimit(Arc<ratelimit::RateLimitServiceConfig>),
    /// `envoy.filters.http.health_check`.
    HealthCheck(Arc<health_check::HealthCheckConfig>),
    /// `envoy.filters.http.ext_authz`.
    ExtAuthz(Arc<ext_authz::ExtAuthzConfig>),
    /// `envoy.filters.http.basic_auth`.
    BasicAuth(Arc<basic_auth::BasicAuthConfig>),
    /// `envoy.filters.http.jwt_authn`.
    JwtAuthn(Arc<jwt_authn::JwtAuthnConfig>),
    /// `envoy.filters.http.rbac`.
    Rbac {
        /// Its rules.
        config: Arc<super::rbac::HttpRbacConfig>,
        /// A filter revoy skips (or a jwt_authn asked for metadata revoy does not keep) that
        /// runs before it (in this chain or the listener's): rules reading dynamic metadata
        /// or filter state, which that filter may set, then deny every request they see.
        after_skipped: Option<Arc<str>>,
    },
    /// `envoy.filters.http.cors` (its policies are per route).
    Cors,
    /// `envoy.filters.http.csrf`.
    Csrf(Arc<csrf::CsrfConfig>),
    /// `envoy.filters.http.lua`.
    Lua(Arc<lua::LuaConfig>),
    /// `envoy.filters.http.grpc_web`.
    GrpcWeb,
    /// `envoy.filters.http.grpc_http1_bridge`.
    GrpcHttp1Bridge,
    /// `envoy.filters.http.grpc_stats`.
    GrpcStats(Arc<grpc_stats::GrpcStatsConfig>),
    /// `envoy.filters.http.header_to_metadata`.
    HeaderToMetadata(Arc<header_to_metadata::HeaderToMetadataConfig>),
    /// `istio.alpn`: the ALPN list upstream TLS connections offer, per upstream protocol.
    IstioAlpn(Arc<super::istio::alpn::AlpnOverrides>),
    /// `istio.metadata_exchange` (io.istio.http.peer_metadata.Config): peers' workload
    /// metadata from `x-envoy-peer-metadata` headers, and this proxy's sent in them.
    PeerMetadata(Arc<super::istio::peer_metadata::PeerMetadataConfig>),
    /// `istio.stats` (stats.PluginConfig): Istio's standard request metrics.
    IstioStats(Arc<super::istio::stats::IstioStatsConfig>),
}

impl FilterChain {
    /// Notes that `skipped`, a network filter revoy does not run, comes before this chain
    /// (`at`: the chain's path, for the warnings).
    pub fn after_skipped_network_filter(
        &mut self,
        skipped: &str,
        at: &str,
        warnings: &mut Warnings,
    ) {
        for (i, f) in self.filters.iter_mut().enumerate() {
            if let FilterKind::Rbac {
                config,
                after_skipped: after @ None,
            } = &mut f.kind
            {
                *after = Some(Arc::from(skipped));
                if config.reads_metadata {
                    unknown_metadata_warning(warnings, &format!("{at}.http_filters[{i}]"), skipped);
                }
            }
        }
    }
}

/// The finding of an RBAC filter at `at` whose rules read what `skipped` may set.
fn unknown_metadata_warning(warnings: &mut Warnings, at: &str, skipped: &str) {
    warnings.fails_closed(
        at,
        format!(
            "{}; every request reaching it is denied (403)",
            super::rbac::unknown_metadata(skipped)
        ),
    );
}

/// Compiles `http_filters`. Filters revoy lacks are reported in `warnings` (skipped, or
/// failing closed).
pub fn compile_chain(
    ctx: &Context<'_>,
    filters: &[HttpFilterProto],
    warnings: &mut Warnings,
) -> Result<FilterChain, ConfigError> {
    let mut chain = FilterChain::default();
    let mut skipped: Option<Arc<str>> = None;
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
        let wrapper = match any {
            Some(a) if proto::type_name_of(&a.type_url) == matching::EXTENSION_WITH_MATCHER => {
                Some(unpack(a).map_err(|e| e.within(&format!("{at}.typed_config")))?)
            }
            _ => None,
        };
        let (any, matcher) = match &wrapper {
            Some(w) => {
                let (inner, matcher) = matching::compile(ctx, w)
                    .map_err(|e| e.within(&format!("{at}.typed_config")))?;
                (Some(inner), Some(Arc::new(matcher)))
            }
            None => (any, None),
        };
        let at = match matcher {
            Some(_) => format!("{at}.typed_config.extension_config"),
            None => at,
        };
        let type_name = any.map_or("", |a| proto::type_name_of(&a.type_url));
        if matcher.is_some() && type_name == ROUTER {
            return Err(ConfigError::unimplemented(
                at,
                "an ExtensionWithMatcher around the router",
            ));
        }
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
                let before = warnings.len();
                let kind = compile_kind(ctx, any, warnings);
                warnings.prefix_since(before, &format!("{at}.typed_config"));
                kind.map_err(|e| e.within(&format!("{at}.typed_config")))?
            }
            None => None,
        };
        let kind = match kind {
            Some(FilterKind::Rbac { config, .. }) => {
                if let Some(s) = skipped.as_deref().filter(|_| config.reads_metadata) {
                    unknown_metadata_warning(warnings, &at, s);
                }
                FilterKind::Rbac {
                    config,
                    after_skipped: skipped.clone(),
                }
            }
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
                    skipped.get_or_insert_with(|| Arc::from(f.name.as_str()));
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
            matcher,
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
fn compile_kind(
    ctx: &Context<'_>,
    any: &Any,
    warnings: &mut Warnings,
) -> Result<Option<FilterKind>, ConfigError> {
    Ok(match proto::type_name_of(&any.type_url) {
        FAULT => Some(FilterKind::Fault(Arc::new(fault::compile(
            ctx,
            &unpack(any)?,
        )?))),
        BUFFER => Some(FilterKind::Buffer(buffer::compile(&unpack(any)?)?)),
        local_ratelimit::HTTP_LOCAL_RATE_LIMIT => Some(FilterKind::LocalRateLimit(Arc::new(
            local_ratelimit::compile_local(ctx, &unpack(any)?, false)?,
        ))),
        ratelimit::HTTP_RATE_LIMIT => Some(FilterKind::RateLimit(Arc::new(
            ratelimit::compile_service(ctx, &unpack(any)?)?,
        ))),
        HEALTH_CHECK => Some(FilterKind::HealthCheck(Arc::new(health_check::compile(
            ctx,
            &unpack(any)?,
        )?))),
        EXT_AUTHZ => Some(FilterKind::ExtAuthz(Arc::new(ext_authz::compile(
            ctx,
            &unpack(any)?,
            warnings,
        )?))),
        BASIC_AUTH => Some(FilterKind::BasicAuth(Arc::new(basic_auth::compile(
            ctx,
            &unpack(any)?,
        )?))),
        JWT_AUTHN => Some(FilterKind::JwtAuthn(Arc::new(jwt_authn::compile(
            ctx,
            &unpack(any)?,
            warnings,
        )?))),
        RBAC => Some(FilterKind::Rbac {
            config: Arc::new(super::rbac::compile_http(ctx, &unpack(any)?, warnings)?),
            after_skipped: None,
        }),
        CORS => {
            unpack::<proto::pb::envoy::extensions::filters::http::cors::v3::Cors>(any)?;
            Some(FilterKind::Cors)
        }
        CSRF => Some(FilterKind::Csrf(Arc::new(csrf::compile(
            ctx,
            &unpack(any)?,
        )?))),
        COMPRESSOR => Some(FilterKind::Compressor(Arc::new(compressor::compile(
            &unpack(any)?,
            warnings,
        )?))),
        DECOMPRESSOR => Some(FilterKind::Decompressor(Arc::new(decompressor::compile(
            &unpack(any)?,
        )?))),
        LUA => Some(FilterKind::Lua(Arc::new(lua::compile(ctx, &unpack(any)?)?))),
        GRPC_WEB => {
            unpack::<proto::pb::envoy::extensions::filters::http::grpc_web::v3::GrpcWeb>(any)?;
            Some(FilterKind::GrpcWeb)
        }
        GRPC_HTTP1_BRIDGE => {
            grpc_http1_bridge::compile(&unpack(any)?)?;
            Some(FilterKind::GrpcHttp1Bridge)
        }
        GRPC_STATS => Some(FilterKind::GrpcStats(Arc::new(grpc_stats::compile(
            &unpack(any)?,
        )?))),
        HEADER_TO_METADATA => Some(FilterKind::HeaderToMetadata(Arc::new(
            header_to_metadata::compile(ctx, &unpack(any)?, false, warnings)?,
        ))),
        _ => compile_istio(any, warnings)?,
    })
}

/// The Istio filter `any` configures (from istio/proxy, which stock Envoy lacks), or `None`
/// when it is none revoy has.
fn compile_istio(any: &Any, warnings: &mut Warnings) -> Result<Option<FilterKind>, ConfigError> {
    use super::istio::{Fields, alpn, peer_metadata, stats, wasm};
    if let Some(fields) = Fields::of(any, alpn::FILTER_CONFIG) {
        return Ok(Some(FilterKind::IstioAlpn(Arc::new(alpn::compile(
            fields,
        )?))));
    }
    if let Some(fields) = Fields::of(any, peer_metadata::CONFIG) {
        return Ok(Some(FilterKind::PeerMetadata(Arc::new(
            peer_metadata::compile(fields, warnings)?,
        ))));
    }
    if let Some(fields) = Fields::of(any, stats::PLUGIN_CONFIG) {
        return Ok(Some(FilterKind::IstioStats(Arc::new(stats::compile(
            fields, warnings,
        )?))));
    }
    Ok(match wasm::compile(any, wasm::HTTP_WASM, warnings)? {
        Some(wasm::NullPlugin::MetadataExchange(c)) => Some(FilterKind::PeerMetadata(Arc::new(c))),
        Some(wasm::NullPlugin::Stats(c)) => Some(FilterKind::IstioStats(Arc::from(c))),
        None => None,
    })
}

/// Compiles a `typed_per_filter_config` map. Entries for filters revoy lacks are left out:
/// the filter itself is reported where the connection manager names it. Route compiles keep
/// no warnings, so an `RBACPerRoute`'s notes (metadata matchers that never see metadata) are
/// not listed; the filter-level rules' are.
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
        if proto::type_name_of(&any.type_url) == matching::EXTENSION_WITH_MATCHER_PER_ROUTE {
            return Err(ConfigError::unimplemented(
                at,
                "a per-route ExtensionWithMatcherPerRoute",
            ));
        }
        let kind = match proto::type_name_of(&any.type_url) {
            FAULT => Some(routed(fault::compile(
                ctx,
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            BUFFER_PER_ROUTE => Some(routed(buffer::compile_per_route(
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            local_ratelimit::HTTP_LOCAL_RATE_LIMIT => Some(routed(local_ratelimit::compile_local(
                ctx,
                &unpack(any).map_err(|e| e.within(&at))?,
                true,
            ))),
            ratelimit::HTTP_RATE_LIMIT_PER_ROUTE => Some(routed(ratelimit::compile_per_route(
                ctx,
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            EXT_AUTHZ_PER_ROUTE => Some(routed(ext_authz::compile_per_route(
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            BASIC_AUTH_PER_ROUTE => Some(routed(basic_auth::compile_per_route(
                ctx,
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            JWT_AUTHN_PER_ROUTE => Some(routed(jwt_authn::compile_per_route(
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            RBAC_PER_ROUTE => Some(routed(super::rbac::compile_per_route(
                ctx,
                &unpack(any).map_err(|e| e.within(&at))?,
                &mut Warnings::new(),
            ))),
            CORS_POLICY => Some(routed(cors::compile(
                ctx,
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            CSRF => Some(routed(csrf::compile(
                ctx,
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            COMPRESSOR_PER_ROUTE => Some(routed(compressor::compile_per_route(
                &unpack(any).map_err(|e| e.within(&at))?,
            ))),
            HEADER_TO_METADATA => Some(routed(
                header_to_metadata::compile(
                    ctx,
                    &unpack(any).map_err(|e| e.within(&at))?,
                    true,
                    &mut Warnings::new(),
                )
                .map(Arc::new),
            )),
            LUA_PER_ROUTE => Some(routed(lua::compile_per_route(
                ctx,
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
    Ok((!out.is_empty()).then(|| Box::new(PerFilterConfigs(out, None))))
}

/// A compiled per-route configuration, as routes keep it.
fn routed<T: FilterRouteConfig>(
    compiled: Result<T, ConfigError>,
) -> Result<Arc<dyn FilterRouteConfig>, ConfigError> {
    compiled.map(|c| Arc::new(c) as Arc<dyn FilterRouteConfig>)
}

/// An `HttpUri`'s cluster and timeout, both required (the services and fetches of
/// ext_authz and jwt_authn go through that cluster).
fn http_uri_target(
    h: &proto::pb::envoy::config::core::v3::HttpUri,
) -> Result<(String, std::time::Duration), ConfigError> {
    use proto::pb::envoy::config::core::v3::http_uri::HttpUpstreamType;
    let cluster = match &h.http_upstream_type {
        Some(HttpUpstreamType::Cluster(c)) if !c.is_empty() => c.clone(),
        _ => {
            return Err(ConfigError::new(
                "cluster",
                "value length must be at least 1 characters",
            ));
        }
    };
    let timeout = h
        .timeout
        .as_ref()
        .map(super::route::duration)
        .ok_or_else(|| ConfigError::new("timeout", "value is required"))?;
    Ok((cluster, timeout))
}

/// Decodes `any` as a `T`, its error a [`ConfigError`].
fn unpack<T: prost::Message + prost::Name + Default>(any: &Any) -> Result<T, ConfigError> {
    proto::unpack(any).map_err(|e| ConfigError::new("", e.to_string()))
}
