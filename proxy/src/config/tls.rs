//! `DownstreamTlsContext` -> a rustls server configuration, ready to accept.
//!
//! Certificates come from `tls_certificates` data sources (file, inline, environment variable),
//! read through the compile's [`Context`]. Errors are [`ConfigError`]s whose path is relative
//! to the `DownstreamTlsContext`. A context whose certificates are delivered by SDS is never
//! built: its chain refuses every connection (see `config/listener.rs`).

pub mod der;

use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, common_tls_context::ValidationContextType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};

use super::{ConfigError, Context};

const CHAIN: &str = "common_tls_context.tls_certificates[0].certificate_chain";
const KEY: &str = "common_tls_context.tls_certificates[0].private_key";
const PARAMS: &str = "common_tls_context.tls_params";

/// Reads a data source (`filename`, `inline_bytes`, `inline_string`, `environment_variable`).
fn data(
    ctx: &Context<'_>,
    source: Option<&DataSource>,
    field: &str,
) -> Result<Vec<u8>, ConfigError> {
    match source.and_then(|s| s.specifier.as_ref()) {
        Some(Specifier::Filename(path)) => ctx
            .io()
            .read_file(path)
            .map_err(|e| ConfigError::new(field, format!("failed to read file {path}: {e}"))),
        Some(Specifier::InlineBytes(b)) => Ok(b.clone()),
        Some(Specifier::InlineString(s)) => Ok(s.clone().into_bytes()),
        Some(Specifier::EnvironmentVariable(v)) => {
            ctx.io().env(v).map(String::into_bytes).ok_or_else(|| {
                ConfigError::new(field, format!("environment variable {v} is not set"))
            })
        }
        None => Err(ConfigError::new(field, "a data source is required")),
    }
}

fn certificates(pem: &[u8], field: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::new(field, format!("failed to load certificate chain: {e}")))?;
    if certs.is_empty() {
        return Err(ConfigError::new(
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
) -> Result<CertifiedKey, ConfigError> {
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| ConfigError::new(KEY, format!("failed to load private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    let matches = match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => true,
        Err(rustls::Error::InconsistentKeys(_)) => false,
        Err(parse) => {
            let spki = der::subject_public_key_info(&certified.cert[0]).ok_or_else(|| {
                ConfigError::new(CHAIN, format!("failed to load certificate chain: {parse}"))
            })?;
            certified
                .key
                .public_key()
                .is_none_or(|key| key.as_ref() == spki)
        }
    };
    if !matches {
        return Err(ConfigError::new(
            KEY,
            "the private key does not match the certificate's public key",
        ));
    }
    Ok(certified)
}

/// Builds the rustls server configuration of a `DownstreamTlsContext` (its first
/// certificate, its TLS versions, client-certificate verification against `trusted_ca`, its
/// ALPN list), reading files and environment variables through `ctx`.
pub fn downstream(
    ctx: &Context<'_>,
    tls: &DownstreamTlsContext,
) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
    let common = tls.common_tls_context.clone().unwrap_or_default();
    let Some(cert) = common.tls_certificates.first() else {
        return Err(ConfigError::new(
            "common_tls_context.tls_certificates",
            "no certificate configured",
        ));
    };
    let chain = certificates(&data(ctx, cert.certificate_chain.as_ref(), CHAIN)?, CHAIN)?;
    let key_pem = data(ctx, cert.private_key.as_ref(), KEY)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| ConfigError::new(KEY, format!("failed to load private key: {e}")))?;
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
        return Err(ConfigError::new(
            PARAMS,
            "no TLS version revoy supports (1.2, 1.3) is allowed",
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| ConfigError::new(PARAMS, e.to_string()))?;
    let trusted_ca = match &common.validation_context_type {
        Some(ValidationContextType::ValidationContext(v)) => v
            .trusted_ca
            .as_ref()
            .map(|ca| (ca, "common_tls_context.validation_context")),
        Some(ValidationContextType::CombinedValidationContext(c)) => c
            .default_validation_context
            .as_ref()
            .and_then(|v| v.trusted_ca.as_ref())
            .map(|ca| {
                (
                    ca,
                    "common_tls_context.combined_validation_context.default_validation_context",
                )
            }),
        _ => None,
    };
    let require_client = tls.require_client_certificate.is_some_and(|b| b.value);
    let builder = match trusted_ca {
        Some((ca, validation)) => {
            let field = format!("{validation}.trusted_ca");
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(&data(ctx, Some(ca), &field)?, &field)? {
                roots
                    .add(c)
                    .map_err(|e| ConfigError::new(&field, e.to_string()))?;
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
                    .map_err(|e| ConfigError::new(validation, e.to_string()))?,
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
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigIo, FakeIo};
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, CommonTlsContext, TlsCertificate,
    };

    /// The test certificates, as files of a fake file system under `/certs`.
    fn certs() -> FakeIo {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/differential/certs");
        ["server.pem", "server.key", "v1.pem", "v1.key"]
            .into_iter()
            .fold(FakeIo::new(), |io, name| {
                let bytes = std::fs::read(format!("{dir}/{name}")).unwrap();
                io.with_file(&format!("/certs/{name}"), bytes)
            })
    }

    fn file(name: &str) -> DataSource {
        DataSource {
            specifier: Some(Specifier::Filename(format!("/certs/{name}"))),
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

    fn build(
        io: &FakeIo,
        tls: &DownstreamTlsContext,
    ) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
        downstream(&Context::new(io), tls)
    }

    #[test]
    fn loads_certificates_and_names_bad_sources() {
        let io = certs();
        let config = build(&io, &context(file("server.pem"), file("server.key"))).unwrap();
        assert_eq!(config.alpn_protocols, [b"h2".to_vec()]);
        let e = build(&io, &context(file("missing.pem"), file("server.key"))).unwrap_err();
        assert_eq!(e.path, CHAIN);
        assert!(e.message.contains("/certs/missing.pem"), "{e}");
        let e = build(&io, &context(file("server.pem"), file("server.pem"))).unwrap_err();
        assert_eq!(e.path, KEY);
        let env = DataSource {
            specifier: Some(Specifier::EnvironmentVariable("CERT".into())),
            ..Default::default()
        };
        let e = build(&io, &context(env.clone(), file("server.key"))).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{CHAIN}: environment variable CERT is not set")
        );
        let pem = String::from_utf8(io.read_file("/certs/server.pem").unwrap()).unwrap();
        let io = io.with_env("CERT", &pem);
        assert!(build(&io, &context(env, file("server.key"))).is_ok());
    }

    #[test]
    fn serves_x509_v1_certificates_and_checks_their_key() {
        let io = certs();
        assert!(build(&io, &context(file("v1.pem"), file("v1.key"))).is_ok());
        for (cert, key) in [("v1.pem", "server.key"), ("server.pem", "v1.key")] {
            let e = build(&io, &context(file(cert), file(key))).unwrap_err();
            assert_eq!(e.path, KEY, "{cert} {key}");
            assert!(e.message.contains("does not match"), "{e}");
        }
    }

    #[test]
    fn a_bad_trusted_ca_is_named_by_its_field() {
        let mut tls = context(file("server.pem"), file("server.key"));
        let common = tls.common_tls_context.as_mut().unwrap();
        common.validation_context_type = Some(ValidationContextType::ValidationContext(
            CertificateValidationContext {
                trusted_ca: Some(file("server.key")),
                ..Default::default()
            },
        ));
        let e = build(&certs(), &tls).unwrap_err();
        assert_eq!(e.path, "common_tls_context.validation_context.trusted_ca");
        assert!(e.message.contains("no certificate found"), "{e}");
    }

    #[test]
    fn a_context_without_certificates_is_an_error() {
        let e = build(&certs(), &DownstreamTlsContext::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "common_tls_context.tls_certificates: no certificate configured"
        );
    }
}
