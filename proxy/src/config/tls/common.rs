//! A `CommonTlsContext` -> [`CommonTls`]: the certificates a side presents, how it checks its
//! peer, ALPN and `tls_params`. Certificates and validation contexts delivered by SDS are named
//! here and resolved at run time (`crate::tls`), so a rotation never recompiles a context.

use std::sync::Arc;

use prost::Message;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, common_tls_context::ValidationContextType,
};

use super::certificate::{self, Certificate};
use super::provider::{self, Params, Side};
use super::sds::{self, SecretRef};
use super::validation::{self, Validation};
use crate::config::{ConfigError, Context};

/// The certificates a side presents.
#[derive(Debug, Clone)]
pub enum Certificates {
    /// None configured (a client without a client certificate).
    None,
    /// `tls_certificates`, in order (the first is the default).
    Static(Vec<Certificate>),
    /// `tls_certificate_sds_secret_configs`, in order.
    Sds(Vec<SecretRef>),
}

/// How a side checks its peer's certificate.
#[derive(Debug, Clone)]
pub enum ValidationSpec {
    /// No `validation_context`: any certificate (or none) is accepted.
    None,
    /// A `validation_context` in the config.
    Static(Arc<Validation>),
    /// `validation_context_sds_secret_config`, or a `combined_validation_context`: the secret,
    /// merged over the default context (proto `MergeFrom`, as Envoy combines them).
    Sds {
        /// The secret holding a `CertificateValidationContext`.
        secret: SecretRef,
        /// `default_validation_context`, when combined.
        default: Option<Arc<CertificateValidationContext>>,
    },
}

/// A compiled `CommonTlsContext`.
#[derive(Debug, Clone)]
pub struct CommonTls {
    /// What this side presents.
    pub certificates: Certificates,
    /// How the peer is checked.
    pub validation: ValidationSpec,
    /// `alpn_protocols`, in order.
    pub alpn: Vec<Vec<u8>>,
    /// `tls_params`.
    pub params: Params,
}

impl CommonTls {
    /// Every secret the context waits for.
    pub fn secrets(&self) -> Vec<&SecretRef> {
        let mut out: Vec<&SecretRef> = match &self.certificates {
            Certificates::Sds(refs) => refs.iter().collect(),
            _ => Vec::new(),
        };
        if let ValidationSpec::Sds { secret, .. } = &self.validation {
            out.push(secret);
        }
        out
    }
}

/// A dynamic validation context merged over a combined context's default, as Envoy does.
pub fn combine(
    default: Option<&CertificateValidationContext>,
    dynamic: &CertificateValidationContext,
) -> CertificateValidationContext {
    match default {
        None => dynamic.clone(),
        Some(d) => {
            let mut merged = d.clone();
            merged
                .merge(dynamic.encode_to_vec().as_slice())
                .expect("a message re-decodes from its own encoding");
            merged
        }
    }
}

/// Compiles a `CommonTlsContext` for `side`; errors name fields relative to it.
#[allow(deprecated)] // the certificate-provider fields: still in configs, so still refused.
pub fn compile(
    ctx: &Context<'_>,
    c: &CommonTlsContext,
    side: Side,
) -> Result<CommonTls, ConfigError> {
    if c.tls_certificate_provider_instance.is_some() {
        return Err(ConfigError::new(
            "tls_certificate_provider_instance",
            "certificates from a certificate provider are not implemented by revoy",
        ));
    }
    for (set, field) in [
        (
            c.custom_tls_certificate_selector.is_some(),
            "custom_tls_certificate_selector",
        ),
        (
            c.tls_certificate_certificate_provider.is_some(),
            "tls_certificate_certificate_provider",
        ),
        (
            c.tls_certificate_certificate_provider_instance.is_some(),
            "tls_certificate_certificate_provider_instance",
        ),
    ] {
        if set {
            return Err(ConfigError::new(
                field,
                "certificates chosen or provided by an extension are not implemented by revoy",
            ));
        }
    }
    if c.custom_handshaker.is_some() {
        return Err(ConfigError::new(
            "custom_handshaker",
            "custom handshakers are not implemented by revoy",
        ));
    }
    let certificates = if !c.tls_certificates.is_empty() {
        if !c.tls_certificate_sds_secret_configs.is_empty() {
            return Err(ConfigError::new(
                "tls_certificate_sds_secret_configs",
                "tls_certificates and tls_certificate_sds_secret_configs cannot both be set",
            ));
        }
        Certificates::Static(
            c.tls_certificates
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    certificate::compile(ctx, t)
                        .map_err(|e| e.within(&format!("tls_certificates[{i}]")))
                })
                .collect::<Result<_, _>>()?,
        )
    } else if !c.tls_certificate_sds_secret_configs.is_empty() {
        Certificates::Sds(
            c.tls_certificate_sds_secret_configs
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    sds::compile(s)
                        .map_err(|e| e.within(&format!("tls_certificate_sds_secret_configs[{i}]")))
                })
                .collect::<Result<_, _>>()?,
        )
    } else {
        Certificates::None
    };
    let validation = match &c.validation_context_type {
        None => ValidationSpec::None,
        Some(ValidationContextType::ValidationContext(v)) => ValidationSpec::Static(Arc::new(
            validation::compile(ctx, v).map_err(|e| e.within("validation_context"))?,
        )),
        Some(ValidationContextType::ValidationContextSdsSecretConfig(s)) => ValidationSpec::Sds {
            secret: sds::compile(s)
                .map_err(|e| e.within("validation_context_sds_secret_config"))?,
            default: None,
        },
        Some(ValidationContextType::CombinedValidationContext(combined)) => {
            let at = "combined_validation_context";
            if combined.validation_context_certificate_provider.is_some()
                || combined
                    .validation_context_certificate_provider_instance
                    .is_some()
            {
                return Err(ConfigError::new(
                    format!("{at}.validation_context_certificate_provider"),
                    "a validation context from a certificate provider is not implemented by revoy",
                ));
            }
            let secret = combined
                .validation_context_sds_secret_config
                .as_ref()
                .ok_or_else(|| {
                    ConfigError::new(
                        format!("{at}.validation_context_sds_secret_config"),
                        "value is required",
                    )
                })?;
            let default = combined
                .default_validation_context
                .clone()
                .unwrap_or_default();
            // The default alone must compile: its matchers and files are checked now.
            validation::compile(ctx, &default)
                .map_err(|e| e.within(&format!("{at}.default_validation_context")))?;
            ValidationSpec::Sds {
                secret: sds::compile(secret)
                    .map_err(|e| e.within(&format!("{at}.validation_context_sds_secret_config")))?,
                default: Some(Arc::new(default)),
            }
        }
        Some(_) => {
            return Err(ConfigError::new(
                "validation_context_certificate_provider",
                "a validation context from a certificate provider is not implemented by revoy",
            ));
        }
    };
    Ok(CommonTls {
        certificates,
        validation,
        alpn: c
            .alpn_protocols
            .iter()
            .map(|p| p.as_bytes().to_vec())
            .collect(),
        params: provider::compile(c.tls_params.as_ref(), side)
            .map_err(|e| e.within("tls_params"))?,
    })
}
