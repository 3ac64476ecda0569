//! A `DownstreamTlsContext` -> [`ServerTls`]: what a listener's filter chain presents and
//! requires.

use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, downstream_tls_context::SessionTicketKeysType,
};

use super::common::{self, CommonTls, ValidationSpec};
use super::provider::Side;
use crate::config::{ConfigError, Context};

/// A compiled `DownstreamTlsContext`.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// Certificates, validation, ALPN, versions.
    pub common: CommonTls,
    /// `require_client_certificate`: a client without a certificate is refused (only with a
    /// validation context, as in Envoy).
    pub require_client_certificate: bool,
    /// Stateless resumption (tickets) is on (`disable_stateless_session_resumption` unset).
    pub tickets: bool,
    /// Stateful resumption (a session cache) is on (`disable_stateful_session_resumption` unset).
    pub session_cache: bool,
    /// `full_scan_certs_on_sni_mismatch`: a server name no certificate has picks among all of
    /// them (by key type) rather than taking the first.
    pub full_scan_certs_on_sni_mismatch: bool,
}

impl ServerTls {
    /// Whether client certificates are asked for (a validation context exists).
    pub fn verifies_clients(&self) -> bool {
        !matches!(self.common.validation, ValidationSpec::None)
    }
}

/// Compiles a `DownstreamTlsContext`; errors name fields relative to it.
pub fn compile(ctx: &Context<'_>, tls: &DownstreamTlsContext) -> Result<ServerTls, ConfigError> {
    let common = common::compile(
        ctx,
        &tls.common_tls_context.clone().unwrap_or_default(),
        Side::Server,
    )
    .map_err(|e| e.within("common_tls_context"))?;
    if matches!(common.certificates, common::Certificates::None) {
        return Err(ConfigError::new(
            "common_tls_context.tls_certificates",
            "no certificate configured",
        ));
    }
    if tls.ocsp_staple_policy != 0 {
        return Err(ConfigError::new(
            "ocsp_staple_policy",
            "OCSP stapling policies other than LENIENT_STAPLING are not implemented by revoy",
        ));
    }
    if let Some(keys) = &tls.session_ticket_keys_type {
        let field = match keys {
            SessionTicketKeysType::SessionTicketKeys(_) => "session_ticket_keys",
            SessionTicketKeysType::SessionTicketKeysSdsSecretConfig(_) => {
                "session_ticket_keys_sds_secret_config"
            }
            SessionTicketKeysType::DisableStatelessSessionResumption(_) => "",
        };
        if !field.is_empty() {
            return Err(ConfigError::new(
                field,
                "configured session ticket keys are not implemented by revoy (tickets use keys it makes itself)",
            ));
        }
    }
    let tickets = !matches!(
        tls.session_ticket_keys_type,
        Some(SessionTicketKeysType::DisableStatelessSessionResumption(
            true
        ))
    );
    Ok(ServerTls {
        common,
        require_client_certificate: tls.require_client_certificate.is_some_and(|b| b.value),
        tickets,
        session_cache: !tls.disable_stateful_session_resumption,
        full_scan_certs_on_sni_mismatch: tls
            .full_scan_certs_on_sni_mismatch
            .is_some_and(|b| b.value),
    })
}
