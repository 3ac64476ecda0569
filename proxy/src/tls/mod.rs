//! TLS at run time: compiled contexts (`config::tls`) bound to the live secrets of the
//! [`SecretStore`], as rustls configurations. The certificate resolvers and verifiers read
//! the current secrets at each handshake, so a rotation reaches new handshakes at once and
//! leaves listeners, clusters and established connections alone.

pub mod certs;
pub mod peer;
pub mod secrets;
pub mod sessions;
pub mod stats;
pub mod verify;
pub mod x509;

use std::sync::Arc;

use rustls::client::Resumption;
use rustls::pki_types::{ServerName, SignatureVerificationAlgorithm};
use rustls::server::{NoServerSessionStorage, ServerSessionMemoryCache};
use sessions::{Generation, PerGeneration};

use crate::config::tls::certificate::Certificate;
use crate::config::tls::common::CommonTls;
use crate::config::tls::downstream::ServerTls;
use crate::config::tls::sds::SecretSource;
use crate::config::tls::upstream::ClientTls;
pub use peer::PeerTls;

/// An established downstream TLS connection, boxed: its rustls state (over a kilobyte) stays
/// in one place while the connection's futures hold a pointer, instead of being sized into, and
/// sometimes copied across, each future that takes the stream.
pub type ServerStream = Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;
pub use secrets::SecretStore;
use stats::TlsStats;
use verify::LiveValidation;

/// What one TLS context presents and checks its peer against, as it is now: what `/certs`
/// lists (one entry per context, as Envoy's context manager holds them).
#[derive(Debug, Clone)]
pub struct ContextCertificates {
    /// The certificates the context presents.
    pub presented: Arc<certs::LiveCertificates>,
    /// The validation context its peer is checked against, if any.
    pub validation: Option<Arc<LiveValidation>>,
}

impl ContextCertificates {
    /// Whether every SDS secret the context names has arrived and is in force (a validation
    /// secret that does not compile merged with its default is not): until then Envoy has no
    /// TLS context to handshake with.
    pub fn ready(&self) -> bool {
        self.presented.ready()
            && self
                .validation
                .as_ref()
                .is_none_or(|v| v.current().is_some())
    }

    /// The certificates presented (with where each came from) and the trusted CA
    /// certificates (with where they came from), once every SDS secret the context names has
    /// arrived; `None` before, when Envoy has not built the context yet.
    pub fn in_force(&self) -> Option<(Vec<Certificate>, Option<TrustedCertificates>)> {
        let presented = self.presented.in_force()?;
        let trusted = match &self.validation {
            None => None,
            Some(v) => v.current()?.trusted.as_ref().map(|t| TrustedCertificates {
                certificates: t.certificates.clone(),
                origin: t.origin.clone(),
            }),
        };
        Some((presented, trusted))
    }
}

/// The trusted CA certificates of a validation context in force.
#[derive(Debug, Clone)]
pub struct TrustedCertificates {
    /// The CA certificates, in file order.
    pub certificates: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// Where they came from (a file, or `<inline>`).
    pub origin: String,
}

/// A listener chain's TLS: the rustls server configurations and what it presents and trusts.
///
/// Its ticket keys and session cache are made afresh for each generation of its SDS secrets
/// (`sessions.rs`), as Envoy builds a new context for each SDS update.
#[derive(Debug)]
pub struct ServerContext {
    /// The configuration with the context's ALPN, before session state.
    base: Arc<rustls::ServerConfig>,
    /// `tickets` and `session_cache` of the spec.
    tickets: bool,
    session_cache: bool,
    sessions: PerGeneration<Sessions>,
    /// Its certificates, for `/certs`.
    pub certificates: ContextCertificates,
}

/// The configurations for one generation of a context's secrets, sharing its session state.
#[derive(Debug)]
pub struct Sessions {
    /// With the context's ALPN.
    pub config: Arc<rustls::ServerConfig>,
    /// The same without ALPN, for a client whose ALPN offer has none of the context's
    /// protocols: Envoy then goes on without ALPN (Istio's clients offer `istio-http/1.1` to
    /// chains of `h2, http/1.1`), where rustls would refuse. `None` when the context has none.
    pub without_alpn: Option<Arc<rustls::ServerConfig>>,
}

impl ServerContext {
    /// The configurations for a handshake starting now.
    pub fn sessions(&self) -> Arc<Generation<Sessions>> {
        self.sessions
            .current(|| Sessions::new(&self.base, self.tickets, self.session_cache))
    }
}

impl Sessions {
    /// Fresh ticket keys and session cache over `base`.
    fn new(base: &rustls::ServerConfig, tickets: bool, session_cache: bool) -> Self {
        let mut config = base.clone();
        if tickets && let Ok(ticketer) = rustls::crypto::ring::Ticketer::new() {
            config.ticketer = ticketer;
        }
        config.session_storage = if session_cache {
            ServerSessionMemoryCache::new(1024)
        } else {
            Arc::new(NoServerSessionStorage {})
        };
        let without_alpn = (!config.alpn_protocols.is_empty()).then(|| {
            let mut plain = config.clone();
            plain.alpn_protocols.clear();
            Arc::new(plain)
        });
        Sessions {
            config: Arc::new(config),
            without_alpn,
        }
    }
}

/// The signature algorithms chains are verified with (ring's).
pub(crate) fn provider_algorithms() -> &'static [&'static dyn SignatureVerificationAlgorithm] {
    crate::config::tls::provider::base()
        .signature_verification_algorithms
        .all
}

/// The TLS of a listener's chain, bound to the store's secrets; `None` when its `tls_params`
/// allow no version revoy has (the chain then refuses every connection).
pub fn server_context(
    spec: &ServerTls,
    store: &SecretStore,
    stats: TlsStats,
) -> Option<ServerContext> {
    let params = &spec.common.params;
    let builder = rustls::ServerConfig::builder_with_provider(params.provider.clone())
        .with_protocol_versions(&params.versions)
        .ok()?;
    let validation = LiveValidation::bind(&spec.common.validation, store).map(Arc::new);
    let builder = match &validation {
        None => builder.with_no_client_auth(),
        Some(validation) => builder.with_client_cert_verifier(Arc::new(verify::ClientVerifier {
            validation: validation.clone(),
            mandatory: spec.require_client_certificate,
            hints: verify::CaNames::default(),
            checks: verify::Checks {
                stats,
                provider: params.provider.clone(),
            },
        })),
    };
    let presented = Arc::new(certs::LiveCertificates::bind(
        &spec.common.certificates,
        store,
    ));
    let mut config = builder.with_cert_resolver(Arc::new(certs::ServerCertificates {
        certificates: presented.clone(),
        full_scan: spec.full_scan_certs_on_sni_mismatch,
    }));
    config.alpn_protocols = spec.common.alpn.clone();
    // TLS 1.3 resumes by ticket only, as in BoringSSL (Envoy): without stateless resumption
    // no ticket is sent, though rustls could send ones naming the session cache.
    if !spec.tickets {
        config.send_tls13_tickets = 0;
    }
    let first = Sessions::new(&config, spec.tickets, spec.session_cache);
    Some(ServerContext {
        base: Arc::new(config),
        tickets: spec.tickets,
        session_cache: spec.session_cache,
        sessions: PerGeneration::new(rotating_secrets(&spec.common, store), first),
        certificates: ContextCertificates {
            presented,
            validation,
        },
    })
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
    /// The configuration with the context's own ALPN list, before session state.
    base: Arc<rustls::ClientConfig>,
    /// `max_session_keys`.
    max_session_keys: usize,
    /// The configurations of each generation of its SDS secrets, with their own session
    /// cache (`sessions.rs`).
    configs: PerGeneration<ClientConfigs>,
    /// `sni`.
    pub sni: Option<ServerName<'static>>,
    /// `cluster.<name>.ssl.*`.
    pub stats: TlsStats,
    /// `cluster.<name>.client_ssl_socket_factory.upstream_context_secrets_not_ready`:
    /// connections closed before their handshake because a secret had not arrived.
    secrets_not_ready: crate::stats::Counter,
    /// What it presents and trusts, for `/certs`.
    pub certificates: ContextCertificates,
}

/// A client context's configurations sharing one session cache.
#[derive(Debug)]
struct ClientConfigs {
    /// With the context's own ALPN list.
    config: Arc<rustls::ClientConfig>,
    /// Without a list of its own: one configuration per [`Carries`] with Envoy's fallback,
    /// made on first use (most clusters only ever carry one protocol).
    fallbacks: [std::sync::OnceLock<Arc<rustls::ClientConfig>>; 3],
}

impl ClientConfigs {
    /// `base` with a fresh session cache of `max_session_keys` (0: no resumption).
    fn new(base: &rustls::ClientConfig, max_session_keys: usize) -> Self {
        let mut config = base.clone();
        config.resumption = if max_session_keys == 0 {
            Resumption::disabled()
        } else {
            Resumption::in_memory_sessions(max_session_keys)
        };
        ClientConfigs {
            config: Arc::new(config),
            fallbacks: Default::default(),
        }
    }
}

impl ClientContext {
    /// Binds a compiled `UpstreamTlsContext` to the store's secrets; `None` when its
    /// `tls_params` allow no version revoy has. With `auto_sni`, every connection sends the
    /// server name it is opened with (see [`crate::upstream::Host`]), and with its
    /// `san_validation` the server's certificate must be valid for that name.
    pub fn new(
        spec: &ClientTls,
        store: &SecretStore,
        stats: TlsStats,
        auto_sni: Option<&crate::config::cluster::AutoSni>,
    ) -> Option<Self> {
        let params = &spec.common.params;
        let validation = LiveValidation::bind(&spec.common.validation, store).map(Arc::new);
        let builder = rustls::ClientConfig::builder_with_provider(params.provider.clone())
            .with_protocol_versions(&params.versions)
            .ok()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verify::ServerVerifier {
                validation: validation.clone(),
                name_san: auto_sni.is_some_and(|a| a.san_validation),
                checks: verify::Checks {
                    stats: stats.clone(),
                    provider: params.provider.clone(),
                },
            }));
        let presented = Arc::new(certs::LiveCertificates::bind(
            &spec.common.certificates,
            store,
        ));
        let mut config = builder
            .with_client_cert_resolver(Arc::new(certs::ClientCertificates(presented.clone())));
        config.alpn_protocols = spec.common.alpn.clone();
        config.enable_sni = spec.sni.is_some() || auto_sni.is_some();
        let sni = match &spec.sni {
            None => None,
            Some(name) => Some(ServerName::try_from(name.clone()).ok()?),
        };
        let first = ClientConfigs::new(&config, spec.max_session_keys);
        Some(ClientContext {
            base: Arc::new(config),
            max_session_keys: spec.max_session_keys,
            configs: PerGeneration::new(rotating_secrets(&spec.common, store), first),
            sni,
            secrets_not_ready: stats
                .scoped_counter("client_ssl_socket_factory.upstream_context_secrets_not_ready"),
            stats,
            certificates: ContextCertificates {
                presented,
                validation,
            },
        })
    }

    /// Whether a handshake may start: every SDS secret the context names is in force. When
    /// one is not (its `initial_fetch_timeout` passed without it), Envoy's cluster has no TLS
    /// context and its transport socket closes each connection before sending a byte
    /// (`NotReadySslSocket`); so does revoy, never handshaking without the client certificate
    /// or the trust it was told to use. Counts the refusal.
    pub fn may_handshake(&self) -> bool {
        let ready = self.certificates.ready();
        if !ready {
            self.secrets_not_ready.inc();
        }
        ready
    }

    /// The configuration for a connection that carries `what`, starting now.
    pub fn config(&self, what: Carries) -> Arc<rustls::ClientConfig> {
        let configs = self
            .configs
            .current(|| ClientConfigs::new(&self.base, self.max_session_keys));
        let configs = &configs.value;
        let (slot, alpn): (usize, &[&[u8]]) = match what {
            _ if !configs.config.alpn_protocols.is_empty() => return configs.config.clone(),
            Carries::Raw => return configs.config.clone(),
            Carries::Http1 => (0, &[b"http/1.1"]),
            Carries::Http2 => (1, &[b"h2"]),
            Carries::Auto => (2, &[b"h2", b"http/1.1"]),
        };
        configs.fallbacks[slot]
            .get_or_init(|| {
                let mut config = (*configs.config).clone();
                config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
                Arc::new(config)
            })
            .clone()
    }

    /// The configuration for a connection offering `alpn` in place of the context's list
    /// (`istio.alpn`), starting now: the current one with that list, its session cache shared.
    pub fn config_offering(&self, alpn: &[Vec<u8>]) -> Arc<rustls::ClientConfig> {
        let configs = self
            .configs
            .current(|| ClientConfigs::new(&self.base, self.max_session_keys));
        let mut config = (*configs.value.config).clone();
        config.alpn_protocols = alpn.to_vec();
        Arc::new(config)
    }

    /// The server name for a connection to `addr`: `sni`, else the address (used for
    /// session lookup only; no SNI is sent).
    pub fn server_name(&self, addr: std::net::SocketAddr) -> ServerName<'static> {
        self.sni
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()))
    }
}

/// The control plane's connections (an xDS or SDS cluster with TLS): counted in its
/// `ssl.*`, refused while a secret is missing, as a cluster's.
impl xds_client::client::HandshakeObserver for ClientContext {
    fn may_handshake(&self) -> bool {
        ClientContext::may_handshake(self)
    }

    fn completed(&self, connection: &rustls::CommonState) {
        self.stats.handshake_done(connection);
    }

    fn failed(&self, error: &std::io::Error) {
        self.stats.handshake_failed(error);
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
