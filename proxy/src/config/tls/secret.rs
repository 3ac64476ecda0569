//! A `Secret` (from SDS or `static_resources.secrets`) -> [`SecretValue`].

use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
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

/// An SDS secret as Envoy holds it: the files its certificate chain, private key and trusted
/// CA name read into `inline_bytes` (so `/certs` names them `<inline>`, and `/config_dump`
/// shows them inline). A file that cannot be read stays named; compiling the secret then
/// says why.
pub fn inline_files(ctx: &Context<'_>, s: &mut Secret) {
    let inline = |source: Option<&mut DataSource>| {
        if let Some(source) = source
            && let Some(Specifier::Filename(path)) = &source.specifier
            && let Ok(bytes) = ctx.io().read_file(path)
        {
            source.specifier = Some(Specifier::InlineBytes(bytes));
        }
    };
    match &mut s.r#type {
        Some(Type::TlsCertificate(c)) => {
            inline(c.certificate_chain.as_mut());
            inline(c.private_key.as_mut());
        }
        Some(Type::ValidationContext(v)) => inline(v.trusted_ca.as_mut()),
        _ => {}
    }
}
