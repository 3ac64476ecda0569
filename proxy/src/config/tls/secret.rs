//! A `Secret` (from SDS or `static_resources.secrets`) -> [`SecretValue`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use proto::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, secret::Type,
};

use super::certificate::{self, Certificate};
use super::validation::{self, Validation};
use crate::config::watched_file::parent;
use crate::config::{ConfigError, Context};

/// What a secret delivers.
#[derive(Debug, Clone)]
pub enum SecretValue {
    /// A `tls_certificate`.
    Certificate(Certificate),
    /// A `validation_context`: the proto (combined contexts merge their default under it) and
    /// its own compile.
    Validation {
        /// As delivered.
        proto: Arc<CertificateValidationContext>,
        /// Compiled alone.
        compiled: Arc<Validation>,
    },
}

/// Compiles a `Secret`; errors name fields relative to it.
pub fn compile(ctx: &Context<'_>, s: &Secret) -> Result<SecretValue, ConfigError> {
    match &s.r#type {
        Some(Type::TlsCertificate(c)) => Ok(SecretValue::Certificate(
            certificate::compile(ctx, c).map_err(|e| e.within("tls_certificate"))?,
        )),
        Some(Type::ValidationContext(v)) => Ok(SecretValue::Validation {
            compiled: Arc::new(
                validation::compile(ctx, v).map_err(|e| e.within("validation_context"))?,
            ),
            proto: Arc::new(v.clone()),
        }),
        Some(Type::SessionTicketKeys(_)) => Err(ConfigError::new(
            "session_ticket_keys",
            "session ticket key secrets are not implemented by revoy",
        )),
        Some(Type::GenericSecret(_)) => Err(ConfigError::new(
            "generic_secret",
            "generic secrets are not used by any filter revoy implements",
        )),
        None => Err(ConfigError::new(
            "type",
            "a secret needs one of tls_certificate, validation_context",
        )),
    }
}

/// An SDS secret as Envoy holds it: the files its certificate chain, private key and trusted
/// CA name read into `inline_bytes` (so `/certs` names them `<inline>`, and `/config_dump`
/// shows them inline). A file that cannot be read stays named; compiling the secret then
/// says why.
pub fn inline_files(ctx: &Context<'_>, s: &mut Secret) {
    let inline = |source: Option<&mut DataSource>| {
        if let Some(source) = source
            && let Some(Specifier::Filename(path)) = &source.specifier
            && let Ok(bytes) = ctx.io().read_file(path)
        {
            source.specifier = Some(Specifier::InlineBytes(bytes));
        }
    };
    match &mut s.r#type {
        Some(Type::TlsCertificate(c)) => {
            inline(c.certificate_chain.as_mut());
            inline(c.private_key.as_mut());
        }
        Some(Type::ValidationContext(v)) => inline(v.trusted_ca.as_mut()),
        _ => {}
    }
}

/// The directories whose changes make an SDS secret's files be read again, as Envoy watches
/// them: the `watched_directory` of its `tls_certificate` or `validation_context`, else the
/// directories of the files it names (certificate chain and private key; trusted CA). Empty
/// when it names no file.
pub fn watched_directories(s: &Secret) -> Vec<PathBuf> {
    let file = |source: Option<&DataSource>| match source.and_then(|s| s.specifier.as_ref()) {
        Some(Specifier::Filename(path)) => Some(parent(Path::new(path))),
        _ => None,
    };
    let (watched, files) = match &s.r#type {
        Some(Type::TlsCertificate(c)) => (
            c.watched_directory.as_ref(),
            vec![
                file(c.certificate_chain.as_ref()),
                file(c.private_key.as_ref()),
            ],
        ),
        Some(Type::ValidationContext(v)) => (
            v.watched_directory.as_ref(),
            vec![file(v.trusted_ca.as_ref())],
        ),
        _ => (None, Vec::new()),
    };
    let mut dirs: Vec<PathBuf> = files.into_iter().flatten().collect();
    if let Some(watched) = watched
        && !dirs.is_empty()
    {
        dirs = vec![PathBuf::from(&watched.path)];
    }
    dirs.sort();
    dirs.dedup();
    dirs
}

#[cfg(test)]
mod tests {
    use proto::pb::envoy::config::core::v3::WatchedDirectory;
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::TlsCertificate;

    use super::*;

    fn file(path: &str) -> Option<DataSource> {
        Some(DataSource {
            specifier: Some(Specifier::Filename(path.into())),
            ..Default::default()
        })
    }

    fn certificate(watched: Option<&str>, chain: Option<DataSource>) -> Secret {
        Secret {
            name: "default".into(),
            r#type: Some(Type::TlsCertificate(TlsCertificate {
                certificate_chain: chain,
                private_key: file("/etc/certs/key.pem"),
                watched_directory: watched.map(|p| WatchedDirectory {
                    path: p.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn a_secrets_files_are_watched_through_their_directories_or_its_watched_directory() {
        let own = certificate(None, file("/var/chains/chain.pem"));
        assert_eq!(
            watched_directories(&own),
            [PathBuf::from("/etc/certs"), PathBuf::from("/var/chains")]
        );
        let watched = certificate(Some("/var/mount"), file("/var/chains/chain.pem"));
        assert_eq!(watched_directories(&watched), [PathBuf::from("/var/mount")]);
        let validation = Secret {
            name: "ROOTCA".into(),
            r#type: Some(Type::ValidationContext(CertificateValidationContext {
                trusted_ca: file("root.pem"),
                ..Default::default()
            })),
        };
        assert_eq!(watched_directories(&validation), [PathBuf::from(".")]);
    }

    #[test]
    fn a_secret_naming_no_file_is_not_watched() {
        let mut inline = certificate(Some("/var/mount"), None);
        if let Some(Type::TlsCertificate(c)) = &mut inline.r#type {
            c.private_key = None;
        }
        assert!(watched_directories(&inline).is_empty());
    }
}
