//! `Bootstrap.dynamic_resources` -> [`DynamicConfig`]: where listeners and clusters come from
//! (an ADS stream, or files), how to reach the control plane, and how long start-up waits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use proto::pb::envoy::config::bootstrap::v3::Bootstrap;
use proto::pb::envoy::config::core::v3::{
    ApiConfigSource, ConfigSource, address, api_config_source::ApiType,
    config_source::ConfigSourceSpecifier, grpc_service::TargetSpecifier,
};
use proto::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;

use super::ConfigError;
use super::watched_file::WatchedFile;

mod keep_alive;

pub use keep_alive::KeepAlive;

/// Envoy's default `initial_fetch_timeout`.
const DEFAULT_INITIAL_FETCH_TIMEOUT: Duration = Duration::from_secs(15);

/// How long what `cs` delivers is waited for before going on without it: its
/// `initial_fetch_timeout`, 15 s when unset, `None` (for ever) when 0.
pub fn initial_fetch_timeout(cs: &ConfigSource) -> Option<Duration> {
    match &cs.initial_fetch_timeout {
        None => Some(DEFAULT_INITIAL_FETCH_TIMEOUT),
        Some(d) if d.seconds == 0 && d.nanos == 0 => None,
        Some(d) => Some(super::route::duration(d)),
    }
}

/// Where the control plane is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlPlane {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A unix socket (`pipe`, or a `unix:` target URI).
    Unix(PathBuf),
}

/// The ADS stream (`ads_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct AdsConfig {
    /// Where to connect.
    pub target: ControlPlane,
    /// The static cluster it is reached through (`envoy_grpc`), whose transport socket
    /// (TLS, for one) the stream uses; `None` for `google_grpc`.
    pub cluster: Option<String>,
    /// `api_type: DELTA_GRPC` (else `GRPC`, state of the world).
    pub delta: bool,
    /// `set_node_on_first_message_only`.
    pub set_node_on_first_message_only: bool,
    /// `rate_limit_settings`: `(max_tokens, fill_rate)`, Envoy's defaults filled in.
    pub rate_limit: Option<(u32, f64)>,
    /// HTTP/2 keep-alive on the channel.
    pub keep_alive: KeepAlive,
}

/// Where one type's resources come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The ADS stream.
    Ads,
    /// A file holding a `DiscoveryResponse`, watched for changes.
    Path(WatchedFile),
}

/// A subscription's source and how long start-up waits for its first answer (`None`: for
/// ever, `initial_fetch_timeout: 0s`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// Where the resources come from.
    pub source: Source,
    /// `initial_fetch_timeout`.
    pub initial_fetch_timeout: Option<Duration>,
}

/// A compiled `dynamic_resources`.
#[derive(Debug, Clone, PartialEq)]
pub struct DynamicConfig {
    /// The ADS stream, when some source uses it.
    pub ads: Option<AdsConfig>,
    /// Listeners (`lds_config`).
    pub lds: Option<Subscription>,
    /// Clusters (`cds_config`).
    pub cds: Option<Subscription>,
}

/// Compiles `b.dynamic_resources`; `None` when it is absent. Errors name the field path.
pub fn compile_dynamic(b: &Bootstrap) -> Result<Option<DynamicConfig>, ConfigError> {
    let Some(d) = &b.dynamic_resources else {
        return Ok(None);
    };
    let base = "dynamic_resources";
    if !d.lds_resources_locator.is_empty() || !d.cds_resources_locator.is_empty() {
        return Err(ConfigError::new(
            base,
            "xdstp resource locators (lds_resources_locator, cds_resources_locator) are not supported by revoy",
        ));
    }
    let ads = d
        .ads_config
        .as_ref()
        .map(|a| ads_config(b, a).map_err(|e| e.within(&format!("{base}.ads_config"))))
        .transpose()?;
    let lds = subscription(d.lds_config.as_ref(), &format!("{base}.lds_config"))?;
    let cds = subscription(d.cds_config.as_ref(), &format!("{base}.cds_config"))?;
    for (s, field) in [(&lds, "lds_config"), (&cds, "cds_config")] {
        if matches!(
            s,
            Some(Subscription {
                source: Source::Ads,
                ..
            })
        ) && ads.is_none()
        {
            return Err(ConfigError::new(
                format!("{base}.{field}"),
                "ads: {} needs dynamic_resources.ads_config",
            ));
        }
    }
    Ok(Some(DynamicConfig { ads, lds, cds }))
}

fn subscription(
    source: Option<&ConfigSource>,
    path: &str,
) -> Result<Option<Subscription>, ConfigError> {
    let Some(cs) = source else {
        return Ok(None);
    };
    let initial_fetch_timeout = initial_fetch_timeout(cs);
    #[allow(deprecated)] // `path` is deprecated in favour of `path_config_source`; still used.
    let source = match &cs.config_source_specifier {
        Some(ConfigSourceSpecifier::Ads(_)) => Source::Ads,
        Some(ConfigSourceSpecifier::Path(p)) => Source::Path(WatchedFile::path(p)),
        Some(ConfigSourceSpecifier::PathConfigSource(p)) => Source::Path(
            super::watched_file::compile(p)
                .map_err(|e| e.within(&format!("{path}.path_config_source")))?,
        ),
        Some(ConfigSourceSpecifier::ApiConfigSource(_)) => {
            return Err(ConfigError::new(
                format!("{path}.api_config_source"),
                "a separate xDS stream per type is not supported by revoy; use ads: {} with dynamic_resources.ads_config",
            ));
        }
        Some(ConfigSourceSpecifier::Self_(_)) | None => {
            return Err(ConfigError::new(
                path,
                "config source must be ads or path_config_source",
            ));
        }
    };
    Ok(Some(Subscription {
        source,
        initial_fetch_timeout,
    }))
}

fn ads_config(b: &Bootstrap, a: &ApiConfigSource) -> Result<AdsConfig, ConfigError> {
    let delta = match ApiType::try_from(a.api_type) {
        Ok(ApiType::Grpc) => false,
        Ok(ApiType::DeltaGrpc) => true,
        _ => {
            return Err(ConfigError::new(
                "api_type",
                "ADS needs api_type GRPC or DELTA_GRPC",
            ));
        }
    };
    let service = match a.grpc_services.as_slice() {
        [one] => one,
        [] => {
            return Err(ConfigError::new(
                "grpc_services",
                "ADS needs exactly one grpc_services entry",
            ));
        }
        _ => {
            return Err(ConfigError::new(
                "grpc_services",
                "only one grpc_services entry is allowed for ADS",
            ));
        }
    };
    let (target, cluster, keep_alive) = match &service.target_specifier {
        Some(TargetSpecifier::EnvoyGrpc(e)) => {
            let at = "grpc_services[0].envoy_grpc.cluster_name";
            let target = cluster_target(b, &e.cluster_name).map_err(|e| e.within(at))?;
            let keep_alive = static_cluster(b, &e.cluster_name)
                .map(keep_alive::of_cluster)
                .transpose()
                .map_err(|err| {
                    err.within(&format!("static_resources.clusters['{}']", e.cluster_name))
                })?
                .unwrap_or(KeepAlive::Default);
            (target, Some(e.cluster_name.clone()), keep_alive)
        }
        Some(TargetSpecifier::GoogleGrpc(g)) => {
            let at = "grpc_services[0].google_grpc";
            google_grpc_supported(g).map_err(|e| e.within(at))?;
            let target =
                uri_target(&g.target_uri).map_err(|e| e.within(&format!("{at}.target_uri")))?;
            let keep_alive =
                keep_alive::of_channel_args(g.channel_args.as_ref()).map_err(|e| e.within(at))?;
            (target, None, keep_alive)
        }
        None => {
            return Err(ConfigError::new(
                "grpc_services[0]",
                "one of envoy_grpc, google_grpc is required",
            ));
        }
    };
    let rate_limit = a.rate_limit_settings.as_ref().map(|r| {
        (
            r.max_tokens.as_ref().map_or(100, |v| v.value),
            r.fill_rate.as_ref().map_or(10.0, |v| v.value),
        )
    });
    Ok(AdsConfig {
        target,
        cluster,
        delta,
        set_node_on_first_message_only: a.set_node_on_first_message_only,
        rate_limit,
        keep_alive,
    })
}

/// Refuses what a `google_grpc` service asks for that revoy's plaintext channel cannot do:
/// TLS or Google credentials (reach a TLS control plane through `envoy_grpc` and a cluster
/// with an `UpstreamTlsContext`), call credentials, and credential plugins. Local
/// credentials (plaintext to a local address or socket) are what it does.
fn google_grpc_supported(
    g: &proto::pb::envoy::config::core::v3::grpc_service::GoogleGrpc,
) -> Result<(), ConfigError> {
    use proto::pb::envoy::config::core::v3::grpc_service::google_grpc::channel_credentials::CredentialSpecifier;
    let refused = "is not implemented by revoy's ADS client; use envoy_grpc with a static cluster (its UpstreamTlsContext for TLS)";
    match g
        .channel_credentials
        .as_ref()
        .and_then(|c| c.credential_specifier.as_ref())
    {
        Some(CredentialSpecifier::SslCredentials(_)) => {
            return Err(ConfigError::new(
                "channel_credentials.ssl_credentials",
                format!("TLS on a google_grpc channel {refused}"),
            ));
        }
        Some(CredentialSpecifier::GoogleDefault(_)) => {
            return Err(ConfigError::new(
                "channel_credentials.google_default",
                format!("Google default credentials {refused}"),
            ));
        }
        Some(CredentialSpecifier::LocalCredentials(_)) | None => {}
    }
    for (present, field) in [
        (!g.call_credentials.is_empty(), "call_credentials"),
        (
            !g.channel_credentials_plugin.is_empty(),
            "channel_credentials_plugin",
        ),
        (
            !g.call_credentials_plugin.is_empty(),
            "call_credentials_plugin",
        ),
        (
            !g.credentials_factory_name.is_empty(),
            "credentials_factory_name",
        ),
    ] {
        if present {
            return Err(ConfigError::new(field, format!("{field} {refused}")));
        }
    }
    Ok(())
}

/// The bootstrap's static cluster `name`.
fn static_cluster<'b>(
    b: &'b Bootstrap,
    name: &str,
) -> Option<&'b proto::pb::envoy::config::cluster::v3::Cluster> {
    b.static_resources
        .as_ref()
        .and_then(|s| s.clusters.iter().find(|c| c.name == name))
}

/// The address of the static cluster `name`'s first endpoint: a socket address or a pipe.
pub fn cluster_target(b: &Bootstrap, name: &str) -> Result<ControlPlane, ConfigError> {
    let cluster = static_cluster(b, name).ok_or_else(|| {
        ConfigError::new(
            "",
            format!("'{name}' is not a static cluster of the bootstrap"),
        )
    })?;
    let address = cluster
        .load_assignment
        .as_ref()
        .and_then(|la| la.endpoints.first())
        .and_then(|lle| lle.lb_endpoints.first())
        .and_then(|lbe| match &lbe.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => ep.address.as_ref(),
            _ => None,
        })
        .and_then(|a| a.address.as_ref())
        .ok_or_else(|| {
            ConfigError::new(
                "",
                format!("cluster '{name}' has no endpoint address to reach the control plane at"),
            )
        })?;
    match address {
        address::Address::Pipe(p) => Ok(ControlPlane::Unix(PathBuf::from(&p.path))),
        address::Address::SocketAddress(_) => {
            let a = proto::pb::envoy::config::core::v3::Address {
                address: Some(address.clone()),
            };
            super::listener::socket_addr(Some(&a), "")
                .map(ControlPlane::Tcp)
                .map_err(|e| {
                    ConfigError::new(
                        "",
                        format!("cluster '{name}': {} (an IP address is needed)", e.message),
                    )
                })
        }
        _ => Err(ConfigError::new(
            "",
            format!(
                "cluster '{name}': only socket_address and pipe endpoints can reach a control plane"
            ),
        )),
    }
}

/// A gRPC target URI: `unix:PATH`, `unix://PATH` or `IP:PORT`.
fn uri_target(uri: &str) -> Result<ControlPlane, ConfigError> {
    if let Some(path) = uri
        .strip_prefix("unix://")
        .or_else(|| uri.strip_prefix("unix:"))
    {
        return Ok(ControlPlane::Unix(PathBuf::from(path)));
    }
    uri.parse().map(ControlPlane::Tcp).map_err(|_| {
        ConfigError::new(
            "",
            format!("'{uri}' is neither unix:PATH nor IP:PORT (revoy does not resolve names here)"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bootstrap(yaml: &str) -> Bootstrap {
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).expect("yaml");
        proto::Codec::new()
            .decode(value, false)
            .expect("bootstrap decodes")
            .message
    }

    const ISTIO_LIKE: &str = r#"
dynamic_resources:
  lds_config: { ads: {}, initial_fetch_timeout: 0s, resource_api_version: V3 }
  cds_config: { ads: {}, initial_fetch_timeout: 0s, resource_api_version: V3 }
  ads_config:
    api_type: DELTA_GRPC
    set_node_on_first_message_only: true
    transport_api_version: V3
    grpc_services: [{ envoy_grpc: { cluster_name: xds-grpc } }]
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    load_assignment:
      cluster_name: xds-grpc
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { pipe: { path: ./etc/istio/proxy/XDS } } } }] }]
"#;

    #[test]
    fn istio_bootstrap_uses_delta_ads_over_the_pipe_and_waits_for_ever() {
        let d = compile_dynamic(&bootstrap(ISTIO_LIKE))
            .expect("compiles")
            .expect("present");
        let ads = d.ads.expect("ads");
        assert_eq!(
            ads.target,
            ControlPlane::Unix(PathBuf::from("./etc/istio/proxy/XDS"))
        );
        assert!(ads.delta);
        assert!(ads.set_node_on_first_message_only);
        assert_eq!(ads.rate_limit, None);
        let lds = d.lds.expect("lds");
        assert_eq!(lds.source, Source::Ads);
        assert_eq!(lds.initial_fetch_timeout, None);
    }

    #[test]
    fn an_unknown_ads_cluster_is_named_by_path() {
        let yaml = ISTIO_LIKE.replace("cluster_name: xds-grpc }", "cluster_name: nope }");
        let e = compile_dynamic(&bootstrap(&yaml)).expect_err("unknown cluster");
        assert_eq!(
            e.path,
            "dynamic_resources.ads_config.grpc_services[0].envoy_grpc.cluster_name"
        );
        assert!(e.message.contains("'nope'"), "{e}");
    }

    #[test]
    fn sotw_over_tcp_with_default_timeout_and_rate_limit_defaults() {
        let yaml = r#"
dynamic_resources:
  cds_config: { ads: {} }
  ads_config:
    api_type: GRPC
    rate_limit_settings: {}
    grpc_services: [{ google_grpc: { target_uri: "127.0.0.1:18000", stat_prefix: x } }]
"#;
        let d = compile_dynamic(&bootstrap(yaml))
            .expect("compiles")
            .expect("present");
        let ads = d.ads.expect("ads");
        assert_eq!(
            ads.target,
            ControlPlane::Tcp("127.0.0.1:18000".parse().unwrap())
        );
        assert!(!ads.delta);
        assert_eq!(ads.rate_limit, Some((100, 10.0)));
        assert_eq!(
            d.cds.expect("cds").initial_fetch_timeout,
            Some(DEFAULT_INITIAL_FETCH_TIMEOUT)
        );
        assert_eq!(d.lds, None);
    }

    #[test]
    fn google_grpc_credentials_revoy_lacks_are_refused_by_path() {
        let google = |fields: &str| {
            format!(
                "dynamic_resources:\n  ads_config:\n    api_type: GRPC\n    grpc_services: [{{ google_grpc: {{ target_uri: \"127.0.0.1:18000\", stat_prefix: x, {fields} }} }}]\n"
            )
        };
        let e = compile_dynamic(&bootstrap(&google(
            "channel_credentials: {ssl_credentials: {}}",
        )))
        .expect_err("TLS credentials");
        assert_eq!(
            e.path,
            "dynamic_resources.ads_config.grpc_services[0].google_grpc.channel_credentials.ssl_credentials"
        );
        let e = compile_dynamic(&bootstrap(&google("call_credentials: [{access_token: t}]")))
            .expect_err("call credentials");
        assert!(e.path.ends_with("google_grpc.call_credentials"), "{e}");
        let local = keep_alive_of(&google(
            "channel_credentials: {local_credentials: {}}, channel_args: {args: {grpc.keepalive_time_ms: {int_value: 1000}}}",
        ));
        assert_eq!(local, every(1, 20), "local credentials are plaintext");
    }

    /// The ADS channel's keep-alive under the bootstrap `yaml`.
    fn keep_alive_of(yaml: &str) -> KeepAlive {
        compile_dynamic(&bootstrap(yaml))
            .expect("compiles")
            .expect("present")
            .ads
            .expect("ads")
            .keep_alive
    }

    /// A PING every `interval` seconds, `timeout` seconds to answer.
    fn every(interval: u64, timeout: u64) -> KeepAlive {
        KeepAlive::Every {
            interval: Duration::from_secs(interval),
            timeout: Duration::from_secs(timeout),
        }
    }

    #[test]
    fn the_xds_clusters_keep_alive_is_the_channels() {
        let yaml = ISTIO_LIKE.replace(
            "    type: STATIC\n",
            "    type: STATIC\n    http2_protocol_options: {connection_keepalive: {interval: 30s, timeout: 10s}}\n",
        );
        assert_ne!(yaml, ISTIO_LIKE);
        assert_eq!(keep_alive_of(&yaml), every(30, 10));
    }

    #[test]
    fn ads_sources_without_ads_config_are_refused() {
        let e = compile_dynamic(&bootstrap("dynamic_resources: { lds_config: { ads: {} } }"))
            .expect_err("no ads_config");
        assert_eq!(e.path, "dynamic_resources.lds_config");
    }
}
