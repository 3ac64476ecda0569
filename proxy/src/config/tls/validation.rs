//! A `CertificateValidationContext` -> what a peer's certificate is checked against: trusted
//! CAs and CRLs (the chain), subject-alternative-name matchers, SPKI and certificate pins.

use std::sync::Arc;

use base64::Engine as _;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, SubjectAltNameMatcher, certificate_validation_context,
    subject_alt_name_matcher::SanType,
};
use rustls::pki_types::CertificateDer;
use webpki::OwnedCertRevocationList;

use super::{certificate::origin, source};
use crate::config::route::matchers::string_matcher;
use crate::config::{ConfigError, Context};
use crate::route::matcher::StringMatcher;

/// The checks a peer certificate must pass.
#[derive(Debug, Default)]
pub struct Validation {
    /// `trusted_ca`: the chain must lead to one of these (`None`: the chain is not verified,
    /// as in Envoy without a `trusted_ca`).
    pub trusted: Option<TrustedCa>,
    /// `crl`: certificates revoked by these are refused.
    pub crls: Vec<OwnedCertRevocationList>,
    /// `only_verify_leaf_cert_crl`: CRLs are checked for the leaf only.
    pub leaf_crl_only: bool,
    /// `match_typed_subject_alt_names` and `match_subject_alt_names`: when any, one must match.
    pub sans: Vec<SanMatcher>,
    /// `verify_certificate_spki`: SHA-256 digests of accepted public keys (any matches).
    pub spki: Vec<Vec<u8>>,
    /// `verify_certificate_hash`: SHA-256 digests of accepted certificates (any matches; with
    /// `spki`, either list may match, as in Envoy).
    pub hashes: Vec<Vec<u8>>,
    /// `trust_chain_verification: ACCEPT_UNTRUSTED`: a chain failure is counted, not fatal.
    pub accept_untrusted: bool,
    /// `max_verify_depth`: the most intermediates a chain may have between the peer's
    /// certificate and the trusted CA.
    pub max_depth: Option<usize>,
}

/// The trusted CA certificates of a validation context.
#[derive(Debug)]
pub struct TrustedCa {
    /// The trust anchors the chain is verified against.
    pub anchors: Arc<Vec<rustls::pki_types::TrustAnchor<'static>>>,
    /// The CA certificates themselves (for `/certs`).
    pub certificates: Vec<CertificateDer<'static>>,
    /// Their subjects: the CA names a listener's certificate request lists, as Envoy's does.
    pub subjects: Vec<rustls::DistinguishedName>,
    /// Where they came from (a file, or `<inline>`).
    pub origin: String,
}

/// Which subject alternative names a matcher looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SanKind {
    /// DNS names (a certificate's `*.example.com` matches an exact `a.example.com`).
    Dns,
    /// URIs (SPIFFE identities).
    Uri,
    /// IP addresses, as text.
    Ip,
    /// e-mail addresses.
    Email,
    /// Any of the above (the deprecated `match_subject_alt_names`).
    Any,
}

/// One subject-alternative-name matcher.
#[derive(Debug)]
pub struct SanMatcher {
    /// Which names it looks at.
    pub kind: SanKind,
    /// What one must match.
    pub matcher: StringMatcher,
}

impl SanMatcher {
    /// Whether a SAN of `kind` with `value` matches.
    pub fn matches(&self, kind: SanKind, value: &str) -> bool {
        if self.kind != SanKind::Any && self.kind != kind {
            return false;
        }
        match (&self.matcher, kind) {
            (StringMatcher::Exact(want, _), SanKind::Dns) => dns_name_match(want, value),
            (m, _) => m.matches(value),
        }
    }
}

/// Envoy's DNS SAN match: equal ignoring case, or a certificate's wildcard `*.b.c` standing
/// for one label of `a.b.c`.
fn dns_name_match(want: &str, cert: &str) -> bool {
    want.eq_ignore_ascii_case(cert) || wildcard_covers(cert, want)
}

/// Whether a certificate's wildcard name `*.b.c` covers `name` (`a.b.c`: exactly one label
/// in place of the `*`, compared ignoring case).
pub fn wildcard_covers(pattern: &str, name: &str) -> bool {
    match (pattern.strip_prefix("*."), name.split_once('.')) {
        (Some(suffix), Some((label, rest))) => {
            !label.is_empty() && rest.eq_ignore_ascii_case(suffix)
        }
        _ => false,
    }
}

impl Validation {
    /// Whether any check at all applies (else a peer certificate is accepted as it comes).
    pub fn checks_anything(&self) -> bool {
        self.trusted.is_some()
            || !self.sans.is_empty()
            || !self.spki.is_empty()
            || !self.hashes.is_empty()
    }
}

/// Compiles a validation context; errors name fields relative to it.
#[allow(deprecated)] // match_subject_alt_names: still in configs, so still honoured.
pub fn compile(
    ctx: &Context<'_>,
    v: &CertificateValidationContext,
) -> Result<Validation, ConfigError> {
    let unimplemented = |field: &str, what: &str| {
        Err(ConfigError::new(
            field,
            format!("{what} is not implemented by revoy"),
        ))
    };
    if v.custom_validator_config.is_some() {
        return unimplemented("custom_validator_config", "a custom certificate validator");
    }
    if v.ca_certificate_provider_instance.is_some() {
        return unimplemented(
            "ca_certificate_provider_instance",
            "a CA from a certificate provider",
        );
    }
    if v.require_signed_certificate_timestamp
        .as_ref()
        .is_some_and(|b| b.value)
    {
        return unimplemented(
            "require_signed_certificate_timestamp",
            "requiring signed certificate timestamps",
        );
    }
    if v.allow_expired_certificate {
        return unimplemented(
            "allow_expired_certificate",
            "accepting expired certificates",
        );
    }
    let trusted = match &v.trusted_ca {
        None => None,
        Some(ca) => {
            let certificates =
                source::certificates(&source::data(ctx, Some(ca), "trusted_ca")?, "trusted_ca")?;
            let anchors = certificates
                .iter()
                .map(|c| {
                    webpki::anchor_from_trusted_cert(c)
                        .map(|a| a.to_owned())
                        .map_err(|e| {
                            ConfigError::new("trusted_ca", format!("bad CA certificate: {e}"))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Some(TrustedCa {
                subjects: anchors
                    .iter()
                    .map(|a| rustls::DistinguishedName::in_sequence(a.subject.as_ref()))
                    .collect(),
                anchors: Arc::new(anchors),
                certificates,
                origin: origin(Some(ca)),
            })
        }
    };
    let crls = match &v.crl {
        None => Vec::new(),
        Some(crl) => source::crls(&source::data(ctx, Some(crl), "crl")?, "crl")?
            .iter()
            .map(|der| {
                OwnedCertRevocationList::from_der(der)
                    .map_err(|e| ConfigError::new("crl", format!("failed to load CRL: {e}")))
            })
            .collect::<Result<_, _>>()?,
    };
    if !crls.is_empty() && trusted.is_none() {
        return Err(ConfigError::new(
            "crl",
            "a CRL needs a trusted_ca to be checked against",
        ));
    }
    let mut sans = Vec::new();
    for (i, m) in v.match_typed_subject_alt_names.iter().enumerate() {
        sans.push(
            san_matcher(ctx, m)
                .map_err(|e| e.within(&format!("match_typed_subject_alt_names[{i}]")))?,
        );
    }
    for (i, m) in v.match_subject_alt_names.iter().enumerate() {
        sans.push(SanMatcher {
            kind: SanKind::Any,
            matcher: string_matcher(ctx, m)
                .map_err(|e| e.within(&format!("match_subject_alt_names[{i}]")))?,
        });
    }
    let spki = v
        .verify_certificate_spki
        .iter()
        .enumerate()
        .map(|(i, s)| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .ok()
                .filter(|d| d.len() == 32)
                .ok_or_else(|| {
                    ConfigError::new(
                        format!("verify_certificate_spki[{i}]"),
                        format!("invalid base64-encoded SHA-256 {s}"),
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    let hashes = v
        .verify_certificate_hash
        .iter()
        .enumerate()
        .map(|(i, h)| {
            hex_digest(h).ok_or_else(|| {
                ConfigError::new(
                    format!("verify_certificate_hash[{i}]"),
                    format!("invalid hex-encoded SHA-256 {h}"),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Validation {
        trusted,
        crls,
        leaf_crl_only: v.only_verify_leaf_cert_crl,
        sans,
        spki,
        hashes,
        max_depth: v.max_verify_depth.as_ref().map(|d| d.value as usize),
        accept_untrusted: v.trust_chain_verification
            == certificate_validation_context::TrustChainVerification::AcceptUntrusted as i32,
    })
}

fn san_matcher(ctx: &Context<'_>, m: &SubjectAltNameMatcher) -> Result<SanMatcher, ConfigError> {
    let kind = match SanType::try_from(m.san_type) {
        Ok(SanType::Dns) => SanKind::Dns,
        Ok(SanType::Uri) => SanKind::Uri,
        Ok(SanType::IpAddress) => SanKind::Ip,
        Ok(SanType::Email) => SanKind::Email,
        Ok(SanType::OtherName) => {
            return Err(ConfigError::new(
                "san_type",
                "OTHER_NAME subject alternative names are not implemented by revoy",
            ));
        }
        _ => {
            return Err(ConfigError::new(
                "san_type",
                "value must not be SAN_TYPE_UNSPECIFIED",
            ));
        }
    };
    let matcher = m
        .matcher
        .as_ref()
        .ok_or_else(|| ConfigError::new("matcher", "value is required"))?;
    Ok(SanMatcher {
        kind,
        matcher: string_matcher(ctx, matcher).map_err(|e| e.within("matcher"))?,
    })
}

/// A SHA-256 digest written in hex, with or without colons between the bytes.
fn hex_digest(s: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = s.bytes().filter(|b| *b != b':').collect();
    if digits.len() != 64 {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_matchers_honour_certificate_wildcards_like_envoy() {
        assert!(dns_name_match("a.example.com", "*.example.com"));
        assert!(dns_name_match("A.example.com", "a.EXAMPLE.com"));
        assert!(!dns_name_match("b.a.example.com", "*.example.com"));
        assert!(!dns_name_match("example.com", "*.example.com"));
    }

    #[test]
    fn pins_decode_and_bad_ones_are_named() {
        let hash = "DF:6F:F7:2F:E9:11:65:21:26:8F:61:68:02:8D:E0:9D:B2:E1:ED:8E:5A:3D:94:7A:A4:5D:AF:A5:0B:91:33:83";
        assert_eq!(hex_digest(hash).unwrap().len(), 32);
        assert_eq!(hex_digest(&hash.replace(':', "")), hex_digest(hash));
        assert!(hex_digest("abcd").is_none());
        let io = crate::config::FakeIo::new();
        let v = CertificateValidationContext {
            verify_certificate_spki: vec!["not base64!".into()],
            ..Default::default()
        };
        let e = compile(&Context::new(&io), &v).unwrap_err();
        assert_eq!(e.path, "verify_certificate_spki[0]");
    }
}
