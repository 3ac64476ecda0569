//! A JSON Web Key Set read as Envoy's `Jwks::createFrom(.., JWKS)` reads it (keys it cannot
//! use are left out; none left is an error), and a token's signature checked against it as
//! `verifyJwtWithoutTimeChecking` does, with ring.
//!
//! ring lacks what Envoy also accepts: P-521 keys (ES512), RSA moduli under 2048 bits, and
//! the Google-style set of X.509 certificates by `kid`. Those keys are left out, so tokens
//! they would verify are denied (never let through), and a set of only such keys is
//! refused.

use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::{Map, Value};

use super::token::Jwt;
use super::{KeyError, Status, base64url_decode};

/// The usable keys of a JWKS.
#[derive(Debug, Clone, Default)]
pub struct Jwks {
    keys: Vec<Jwk>,
}

/// One key.
#[derive(Debug, Clone)]
struct Jwk {
    /// `kid` (empty when absent).
    kid: String,
    /// `alg` (empty when absent).
    alg: String,
    key: Key,
}

/// A key's material.
#[derive(Debug, Clone)]
enum Key {
    /// `kty: RSA`: modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// `kty: EC` on P-256 or P-384: the uncompressed point.
    Ec { p384: bool, point: Vec<u8> },
    /// `kty: oct`: an HMAC secret.
    Oct(Vec<u8>),
    /// `kty: OKP`, `crv: Ed25519`.
    Ed25519(Vec<u8>),
}

impl Jwks {
    /// Reads the JWKS `json`: its usable keys, or the status Envoy gives the set.
    pub fn parse(json: &[u8]) -> Result<Jwks, Status> {
        let Ok(Value::Object(set)) = serde_json::from_slice::<Value>(json) else {
            return Err(Status::JwksParseError);
        };
        let keys = match set.get("keys") {
            None => return Err(Status::JwksNoKeys),
            Some(Value::Array(keys)) => keys,
            Some(_) => return Err(Status::JwksBadKeys),
        };
        // As Envoy: the first error since the last good key is the set's status when no
        // key is good.
        let mut usable = Vec::new();
        let mut error = None;
        for k in keys.iter().filter_map(Value::as_object) {
            match jwk(k) {
                Ok(Some(key)) => {
                    usable.push(key);
                    error = None;
                }
                Ok(None) => {}
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        if usable.is_empty() {
            return Err(error.map_or(Status::JwksNoValidKeys, Status::Key));
        }
        let keys = usable;
        Ok(Jwks { keys })
    }

    /// Checks `jwt`'s signature with the keys whose `kid` and `alg` fit it.
    pub fn verify(&self, jwt: &Jwt) -> Status {
        let signed = jwt.signed.as_bytes();
        let sig = jwt.signature.as_slice();
        let mut matched = false;
        for k in &self.keys {
            if !jwt.kid.is_empty() && !k.kid.is_empty() && k.kid != jwt.kid {
                continue;
            }
            if !k.alg.is_empty() && k.alg != jwt.alg {
                continue;
            }
            matched = true;
            let alg = jwt.alg.as_str();
            let ok = match &k.key {
                Key::Rsa { n, e } => {
                    let params: &signature::RsaParameters = match alg {
                        "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                        "RS512" => &signature::RSA_PKCS1_2048_8192_SHA512,
                        "PS256" => &signature::RSA_PSS_2048_8192_SHA256,
                        "PS384" => &signature::RSA_PSS_2048_8192_SHA384,
                        "PS512" => &signature::RSA_PSS_2048_8192_SHA512,
                        a if a.starts_with("RS") => &signature::RSA_PKCS1_2048_8192_SHA256,
                        _ => continue,
                    };
                    RsaPublicKeyComponents { n, e }
                        .verify(params, signed, sig)
                        .is_ok()
                }
                Key::Ec { p384, point } => {
                    let params = match (p384, alg) {
                        (false, "ES384" | "ES512") | (true, "ES512") => continue,
                        (false, _) => &signature::ECDSA_P256_SHA256_FIXED,
                        (true, "ES384") => &signature::ECDSA_P384_SHA384_FIXED,
                        (true, _) => continue,
                    };
                    UnparsedPublicKey::new(params, point)
                        .verify(signed, sig)
                        .is_ok()
                }
                Key::Oct(secret) => {
                    let algorithm = match alg {
                        "HS384" => ring::hmac::HMAC_SHA384,
                        "HS512" => ring::hmac::HMAC_SHA512,
                        _ => ring::hmac::HMAC_SHA256,
                    };
                    let key = ring::hmac::Key::new(algorithm, secret);
                    ring::hmac::verify(&key, signed, sig).is_ok()
                }
                Key::Ed25519(public) => {
                    if sig.len() != 64 {
                        return Status::JwtEd25519SignatureWrongLength;
                    }
                    UnparsedPublicKey::new(&signature::ED25519, public)
                        .verify(signed, sig)
                        .is_ok()
                }
            };
            if ok {
                return Status::Ok;
            }
        }
        if matched {
            Status::JwtVerificationFail
        } else {
            Status::JwksKidAlgMismatch
        }
    }
}

/// One key of the set: `None` when Envoy takes it but ring cannot use it (P-521).
fn jwk(k: &Map<String, Value>) -> Result<Option<Jwk>, KeyError> {
    use KeyError as E;
    // A string field: `missing` when absent, `bad` when not a string.
    let field = |name: &str, missing: E, bad: E| match k.get(name) {
        None => Err(missing),
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(_) => Err(bad),
    };
    let kty = field("kty", E::MissingKty, E::BadKty)?;
    let alg = k.get("alg").and_then(Value::as_str).unwrap_or_default();
    let key = match kty {
        "RSA" => {
            if !(alg.is_empty() || alg.starts_with("RS") || alg.starts_with("PS")) {
                return Err(E::RsaBadAlg);
            }
            let n = field("n", E::RsaMissingN, E::RsaBadN)?;
            let e = field("e", E::RsaMissingE, E::RsaBadE)?;
            let (n, e) = base64url_decode(n)
                .zip(base64url_decode(e))
                .ok_or(E::RsaParseError)?;
            if !matches!(strip_zeros(&e), [3] | [1, 0, 1]) || strip_zeros(&n).is_empty() {
                return Err(E::RsaParseError);
            }
            Key::Rsa { n, e }
        }
        "EC" => {
            if !(alg.is_empty() || alg.starts_with("ES")) {
                return Err(E::EcBadAlg);
            }
            let crv = match k.get("crv") {
                None => "",
                Some(Value::String(c)) => c.as_str(),
                Some(_) => return Err(E::EcBadCrv),
            };
            if !alg.is_empty()
                && !crv.is_empty()
                && !matches!(
                    (alg, crv),
                    ("ES256", "P-256") | ("ES384", "P-384") | ("ES512", "P-521")
                )
            {
                return Err(E::EcAlgNotCompatibleWithCrv);
            }
            let size = match (alg, crv) {
                ("ES256", _) | (_, "P-256") | ("", "") => 32,
                ("ES384", _) | (_, "P-384") => 48,
                ("ES512", _) | (_, "P-521") => 66,
                _ => return Err(E::EcAlgOrCrvUnsupported),
            };
            let x = field("x", E::EcMissingX, E::EcBadX)?;
            let y = field("y", E::EcMissingY, E::EcBadY)?;
            let (x, y) = base64url_decode(x)
                .zip(base64url_decode(y))
                .ok_or(E::EcXorYBadBase64)?;
            let mut point = vec![4u8];
            for c in [x, y] {
                let c = strip_zeros(&c);
                if c.len() > size {
                    return Err(E::EcParseError);
                }
                point.extend(std::iter::repeat_n(0, size - c.len()));
                point.extend_from_slice(c);
            }
            if size == 66 {
                return Ok(None);
            }
            Key::Ec {
                p384: size == 48,
                point,
            }
        }
        "oct" => {
            if !(alg.is_empty() || ["HS256", "HS384", "HS512"].contains(&alg)) {
                return Err(E::HmacBadAlg);
            }
            let secret = field("k", E::HmacMissingK, E::HmacBadK)?;
            let secret = base64url_decode(secret)
                .filter(|s| !s.is_empty())
                .ok_or(E::OctBadBase64)?;
            Key::Oct(secret)
        }
        "OKP" => {
            if !(alg.is_empty() || alg == "EdDSA") {
                return Err(E::OkpBadAlg);
            }
            if field("crv", E::OkpMissingCrv, E::OkpBadCrv)? != "Ed25519" {
                return Err(E::OkpCrvUnsupported);
            }
            let x = field("x", E::OkpMissingX, E::OkpBadX)?;
            let x = base64url_decode(x).ok_or(E::OkpXBadBase64)?;
            if x.len() != 32 {
                return Err(E::OkpXWrongLength);
            }
            Key::Ed25519(x)
        }
        _ => return Err(E::NotImplementedKty),
    };
    Ok(Some(Jwk {
        kid: k
            .get("kid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        alg: alg.to_owned(),
        key,
    }))
}

/// `b` without leading zero bytes.
fn strip_zeros(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|x| *x != 0).unwrap_or(b.len());
    &b[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_without_usable_keys_are_errors() {
        for (json, status) in [
            ("not json", Status::JwksParseError),
            ("{}", Status::JwksNoKeys),
            (r#"{"keys": {}}"#, Status::JwksBadKeys),
            (r#"{"keys": []}"#, Status::JwksNoValidKeys),
            (
                r#"{"keys": [{"kty": "RSA"}, {"kty": "EC"}]}"#,
                Status::Key(KeyError::RsaMissingN),
            ),
            (
                r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0", "alg": "RS256"}]}"#,
                Status::Key(KeyError::HmacBadAlg),
            ),
        ] {
            assert_eq!(Jwks::parse(json.as_bytes()).unwrap_err(), status, "{json}");
        }
    }

    #[test]
    fn hmac_keys_verify_and_kid_alg_must_match() {
        use base64::Engine;
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let jwks = Jwks::parse(
            br#"{"keys": [{"kty": "oct", "kid": "k1", "alg": "HS256", "k": "c2VjcmV0"}]}"#,
        )
        .unwrap();
        let signed = format!(
            "{}.{}",
            e.encode(r#"{"alg":"HS256","kid":"k1"}"#),
            e.encode(r#"{"iss":"i"}"#)
        );
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"secret");
        let sig = e.encode(ring::hmac::sign(&key, signed.as_bytes()));
        let jwt = Jwt::parse(&format!("{signed}.{sig}")).unwrap();
        assert_eq!(jwks.verify(&jwt), Status::Ok);
        let bad = Jwt::parse(&format!("{signed}.{}", e.encode("nope"))).unwrap();
        assert_eq!(jwks.verify(&bad), Status::JwtVerificationFail);
        let other_kid = format!(
            "{}.{}.{sig}",
            e.encode(r#"{"alg":"HS256","kid":"k2"}"#),
            e.encode(r#"{"iss":"i"}"#)
        );
        assert_eq!(
            jwks.verify(&Jwt::parse(&other_kid).unwrap()),
            Status::JwksKidAlgMismatch
        );
    }
}
