//! Reading what a TLS context names: `DataSource`s (file, inline, environment variable) through
//! the compile's [`Context`], and the PEM they hold.

use proto::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, pem::PemObject,
};

use crate::config::{ConfigError, Context};

/// Reads a data source (`filename`, `inline_bytes`, `inline_string`, `environment_variable`);
/// `field` names it in errors.
pub fn data(
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

/// The PEM certificates in `pem`, at least one.
pub fn certificates(pem: &[u8], field: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
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

/// The private key in `pem` (PKCS#1, PKCS#8 or SEC1).
pub fn private_key(pem: &[u8], field: &str) -> Result<PrivateKeyDer<'static>, ConfigError> {
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| ConfigError::new(field, format!("failed to load private key: {e}")))
}

/// The PEM certificate revocation lists in `pem`, at least one.
pub fn crls(
    pem: &[u8],
    field: &str,
) -> Result<Vec<CertificateRevocationListDer<'static>>, ConfigError> {
    let crls = CertificateRevocationListDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::new(field, format!("failed to load CRL: {e}")))?;
    if crls.is_empty() {
        return Err(ConfigError::new(field, "failed to load CRL: no CRL found"));
    }
    Ok(crls)
}
