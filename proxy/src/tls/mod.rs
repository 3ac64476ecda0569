//! TLS at run time: compiled contexts (`config::tls`) bound to the live secrets of the
//! [`SecretStore`], as rustls configurations. The certificate resolvers and verifiers read
//! the current secrets at each handshake, so a rotation reaches new handshakes at once and
//! leaves listeners, clusters and established connections alone.

pub mod certs;
pub mod secrets;
pub mod sessions;
pub mod stats;
pub mod verify;
pub mod x509;

use std::sync::Arc;

use rustls::client::Resumption;
use rustls::pki_types::{ServerName, SignatureVerificationAlgorithm};
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache};

use crate::config::tls::common::CommonTls;
use crate::config::tls::downstream::ServerTls;
use crate::config::tls::sds::SecretSource;
use crate::config::tls::upstream::ClientTls;
pub use secrets::SecretStore;
use stats::TlsStats;

/// The signature algorithms chains are verified with (ring's).
pub(crate) fn provider_algorithms() -> &'static [&'static dyn SignatureVerificationAlgorithm] {
    crate::config::tls::provider::base()
        .signature_verification_algorithms
        .all
}

/// The rustls server configuration of a listener's chain; `None` when its `tls_params` allow
/// no version revoy has (the chain then refuses every connection).
pub fn server_config(
    spec: &ServerTls,
    store: &SecretStore,
    stats: TlsStats,
) -> Option<Arc<rustls::ServerConfig>> {
    let params = &spec.common.params;
    let builder = rustls::ServerConfig::builder_with_provider(params.provider.clone())
        .with_protocol_versions(&params.versions)
        .ok()?;
    let builder = match verify::LiveValidation::bind(&spec.common.validation, store) {
        None => builder.with_no_client_auth(),
        Some(validation) => builder.with_client_cert_verifier(Arc::new(verify::ClientVerifier {
            validation,
            mandatory: spec.require_client_certificate,
            stats,
            provider: params.provider.clone(),
        })),
    };
    let mut config = builder.with_cert_resolver(Arc::new(certs::ServerCertificates {
        certificates: certs::LiveCertificates::bind(&spec.common.certificates, store),
        full_scan: spec.full_scan_certs_on_sni_mismatch,
    }));
    config.alpn_protocols = spec.common.alpn.clone();
    // Sessions made under secrets SDS has since rotated are not resumed (sessions.rs).
    let rotating = rotating_secrets(&spec.common, store);
    if spec.tickets {
        if !rotating.is_empty() {
            config.ticketer = Arc::new(sessions::Tickets::new(rotating.clone()));
        } else if let Ok(ticketer) = rustls::crypto::ring::Ticketer::new() {
            config.ticketer = ticketer;
        }
    }
    config.session_storage = match (spec.session_cache, rotating.is_empty()) {
        (false, _) => Arc::new(NoServerSessionStorage {}),
        (true, true) => ServerSessionMemoryCache::new(1024),
        (true, false) => Arc::new(sessions::ServerSessions::new(rotating)),
    };
    if !spec.tickets && !spec.session_cache {
        config.send_tls13_tickets = 0;
    }
    Some(Arc::new(config))
}

/// The cells of the secrets of `common` that SDS delivers (and may rotate).
fn rotating_secrets(common: &CommonTls, store: &SecretStore) -> Vec<Arc<secrets::SecretCell>> {
    common
        .secrets()
        .into_iter()
        .filter(|r| r.source != SecretSource::Static)
        .map(|r| store.cell(r))
        .collect()
}

/// What an upstream connection will carry, which decides the ALPN it offers when its
/// context names none (Envoy's ALPN fallback by connection-pool protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carries {
    /// Bytes for tcp_proxy: only the context's ALPN.
    Raw,
    /// HTTP/1.1: `http/1.1`.
    Http1,
    /// HTTP/2: `h2`.
    Http2,
    /// Either, by what the server picks (`auto_config`): `h2`, `http/1.1`.
    Auto,
}

/// A cluster's TLS: the rustls client configurations and the server name sent.
#[derive(Debug)]
pub struct ClientContext {
    /// The configuration with the context's own ALPN list.
    config: Arc<rustls::ClientConfig>,
    /// Without a list of its own: one configuration per [`Carries`] with Envoy's fallback,
    /// made on first use (most clusters only ever carry one protocol).
    fallbacks: [std::sync::OnceLock<Arc<rustls::ClientConfig>>; 3],
    /// `sni`.
    pub sni: Option<ServerName<'static>>,
    /// `cluster.<name>.ssl.*`.
    pub stats: TlsStats,
}

impl ClientContext {
    /// Binds a compiled `UpstreamTlsContext` to the store's secrets; `None` when its
    /// `tls_params` allow no version revoy has.
    pub fn new(spec: &ClientTls, store: &SecretStore, stats: TlsStats) -> Option<Self> {
        let params = &spec.common.params;
        let builder = rustls::ClientConfig::builder_with_provider(params.provider.clone())
            .with_protocol_versions(&params.versions)
            .ok()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verify::ServerVerifier {
                validation: verify::LiveValidation::bind(&spec.common.validation, store),
                stats: stats.clone(),
                provider: params.provider.clone(),
            }));
        let mut config = builder.with_client_cert_resolver(Arc::new(certs::ClientCertificates(
            certs::LiveCertificates::bind(&spec.common.certificates, store),
        )));
        config.alpn_protocols = spec.common.alpn.clone();
        let rotating = rotating_secrets(&spec.common, store);
        config.resumption = if spec.max_session_keys == 0 {
            Resumption::disabled()
        } else if rotating.is_empty() {
            Resumption::in_memory_sessions(spec.max_session_keys)
        } else {
            // Sessions made under secrets SDS has since rotated are not resumed (sessions.rs).
            Resumption::store(Arc::new(sessions::ClientSessions::new(
                rotating,
                spec.max_session_keys,
            )))
        };
        config.enable_sni = spec.sni.is_some();
        let sni = match &spec.sni {
            None => None,
            Some(name) => Some(ServerName::try_from(name.clone()).ok()?),
        };
        Some(ClientContext {
            config: Arc::new(config),
            fallbacks: Default::default(),
            sni,
            stats,
        })
    }

    /// The configuration for a connection that carries `what`.
    pub fn config(&self, what: Carries) -> Arc<rustls::ClientConfig> {
        let (slot, alpn): (usize, &[&[u8]]) = match what {
            _ if !self.config.alpn_protocols.is_empty() => return self.config.clone(),
            Carries::Raw => return self.config.clone(),
            Carries::Http1 => (0, &[b"http/1.1"]),
            Carries::Http2 => (1, &[b"h2"]),
            Carries::Auto => (2, &[b"h2", b"http/1.1"]),
        };
        self.fallbacks[slot]
            .get_or_init(|| {
                let mut config = (*self.config).clone();
                config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
                Arc::new(config)
            })
            .clone()
    }

    /// The server name for a connection to `addr`: `sni`, else the address (used for
    /// session lookup only; no SNI is sent).
    pub fn server_name(&self, addr: std::net::SocketAddr) -> ServerName<'static> {
        self.sni
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()))
    }
}

/// Envoy's transport failure reason for a failed handshake, in BoringSSL's shape
/// (`TLS_error:|268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED:TLS_error_end`)
/// where the failure has a BoringSSL name, else rustls' words in the same frame.
pub fn failure_reason(e: &std::io::Error) -> String {
    use rustls::{AlertDescription, CertificateError, Error};
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<Error>());
    let what = match inner {
        Some(Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        )) => "268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED".to_owned(),
        Some(Error::InvalidCertificate(_)) => {
            "268435581:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED".to_owned()
        }
        Some(Error::AlertReceived(alert)) => {
            let name = match alert {
                AlertDescription::HandshakeFailure => "SSLV3_ALERT_HANDSHAKE_FAILURE",
                AlertDescription::BadCertificate => "SSLV3_ALERT_BAD_CERTIFICATE",
                AlertDescription::CertificateRequired => "TLSV1_CERTIFICATE_REQUIRED",
                AlertDescription::UnknownCA => "TLSV1_ALERT_UNKNOWN_CA",
                AlertDescription::ProtocolVersion => "TLSV1_ALERT_PROTOCOL_VERSION",
                AlertDescription::NoApplicationProtocol => "TLSV1_ALERT_NO_APPLICATION_PROTOCOL",
                AlertDescription::DecryptError => "TLSV1_ALERT_DECRYPT_ERROR",
                _ => "TLSV1_ALERT",
            };
            format!("SSL routines:OPENSSL_internal:{name}")
        }
        Some(other) => format!("rustls:{other}"),
        None => format!("connection:{e}"),
    };
    format!("TLS_error:|{what}:TLS_error_end")
}
