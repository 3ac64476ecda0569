//! Smaller parsers on the request path, the first byte choosing: `grpc-timeout`, the path
//! rules (under connection manager options from the second byte), a JWT, a JWKS document and
//! a JWT (after the first newline) verified with it.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use revoy::config::hcm::HcmConfig;
use revoy::jwt::{jwks::Jwks, token::Jwt};

static CONFIGS: LazyLock<Vec<HcmConfig>> =
    LazyLock::new(|| (0..32).map(revoy::fuzzing::hcm).collect());

fuzz_target!(|data: &[u8]| {
    let [which, options, rest @ ..] = data else {
        return;
    };
    match which % 4 {
        0 => drop(revoy::fuzzing::grpc_timeout(rest)),
        1 => {
            if let Ok(path) = std::str::from_utf8(rest) {
                let cfg = &CONFIGS[usize::from(options % 32)];
                revoy::fuzzing::normalize_path(cfg, path);
            }
        }
        2 => {
            if let Ok(token) = std::str::from_utf8(rest) {
                drop(Jwt::parse(token));
            }
        }
        _ => {
            let mut parts = rest.splitn(2, |b| *b == b'\n');
            let (keys, token) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            if let Ok(jwks) = Jwks::parse(keys)
                && let Ok(token) = Jwt::parse(std::str::from_utf8(token).unwrap_or(""))
            {
                jwks.verify(&token);
            }
        }
    }
});
