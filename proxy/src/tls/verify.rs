//! Checking a peer's certificate against a validation context that may change at any time
//! (SDS): the chain (webpki, with CRLs), then subject alternative names and pins, as Envoy's
//! default validator does. Used by both ends: a listener checking clients and a cluster
//! checking servers.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use webpki::{EndEntityCert, KeyUsage, RevocationCheckDepth, RevocationOptionsBuilder};

use super::secrets::SecretCell;
use super::stats::{TlsStats, VerifyFailure};
use super::x509::SubjectAltName;
use crate::config::tls::common::{ValidationSpec, combine};
use crate::config::tls::secret::SecretValue;
use crate::config::tls::validation::{self, SanKind, Validation};
use crate::config::{Context, SystemIo};

/// A validation context as it is now.
#[derive(Debug)]
pub enum LiveValidation {
    /// Written in the config.
    Static(Arc<Validation>),
    /// From an SDS secret (merged under a combined context's default), recompiled when the
    /// secret changes.
    Sds {
        /// The secret.
        cell: Arc<SecretCell>,
        /// A combined context's default.
        default: Option<Arc<proto::pb::envoy::extensions::transport_sockets::tls::v3::CertificateValidationContext>>,
        /// The compile for the secret's generation it was made from.
        cache: ArcSwapOption<(u64, Arc<Validation>)>,
    },
}

impl LiveValidation {
    /// Binds a compiled spec to the store's secrets; `None` for no validation at all.
    pub fn bind(spec: &ValidationSpec, store: &super::SecretStore) -> Option<Self> {
        match spec {
            ValidationSpec::None => None,
            ValidationSpec::Static(v) => Some(LiveValidation::Static(v.clone())),
            ValidationSpec::Sds { secret, default } => Some(LiveValidation::Sds {
                cell: store.cell(secret),
                default: default.clone(),
                cache: ArcSwapOption::empty(),
            }),
        }
    }

    /// The validation in force, `None` while its secret has not arrived (or does not compile
    /// merged with the default: then nothing verifies, failing closed).
    pub fn current(&self) -> Option<Arc<Validation>> {
        match self {
            LiveValidation::Static(v) => Some(v.clone()),
            LiveValidation::Sds {
                cell,
                default,
                cache,
            } => {
                let generation = cell.generation();
                if let Some(hit) = cache.load().as_ref().filter(|c| c.0 == generation) {
                    return Some(hit.1.clone());
                }
                let delivered = cell.current()?;
                let SecretValue::Validation { proto, compiled } = &delivered.value else {
                    return None;
                };
                let merged = match default {
                    None => compiled.clone(),
                    Some(d) => {
                        let io = SystemIo;
                        match validation::compile(&Context::new(&io), &combine(Some(d), proto)) {
                            Ok(v) => Arc::new(v),
                            Err(e) => {
                                tracing::warn!(secret = %cell.name, "combined validation context: {e}");
                                return None;
                            }
                        }
                    }
                };
                cache.store(Some(Arc::new((generation, merged.clone()))));
                Some(merged)
            }
        }
    }
}

/// A refused certificate: what is counted, and the error (so the alert) rustls answers with.
pub type Refused = (VerifyFailure, CertificateError);

/// Checks `end_entity` (with the peer's `intermediates`) against `v` for `usage`.
pub fn verify(
    v: &Validation,
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    now: UnixTime,
    usage: KeyUsage,
) -> Result<(), Refused> {
    if let Some(trusted) = &v.trusted {
        let cert = EndEntityCert::try_from(end_entity)
            .map_err(|_| (VerifyFailure::Chain, CertificateError::BadEncoding))?;
        let crls: Vec<webpki::CertRevocationList<'_>> = v
            .crls
            .iter()
            .map(|c| webpki::CertRevocationList::from(c.clone()))
            .collect();
        let crl_refs: Vec<&webpki::CertRevocationList<'_>> = crls.iter().collect();
        let revocation = RevocationOptionsBuilder::new(&crl_refs).ok().map(|b| {
            b.with_depth(if v.leaf_crl_only {
                RevocationCheckDepth::EndEntity
            } else {
                RevocationCheckDepth::Chain
            })
            .build()
        });
        let depth = |path: &webpki::VerifiedPath<'_>| match v.max_depth {
            Some(max) if path.intermediate_certificates().count() > max => {
                Err(webpki::Error::MaximumPathDepthExceeded)
            }
            _ => Ok(()),
        };
        let chain = cert.verify_for_usage(
            super::provider_algorithms(),
            &trusted.anchors,
            intermediates,
            now,
            usage,
            revocation,
            Some(&depth),
        );
        if let Err(e) = chain
            && !v.accept_untrusted
        {
            return Err((VerifyFailure::Chain, chain_error(e)));
        }
    }
    if !v.sans.is_empty() && !sans_match(v, end_entity) {
        return Err((VerifyFailure::San, unmatched(Unmatched::San)));
    }
    if (!v.spki.is_empty() || !v.hashes.is_empty()) && !pins_match(v, end_entity) {
        return Err((VerifyFailure::Pin, unmatched(Unmatched::Pin)));
    }
    Ok(())
}

/// What a peer certificate that verified up its chain failed to match.
#[derive(Debug, thiserror::Error)]
enum Unmatched {
    /// No configured subject alternative name matcher.
    #[error("no subject alternative name of the certificate matches")]
    San,
    /// No configured SPKI or certificate hash.
    #[error("the certificate matches no configured SPKI or hash")]
    Pin,
}

/// The refusal of a certificate that matched no SAN or pin: refused with the alert
/// `certificate_unknown`, as BoringSSL (Envoy) refuses it; rustls' own
/// `ApplicationVerificationFailure` would send `access_denied`.
fn unmatched(what: Unmatched) -> CertificateError {
    CertificateError::Other(rustls::OtherError(Arc::new(what)))
}

/// The rustls error (so the alert: `certificate_expired`, `unknown_ca`, ...) for a chain that
/// did not verify, as BoringSSL alerts for it.
fn chain_error(e: webpki::Error) -> CertificateError {
    match e {
        webpki::Error::CertExpired { .. } => CertificateError::Expired,
        webpki::Error::CertNotValidYet { .. } => CertificateError::NotValidYet,
        webpki::Error::CertRevoked => CertificateError::Revoked,
        webpki::Error::UnknownIssuer | webpki::Error::MaximumPathDepthExceeded => {
            CertificateError::UnknownIssuer
        }
        webpki::Error::InvalidSignatureForPublicKey
        | webpki::Error::UnsupportedSignatureAlgorithmForPublicKeyContext(_)
        | webpki::Error::UnsupportedSignatureAlgorithmContext(_) => CertificateError::BadSignature,
        _ => CertificateError::BadEncoding,
    }
}

/// Whether one of the certificate's subject alternative names (as Envoy writes them)
/// matches one matcher.
fn sans_match(v: &Validation, der: &CertificateDer<'_>) -> bool {
    let Ok(sans) = super::x509::subject_alt_names(der) else {
        return false;
    };
    sans.iter().any(|san| {
        let kind = match san {
            SubjectAltName::Dns(_) => SanKind::Dns,
            SubjectAltName::Uri(_) => SanKind::Uri,
            SubjectAltName::Email(_) => SanKind::Email,
            SubjectAltName::Ip(_) => SanKind::Ip,
        };
        let text = san.to_string();
        v.sans.iter().any(|m| m.matches(kind, &text))
    })
}

/// Whether one of the certificate's SANs names `name` (a DNS SAN, wildcards included, for a
/// host name; an IP SAN for an address), as Envoy checks `auto_san_validation`.
fn names(der: &CertificateDer<'_>, name: &ServerName<'_>) -> bool {
    let Ok(sans) = super::x509::subject_alt_names(der) else {
        return false;
    };
    sans.iter().any(|san| match (san, name) {
        (SubjectAltName::Dns(pattern), ServerName::DnsName(host)) => {
            pattern.eq_ignore_ascii_case(host.as_ref())
                || validation::wildcard_covers(pattern, host.as_ref())
        }
        (SubjectAltName::Ip(ip), ServerName::IpAddress(addr)) => {
            *ip == std::net::IpAddr::from(*addr)
        }
        _ => false,
    })
}

/// Whether the certificate's SHA-256 or its public key's is pinned.
fn pins_match(v: &Validation, der: &CertificateDer<'_>) -> bool {
    let digest = |b: &[u8]| {
        ring::digest::digest(&ring::digest::SHA256, b)
            .as_ref()
            .to_vec()
    };
    if v.hashes.contains(&digest(der)) {
        return true;
    }
    x509_parser::parse_x509_certificate(der)
        .is_ok_and(|(_, c)| v.spki.contains(&digest(c.tbs_certificate.subject_pki.raw)))
}

/// Counts a refused certificate and turns it into rustls' error.
fn refuse(stats: &TlsStats, (why, error): Refused) -> Error {
    stats.verify_failed(why);
    Error::InvalidCertificate(error)
}

/// A validation context whose SDS secret has not arrived: nothing verifies.
const NOT_READY: Refused = (VerifyFailure::Chain, CertificateError::UnknownIssuer);

/// The peer signature checks both verifiers make, counted by scheme in the `ssl.*` stats.
#[derive(Debug)]
pub struct Checks {
    /// Where verification failures and signature schemes are counted.
    pub stats: TlsStats,
    /// The signature algorithms.
    pub provider: Arc<CryptoProvider>,
}

impl Checks {
    /// Checks a handshake signature (TLS 1.3's when `tls13`, else TLS 1.2's).
    fn signature(
        &self,
        tls13: bool,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        let valid = if tls13 {
            verify_tls13_signature(message, cert, dss, algorithms)
        } else {
            verify_tls12_signature(message, cert, dss, algorithms)
        }?;
        self.stats.peer_signature(dss.scheme);
        Ok(valid)
    }

    /// The schemes the algorithms verify.
    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The subjects of the trusted CAs a listener's certificate requests name: every distinct
/// list its validation context has had, kept until the verifier goes, since rustls borrows
/// the list from the verifier while the CAs may change under it (SDS).
#[derive(Debug, Default)]
pub struct CaNames(std::sync::Mutex<Vec<Box<[DistinguishedName]>>>);

impl CaNames {
    /// `names`, from a copy that lives as long as `self`.
    fn lend(&self, names: &[DistinguishedName]) -> &[DistinguishedName] {
        let mut kept = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let same = |last: &[DistinguishedName]| {
            last.len() == names.len()
                && last
                    .iter()
                    .zip(names)
                    .all(|(a, b)| a.as_ref() == b.as_ref())
        };
        if kept.last().is_none_or(|last| !same(last)) {
            kept.push(names.into());
        }
        let last: *const [DistinguishedName] = &**kept.last().expect("just kept");
        // SAFETY: the boxed lists are never removed nor changed while `self` lives, and a
        // box's contents stay where they are when the vector around it grows.
        unsafe { &*last }
    }
}

/// Verifies clients for a listener's chain.
#[derive(Debug)]
pub struct ClientVerifier {
    /// What client certificates are checked against.
    pub validation: Arc<LiveValidation>,
    /// `require_client_certificate`.
    pub mandatory: bool,
    /// The CA names its certificate requests list.
    pub hints: CaNames,
    /// Signature checks, and where failures are counted.
    pub checks: Checks,
}

impl ClientCertVerifier for ClientVerifier {
    /// A certificate is asked for when there is something to check it against: a trusted CA
    /// or pins (Envoy asks for none otherwise, whatever `require_client_certificate` says).
    fn offer_client_auth(&self) -> bool {
        self.validation
            .current()
            .is_some_and(|v| v.trusted.is_some() || !v.spki.is_empty() || !v.hashes.is_empty())
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory && self.offer_client_auth()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        let current = self.validation.current();
        let names = current
            .as_ref()
            .and_then(|v| v.trusted.as_ref())
            .map_or(&[][..], |t| &t.subjects);
        self.hints.lend(names)
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let Some(v) = self.validation.current() else {
            return Err(refuse(&self.checks.stats, NOT_READY));
        };
        verify(&v, end_entity, intermediates, now, KeyUsage::client_auth())
            .map(|()| ClientCertVerified::assertion())
            .map_err(|r| refuse(&self.checks.stats, r))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.checks.signature(false, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.checks.signature(true, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.checks.schemes()
    }
}

/// Verifies servers for a cluster. Without a validation context any certificate is
/// accepted, as Envoy does; the server name is never checked against the certificate unless
/// a SAN matcher asks for it.
#[derive(Debug)]
pub struct ServerVerifier {
    /// What server certificates are checked against (`None`: anything).
    pub validation: Option<Arc<LiveValidation>>,
    /// `auto_san_validation`: the certificate must also carry a SAN for the server name the
    /// connection was opened with (with or without a validation context, as Envoy).
    pub name_san: bool,
    /// Signature checks, and where failures are counted.
    pub checks: Checks,
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if let Some(live) = &self.validation {
            let Some(v) = live.current() else {
                return Err(refuse(&self.checks.stats, NOT_READY));
            };
            verify(&v, end_entity, intermediates, now, KeyUsage::server_auth())
                .map_err(|r| refuse(&self.checks.stats, r))?;
        }
        if self.name_san && !names(end_entity, server_name) {
            let failure = (VerifyFailure::San, unmatched(Unmatched::San));
            return Err(refuse(&self.checks.stats, failure));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.checks.signature(false, message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.checks.signature(true, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.checks.schemes()
    }
}
