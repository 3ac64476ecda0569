//! A `TlsCertificate` (chain and private key) -> a rustls `CertifiedKey`, checked to belong
//! together.

use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::TlsCertificate;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::{der, provider, source};
use crate::config::{ConfigError, Context};

/// A certificate chain with its private key, ready to present.
#[derive(Debug, Clone)]
pub struct Certificate {
    /// The chain (leaf first) and signing key.
    pub key: Arc<CertifiedKey>,
    /// Where the chain came from, as Envoy's `/certs` names it: the file, or `<inline>`.
    pub origin: Arc<str>,
    /// The names it serves, for choosing by SNI: its DNS SANs, or without any its common
    /// names (read once here, not at each handshake).
    pub names: Arc<[String]>,
}

/// Compiles a `TlsCertificate`; errors name `chain_certificate` / `private_key` relative to it.
pub fn compile(ctx: &Context<'_>, cert: &TlsCertificate) -> Result<Certificate, ConfigError> {
    const CHAIN: &str = "certificate_chain";
    const KEY: &str = "private_key";
    if cert.private_key_provider.is_some() {
        return Err(ConfigError::new(
            "private_key_provider",
            "private key providers are not implemented by revoy",
        ));
    }
    if cert.password.is_some() {
        return Err(ConfigError::new(
            "password",
            "password-protected private keys are not implemented by revoy",
        ));
    }
    if cert.pkcs12.is_some() {
        return Err(ConfigError::new(
            "pkcs12",
            "PKCS#12 certificates are not implemented by revoy",
        ));
    }
    let chain = source::certificates(
        &source::data(ctx, cert.certificate_chain.as_ref(), CHAIN)?,
        CHAIN,
    )?;
    let key = source::private_key(&source::data(ctx, cert.private_key.as_ref(), KEY)?, KEY)?;
    let mut certified = certified_key(chain, key)?;
    if cert.ocsp_staple.is_some() {
        certified.ocsp = Some(source::data(ctx, cert.ocsp_staple.as_ref(), "ocsp_staple")?);
    }
    let names = served_names(&certified.cert[0]);
    Ok(Certificate {
        key: Arc::new(certified),
        origin: origin(cert.certificate_chain.as_ref()).into(),
        names,
    })
}

/// A certificate's DNS SANs, or without any its common names (how Envoy matches SNI).
fn served_names(der: &[u8]) -> Arc<[String]> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(der) else {
        return Arc::from([]);
    };
    let dns: Vec<String> = match parsed.subject_alternative_name() {
        Ok(Some(ext)) => ext
            .value
            .general_names
            .iter()
            .filter_map(|g| match g {
                x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    if !dns.is_empty() {
        return dns.into();
    }
    parsed
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect::<Vec<_>>()
        .into()
}

/// How `/certs` names a data source.
pub fn origin(source: Option<&DataSource>) -> String {
    match source.and_then(|s| s.specifier.as_ref()) {
        Some(Specifier::Filename(path)) => path.clone(),
        _ => "<inline>".to_owned(),
    }
}

/// The certificate chain with its private key, checked to belong together. rustls checks
/// that by parsing the certificate with webpki, which refuses X.509 v1 certificates (what
/// `openssl x509 -req` makes without extensions, as in Envoy's TLS sandboxes); Envoy serves
/// them, so for a certificate webpki cannot parse the key is found with [`der`] instead.
fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, ConfigError> {
    let signing = provider::base()
        .key_provider
        .load_private_key(key)
        .map_err(|e| ConfigError::new("private_key", format!("failed to load private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    let matches = match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => true,
        Err(rustls::Error::InconsistentKeys(_)) => false,
        Err(parse) => {
            let spki = der::subject_public_key_info(&certified.cert[0]).ok_or_else(|| {
                ConfigError::new(
                    "certificate_chain",
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
        return Err(ConfigError::new(
            "private_key",
            "the private key does not match the certificate's public key",
        ));
    }
    Ok(certified)
}
