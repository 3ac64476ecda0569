//! `envoy.filters.http.basic_auth` (`BasicAuth`, `BasicAuthPerRoute`) -> [`BasicAuthConfig`],
//! [`Users`]: htpasswd users with `{SHA}` hashes only, as Envoy reads them.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderName;
use proto::pb::envoy::config::core::v3::DataSource;
use proto::pb::envoy::extensions::filters::http::basic_auth::v3 as pb;

use crate::config::tls::source::data;
use crate::config::{ConfigError, Context};

/// A compiled `BasicAuth`.
#[derive(Debug, Clone)]
pub struct BasicAuthConfig {
    /// `users`.
    pub users: Arc<Users>,
    /// `forward_username_header`: set to the authenticated user's name.
    pub forward_username_header: Option<HeaderName>,
    /// `authentication_header`: where the credentials are read (`authorization` unless set).
    pub authentication_header: HeaderName,
    /// `allow_missing`: a request without `Basic` credentials goes on unauthenticated.
    pub allow_missing: bool,
    /// `emit_dynamic_metadata`: the authenticated user's name is written to the request's
    /// dynamic metadata as `username`, under the filter's name.
    pub emit_dynamic_metadata: bool,
}

/// htpasswd users: each name's base64 SHA-1 password hash.
#[derive(Debug, Clone, Default)]
pub struct Users(HashMap<String, String>);

impl Users {
    /// The base64 SHA-1 hash of `name`'s password, if there is such a user.
    pub fn hash(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// Compiles a `BasicAuth`.
pub fn compile(ctx: &Context<'_>, c: &pb::BasicAuth) -> Result<BasicAuthConfig, ConfigError> {
    let header = |field: &str, name: &str| {
        HeaderName::try_from(name.to_ascii_lowercase())
            .map_err(|_| ConfigError::new(field, format!("invalid header name '{name}'")))
    };
    Ok(BasicAuthConfig {
        users: Arc::new(users(ctx, c.users.as_ref())?),
        forward_username_header: match c.forward_username_header.as_str() {
            "" => None,
            name => Some(header("forward_username_header", name)?),
        },
        authentication_header: match c.authentication_header.as_str() {
            "" => http::header::AUTHORIZATION,
            name => header("authentication_header", name)?,
        },
        allow_missing: c.allow_missing,
        emit_dynamic_metadata: c.emit_dynamic_metadata,
    })
}

/// Compiles a `BasicAuthPerRoute`: the users replacing the filter's.
pub fn compile_per_route(
    ctx: &Context<'_>,
    r: &pb::BasicAuthPerRoute,
) -> Result<Users, ConfigError> {
    users(ctx, r.users.as_ref())
}

/// Reads the htpasswd file `users` names, as Envoy's `readHtpasswd`.
fn users(ctx: &Context<'_>, source: Option<&DataSource>) -> Result<Users, ConfigError> {
    let text = data(ctx, source, "users")?;
    let text = String::from_utf8_lossy(&text);
    let mut users = HashMap::new();
    for line in text.split('\n') {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |m: String| ConfigError::new("users", m);
        let (name, hash) = line.split_once(':').ok_or_else(|| {
            err("basic auth: invalid htpasswd format, username:password is expected".into())
        })?;
        if name.is_empty() || hash.is_empty() {
            return Err(err("basic auth: empty user name or password".into()));
        }
        if users.contains_key(name) {
            return Err(err(format!("basic auth: duplicate user '{name}'")));
        }
        let hash = hash.strip_prefix("{SHA}").ok_or_else(|| {
            err(format!(
                "basic auth: unsupported htpasswd format: please use {{SHA}} for '{name}'"
            ))
        })?;
        if hash.len() != 28 {
            return Err(err(format!(
                "basic auth: invalid SHA hash length for '{name}'"
            )));
        }
        users.insert(name.to_owned(), hash.to_owned());
    }
    Ok(Users(users))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::core::v3::data_source::Specifier;

    fn read(text: &str) -> Result<Users, ConfigError> {
        let io = crate::config::context::FakeIo::new();
        let ctx = Context::new(&io);
        let source = DataSource {
            specifier: Some(Specifier::InlineString(text.into())),
            ..Default::default()
        };
        users(&ctx, Some(&source))
    }

    #[test]
    fn htpasswd_users_with_sha_hashes() {
        let users = read("# users\n\nuser1:{SHA}tESsBmE/yNY3lb6a0L6vVQEZNqw=\n").unwrap();
        assert_eq!(users.hash("user1"), Some("tESsBmE/yNY3lb6a0L6vVQEZNqw="));
        assert_eq!(users.hash("user2"), None);
    }

    #[test]
    fn other_formats_and_duplicates_are_errors() {
        for (text, message) in [
            ("user1", "username:password is expected"),
            ("user1:$apr1$abc", "please use {SHA} for 'user1'"),
            ("user1:{SHA}short", "invalid SHA hash length"),
            (":{SHA}tESsBmE/yNY3lb6a0L6vVQEZNqw=", "empty user name"),
            (
                "a:{SHA}tESsBmE/yNY3lb6a0L6vVQEZNqw=\na:{SHA}tESsBmE/yNY3lb6a0L6vVQEZNqw=",
                "duplicate user 'a'",
            ),
        ] {
            let e = read(text).unwrap_err();
            assert!(e.to_string().contains(message), "{text}: {e}");
        }
    }
}
