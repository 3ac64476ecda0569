//! The certificates a TLS context presents, as they are now: written in the config, or
//! delivered (and rotated) by SDS. A handshake asks for the current set and picks one by the
//! client's server name and the signature schemes it offers.

use std::cell::RefCell;
use std::sync::Arc;

use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{SignatureAlgorithm, SignatureScheme};

use super::SecretStore;
use super::secrets::SecretCell;
use crate::config::tls::certificate::Certificate;
use crate::config::tls::common::Certificates;
use crate::config::tls::secret::SecretValue;
use crate::config::tls::validation::wildcard_covers;

/// A context's certificates, bound to the secrets that deliver them.
#[derive(Debug)]
pub enum LiveCertificates {
    /// None (a client without a client certificate).
    None,
    /// Written in the config.
    Static(Vec<Certificate>),
    /// Delivered by SDS, in configured order.
    Sds(Vec<Arc<SecretCell>>),
}

impl LiveCertificates {
    /// Binds a compiled spec to the store's secrets.
    pub fn bind(spec: &Certificates, store: &SecretStore) -> Self {
        match spec {
            Certificates::None => LiveCertificates::None,
            Certificates::Static(certs) => LiveCertificates::Static(certs.clone()),
            Certificates::Sds(refs) => {
                LiveCertificates::Sds(refs.iter().map(|r| store.cell(r)).collect())
            }
        }
    }

    /// The certificates in force, in configured order (an SDS secret not arrived yet, or not
    /// a certificate, is left out).
    pub fn current(&self) -> Vec<Certificate> {
        match self {
            LiveCertificates::None => Vec::new(),
            LiveCertificates::Static(certs) => certs.clone(),
            LiveCertificates::Sds(cells) => cells
                .iter()
                .filter_map(|cell| match &cell.current()?.value {
                    SecretValue::Certificate(c) => Some(c.clone()),
                    SecretValue::Validation { .. } => None,
                })
                .collect(),
        }
    }

    /// Whether each SDS secret has arrived as a certificate (always, for certificates
    /// written in the config or none).
    pub fn ready(&self) -> bool {
        match self {
            LiveCertificates::None | LiveCertificates::Static(_) => true,
            LiveCertificates::Sds(cells) => cells.iter().all(|cell| {
                cell.current()
                    .is_some_and(|d| matches!(d.value, SecretValue::Certificate(_)))
            }),
        }
    }

    /// Every certificate with where it came from, in configured order; `None` until each SDS
    /// secret has arrived as a certificate (Envoy builds no context before that, so `/certs`
    /// does not list it).
    pub fn in_force(&self) -> Option<Vec<Certificate>> {
        match self {
            LiveCertificates::None => Some(Vec::new()),
            LiveCertificates::Static(certs) => Some(certs.clone()),
            LiveCertificates::Sds(cells) => cells
                .iter()
                .map(|cell| match &cell.current()?.value {
                    SecretValue::Certificate(c) => Some(c.clone()),
                    SecretValue::Validation { .. } => None,
                })
                .collect(),
        }
    }

    /// Picks the certificate for a peer offering `schemes` (and asking for `server_name`) as
    /// Envoy does: with a server name, among the certificates whose DNS names (or, without
    /// any, common name) are exactly that name, then among those whose wildcard covers it,
    /// then (only with `full_scan`, Envoy's `full_scan_certs_on_sni_mismatch`) among all;
    /// without one, among all. Within a set, the first ECDSA certificate the peer can use wins,
    /// else the first other one it can use. When no set yields one, the first certificate.
    fn pick(
        &self,
        server_name: Option<&str>,
        schemes: &[SignatureScheme],
        full_scan: bool,
    ) -> Option<Arc<CertifiedKey>> {
        let all = self.current();
        if all.len() <= 1 {
            return all.into_iter().next().map(|c| c.key);
        }
        let chosen = match server_name {
            Some(name) => {
                let named = |how: Match| all.iter().filter(move |c| covers(c, name, how));
                choose(named(Match::Exact), schemes)
                    .or_else(|| choose(named(Match::Wildcard), schemes))
                    .or_else(|| full_scan.then(|| choose(all.iter(), schemes)).flatten())
            }
            None => choose(all.iter(), schemes),
        };
        chosen.or(all.first()).map(|c| c.key.clone())
    }
}

/// Envoy's choice among `candidates` (in configured order) for a peer offering `schemes`: the
/// first ECDSA certificate it can use, else the first other one it can use.
fn choose<'a>(
    candidates: impl Iterator<Item = &'a Certificate> + Clone,
    schemes: &[SignatureScheme],
) -> Option<&'a Certificate> {
    let usable = |ecdsa: bool| {
        candidates.clone().find(|c| {
            (c.key.key.algorithm() == SignatureAlgorithm::ECDSA) == ecdsa
                && c.key.key.choose_scheme(schemes).is_some()
        })
    };
    usable(true).or_else(|| usable(false))
}

/// How a certificate's name is compared with a server name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Match {
    /// Equal (ignoring case).
    Exact,
    /// A leading `*.` standing for the server name's first label.
    Wildcard,
}

/// Whether a certificate's DNS names (or, without any, its common names) cover `name` as
/// `how` says.
fn covers(cert: &Certificate, name: &str, how: Match) -> bool {
    cert.names.iter().any(|pattern| match how {
        Match::Exact => pattern.eq_ignore_ascii_case(name),
        Match::Wildcard => wildcard_covers(pattern, name),
    })
}

tokio::task_local! {
    /// The certificate picked for the server handshake being polled (see [`recording_pick`]).
    static PICKED: RefCell<Option<Arc<CertifiedKey>>>;
}

/// Runs a server handshake and returns its outcome with the certificate the listener's
/// resolver picked for it (`None` if it picked none). The resolver runs inside the
/// handshake's poll, so a task-local (scoped to this handshake alone) carries its pick out.
pub async fn recording_pick<F: Future>(handshake: F) -> (F::Output, Option<Arc<CertifiedKey>>) {
    let mut scoped = std::pin::pin!(PICKED.scope(RefCell::new(None), handshake));
    let outcome = scoped.as_mut().await;
    let picked = scoped.as_mut().take_value().and_then(RefCell::into_inner);
    (outcome, picked)
}

/// A listener's certificate resolver.
#[derive(Debug)]
pub struct ServerCertificates {
    /// The chain's certificates.
    pub certificates: Arc<LiveCertificates>,
    /// `full_scan_certs_on_sni_mismatch`.
    pub full_scan: bool,
}

impl ResolvesServerCert for ServerCertificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let picked = self.certificates.pick(
            hello.server_name(),
            hello.signature_schemes(),
            self.full_scan,
        );
        if let Some(key) = &picked {
            // Outside `recording_pick` nobody asks which certificate was presented.
            let _ = PICKED.try_with(|slot| *slot.borrow_mut() = Some(key.clone()));
        }
        picked
    }
}

/// A cluster's client-certificate resolver.
#[derive(Debug)]
pub struct ClientCertificates(pub Arc<LiveCertificates>);

impl ResolvesClientCert for ClientCertificates {
    fn resolve(&self, _hints: &[&[u8]], schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.0.pick(None, schemes, false)
    }

    fn has_certs(&self) -> bool {
        !matches!(*self.0, LiveCertificates::None)
    }
}
