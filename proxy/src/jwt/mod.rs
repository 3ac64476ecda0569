//! JSON Web Tokens as Envoy's `jwt_authn` filter reads them: parsing a token ([`token`]),
//! parsing a JWKS and checking a signature with its keys ([`jwks`], on ring), and the
//! [`Status`] of each outcome with Envoy's wording (the filter's reply bodies and response
//! code details are these texts).

pub mod jwks;
pub mod token;

use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

/// Base64url with or without padding, as Envoy's `WebSafeBase64Unescape` reads it.
const BASE64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Decodes base64url (padding optional).
pub fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    BASE64URL.decode(s).ok()
}

/// How verifying a token (or reading a JWKS) ended, as Envoy's `jwt_verify::Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Verified.
    Ok,
    /// No token where the provider looks.
    JwtMissed,
    /// `nbf` is in the future.
    JwtNotYetValid,
    /// `exp` is in the past.
    JwtExpired,
    /// Not three dot-separated sections.
    JwtBadFormat,
    /// The header is not base64url.
    JwtHeaderParseErrorBadBase64,
    /// The header is not a JSON object.
    JwtHeaderParseErrorBadJson,
    /// `alg` is missing or not a string.
    JwtHeaderBadAlg,
    /// `alg` names no algorithm Envoy knows.
    JwtHeaderNotImplementedAlg,
    /// `kid` is not a string.
    JwtHeaderBadKid,
    /// The payload is not base64url.
    JwtPayloadParseErrorBadBase64,
    /// An Ed25519 signature of the wrong length.
    JwtEd25519SignatureWrongLength,
    /// The payload is not a JSON object.
    JwtPayloadParseErrorBadJson,
    /// `iss` is not a string.
    JwtPayloadParseErrorIssNotString,
    /// `sub` is not a string.
    JwtPayloadParseErrorSubNotString,
    /// `iat` is not a number.
    JwtPayloadParseErrorIatNotInteger,
    /// `iat` is negative or too large.
    JwtPayloadParseErrorIatOutOfRange,
    /// `nbf` is not a number.
    JwtPayloadParseErrorNbfNotInteger,
    /// `nbf` is negative or too large.
    JwtPayloadParseErrorNbfOutOfRange,
    /// `exp` is not a number.
    JwtPayloadParseErrorExpNotInteger,
    /// `exp` is negative or too large.
    JwtPayloadParseErrorExpOutOfRange,
    /// `jti` is not a string.
    JwtPayloadParseErrorJtiNotString,
    /// `aud` is neither a string nor a list of strings.
    JwtPayloadParseErrorAudNotString,
    /// The signature is not base64url.
    JwtSignatureParseErrorBadBase64,
    /// No provider has the token's issuer.
    JwtUnknownIssuer,
    /// None of the token's audiences is allowed.
    JwtAudienceNotAllowed,
    /// The signature does not verify (or the subject or lifetime is not allowed).
    JwtVerificationFail,
    /// The JWKS is not JSON.
    JwksParseError,
    /// The JWKS has no `keys`.
    JwksNoKeys,
    /// `keys` is not a list.
    JwksBadKeys,
    /// No key of the JWKS could be read.
    JwksNoValidKeys,
    /// No key has the token's `kid` and `alg`.
    JwksKidAlgMismatch,
    /// Fetching the remote JWKS failed.
    JwksFetchFail,
    /// Why one key of a JWKS is unusable.
    Key(KeyError),
}

/// Why a key of a JWKS is unusable (Envoy's per-key statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // each variant is its message
pub enum KeyError {
    MissingKty,
    BadKty,
    NotImplementedKty,
    RsaBadAlg,
    RsaMissingN,
    RsaBadN,
    RsaMissingE,
    RsaBadE,
    RsaParseError,
    EcBadAlg,
    EcBadCrv,
    EcAlgOrCrvUnsupported,
    EcAlgNotCompatibleWithCrv,
    EcMissingX,
    EcBadX,
    EcMissingY,
    EcBadY,
    EcXorYBadBase64,
    EcParseError,
    HmacBadAlg,
    HmacMissingK,
    HmacBadK,
    OctBadBase64,
    OkpBadAlg,
    OkpMissingCrv,
    OkpBadCrv,
    OkpCrvUnsupported,
    OkpMissingX,
    OkpBadX,
    OkpXBadBase64,
    OkpXWrongLength,
}

impl KeyError {
    /// Envoy's text for the status.
    pub fn message(self) -> &'static str {
        use KeyError::*;
        match self {
            MissingKty => "[kty] is missing in [keys]",
            BadKty => "[kty] is bad in [keys]",
            NotImplementedKty => "[kty] is not supported in [keys]",
            RsaBadAlg => "[alg] is not started with [RS] or [PS] for an RSA key",
            RsaMissingN => "[n] field is missing for a RSA key",
            RsaBadN => "[n] field is not string for a RSA key",
            RsaMissingE => "[e] field is missing for a RSA key",
            RsaBadE => "[e] field is not string for a RSA key",
            RsaParseError => "Jwks RSA [n] or [e] field is missing or has a parse error",
            EcBadAlg => "[alg] is not started with [ES] for an EC key",
            EcBadCrv => "[crv] field is not string for an EC key",
            EcAlgOrCrvUnsupported => "[crv] or [alg] field is not supported for an EC key",
            EcAlgNotCompatibleWithCrv => {
                "[crv] field specified is not compatible with [alg] for an EC key"
            }
            EcMissingX => "[x] field is missing for an EC key",
            EcBadX => "[x] field is not string for an EC key",
            EcMissingY => "[y] field is missing for an EC key",
            EcBadY => "[y] field is not string for an EC key",
            EcXorYBadBase64 => "Jwks EC [x] or [y] field is an invalid Base64.",
            EcParseError => "Jwks EC [x] and [y] fields have a parse error.",
            HmacBadAlg => "[alg] does not start with [HS] for an HMAC key",
            HmacMissingK => "[k] field is missing for an HMAC key",
            HmacBadK => "[k] field is not string for an HMAC key",
            OctBadBase64 => "Jwks Oct key is an invalid Base64",
            OkpBadAlg => "[alg] is not [EdDSA] for an OKP key",
            OkpMissingCrv => "[crv] field is missing for an OKP key",
            OkpBadCrv => "[crv] field is not string for an OKP key",
            OkpCrvUnsupported => "[crv] field is not supported for an OKP key",
            OkpMissingX => "[x] field is missing for an OKP key",
            OkpBadX => "[x] field is not string for an OKP key",
            OkpXBadBase64 => "Jwks OKP [x] field is an invalid Base64.",
            OkpXWrongLength => "Jwks OKP [x] field is wrong length.",
        }
    }
}

impl Status {
    /// The status's number in Envoy's `jwt_verify::Status` enum (what
    /// `failed_status_in_metadata` writes as `code`); a key's error counts as
    /// `JwksNoValidKeys`, the status it leads to.
    pub fn code(self) -> u32 {
        use Status::*;
        match self {
            Ok => 0,
            JwtMissed => 1,
            JwtNotYetValid => 2,
            JwtExpired => 3,
            JwtBadFormat => 4,
            JwtHeaderParseErrorBadBase64 => 5,
            JwtHeaderParseErrorBadJson => 6,
            JwtHeaderBadAlg => 7,
            JwtHeaderNotImplementedAlg => 8,
            JwtHeaderBadKid => 9,
            JwtPayloadParseErrorBadBase64 => 10,
            JwtEd25519SignatureWrongLength => 11,
            JwtPayloadParseErrorBadJson => 12,
            JwtPayloadParseErrorIssNotString => 13,
            JwtPayloadParseErrorSubNotString => 14,
            JwtPayloadParseErrorIatNotInteger => 15,
            JwtPayloadParseErrorIatOutOfRange => 16,
            JwtPayloadParseErrorNbfNotInteger => 17,
            JwtPayloadParseErrorNbfOutOfRange => 18,
            JwtPayloadParseErrorExpNotInteger => 19,
            JwtPayloadParseErrorExpOutOfRange => 20,
            JwtPayloadParseErrorJtiNotString => 21,
            JwtPayloadParseErrorAudNotString => 22,
            JwtSignatureParseErrorBadBase64 => 23,
            JwtUnknownIssuer => 24,
            JwtAudienceNotAllowed => 25,
            JwtVerificationFail => 26,
            JwksParseError => 28,
            JwksNoKeys => 29,
            JwksBadKeys => 30,
            JwksNoValidKeys | Key(_) => 31,
            JwksKidAlgMismatch => 32,
            JwksFetchFail => 41,
        }
    }

    /// Envoy's text for the status (`getStatusString`).
    pub fn message(self) -> &'static str {
        use Status::*;
        match self {
            Ok => "OK",
            JwtMissed => "Jwt is missing",
            JwtNotYetValid => "Jwt not yet valid",
            JwtExpired => "Jwt is expired",
            JwtBadFormat => {
                "Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections"
            }
            JwtHeaderParseErrorBadBase64 => "Jwt header is an invalid Base64url encoded",
            JwtHeaderParseErrorBadJson => "Jwt header is an invalid JSON",
            JwtHeaderBadAlg => "Jwt header [alg] field is required and must be a string",
            JwtHeaderNotImplementedAlg => "Jwt header [alg] is not supported",
            JwtHeaderBadKid => "Jwt header [kid] field is not a string",
            JwtPayloadParseErrorBadBase64 => "Jwt payload is an invalid Base64url encoded",
            JwtEd25519SignatureWrongLength => "Jwt ED25519 signature is wrong length",
            JwtPayloadParseErrorBadJson => "Jwt payload is an invalid JSON",
            JwtPayloadParseErrorIssNotString => "Jwt payload [iss] field is not a string",
            JwtPayloadParseErrorSubNotString => "Jwt payload [sub] field is not a string",
            JwtPayloadParseErrorIatNotInteger => "Jwt payload [iat] field is not an integer",
            JwtPayloadParseErrorIatOutOfRange => {
                "Jwt payload [iat] field is not a positive 64 bit integer"
            }
            JwtPayloadParseErrorNbfNotInteger => "Jwt payload [nbf] field is not an integer",
            JwtPayloadParseErrorNbfOutOfRange => {
                "Jwt payload [nbf] field is not a positive 64 bit integer"
            }
            JwtPayloadParseErrorExpNotInteger => "Jwt payload [exp] field is not an integer",
            JwtPayloadParseErrorExpOutOfRange => {
                "Jwt payload [exp] field is not a positive 64 bit integer"
            }
            JwtPayloadParseErrorJtiNotString => "Jwt payload [jti] field is not a string",
            JwtPayloadParseErrorAudNotString => {
                "Jwt payload [aud] field is not a string or string list"
            }
            JwtSignatureParseErrorBadBase64 => "Jwt signature is an invalid Base64url encoded",
            JwtUnknownIssuer => "Jwt issuer is not configured",
            JwtAudienceNotAllowed => "Audiences in Jwt are not allowed",
            JwtVerificationFail => "Jwt verification fails",
            JwksParseError => "Jwks is an invalid JSON",
            JwksNoKeys => "Jwks does not have [keys] field",
            JwksBadKeys => "[keys] in Jwks is not an array",
            JwksNoValidKeys => "Jwks doesn't have any valid public key",
            JwksKidAlgMismatch => "Jwks doesn't have key to match kid or alg from Jwt",
            JwksFetchFail => "Jwks remote fetch is failed",
            Key(k) => k.message(),
        }
    }
}

/// Audiences a provider or requirement allows, compared as Envoy's `CheckAudience` does
/// (an `http://` or `https://` prefix and a trailing `/` ignored); empty allows any.
#[derive(Debug, Clone, Default)]
pub struct Audiences(std::collections::HashSet<String>);

impl Audiences {
    /// The allowed audiences `list`.
    pub fn new<'a>(list: impl IntoIterator<Item = &'a String>) -> Audiences {
        Audiences(list.into_iter().map(|a| sanitize(a).to_owned()).collect())
    }

    /// Whether one of a token's `audiences` is allowed (any is, when none is configured).
    pub fn allows(&self, audiences: &[String]) -> bool {
        self.0.is_empty() || audiences.iter().any(|a| self.0.contains(sanitize(a)))
    }
}

/// `aud` without its scheme prefix and trailing slash.
fn sanitize(aud: &str) -> &str {
    let rest = aud
        .strip_prefix("http://")
        .or_else(|| aud.strip_prefix("https://"))
        .unwrap_or(aud);
    rest.strip_suffix('/').unwrap_or(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audiences_ignore_scheme_and_trailing_slash() {
        let allowed = Audiences::new(&["https://example.test/".to_owned()]);
        assert!(allowed.allows(&["example.test".to_owned()]));
        assert!(allowed.allows(&["other".to_owned(), "http://example.test".to_owned()]));
        assert!(!allowed.allows(&["example.test/x".to_owned()]));
        assert!(!allowed.allows(&[]));
        assert!(Audiences::default().allows(&[]));
    }
}
