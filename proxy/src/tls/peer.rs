//! The certificates of one downstream TLS connection: the chain the client presented and the
//! certificate this side presented, kept as the handshake left them and read (parsed) only
//! when a request rule asks, at most once per connection.

use std::sync::{Arc, OnceLock};

use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;

use super::x509::{self, CertInfo};

/// A downstream TLS connection's certificates.
#[derive(Debug)]
pub struct PeerTls {
    /// What the client presented, leaf first; empty when it presented nothing.
    chain: Vec<CertificateDer<'static>>,
    /// What this side presented.
    local: Option<Arc<CertifiedKey>>,
    /// The client's certificate read (`None` inside: it does not parse).
    peer_info: OnceLock<Option<CertInfo>>,
    /// The URI SANs of this side's certificate.
    local_uris: OnceLock<Vec<String>>,
    /// This hop's `x-forwarded-client-cert` element in its text and JSON forms, each built
    /// by the connection manager on the first request that needs it (a connection has one
    /// connection manager, so one element of each form).
    xfcc: [OnceLock<String>; 2],
    /// The SNI the client sent (`%REQUESTED_SERVER_NAME%`).
    server_name: Option<Arc<str>>,
    /// Whether the chain's `istio_authn` filter ran: the principals are filter state.
    istio_authn: bool,
}

impl PeerTls {
    /// The certificates of a completed handshake: the client's chain (`None` or empty: none
    /// presented) and the certificate this side presented.
    pub fn new(
        chain: Option<&[CertificateDer<'static>]>,
        local: Option<Arc<CertifiedKey>>,
    ) -> Self {
        PeerTls {
            chain: chain.map(<[_]>::to_vec).unwrap_or_default(),
            local,
            peer_info: OnceLock::new(),
            local_uris: OnceLock::new(),
            xfcc: [OnceLock::new(), OnceLock::new()],
            server_name: None,
            istio_authn: false,
        }
    }

    /// The same, as a connection of a chain with (`on`) or without Istio's `istio_authn`
    /// filter.
    pub fn with_istio_authn(mut self, on: bool) -> Self {
        self.istio_authn = on;
        self
    }

    /// The same, with the SNI the client sent as the listener's tls_inspector read it (Envoy's
    /// requested server name: the handshake alone does not set it).
    pub fn with_server_name(mut self, sni: Option<&str>) -> Self {
        self.server_name = sni.map(Arc::from);
        self
    }

    /// The SNI the client sent, when the listener's tls_inspector read it.
    pub fn server_name(&self) -> Option<&Arc<str>> {
        self.server_name.as_ref()
    }

    /// Whether the client presented a certificate (Envoy's `peerCertificatePresented`).
    pub fn presented(&self) -> bool {
        !self.chain.is_empty()
    }

    /// The chain the client presented, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The client's certificate, read; `None` without one or when it does not parse.
    pub fn peer(&self) -> Option<&CertInfo> {
        self.peer_info
            .get_or_init(|| x509::parse(self.chain.first()?).ok())
            .as_ref()
    }

    /// The URI SANs of the certificate this side presented (Envoy's
    /// `uriSanLocalCertificate`).
    pub fn local_uri_sans(&self) -> &[String] {
        self.local_uris.get_or_init(|| {
            self.local
                .as_ref()
                .and_then(|key| key.cert.first())
                .and_then(|der| x509::parse(der).ok())
                .map(|info| info.uri_sans().map(str::to_owned).collect())
                .unwrap_or_default()
        })
    }

    /// The connection's `x-forwarded-client-cert` element in its text (`json` false) or JSON
    /// form, built by `build` the first time.
    pub fn xfcc(&self, json: bool, build: impl FnOnce(&PeerTls) -> String) -> &str {
        self.xfcc[usize::from(json)].get_or_init(|| build(self))
    }
}

impl crate::filter_state::FilterState for PeerTls {
    /// The connection's filter state `key`, as `istio_authn` sets it: once the peer presented
    /// a certificate, the first `spiffe://` URI SAN of the peer's certificate
    /// (`io.istio.peer_principal`) and of this side's (`io.istio.local_principal`).
    fn filter_state(&self, key: &str) -> Option<&str> {
        use crate::filter_state::{LOCAL_PRINCIPAL, PEER_PRINCIPAL};
        if !self.istio_authn || !self.presented() {
            return None;
        }
        let spiffe = |s: &&str| s.starts_with("spiffe://");
        match key {
            PEER_PRINCIPAL => self.peer()?.uri_sans().find(spiffe),
            LOCAL_PRINCIPAL => self
                .local_uri_sans()
                .iter()
                .map(String::as_str)
                .find(spiffe),
            _ => None,
        }
    }
}

/// A client's self-signed certificate with these URI and DNS SANs and common name, as a
/// completed handshake's [`PeerTls`] (for tests of what reads a connection's TLS).
#[cfg(test)]
pub(crate) fn test_peer(uris: &[&str], dns: &[&str], cn: &str) -> PeerTls {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};
    let mut params =
        CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>()).unwrap();
    for u in uris {
        params
            .subject_alt_names
            .push(SanType::URI(u.to_string().try_into().unwrap()));
    }
    params.distinguished_name.push(DnType::CommonName, cn);
    let key = KeyPair::generate().unwrap();
    let der = CertificateDer::from(params.self_signed(&key).unwrap().der().to_vec());
    PeerTls::new(Some(&[der]), None)
}
