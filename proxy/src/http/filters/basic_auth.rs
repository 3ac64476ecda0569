//! `envoy.filters.http.basic_auth`: requests must carry `Basic` credentials of a configured
//! user (the route's users, else the filter's); others get 401 with `www-authenticate`. Under
//! `allow_missing` a request without `Basic` credentials (no header, an empty one, another
//! scheme) goes on uncounted; under `emit_dynamic_metadata` an authenticated user's name is
//! written to the request's dynamic metadata as `username` under the filter's name.

use std::sync::Arc;

use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use http::{HeaderValue, Response, StatusCode};

use super::FilterRequest;
use crate::body::Body;
use crate::config::http_filter::basic_auth::{BasicAuthConfig, Users};
use crate::http::local_reply::local_reply;
use crate::stats::{Counter, Store};

/// Base64 with or without padding, as Envoy's `decodeWithoutPadding` reads it.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The basic_auth filter of one connection manager.
#[derive(Debug)]
pub(super) struct BasicAuth {
    config: Arc<BasicAuthConfig>,
    /// `http.<prefix>.basic_auth.allowed`.
    allowed: Counter,
    /// `http.<prefix>.basic_auth.denied`.
    denied: Counter,
}

impl BasicAuth {
    /// The filter with `config`, its stats under `http.<stat_prefix>.basic_auth.`.
    pub(super) fn new(config: &Arc<BasicAuthConfig>, store: &Store, stat_prefix: &str) -> Self {
        BasicAuth {
            config: config.clone(),
            allowed: store.counter(&format!("http.{stat_prefix}.basic_auth.allowed")),
            denied: store.counter(&format!("http.{stat_prefix}.basic_auth.denied")),
        }
    }

    /// Lets `req` go on when its credentials are those of one of `route_users` (else the
    /// filter's users); answers 401 otherwise.
    pub(super) fn decode(
        &self,
        name: &str,
        req: &mut FilterRequest<'_>,
        route_users: Option<&Users>,
    ) -> Option<Response<Body>> {
        let users = route_users.unwrap_or(&self.config.users);
        let value = req.headers.get(&self.config.authentication_header);
        if self.config.allow_missing && value.is_none_or(|v| !v.as_bytes().starts_with(b"Basic ")) {
            return None;
        }
        let Some(value) = value else {
            return self.deny(
                req,
                "User authentication failed. Missing username and password.",
                "no_credential_for_basic_auth",
            );
        };
        let Some(token) = value.as_bytes().strip_prefix(b"Basic ") else {
            return self.deny(
                req,
                "User authentication failed. Expected 'Basic' authentication scheme.",
                "invalid_scheme_for_basic_auth",
            );
        };
        let decoded = BASE64.decode(token).unwrap_or_default();
        let Some(colon) = decoded.iter().position(|b| *b == b':') else {
            return self.deny(
                req,
                "User authentication failed. Invalid basic credential format.",
                "invalid_format_for_basic_auth",
            );
        };
        let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
        let user = std::str::from_utf8(user).ok();
        let known = user
            .and_then(|n| users.hash(n))
            .is_some_and(|hash| hash == sha1_base64(password));
        if !known {
            return self.deny(
                req,
                "User authentication failed. Invalid username/password combination.",
                "invalid_credential_for_basic_auth",
            );
        }
        let user = user.unwrap_or_default();
        if let Some(header) = &self.config.forward_username_header
            && let Ok(v) = HeaderValue::from_str(user)
        {
            req.headers.insert(header, v);
        }
        if self.config.emit_dynamic_metadata {
            req.metadata
                .insert(name, "username", crate::route::metadata::string_value(user));
        }
        self.allowed.inc();
        None
    }

    /// Counts and answers a denial: 401 with `message` and a `www-authenticate` realm naming
    /// the request's URI.
    fn deny(
        &self,
        req: &mut FilterRequest<'_>,
        message: &str,
        details: &str,
    ) -> Option<Response<Body>> {
        self.denied.inc();
        req.note_details(details);
        let realm = format!("Basic realm=\"{}\"", req.original_uri());
        let mut resp = local_reply(StatusCode::UNAUTHORIZED, message);
        if let Ok(v) = HeaderValue::from_str(&realm) {
            resp.headers_mut().insert(http::header::WWW_AUTHENTICATE, v);
        }
        Some(resp)
    }
}

/// The base64 SHA-1 digest of `password`, as htpasswd's `{SHA}` writes it.
fn sha1_base64(password: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, password);
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn htpasswd_sha_of_a_password() {
        // `htpasswd -nbs user1 test1`.
        assert_eq!(sha1_base64(b"test1"), "tESsBmE/yNY3lb6a0L6vVQEZNqw=");
    }
}
