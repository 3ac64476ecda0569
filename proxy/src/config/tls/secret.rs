//! A `Secret` (from SDS or `static_resources.secrets`) -> [`SecretValue`].

use std::sync::Arc;

use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, secret::Type,
};

use super::certificate::{self, Certificate};
use super::validation::{self, Validation};
use crate::config::{ConfigError, Context};

/// What a secret delivers.
#[derive(Debug, Clone)]
pub enum SecretValue {
    /// A `tls_certificate`.
    Certificate(Certificate),
    /// A `validation_context`: the proto (combined contexts merge their default under it) and
    /// its own compile.
    Validation {
        /// As delivered.
        proto: Arc<CertificateValidationContext>,
        /// Compiled alone.
        compiled: Arc<Validation>,
    },
}

/// Compiles a `Secret`; errors name fields relative to it.
pub fn compile(ctx: &Context<'_>, s: &Secret) -> Result<SecretValue, ConfigError> {
    match &s.r#type {
        Some(Type::TlsCertificate(c)) => Ok(SecretValue::Certificate(
            certificate::compile(ctx, c).map_err(|e| e.within("tls_certificate"))?,
        )),
        Some(Type::ValidationContext(v)) => Ok(SecretValue::Validation {
            compiled: Arc::new(
                validation::compile(ctx, v).map_err(|e| e.within("validation_context"))?,
            ),
            proto: Arc::new(v.clone()),
        }),
        Some(Type::SessionTicketKeys(_)) => Err(ConfigError::new(
            "session_ticket_keys",
            "session ticket key secrets are not implemented by revoy",
        )),
        Some(Type::GenericSecret(_)) => Err(ConfigError::new(
            "generic_secret",
            "generic secrets are not used by any filter revoy implements",
        )),
        None => Err(ConfigError::new(
            "type",
            "a secret needs one of tls_certificate, validation_context",
        )),
    }
}
