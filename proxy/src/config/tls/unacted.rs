//! Fields of a TLS context revoy accepts without acting on them, for the warnings
//! (`Skipped`) of the listener or cluster that has them. None of them changes what a handshake
//! checks or whom it trusts: fields that would are refused when the context compiles.

use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, UpstreamTlsContext,
    common_tls_context::ValidationContextType,
};

/// Each field (its path inside the context) and what revoy does instead.
pub type Unacted = Vec<(String, &'static str)>;

/// The fields of a `DownstreamTlsContext` revoy does not act on.
pub fn downstream(d: &DownstreamTlsContext) -> Unacted {
    let mut out = common(d.common_tls_context.as_ref());
    if d.session_timeout.is_some() {
        out.push((
            "session_timeout".into(),
            "not implemented by revoy: resumed sessions live as long as rustls keeps them",
        ));
    }
    out
}

/// The fields of an `UpstreamTlsContext` revoy does not act on.
pub fn upstream(u: &UpstreamTlsContext) -> Unacted {
    common(u.common_tls_context.as_ref())
}

fn common(c: Option<&CommonTlsContext>) -> Unacted {
    let Some(c) = c else {
        return Vec::new();
    };
    let at = |field: &str| format!("common_tls_context.{field}");
    let mut out = Vec::new();
    if c.key_log.is_some() {
        out.push((
            at("key_log"),
            "TLS key logging is not implemented by revoy; no keys are written",
        ));
    }
    for (i, t) in c.tls_certificates.iter().enumerate() {
        if !t.signed_certificate_timestamp.is_empty() {
            out.push((
                at(&format!(
                    "tls_certificates[{i}].signed_certificate_timestamp"
                )),
                "not implemented by revoy: no signed certificate timestamps are sent",
            ));
        }
        if t.watched_directory.is_some() {
            out.push((
                at(&format!("tls_certificates[{i}].watched_directory")),
                STATIC_FILES,
            ));
        }
    }
    if let Some(ValidationContextType::ValidationContext(v)) = &c.validation_context_type {
        if v.watched_directory.is_some() {
            out.push((at("validation_context.watched_directory"), STATIC_FILES));
        }
        if v.system_root_certs.is_some() {
            out.push((
                at("validation_context.system_root_certs"),
                "not implemented by revoy (nor by Envoy 1.40): only trusted_ca is trusted",
            ));
        }
    }
    out
}

/// Why a `watched_directory` outside an SDS secret does nothing.
const STATIC_FILES: &str = "files written in the config are read once, as in Envoy; only an SDS \
                            secret's files are read again when its watched_directory changes";

#[cfg(test)]
mod tests {
    use proto::pb::envoy::config::core::v3::WatchedDirectory;
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::{TlsCertificate, TlsKeyLog};

    use super::*;

    #[test]
    fn fields_revoy_does_not_act_on_are_named() {
        let d = DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                key_log: Some(TlsKeyLog::default()),
                tls_certificates: vec![TlsCertificate {
                    watched_directory: Some(WatchedDirectory::default()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            session_timeout: Some(Default::default()),
            ..Default::default()
        };
        let fields: Vec<String> = downstream(&d).into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "common_tls_context.key_log",
                "common_tls_context.tls_certificates[0].watched_directory",
                "session_timeout",
            ]
        );
        assert!(upstream(&UpstreamTlsContext::default()).is_empty());
    }
}
