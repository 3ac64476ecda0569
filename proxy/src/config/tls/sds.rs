//! `SdsSecretConfig` -> [`SecretRef`]: which secret a TLS context waits for, and where it comes
//! from (the bootstrap's static secrets, the ADS stream, a separate SDS stream such as Istio's
//! `sds-grpc` cluster, or a watched file).

use std::time::Duration;

use proto::pb::envoy::config::core::v3::{
    api_config_source::ApiType, config_source::ConfigSourceSpecifier, grpc_service::TargetSpecifier,
};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::SdsSecretConfig;

use crate::config::ConfigError;
use crate::config::dynamic::initial_fetch_timeout;
use crate::config::watched_file::WatchedFile;

/// Where a secret comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecretSource {
    /// `static_resources.secrets` of the bootstrap (no `sds_config`).
    Static,
    /// The ADS stream.
    Ads,
    /// Its own SDS stream to a static cluster (`api_config_source` with `envoy_grpc`), state
    /// of the world or delta.
    Grpc {
        /// The cluster of the SDS server.
        cluster: String,
        /// `api_type: DELTA_GRPC`.
        delta: bool,
    },
    /// A file holding a `DiscoveryResponse` with the secret, watched for changes.
    File(WatchedFile),
}

/// A secret a TLS context uses, by name and source.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretRef {
    /// The secret's name (Istio: `default`, `ROOTCA`).
    pub name: String,
    /// Where it comes from.
    pub source: SecretSource,
    /// How long a listener or cluster warms waiting for it (`None`: for ever).
    pub initial_fetch_timeout: Option<Duration>,
}

/// Compiles an `SdsSecretConfig`; errors name fields relative to it.
pub fn compile(c: &SdsSecretConfig) -> Result<SecretRef, ConfigError> {
    if c.name.is_empty() {
        return Err(ConfigError::new(
            "name",
            "value length must be at least 1 characters",
        ));
    }
    let Some(cs) = &c.sds_config else {
        return Ok(SecretRef {
            name: c.name.clone(),
            source: SecretSource::Static,
            initial_fetch_timeout: None,
        });
    };
    #[allow(deprecated)] // `path` is deprecated in favour of `path_config_source`; still used.
    let source = match &cs.config_source_specifier {
        Some(ConfigSourceSpecifier::Ads(_)) => SecretSource::Ads,
        Some(ConfigSourceSpecifier::Path(p)) => SecretSource::File(WatchedFile::path(p)),
        Some(ConfigSourceSpecifier::PathConfigSource(p)) => SecretSource::File(
            crate::config::watched_file::compile(p)
                .map_err(|e| e.within("sds_config.path_config_source"))?,
        ),
        Some(ConfigSourceSpecifier::ApiConfigSource(a)) => {
            let at = "sds_config.api_config_source";
            let delta = match ApiType::try_from(a.api_type) {
                Ok(ApiType::Grpc) => false,
                Ok(ApiType::DeltaGrpc) => true,
                _ => {
                    return Err(ConfigError::new(
                        format!("{at}.api_type"),
                        "SDS needs api_type GRPC or DELTA_GRPC",
                    ));
                }
            };
            match a.grpc_services.as_slice() {
                [one] => match &one.target_specifier {
                    Some(TargetSpecifier::EnvoyGrpc(g)) => SecretSource::Grpc {
                        cluster: g.cluster_name.clone(),
                        delta,
                    },
                    _ => {
                        return Err(ConfigError::new(
                            format!("{at}.grpc_services[0]"),
                            "only envoy_grpc (a static cluster) is supported by revoy for SDS",
                        ));
                    }
                },
                _ => {
                    return Err(ConfigError::new(
                        format!("{at}.grpc_services"),
                        "exactly one grpc_services entry is needed",
                    ));
                }
            }
        }
        Some(ConfigSourceSpecifier::Self_(_)) | None => {
            return Err(ConfigError::new(
                "sds_config",
                "config source must be ads, api_config_source or path_config_source",
            ));
        }
    };
    Ok(SecretRef {
        name: c.name.clone(),
        source,
        initial_fetch_timeout: initial_fetch_timeout(cs),
    })
}
