//! TLS client side for cases that reach a TLS filter chain. The proxies serve the test
//! certificate in `certs/`; the client accepts any certificate (the cases compare routing and
//! headers, not PKI), offers the case's SNI and ALPN.
// A test binary that includes this module may use only its client configuration.
#![allow(dead_code)]

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, ring};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Completes a TLS handshake on `stream`; `sni` of `None` sends no SNI (the server name is an IP),
/// an empty `alpn` offers no ALPN.
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    sni: Option<&str>,
    alpn: &[u8],
) -> Result<TlsStream<S>, String> {
    let config = accept_any(alpn)?;
    let name = match sni {
        Some(host) => ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?,
        None => ServerName::from(std::net::IpAddr::from([127, 0, 0, 1])),
    };
    TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .map_err(|e| format!("tls handshake: {e}"))
}

/// A client configuration accepting any server certificate and offering `alpn` (if any).
pub fn accept_any(alpn: &[u8]) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    if !alpn.is_empty() {
        config.alpn_protocols = vec![alpn.to_vec()];
    }
    Ok(config)
}

/// Accepts every server certificate but still checks handshake signatures (TLS 1.3 ones of
/// X.509 v1 certificates too).
#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms).or_else(|e| {
            // webpki reads no X.509 v1 certificate (certs/v1.pem): check the signature
            // against its key, found by revoy's own DER walk.
            let spki = revoy::config::tls::der::subject_public_key_info(cert).ok_or(e)?;
            rustls::crypto::verify_tls13_signature_with_raw_key(
                message,
                &spki.to_vec().into(),
                dss,
                algorithms,
            )
        })
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
