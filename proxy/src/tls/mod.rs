//! Downstream TLS termination: `DownstreamTlsContext` -> a rustls server configuration.
//!
//! Certificates come from `tls_certificates` data sources (file, inline, environment variable).
//! Contexts whose certificates are delivered by SDS cannot serve until an SDS client exists:
//! they are reported as [`DownstreamTls::AwaitingSds`] and their connections are refused.

pub mod der;

use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, common_tls_context::ValidationContextType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use tokio_rustls::TlsAcceptor;

/// Why a TLS context could not be built; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TlsError {
    /// The field path inside the DownstreamTlsContext.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn err(field: &str, message: impl Into<String>) -> TlsError {
    TlsError {
        field: field.into(),
        message: message.into(),
    }
}

/// A downstream TLS context ready to accept, or waiting for SDS secrets.
#[derive(Clone)]
pub enum DownstreamTls {
    /// Accepts TLS connections.
    Ready(TlsAcceptor),
    /// Names of the SDS secrets the context needs.
    AwaitingSds(Vec<String>),
}

/// Reads a data source (`filename`, `inline_bytes`, `inline_string`, `environment_variable`).
fn data(source: Option<&DataSource>, field: &str) -> Result<Vec<u8>, TlsError> {
    match source.and_then(|s| s.specifier.as_ref()) {
        Some(Specifier::Filename(path)) => {
            std::fs::read(path).map_err(|e| err(field, format!("failed to read file {path}: {e}")))
        }
        Some(Specifier::InlineBytes(b)) => Ok(b.clone()),
        Some(Specifier::InlineString(s)) => Ok(s.clone().into_bytes()),
        Some(Specifier::EnvironmentVariable(v)) => std::env::var(v)
            .map(String::into_bytes)
            .map_err(|_| err(field, format!("environment variable {v} is not set"))),
        None => Err(err(field, "a data source is required")),
    }
}

fn certificates(pem: &[u8], field: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(field, format!("failed to load certificate chain: {e}")))?;
    if certs.is_empty() {
        return Err(err(
            field,
            "failed to load certificate chain: no certificate found",
        ));
    }
    Ok(certs)
}

/// The certificate chain with its private key, checked to belong together. rustls checks
/// that by parsing the certificate with webpki, which refuses X.509 v1 certificates (what
/// `openssl x509 -req` makes without extensions, as in Envoy's TLS sandboxes); Envoy serves
/// them, so for a certificate webpki cannot parse the key is found with [`der`] instead.
fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let signing = provider.key_provider.load_private_key(key).map_err(|e| {
        err(
            "tls_certificates[0].private_key",
            format!("failed to load private key: {e}"),
        )
    })?;
    let certified = CertifiedKey::new(chain, signing);
    let matches = match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => true,
        Err(rustls::Error::InconsistentKeys(_)) => false,
        Err(parse) => {
            let spki = der::subject_public_key_info(&certified.cert[0]).ok_or_else(|| {
                err(
                    "tls_certificates[0].certificate_chain",
                    format!("failed to load certificate chain: {parse}"),
                )
            })?;
            certified
                .key
                .public_key()
                .is_none_or(|key| key.as_ref() == spki)
        }
    };
    if !matches {
        return Err(err(
            "tls_certificates[0].private_key",
            "the private key does not match the certificate's public key",
        ));
    }
    Ok(certified)
}

/// Builds the acceptor for a DownstreamTlsContext.
pub fn downstream(ctx: &DownstreamTlsContext) -> Result<DownstreamTls, TlsError> {
    let common = ctx.common_tls_context.clone().unwrap_or_default();
    if common.tls_certificates.is_empty() {
        let sds: Vec<String> = common
            .tls_certificate_sds_secret_configs
            .iter()
            .map(|s| s.name.clone())
            .collect();
        if sds.is_empty() {
            return Err(err(
                "common_tls_context.tls_certificates",
                "no certificate configured",
            ));
        }
        return Ok(DownstreamTls::AwaitingSds(sds));
    }
    let cert = &common.tls_certificates[0];
    let chain = certificates(
        &data(
            cert.certificate_chain.as_ref(),
            "tls_certificates[0].certificate_chain",
        )?,
        "tls_certificates[0].certificate_chain",
    )?;
    let key_pem = data(cert.private_key.as_ref(), "tls_certificates[0].private_key")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        err(
            "tls_certificates[0].private_key",
            format!("failed to load private key: {e}"),
        )
    })?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = {
        let params = common.tls_params.clone().unwrap_or_default();
        let min = if params.tls_minimum_protocol_version == 0 {
            3
        } else {
            params.tls_minimum_protocol_version
        };
        let max = if params.tls_maximum_protocol_version == 0 {
            4
        } else {
            params.tls_maximum_protocol_version
        };
        [(3, &rustls::version::TLS12), (4, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, p)| p)
            .collect()
    };
    if versions.is_empty() {
        return Err(err(
            "common_tls_context.tls_params",
            "no TLS version revoy supports (1.2, 1.3) is allowed",
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| err("common_tls_context.tls_params", e.to_string()))?;
    let trusted_ca = match &common.validation_context_type {
        Some(ValidationContextType::ValidationContext(v)) => v.trusted_ca.as_ref(),
        Some(ValidationContextType::CombinedValidationContext(c)) => c
            .default_validation_context
            .as_ref()
            .and_then(|v| v.trusted_ca.as_ref()),
        _ => None,
    };
    let require_client = ctx.require_client_certificate.is_some_and(|b| b.value);
    let builder = match trusted_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(
                &data(Some(ca), "validation_context.trusted_ca")?,
                "validation_context.trusted_ca",
            )? {
                roots
                    .add(c)
                    .map_err(|e| err("validation_context.trusted_ca", e.to_string()))?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let verifier = if require_client {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| err("validation_context", e.to_string()))?,
            )
        }
        // As in Envoy, require_client_certificate has no effect without a trusted_ca: no client
        // certificate is asked for (config/listener.rs notes it at start).
        None => builder.with_no_client_auth(),
    };
    let certified = certified_key(chain, key, &provider)?;
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = common
        .alpn_protocols
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    Ok(DownstreamTls::Ready(TlsAcceptor::from(Arc::new(config))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
        CommonTlsContext, SdsSecretConfig, TlsCertificate,
    };

    fn file(name: &str) -> DataSource {
        DataSource {
            specifier: Some(Specifier::Filename(format!(
                "{}/tests/differential/certs/{name}",
                env!("CARGO_MANIFEST_DIR")
            ))),
            ..Default::default()
        }
    }

    fn context(cert: DataSource, key: DataSource) -> DownstreamTlsContext {
        DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificates: vec![TlsCertificate {
                    certificate_chain: Some(cert),
                    private_key: Some(key),
                    ..Default::default()
                }],
                alpn_protocols: vec!["h2".into()],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn loads_certificates_and_names_bad_sources() {
        assert!(matches!(
            downstream(&context(file("server.pem"), file("server.key"))),
            Ok(DownstreamTls::Ready(_))
        ));
        let e = downstream(&context(file("missing.pem"), file("server.key")))
            .err()
            .unwrap();
        assert_eq!(e.field, "tls_certificates[0].certificate_chain");
        assert!(e.message.contains("missing.pem"), "{e}");
        let e = downstream(&context(file("server.pem"), file("server.pem")))
            .err()
            .unwrap();
        assert_eq!(e.field, "tls_certificates[0].private_key");
    }

    #[test]
    fn serves_x509_v1_certificates_and_checks_their_key() {
        assert!(matches!(
            downstream(&context(file("v1.pem"), file("v1.key"))),
            Ok(DownstreamTls::Ready(_))
        ));
        for (cert, key) in [("v1.pem", "server.key"), ("server.pem", "v1.key")] {
            let e = downstream(&context(file(cert), file(key))).err().unwrap();
            assert_eq!(e.field, "tls_certificates[0].private_key", "{cert} {key}");
            assert!(e.message.contains("does not match"), "{e}");
        }
    }

    #[test]
    fn sds_certificates_wait_for_sds() {
        let ctx = DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificate_sds_secret_configs: vec![SdsSecretConfig {
                    name: "default".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        match downstream(&ctx) {
            Ok(DownstreamTls::AwaitingSds(names)) => assert_eq!(names, vec!["default"]),
            _ => panic!("expected AwaitingSds"),
        }
    }
}
