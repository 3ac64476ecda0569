//! A JWT's three sections, parsed and checked as Envoy's `Jwt::parseFromString` does (the
//! claims it reads must have the right JSON types), and its time constraints.

use serde_json::{Map, Value};

use super::{Status, base64url_decode};

/// The algorithms Envoy accepts in a token's `alg`.
const IMPLEMENTED: &[&str] = &[
    "ES256", "ES384", "ES512", "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256",
    "PS384", "PS512", "EdDSA",
];

/// A parsed (not yet verified) token.
#[derive(Debug, Clone)]
pub struct Jwt {
    /// `alg`.
    pub alg: String,
    /// `kid` (empty when absent).
    pub kid: String,
    /// `iss` (empty when absent).
    pub iss: String,
    /// `sub` (empty when absent).
    pub sub: String,
    /// `nbf` (0 when absent).
    pub nbf: u64,
    /// `exp` (0 when absent).
    pub exp: u64,
    /// `aud`, a string or a list.
    pub audiences: Vec<String>,
    /// The header's fields.
    pub header: Map<String, Value>,
    /// The payload's claims.
    pub payload: Map<String, Value>,
    /// The payload section as sent (base64url).
    pub payload_base64url: String,
    /// What the signature signs: `header.payload` as sent.
    pub signed: String,
    /// The decoded signature.
    pub signature: Vec<u8>,
}

impl Jwt {
    /// Parses `token`, or the status Envoy gives a malformed one.
    pub fn parse(token: &str) -> Result<Jwt, Status> {
        let parts: Vec<&str> = token.split('.').filter(|p| !p.is_empty()).collect();
        let [header, payload, signature] = parts[..] else {
            return Err(Status::JwtBadFormat);
        };
        let header_json = base64url_decode(header).ok_or(Status::JwtHeaderParseErrorBadBase64)?;
        let header_map = object(&header_json).ok_or(Status::JwtHeaderParseErrorBadJson)?;
        let alg = match header_map.get("alg") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(Status::JwtHeaderBadAlg),
        };
        if !IMPLEMENTED.contains(&alg.as_str()) {
            return Err(Status::JwtHeaderNotImplementedAlg);
        }
        let kid = string(&header_map, "kid").ok_or(Status::JwtHeaderBadKid)?;
        let payload_json =
            base64url_decode(payload).ok_or(Status::JwtPayloadParseErrorBadBase64)?;
        let claims = object(&payload_json).ok_or(Status::JwtPayloadParseErrorBadJson)?;
        let iss = string(&claims, "iss").ok_or(Status::JwtPayloadParseErrorIssNotString)?;
        let sub = string(&claims, "sub").ok_or(Status::JwtPayloadParseErrorSubNotString)?;
        let time = |name, not_integer, out_of_range| match claims.get(name) {
            None => Ok(0),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(v) if (0.0..u64::MAX as f64).contains(&v) => Ok(v as u64),
                _ => Err(out_of_range),
            },
            Some(_) => Err(not_integer),
        };
        time(
            "iat",
            Status::JwtPayloadParseErrorIatNotInteger,
            Status::JwtPayloadParseErrorIatOutOfRange,
        )?;
        let nbf = time(
            "nbf",
            Status::JwtPayloadParseErrorNbfNotInteger,
            Status::JwtPayloadParseErrorNbfOutOfRange,
        )?;
        let exp = time(
            "exp",
            Status::JwtPayloadParseErrorExpNotInteger,
            Status::JwtPayloadParseErrorExpOutOfRange,
        )?;
        string(&claims, "jti").ok_or(Status::JwtPayloadParseErrorJtiNotString)?;
        let audiences = match claims.get("aud") {
            None => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(list)) => list
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or(Status::JwtPayloadParseErrorAudNotString)?,
            Some(_) => return Err(Status::JwtPayloadParseErrorAudNotString),
        };
        let signature =
            base64url_decode(signature).ok_or(Status::JwtSignatureParseErrorBadBase64)?;
        Ok(Jwt {
            alg,
            kid,
            iss,
            sub,
            nbf,
            exp,
            audiences,
            header: header_map,
            payload: claims,
            payload_base64url: payload.to_owned(),
            signed: format!("{header}.{payload}"),
            signature,
        })
    }

    /// Checks `nbf` and `exp` against `now` (Unix seconds), allowing `skew` seconds.
    pub fn check_time(&self, now: u64, skew: u64) -> Status {
        if now.saturating_add(skew) < self.nbf {
            Status::JwtNotYetValid
        } else if self.exp != 0 && now > self.exp.saturating_add(skew) {
            Status::JwtExpired
        } else {
            Status::Ok
        }
    }
}

/// `json` as a JSON object.
fn object(json: &[u8]) -> Option<Map<String, Value>> {
    match serde_json::from_slice(json).ok()? {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

/// The string claim `name` (empty when absent); `None` when it is not a string.
fn string(map: &Map<String, Value>, name: &str) -> Option<String> {
    match map.get(name) {
        None => Some(String::new()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn token(header: &str, payload: &str) -> String {
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!("{}.{}.c2ln", e.encode(header), e.encode(payload))
    }

    #[test]
    fn claims_are_read_with_their_types() {
        let jwt = Jwt::parse(&token(
            r#"{"alg":"RS256","kid":"k1"}"#,
            r#"{"iss":"i","sub":"s","exp":20,"nbf":10,"aud":["a","b"]}"#,
        ))
        .unwrap();
        assert_eq!((jwt.alg.as_str(), jwt.kid.as_str()), ("RS256", "k1"));
        assert_eq!((jwt.iss.as_str(), jwt.sub.as_str()), ("i", "s"));
        assert_eq!((jwt.nbf, jwt.exp), (10, 20));
        assert_eq!(jwt.audiences, ["a", "b"]);
        assert_eq!(jwt.signature, b"sig");
        assert_eq!(jwt.check_time(5, 0), Status::JwtNotYetValid);
        assert_eq!(jwt.check_time(5, 5), Status::Ok);
        assert_eq!(jwt.check_time(21, 0), Status::JwtExpired);
        assert_eq!(jwt.check_time(21, 1), Status::Ok);
    }

    #[test]
    fn malformed_tokens_have_envoys_statuses() {
        let ok = r#"{"alg":"RS256"}"#;
        for (t, status) in [
            ("a.b".to_owned(), Status::JwtBadFormat),
            (
                "!!.e30.e30".to_owned(),
                Status::JwtHeaderParseErrorBadBase64,
            ),
            (token("[]", "{}"), Status::JwtHeaderParseErrorBadJson),
            (token("{}", "{}"), Status::JwtHeaderBadAlg),
            (
                token(r#"{"alg":"none"}"#, "{}"),
                Status::JwtHeaderNotImplementedAlg,
            ),
            (
                token(r#"{"alg":"RS256","kid":1}"#, "{}"),
                Status::JwtHeaderBadKid,
            ),
            (
                token(ok, r#"{"iss":1}"#),
                Status::JwtPayloadParseErrorIssNotString,
            ),
            (
                token(ok, r#"{"exp":"x"}"#),
                Status::JwtPayloadParseErrorExpNotInteger,
            ),
            (
                token(ok, r#"{"exp":-1}"#),
                Status::JwtPayloadParseErrorExpOutOfRange,
            ),
            (
                token(ok, r#"{"aud":[1]}"#),
                Status::JwtPayloadParseErrorAudNotString,
            ),
        ] {
            assert_eq!(Jwt::parse(&t).unwrap_err(), status, "{t}");
        }
    }
}
