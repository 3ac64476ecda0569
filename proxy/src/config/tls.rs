//! TLS contexts -> what revoy presents and checks, compiled without touching a socket:
//! `DownstreamTlsContext` ([`downstream`]), `UpstreamTlsContext` ([`upstream`]) and SDS
//! `Secret`s ([`secret`]). Certificates and validation contexts named by SDS stay names here
//! ([`sds::SecretRef`]); `crate::tls` binds them to the secrets as they arrive. Errors are
//! [`ConfigError`](super::ConfigError)s with the field path inside the context.

pub mod certificate;
pub mod common;
pub mod der;
pub mod downstream;
pub mod provider;
pub mod sds;
pub mod secret;
pub mod source;
pub mod unacted;
pub mod upstream;
pub mod validation;

#[cfg(test)]
mod tests {
    use super::downstream::{ServerTls, compile};
    use crate::config::{ConfigError, ConfigIo, Context, FakeIo};
    use proto::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, TlsCertificate,
        common_tls_context::ValidationContextType,
    };

    const CHAIN: &str = "common_tls_context.tls_certificates[0].certificate_chain";
    const KEY: &str = "common_tls_context.tls_certificates[0].private_key";

    /// The test certificates, as files of a fake file system under `/certs`.
    fn certs() -> FakeIo {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/differential/certs");
        ["server.pem", "server.key", "v1.pem", "v1.key"]
            .into_iter()
            .fold(FakeIo::new(), |io, name| {
                let bytes = std::fs::read(format!("{dir}/{name}")).unwrap();
                io.with_file(&format!("/certs/{name}"), bytes)
            })
    }

    fn file(name: &str) -> DataSource {
        DataSource {
            specifier: Some(Specifier::Filename(format!("/certs/{name}"))),
            ..Default::default()
        }
    }

    fn context(cert: DataSource, key: DataSource) -> DownstreamTlsContext {
        DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificates: vec![TlsCertificate {
                    certificate_chain: Some(cert),
                    private_key: Some(key),
                    ..Default::default()
                }],
                alpn_protocols: vec!["h2".into()],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn build(io: &FakeIo, tls: &DownstreamTlsContext) -> Result<ServerTls, ConfigError> {
        compile(&Context::new(io), tls)
    }

    #[test]
    fn loads_certificates_and_names_bad_sources() {
        let io = certs();
        let config = build(&io, &context(file("server.pem"), file("server.key"))).unwrap();
        assert_eq!(config.common.alpn, [b"h2".to_vec()]);
        let e = build(&io, &context(file("missing.pem"), file("server.key"))).unwrap_err();
        assert_eq!(e.path, CHAIN);
        assert!(e.message.contains("/certs/missing.pem"), "{e}");
        let e = build(&io, &context(file("server.pem"), file("server.pem"))).unwrap_err();
        assert_eq!(e.path, KEY);
        let env = DataSource {
            specifier: Some(Specifier::EnvironmentVariable("CERT".into())),
            ..Default::default()
        };
        let e = build(&io, &context(env.clone(), file("server.key"))).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{CHAIN}: environment variable CERT is not set")
        );
        let pem = String::from_utf8(io.read_file("/certs/server.pem").unwrap()).unwrap();
        let io = io.with_env("CERT", &pem);
        assert!(build(&io, &context(env, file("server.key"))).is_ok());
    }

    /// Fields that would change what a handshake presents, checks or allows, which revoy
    /// lacks, are refused by their path rather than ignored.
    #[test]
    fn tls_fields_revoy_lacks_are_refused_by_path() {
        use proto::pb::envoy::config::core::v3::TypedExtensionConfig;
        use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
            TlsParameters, UpstreamTlsContext,
        };
        let io = certs();
        let mut tls = context(file("server.pem"), file("server.key"));
        let common = tls.common_tls_context.as_mut().unwrap();
        common.custom_tls_certificate_selector = Some(TypedExtensionConfig::default());
        let e = build(&io, &tls).unwrap_err();
        assert_eq!(e.path, "common_tls_context.custom_tls_certificate_selector");

        let mut tls = context(file("server.pem"), file("server.key"));
        tls.common_tls_context.as_mut().unwrap().tls_params = Some(TlsParameters {
            compliance_policies: vec![0],
            ..Default::default()
        });
        let e = build(&io, &tls).unwrap_err();
        assert_eq!(e.path, "common_tls_context.tls_params.compliance_policies");

        let mut tls = context(file("server.pem"), file("server.key"));
        tls.common_tls_context
            .as_mut()
            .unwrap()
            .validation_context_type = Some(ValidationContextType::ValidationContext(
            CertificateValidationContext {
                trusted_ca: Some(file("server.pem")),
                require_signed_certificate_timestamp: Some(
                    proto::pb::google::protobuf::BoolValue { value: true },
                ),
                ..Default::default()
            },
        ));
        let e = build(&io, &tls).unwrap_err();
        assert_eq!(
            e.path,
            "common_tls_context.validation_context.require_signed_certificate_timestamp"
        );

        for (field, upstream) in [
            (
                "auto_host_sni",
                UpstreamTlsContext {
                    auto_host_sni: true,
                    ..Default::default()
                },
            ),
            (
                "auto_sni_san_validation",
                UpstreamTlsContext {
                    auto_sni_san_validation: true,
                    ..Default::default()
                },
            ),
        ] {
            let e = super::upstream::compile(&Context::new(&io), &upstream).unwrap_err();
            assert_eq!(e.path, field);
        }
    }

    #[test]
    fn serves_x509_v1_certificates_and_checks_their_key() {
        let io = certs();
        assert!(build(&io, &context(file("v1.pem"), file("v1.key"))).is_ok());
        for (cert, key) in [("v1.pem", "server.key"), ("server.pem", "v1.key")] {
            let e = build(&io, &context(file(cert), file(key))).unwrap_err();
            assert_eq!(e.path, KEY, "{cert} {key}");
            assert!(e.message.contains("does not match"), "{e}");
        }
    }

    #[test]
    fn a_bad_trusted_ca_is_named_by_its_field() {
        let mut tls = context(file("server.pem"), file("server.key"));
        let common = tls.common_tls_context.as_mut().unwrap();
        common.validation_context_type = Some(ValidationContextType::ValidationContext(
            CertificateValidationContext {
                trusted_ca: Some(file("server.key")),
                ..Default::default()
            },
        ));
        let e = build(&certs(), &tls).unwrap_err();
        assert_eq!(e.path, "common_tls_context.validation_context.trusted_ca");
        assert!(e.message.contains("no certificate found"), "{e}");
    }

    #[test]
    fn a_context_without_certificates_is_an_error() {
        let e = build(&certs(), &DownstreamTlsContext::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "common_tls_context.tls_certificates: no certificate configured"
        );
    }
}
