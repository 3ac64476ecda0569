//! An `UpstreamTlsContext` -> [`ClientTls`]: how revoy connects to a cluster's hosts over TLS.

use proto::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;

use super::common::{self, CommonTls};
use super::provider::Side;
use crate::config::{ConfigError, Context};

/// A compiled `UpstreamTlsContext`.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// Client certificates, server validation, ALPN, versions.
    pub common: CommonTls,
    /// `sni`: the server name sent (none: no SNI, as Envoy without `sni` or `auto_sni`).
    pub sni: Option<String>,
    /// `max_session_keys`: sessions kept for resumption (0: none).
    pub max_session_keys: usize,
}

/// Compiles an `UpstreamTlsContext`; errors name fields relative to it.
pub fn compile(ctx: &Context<'_>, tls: &UpstreamTlsContext) -> Result<ClientTls, ConfigError> {
    if tls.allow_renegotiation {
        return Err(ConfigError::new(
            "allow_renegotiation",
            "TLS renegotiation is not implemented by revoy (rustls never renegotiates)",
        ));
    }
    for (set, field) in [
        (tls.auto_host_sni, "auto_host_sni"),
        (tls.auto_sni_san_validation, "auto_sni_san_validation"),
    ] {
        if set {
            return Err(ConfigError::new(
                field,
                "not implemented by revoy; the cluster's upstream_http_protocol_options \
                 auto_sni and auto_san_validation are",
            ));
        }
    }
    let common = common::compile(
        ctx,
        &tls.common_tls_context.clone().unwrap_or_default(),
        Side::Client,
    )
    .map_err(|e| e.within("common_tls_context"))?;
    Ok(ClientTls {
        common,
        sni: Some(tls.sni.clone()).filter(|s| !s.is_empty()),
        max_session_keys: tls
            .max_session_keys
            .as_ref()
            .map_or(1, |v| v.value as usize),
    })
}
