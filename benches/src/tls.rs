//! The TLS scenarios' certificates, made at run time (nothing is committed): a CA, the
//! certificate every proxy serves to the bench's clients and the one the upstream's TLS
//! listener serves to the proxies, all ECDSA P-256; and the rustls configurations of the
//! bench's own TLS client (TLS 1.3, never resuming a session) and of the upstream.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::client::Resumption;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// The name the proxies' certificate carries and the bench's client sends as SNI.
pub const PROXY_NAME: &str = "bench.local";
/// The name the upstream's certificate carries: the SNI the proxies send upstream and the
/// subject alternative name they check.
pub const UPSTREAM_NAME: &str = "upstream.bench.local";

/// A certificate and its private key, PEM.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The certificate (PEM).
    pub cert: String,
    /// Its PKCS#8 private key (PEM).
    pub key: String,
}

/// The bench's certificates: one CA, which signed both identities.
#[derive(Clone, Debug)]
pub struct Pki {
    /// The CA's certificate (PEM): what the proxies trust upstream and the client trusts.
    pub ca: String,
    /// What every proxy serves (SANs `bench.local` and 127.0.0.1).
    pub proxy: Identity,
    /// What the upstream's TLS listener serves (SAN `upstream.bench.local`).
    pub upstream: Identity,
}

/// Where [`Pki::write`] put the files the proxies' configs name.
#[derive(Clone, Debug)]
pub struct PkiFiles {
    /// The CA certificate.
    pub ca: PathBuf,
    /// The proxy's certificate.
    pub proxy_cert: PathBuf,
    /// The proxy's private key.
    pub proxy_key: PathBuf,
    /// The proxy's certificate followed by its key (haproxy's `crt`).
    pub proxy_pem: PathBuf,
}

fn leaf(names: Vec<String>, issuer: &Issuer<'_, KeyPair>) -> Result<Identity, rcgen::Error> {
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "revoy load bench");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok(Identity {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

impl Pki {
    /// Fresh keys and certificates (ECDSA P-256, SHA-256 signatures).
    pub fn generate() -> Result<Pki, rcgen::Error> {
        let mut params = CertificateParams::new(Vec::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "revoy load bench CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate()?;
        let ca = params.self_signed(&key)?.pem();
        let issuer = Issuer::new(params, key);
        Ok(Pki {
            ca,
            proxy: leaf(vec![PROXY_NAME.into(), "127.0.0.1".into()], &issuer)?,
            upstream: leaf(vec![UPSTREAM_NAME.into()], &issuer)?,
        })
    }

    /// Writes the CA certificate and the proxy's identity under `dir`.
    pub fn write(&self, dir: &Path) -> io::Result<PkiFiles> {
        let files = PkiFiles {
            ca: dir.join("ca.crt"),
            proxy_cert: dir.join("proxy.crt"),
            proxy_key: dir.join("proxy.key"),
            proxy_pem: dir.join("proxy.pem"),
        };
        fs::write(&files.ca, &self.ca)?;
        fs::write(&files.proxy_cert, &self.proxy.cert)?;
        fs::write(&files.proxy_key, &self.proxy.key)?;
        fs::write(
            &files.proxy_pem,
            format!("{}{}", self.proxy.cert, self.proxy.key),
        )?;
        Ok(files)
    }

    /// The upstream's server configuration: its identity, TLS 1.3, HTTP/1.1.
    pub fn upstream_server(&self) -> Result<Arc<ServerConfig>, String> {
        let certs = CertificateDer::pem_slice_iter(self.upstream.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let key = PrivateKeyDer::from_pem_slice(self.upstream.key.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| e.to_string())?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The bench's TLS client for a server named `name`: rustls's defaults (ring) restricted to TLS 1.3, trusting only
    /// the bench's CA, with session resumption disabled, so that every connection makes a full
    /// handshake (it offers no ticket or session id to resume, and keeps none it is sent).
    pub fn client(&self, name: &str) -> Result<TlsClient, String> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca.as_bytes()) {
            roots
                .add(cert.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        }
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.resumption = Resumption::disabled();
        Ok(TlsClient {
            config: Arc::new(config),
            name: ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?,
        })
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What the bench's client connects with: its configuration and the server name it sends
/// (SNI) and checks.
#[derive(Clone, Debug)]
pub struct TlsClient {
    /// The rustls client configuration.
    pub config: Arc<ClientConfig>,
    /// The name it sends and expects: [`PROXY_NAME`], or [`UPSTREAM_NAME`] when it talks to
    /// the upstream directly.
    pub name: ServerName<'static>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::UnixTime;

    fn verify(pki: &Pki, cert_pem: &str, name: &str) -> Result<(), rustls::Error> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pki.ca.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        verifier
            .verify_server_cert(&cert, &[], &name, &[], UnixTime::now())
            .map(drop)
    }

    #[test]
    fn both_identities_chain_to_the_ca_under_their_names_only() {
        let pki = Pki::generate().unwrap();
        assert!(pki.proxy.key.starts_with("-----BEGIN PRIVATE KEY-----"));
        verify(&pki, &pki.proxy.cert, PROXY_NAME).unwrap();
        verify(&pki, &pki.upstream.cert, UPSTREAM_NAME).unwrap();
        assert!(verify(&pki, &pki.upstream.cert, PROXY_NAME).is_err());
        assert!(pki.upstream_server().is_ok());
        assert!(pki.client(UPSTREAM_NAME).is_ok());
    }
}
