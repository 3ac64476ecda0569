//! A JSON Web Key Set read as Envoy's `Jwks::createFrom(.., JWKS)` reads it (keys it cannot
//! use are left out; none left is an error), and a token's signature checked against it as
//! `verifyJwtWithoutTimeChecking` does, with ring.
//!
//! ring lacks what Envoy also accepts: P-521 keys (ES512), RSA moduli under 2048 bits, and
//! the Google-style set of X.509 certificates by `kid`. Those keys are left out, so tokens
//! they would verify are denied (never let through).

use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::{Map, Value};

use super::token::Jwt;
use super::{Status, base64url_decode};

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
        let keys: Vec<Jwk> = keys
            .iter()
            .filter_map(|k| k.as_object().and_then(jwk))
            .collect();
        if keys.is_empty() {
            return Err(Status::JwksNoValidKeys);
        }
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

/// One key of the set, when revoy can use it.
fn jwk(k: &Map<String, Value>) -> Option<Jwk> {
    let text = |name: &str| k.get(name).and_then(Value::as_str);
    let b64 = |name: &str| text(name).and_then(base64url_decode);
    let kty = text("kty")?;
    let alg = text("alg").unwrap_or_default();
    let key = match kty {
        "RSA" => {
            if !(alg.is_empty() || alg.starts_with("RS") || alg.starts_with("PS")) {
                return None;
            }
            let (n, e) = (b64("n")?, b64("e")?);
            if !matches!(strip_zeros(&e), [3] | [1, 0, 1]) {
                return None;
            }
            Key::Rsa { n, e }
        }
        "EC" => {
            if !(alg.is_empty() || alg.starts_with("ES")) {
                return None;
            }
            let crv = match k.get("crv") {
                None => "",
                Some(Value::String(c)) => c.as_str(),
                Some(_) => return None,
            };
            let p384 = match (alg, crv) {
                ("ES256", "P-256" | "") | ("", "P-256" | "") => false,
                ("ES384", "P-384" | "") | ("", "P-384") => true,
                _ => return None,
            };
            let len = if p384 { 48 } else { 32 };
            let mut point = vec![4u8];
            for c in [b64("x")?, b64("y")?] {
                let c = strip_zeros(&c);
                if c.len() > len {
                    return None;
                }
                point.extend(std::iter::repeat_n(0, len - c.len()));
                point.extend_from_slice(c);
            }
            Key::Ec { p384, point }
        }
        "oct" => {
            if !(alg.is_empty() || ["HS256", "HS384", "HS512"].contains(&alg)) {
                return None;
            }
            let secret = b64("k").filter(|s| !s.is_empty())?;
            Key::Oct(secret)
        }
        "OKP" => {
            if !(alg.is_empty() || alg == "EdDSA") || text("crv")? != "Ed25519" {
                return None;
            }
            Key::Ed25519(b64("x").filter(|x| x.len() == 32)?)
        }
        _ => return None,
    };
    Some(Jwk {
        kid: text("kid").unwrap_or_default().to_owned(),
        alg: alg.to_owned(),
        key,
    })
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
            (r#"{"keys": [{"kty": "RSA"}]}"#, Status::JwksNoValidKeys),
            (
                r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0", "alg": "RS256"}]}"#,
                Status::JwksNoValidKeys,
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
