//! `tls_params` -> the TLS versions, cipher suites and key-exchange groups of a context, as a
//! rustls `CryptoProvider` (ring: see ARCHITECTURE.md for why). Envoy's OpenSSL-style names
//! are mapped to rustls' set; a name rustls lacks is an error naming it.

use std::sync::{Arc, LazyLock};

use proto::pb::envoy::extensions::transport_sockets::tls::v3::TlsParameters;
use rustls::crypto::{CryptoProvider, SupportedKxGroup, ring};
use rustls::{CipherSuite, SupportedCipherSuite, SupportedProtocolVersion};

use crate::config::ConfigError;

/// Which end of a connection a context is for: Envoy's defaults differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A listener's `DownstreamTlsContext`: TLS 1.2 to 1.3 by default.
    Server,
    /// A cluster's `UpstreamTlsContext`: TLS 1.2 only by default, as in Envoy.
    Client,
}

/// The ring provider with rustls' full set, for loading keys and verifying signatures.
pub fn base() -> &'static Arc<CryptoProvider> {
    static BASE: LazyLock<Arc<CryptoProvider>> =
        LazyLock::new(|| Arc::new(ring::default_provider()));
    &BASE
}

/// The compiled `tls_params` of one context.
#[derive(Debug, Clone)]
pub struct Params {
    /// The versions allowed, oldest first; empty when `tls_params` allow none revoy has
    /// (TLS 1.0 and 1.1 only, or a minimum above the maximum): no handshake can succeed.
    pub versions: Vec<&'static SupportedProtocolVersion>,
    /// The cipher suites and key-exchange groups.
    pub provider: Arc<CryptoProvider>,
}

/// Envoy's TLS 1.2 cipher-suite names and rustls' suites (TLS 1.3 suites are not
/// configurable in Envoy, so all three are always on).
const SUITES: &[(&str, CipherSuite)] = &[
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "ECDHE-RSA-AES128-GCM-SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "ECDHE-RSA-AES256-GCM-SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "ECDHE-RSA-CHACHA20-POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// TLS 1.2 cipher suites that BoringSSL (so Envoy) knows and rustls does not have: RSA key
/// exchange, CBC, PSK and 3DES. A `cipher_suites` entry naming one is left out (Istio's inbound
/// listeners list `AES256-GCM-SHA384` and `AES128-GCM-SHA256`), so a client offering only such
/// suites is refused where Envoy would serve it.
const LEFT_OUT: &[&str] = &[
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA",
    "AES256-SHA",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-RSA-AES256-SHA",
    "ECDHE-RSA-AES128-SHA256",
    "DES-CBC3-SHA",
    "PSK-AES128-CBC-SHA",
    "PSK-AES256-CBC-SHA",
    "ECDHE-PSK-AES128-CBC-SHA",
    "ECDHE-PSK-AES256-CBC-SHA",
    "ECDHE-PSK-CHACHA20-POLY1305",
];

/// The names in `cipher_suites` (with their entry's index) that revoy leaves out: Envoy knows
/// them, rustls lacks them. For the warnings of the listener or cluster that has them.
pub fn left_out_suites(p: &TlsParameters) -> Vec<(usize, String)> {
    p.cipher_suites
        .iter()
        .enumerate()
        .flat_map(|(i, entry)| {
            suite_names(entry)
                .filter(|name| LEFT_OUT.contains(name))
                .map(move |name| (i, name.to_owned()))
        })
        .collect()
}

/// What a listener or cluster warning says of a suite [`left_out_suites`] found.
pub fn left_out_message(name: &str) -> String {
    format!(
        "cipher suite '{name}' is not in rustls (it has no RSA key exchange, CBC, PSK or 3DES \
         suites); left out, so a client offering only such suites is refused"
    )
}

/// The names of one `cipher_suites` entry (`[A|B]` is a group of equal preference).
fn suite_names(entry: &str) -> impl Iterator<Item = &str> {
    entry
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split('|')
}

/// Envoy's curve names and rustls' groups.
const CURVES: &[(&str, &dyn SupportedKxGroup)] = &[
    ("X25519", ring::kx_group::X25519),
    ("P-256", ring::kx_group::SECP256R1),
    ("P-384", ring::kx_group::SECP384R1),
];

/// Envoy's default `ecdh_curves`.
const DEFAULT_CURVES: &[&str] = &["X25519", "P-256"];

/// Compiles `tls_params` (absent: Envoy's defaults for `side`). Errors name fields relative to
/// `tls_params`. Contexts with Envoy's defaults (nearly all) share one provider per side.
pub fn compile(params: Option<&TlsParameters>, side: Side) -> Result<Params, ConfigError> {
    static SERVER: LazyLock<Params> =
        LazyLock::new(|| build(&TlsParameters::default(), Side::Server).expect("defaults compile"));
    static CLIENT: LazyLock<Params> =
        LazyLock::new(|| build(&TlsParameters::default(), Side::Client).expect("defaults compile"));
    match params {
        Some(p) if *p != TlsParameters::default() => build(p, side),
        _ => Ok(match side {
            Side::Server => SERVER.clone(),
            Side::Client => CLIENT.clone(),
        }),
    }
}

fn build(p: &TlsParameters, side: Side) -> Result<Params, ConfigError> {
    if !p.compliance_policies.is_empty() {
        return Err(ConfigError::new(
            "compliance_policies",
            "compliance policies (FIPS_202205) are not implemented by revoy",
        ));
    }
    let min = if p.tls_minimum_protocol_version == 0 {
        3
    } else {
        p.tls_minimum_protocol_version
    };
    let max = match (p.tls_maximum_protocol_version, side) {
        (0, Side::Server) => 4,
        (0, Side::Client) => 3,
        (v, _) => v,
    };
    let versions = [(3, &rustls::version::TLS12), (4, &rustls::version::TLS13)]
        .into_iter()
        .filter(|(v, _)| (min..=max).contains(v))
        .map(|(_, v)| v)
        .collect();
    let base = base();
    let mut cipher_suites: Vec<SupportedCipherSuite> = base
        .cipher_suites
        .iter()
        .filter(|s| s.version() == &rustls::version::TLS13)
        .copied()
        .collect();
    if p.cipher_suites.is_empty() {
        cipher_suites.extend(base.cipher_suites.iter().filter(|s| s.tls13().is_none()));
    } else {
        for (i, entry) in p.cipher_suites.iter().enumerate() {
            for name in suite_names(entry).filter(|name| !LEFT_OUT.contains(name)) {
                let Some((_, id)) = SUITES.iter().find(|(n, _)| *n == name) else {
                    return Err(ConfigError::new(
                        format!("cipher_suites[{i}]"),
                        format!(
                            "cipher suite '{name}' is not supported by revoy (rustls has {})",
                            SUITES.map_names()
                        ),
                    ));
                };
                let suite = base
                    .cipher_suites
                    .iter()
                    .find(|s| s.suite() == *id)
                    .expect("every mapped suite is in ring's provider");
                if !cipher_suites.contains(suite) {
                    cipher_suites.push(*suite);
                }
            }
        }
    }
    let names: Vec<&str> = if p.ecdh_curves.is_empty() {
        DEFAULT_CURVES.to_vec()
    } else {
        p.ecdh_curves.iter().map(String::as_str).collect()
    };
    let mut kx_groups = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let Some((_, group)) = CURVES.iter().find(|(n, _)| n == name) else {
            return Err(ConfigError::new(
                format!("ecdh_curves[{i}]"),
                format!(
                    "curve '{name}' is not supported by revoy (rustls has {})",
                    CURVES.map_names()
                ),
            ));
        };
        kx_groups.push(*group);
    }
    if !p.signature_algorithms.is_empty() {
        return Err(ConfigError::new(
            "signature_algorithms",
            "choosing signature algorithms is not implemented by revoy",
        ));
    }
    Ok(Params {
        versions,
        provider: Arc::new(CryptoProvider {
            cipher_suites,
            kx_groups,
            ..(**base).clone()
        }),
    })
}

/// The Envoy names of a mapping table, for error messages.
trait Names {
    fn map_names(&self) -> String;
}

impl<T> Names for [(&str, T)] {
    fn map_names(&self) -> String {
        self.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_defaults_differ_by_side() {
        let server = compile(None, Side::Server).unwrap();
        assert_eq!(server.versions.len(), 2);
        let client = compile(None, Side::Client).unwrap();
        assert_eq!(client.versions, [&rustls::version::TLS12]);
        assert_eq!(client.provider.kx_groups.len(), 2);
        assert_eq!(client.provider.cipher_suites.len(), 9);
    }

    #[test]
    fn names_map_to_rustls_and_unknown_ones_are_named() {
        let p = TlsParameters {
            cipher_suites: vec![
                "[ECDHE-ECDSA-AES128-GCM-SHA256|ECDHE-ECDSA-CHACHA20-POLY1305]".into(),
            ],
            ecdh_curves: vec!["P-384".into()],
            ..Default::default()
        };
        let c = compile(Some(&p), Side::Server).unwrap();
        assert_eq!(c.provider.cipher_suites.len(), 3 + 2);
        assert_eq!(c.provider.kx_groups.len(), 1);
        let p = TlsParameters {
            cipher_suites: vec!["ECDHE-RSA-AES128-GCM-SHA256".into(), "NO-SUCH-SUITE".into()],
            ..Default::default()
        };
        let e = compile(Some(&p), Side::Server).unwrap_err();
        assert_eq!(e.path, "cipher_suites[1]");
        assert!(e.message.contains("'NO-SUCH-SUITE'"), "{e}");
        let p = TlsParameters {
            ecdh_curves: vec!["X25519MLKEM768".into()],
            ..Default::default()
        };
        assert_eq!(
            compile(Some(&p), Side::Client).unwrap_err().path,
            "ecdh_curves[0]"
        );
    }

    #[test]
    fn suites_envoy_knows_and_rustls_lacks_are_left_out() {
        // Istio's inbound list.
        let p = TlsParameters {
            cipher_suites: [
                "ECDHE-ECDSA-AES256-GCM-SHA384",
                "ECDHE-RSA-AES256-GCM-SHA384",
                "ECDHE-ECDSA-AES128-GCM-SHA256",
                "ECDHE-RSA-AES128-GCM-SHA256",
                "AES256-GCM-SHA384",
                "AES128-GCM-SHA256",
            ]
            .map(String::from)
            .to_vec(),
            ..Default::default()
        };
        let c = compile(Some(&p), Side::Server).unwrap();
        assert_eq!(c.provider.cipher_suites.len(), 3 + 4);
        assert_eq!(
            left_out_suites(&p),
            [
                (4, "AES256-GCM-SHA384".into()),
                (5, "AES128-GCM-SHA256".into())
            ]
        );
    }

    #[test]
    fn versions_outside_revoys_range_leave_none() {
        let p = TlsParameters {
            tls_minimum_protocol_version: 1,
            tls_maximum_protocol_version: 2,
            ..Default::default()
        };
        assert!(compile(Some(&p), Side::Server).unwrap().versions.is_empty());
    }
}
