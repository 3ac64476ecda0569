//! Envoy's TLS stats (`listener.<address>.ssl.*`, `cluster.<name>.ssl.*`).

use std::sync::{Arc, OnceLock};

use rustls::{CipherSuite, CommonState, NamedGroup, ProtocolVersion, SignatureScheme};

use crate::stats::{Counter, Store};

/// Why a peer's certificate was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyFailure {
    /// None presented where one is required (`fail_verify_no_cert`).
    NoCertificate,
    /// The chain did not verify (`fail_verify_error`).
    Chain,
    /// No subject alternative name matched (`fail_verify_san`).
    San,
    /// Neither the SPKI nor the certificate pins matched (`fail_verify_cert_hash`).
    Pin,
}

/// The counters named by what a handshake negotiated (`versions.TLSv1.3`,
/// `ciphers.TLS_AES_128_GCM_SHA256`, ...), each resolved once: a handshake then counts without
/// formatting a stat name or taking the store's lock. The names come from small fixed tables,
/// so a few slots hold them all; a name beyond them is looked up in the store.
#[derive(Debug)]
struct Negotiated {
    /// `versions`, `ciphers`, `curves` or `sigalgs`.
    kind: &'static str,
    slots: [OnceLock<(&'static str, Counter)>; 16],
}

impl Negotiated {
    fn new(kind: &'static str) -> Self {
        Negotiated {
            kind,
            slots: Default::default(),
        }
    }

    /// Counts one `<kind>.<name>` under `prefix`.
    fn inc(&self, store: &Store, prefix: &str, name: &'static str) {
        let make = || store.counter(&format!("{prefix}{}.{name}", self.kind));
        for slot in &self.slots {
            let (held, counter) = slot.get_or_init(|| (name, make()));
            if *held == name {
                counter.inc();
                return;
            }
        }
        make().inc();
    }
}

/// The kinds of [`Negotiated`] counters, by index into [`TlsStats::negotiated`].
const KINDS: [&str; 4] = ["versions", "ciphers", "curves", "sigalgs"];
const VERSIONS: usize = 0;
const CIPHERS: usize = 1;
const CURVES: usize = 2;
const SIGALGS: usize = 3;

/// One TLS context's counters.
#[derive(Debug, Clone)]
pub struct TlsStats {
    store: Store,
    /// `<scope>ssl.`.
    prefix: Arc<str>,
    /// `<scope>`: `listener.<address>.` or `cluster.<name>.`.
    scope: Arc<str>,
    /// `versions.*`, `ciphers.*`, `curves.*`, `sigalgs.*`.
    negotiated: Arc<[Negotiated; 4]>,
    /// `ssl.handshake`: completed handshakes.
    pub handshake: Counter,
    /// `ssl.connection_error`: handshakes that failed on a TLS error other than a refused
    /// certificate.
    connection_error: Counter,
    /// `ssl.session_reused`.
    pub session_reused: Counter,
    /// `ssl.no_certificate`: handshakes where the peer presented none.
    pub no_certificate: Counter,
    fail_verify_no_cert: Counter,
    fail_verify_error: Counter,
    fail_verify_san: Counter,
    fail_verify_cert_hash: Counter,
}

impl TlsStats {
    /// The counters under `<scope>ssl.` (`scope` is `listener.<address>.` or
    /// `cluster.<name>.`).
    pub fn new(store: &Store, scope: &str) -> Self {
        let prefix = format!("{scope}ssl.");
        let c = |name: &str| store.counter(&format!("{prefix}{name}"));
        TlsStats {
            handshake: c("handshake"),
            connection_error: c("connection_error"),
            session_reused: c("session_reused"),
            no_certificate: c("no_certificate"),
            fail_verify_no_cert: c("fail_verify_no_cert"),
            fail_verify_error: c("fail_verify_error"),
            fail_verify_san: c("fail_verify_san"),
            fail_verify_cert_hash: c("fail_verify_cert_hash"),
            store: store.clone(),
            prefix: prefix.into(),
            scope: scope.into(),
            negotiated: Arc::new(KINDS.map(Negotiated::new)),
        }
    }

    /// The counter `<scope><name>`, beside `ssl.*` (the socket factory's
    /// `client_ssl_socket_factory.*`).
    pub fn scoped_counter(&self, name: &str) -> Counter {
        self.store.counter(&format!("{}{name}", self.scope))
    }

    fn count_negotiated(&self, kind: usize, name: &'static str) {
        self.negotiated[kind].inc(&self.store, &self.prefix, name);
    }

    /// Counts a refused peer certificate.
    pub fn verify_failed(&self, why: VerifyFailure) {
        match why {
            VerifyFailure::NoCertificate => &self.fail_verify_no_cert,
            VerifyFailure::Chain => &self.fail_verify_error,
            VerifyFailure::San => &self.fail_verify_san,
            VerifyFailure::Pin => &self.fail_verify_cert_hash,
        }
        .inc();
    }

    /// Counts a failed handshake as Envoy does: `fail_verify_no_cert` when the peer presented
    /// no certificate where one is required, `connection_error` for any other TLS error. A
    /// refused certificate is counted by the verifier (`fail_verify_*`) alone, and a failure of
    /// the connection itself (closed or reset during the handshake) by no `ssl.*` counter.
    pub fn handshake_failed(&self, e: &std::io::Error) {
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::NoCertificatesPresented) => self.fail_verify_no_cert.inc(),
            Some(rustls::Error::InvalidCertificate(_)) | None => {}
            Some(_) => self.connection_error.inc(),
        }
    }

    /// Counts the peer's handshake signature, verified (`sigalgs.<name>`, named as Envoy names
    /// it). Envoy counts it when the handshake completes, revoy when it checks the signature:
    /// a TLS 1.2 client that the server refuses after that check counts one Envoy does not.
    pub fn peer_signature(&self, scheme: SignatureScheme) {
        self.count_negotiated(SIGALGS, sigalg_name(scheme));
    }

    /// Counts a completed handshake: `handshake`, `session_reused`, `no_certificate`, and the
    /// negotiated `versions.*`, `ciphers.*` and `curves.*`, named as Envoy names them.
    pub fn handshake_done(&self, conn: &CommonState) {
        self.handshake.inc();
        if conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
            self.session_reused.inc();
        }
        if conn.peer_certificates().is_none_or(|c| c.is_empty()) {
            self.no_certificate.inc();
        }
        if let Some(v) = conn.protocol_version() {
            self.count_negotiated(VERSIONS, version_name(v));
        }
        if let Some(s) = conn.negotiated_cipher_suite() {
            self.count_negotiated(CIPHERS, cipher_name(s.suite()));
        }
        if let Some(g) = conn.negotiated_key_exchange_group() {
            self.count_negotiated(CURVES, curve_name(g.name()));
        }
    }
}

/// Envoy's (BoringSSL's) name of a TLS version.
pub fn version_name(v: ProtocolVersion) -> &'static str {
    match v {
        ProtocolVersion::TLSv1_3 => "TLSv1.3",
        ProtocolVersion::TLSv1_2 => "TLSv1.2",
        _ => "unknown",
    }
}

/// Envoy's (BoringSSL's) name of a cipher suite.
pub fn cipher_name(s: CipherSuite) -> &'static str {
    match s {
        CipherSuite::TLS13_AES_128_GCM_SHA256 => "TLS_AES_128_GCM_SHA256",
        CipherSuite::TLS13_AES_256_GCM_SHA384 => "TLS_AES_256_GCM_SHA384",
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => "TLS_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => "ECDHE-ECDSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => "ECDHE-RSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => "ECDHE-ECDSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => "ECDHE-RSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => {
            "ECDHE-ECDSA-CHACHA20-POLY1305"
        }
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => "ECDHE-RSA-CHACHA20-POLY1305",
        _ => "unknown",
    }
}

/// Envoy's (BoringSSL's, with the curve) name of a signature algorithm.
pub fn sigalg_name(s: SignatureScheme) -> &'static str {
    match s {
        SignatureScheme::RSA_PKCS1_SHA1 => "rsa_pkcs1_sha1",
        SignatureScheme::ECDSA_SHA1_Legacy => "ecdsa_sha1",
        SignatureScheme::RSA_PKCS1_SHA256 => "rsa_pkcs1_sha256",
        SignatureScheme::RSA_PKCS1_SHA384 => "rsa_pkcs1_sha384",
        SignatureScheme::RSA_PKCS1_SHA512 => "rsa_pkcs1_sha512",
        SignatureScheme::ECDSA_NISTP256_SHA256 => "ecdsa_secp256r1_sha256",
        SignatureScheme::ECDSA_NISTP384_SHA384 => "ecdsa_secp384r1_sha384",
        SignatureScheme::ECDSA_NISTP521_SHA512 => "ecdsa_secp521r1_sha512",
        SignatureScheme::RSA_PSS_SHA256 => "rsa_pss_rsae_sha256",
        SignatureScheme::RSA_PSS_SHA384 => "rsa_pss_rsae_sha384",
        SignatureScheme::RSA_PSS_SHA512 => "rsa_pss_rsae_sha512",
        SignatureScheme::ED25519 => "ed25519",
        _ => "unknown",
    }
}

/// Envoy's (BoringSSL's) name of a key-exchange group.
pub fn curve_name(g: NamedGroup) -> &'static str {
    match g {
        NamedGroup::X25519 => "X25519",
        NamedGroup::secp256r1 => "P-256",
        NamedGroup::secp384r1 => "P-384",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiated_counters_are_named_like_envoys_and_count_past_their_slots() {
        let store = Store::new();
        let stats = TlsStats::new(&store, "cluster.c.");
        let names: Vec<&'static str> = (0..20)
            .map(|i| &*Box::leak(format!("n{i}").into_boxed_str()))
            .collect();
        for name in names.iter().chain(&names) {
            stats.count_negotiated(CIPHERS, name);
        }
        stats.count_negotiated(VERSIONS, "TLSv1.3");
        for name in &names {
            assert_eq!(
                store
                    .counter(&format!("cluster.c.ssl.ciphers.{name}"))
                    .value(),
                2
            );
        }
        assert_eq!(store.counter("cluster.c.ssl.versions.TLSv1.3").value(), 1);
    }
}
