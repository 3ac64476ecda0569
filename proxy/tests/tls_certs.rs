//! The test certificate kit (`support/certs.rs`) makes what it claims: each certificate is read
//! back with revoy's `tls::x509::parse` (SANs, subject, validity window) and x509-parser (key
//! type, extensions), and verified with rustls' webpki verifiers: the valid ones against their
//! CA's root, the bad ones failing with the error rustls gives for their fault.

#[path = "support/certs.rs"]
mod certs;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use certs::{CA_VALIDITY, Ca, CertDir, Issued, SERVER_VALIDITY, WORKLOAD_VALIDITY};
use revoy::tls::x509::{self, SubjectAltName};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, Error, RootCertStore};
use x509_parser::prelude::{FromDer, X509Certificate};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca: &Ca) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.root_pem().as_bytes()).unwrap())
        .unwrap();
    Arc::new(roots)
}

/// The certificates of a PEM chain: the end entity, then the intermediates.
fn chain(issued: &Issued) -> (CertificateDer<'static>, Vec<CertificateDer<'static>>) {
    let mut certs: Vec<_> = CertificateDer::pem_slice_iter(issued.chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let leaf = certs.remove(0);
    (leaf, certs)
}

/// Verifies `issued` (with its chain) as a server certificate for `name`, trusting `ca`'s root.
fn verify_server(ca: &Ca, issued: &Issued, name: &str) -> Result<(), Error> {
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(ca), provider())
        .build()
        .unwrap();
    let (leaf, intermediates) = chain(issued);
    let name = ServerName::try_from(name.to_owned()).unwrap();
    verifier
        .verify_server_cert(&leaf, &intermediates, &name, &[], UnixTime::now())
        .map(|_| ())
}

/// Verifies `issued` (with its chain) as a client certificate, trusting `ca`'s root.
fn verify_client(ca: &Ca, issued: &Issued) -> Result<(), Error> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca), provider())
        .build()
        .unwrap();
    let (leaf, intermediates) = chain(issued);
    verifier
        .verify_client_cert(&leaf, &intermediates, UnixTime::now())
        .map(|_| ())
}

fn info(issued: &Issued) -> x509::CertInfo {
    x509::parse(&issued.cert_der).unwrap()
}

/// Asserts the window is `length` long and started `backdated` before now (give or take the
/// seconds the test has been running).
fn valid_now_for(info: &x509::CertInfo, length: Duration, backdated: Duration) {
    let now = SystemTime::now();
    assert_eq!(
        info.not_after.duration_since(info.not_before).unwrap(),
        length
    );
    let age = now.duration_since(info.not_before).unwrap();
    assert!(
        age >= backdated - Duration::from_secs(1) && age <= backdated + Duration::from_secs(30),
        "started {age:?} ago: {info:?}"
    );
}

/// The signature algorithm's OID of `der`, and its public key's algorithm OID, curve OID (EC)
/// and size in bits.
fn key_facts(der: &[u8]) -> (String, String, Option<String>, usize) {
    let (_, cert) = X509Certificate::from_der(der).unwrap();
    let spki = cert.public_key();
    let algorithm = spki.algorithm.algorithm.to_id_string();
    let curve = (algorithm == EC_PUBLIC_KEY).then(|| {
        let parameters = spki.algorithm.parameters.as_ref().unwrap();
        parameters.as_oid().unwrap().to_id_string()
    });
    (
        cert.signature_algorithm.algorithm.to_id_string(),
        algorithm,
        curve,
        spki.parsed().unwrap().key_size(),
    )
}

/// How far back the kit dates leaf certificates, and CA certificates.
const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3_600);

const ECDSA_WITH_SHA256: &str = "1.2.840.10045.4.3.2";
const EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const RSA_ENCRYPTION: &str = "1.2.840.113549.1.1.1";
const P256: &str = "1.2.840.10045.3.1.7";
const P384: &str = "1.3.132.0.34";

#[test]
fn workload_certificates_are_istio_shaped() {
    let ca = Ca::new("cluster.local");
    let sleep = ca.workload("default", "sleep").issue();
    let sleep_info = info(&sleep);
    assert_eq!(
        sleep_info.sans,
        [SubjectAltName::Uri(
            "spiffe://cluster.local/ns/default/sa/sleep".into()
        )]
    );
    assert_eq!(sleep_info.subject, "", "no subject, as Istio's");
    assert_eq!(sleep_info.issuer, "O=cluster.local");
    valid_now_for(&sleep_info, WORKLOAD_VALIDITY, MINUTE);
    assert_eq!(WORKLOAD_VALIDITY, Duration::from_secs(24 * 3_600));

    let (_, cert) = X509Certificate::from_der(&sleep.cert_der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    assert!(san.critical, "the SAN of an empty subject is critical");
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth, "{eku:?}");
    assert!(!cert.is_ca());
    assert_eq!(
        key_facts(&sleep.cert_der),
        (
            ECDSA_WITH_SHA256.into(),
            EC_PUBLIC_KEY.into(),
            Some(P256.into()),
            256
        )
    );

    // Workloads are clients and servers of each other; the URI names who they are, so a
    // workload certificate for another service account is the "wrong SAN" case.
    verify_client(&ca, &sleep).unwrap();
    let other = info(&ca.workload("default", "httpbin").issue());
    assert_eq!(
        other.uri_sans().collect::<Vec<_>>(),
        ["spiffe://cluster.local/ns/default/sa/httpbin"]
    );
    let foreign = Ca::new("other.domain").workload("default", "sleep").issue();
    assert_eq!(
        info(&foreign).uri_sans().collect::<Vec<_>>(),
        ["spiffe://other.domain/ns/default/sa/sleep"]
    );
}

#[test]
fn server_certificates_name_their_hosts() {
    let ca = Ca::new("cluster.local");
    let server = ca.server(&["a.test", "b.test"]).issue();
    let server_info = info(&server);
    assert_eq!(
        server_info.sans,
        [
            SubjectAltName::Dns("a.test".into()),
            SubjectAltName::Dns("b.test".into())
        ]
    );
    assert_eq!(server_info.subject, "CN=a.test");
    valid_now_for(&server_info, SERVER_VALIDITY, MINUTE);
    verify_server(&ca, &server, "a.test").unwrap();
    verify_server(&ca, &server, "b.test").unwrap();
    // A name the certificate does not carry: the wrong-SAN case for SNI.
    let e = verify_server(&ca, &server, "c.test").unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
            )
        ),
        "{e:?}"
    );
}

#[test]
fn certificates_from_an_intermediate_verify_with_their_chain() {
    let root = Ca::new("cluster.local");
    let ca = root.intermediate();
    assert_eq!(ca.root_pem(), root.root_pem());
    let ca_info = x509::parse(
        CertificateDer::from_pem_slice(ca.cert_pem().as_bytes())
            .unwrap()
            .as_ref(),
    )
    .unwrap();
    assert_eq!(ca_info.subject, "CN=Intermediate CA,O=cluster.local");
    assert_eq!(ca_info.issuer, "O=cluster.local");
    let root_info = x509::parse(
        CertificateDer::from_pem_slice(root.cert_pem().as_bytes())
            .unwrap()
            .as_ref(),
    )
    .unwrap();
    valid_now_for(&root_info, CA_VALIDITY, HOUR);

    let workload = ca.workload("prod", "api").issue();
    assert_eq!(info(&workload).issuer, "CN=Intermediate CA,O=cluster.local");
    let (_, intermediates) = chain(&workload);
    assert_eq!(intermediates.len(), 1, "the chain holds the intermediate");
    verify_client(&ca, &workload).unwrap();
    let server = ca.server(&["api.prod.svc"]).issue();
    verify_server(&ca, &server, "api.prod.svc").unwrap();

    // Two levels down, the chain carries both intermediates.
    let deeper = ca.intermediate().workload("prod", "api").issue();
    assert_eq!(chain(&deeper).1.len(), 2);
    verify_client(&root, &deeper).unwrap();

    // Without the intermediate the root cannot be reached.
    let leaf_alone = Issued {
        chain_pem: workload.cert_pem.clone(),
        cert_pem: workload.cert_pem.clone(),
        cert_der: workload.cert_der.clone(),
        key_pem: workload.key_pem.clone(),
        serial: workload.serial.clone(),
    };
    let e = verify_client(&root, &leaf_alone).unwrap_err();
    assert_eq!(
        e,
        Error::InvalidCertificate(CertificateError::UnknownIssuer)
    );
}

#[test]
fn bad_certificates_fail_as_rustls_says() {
    let ca = Ca::new("cluster.local");

    let expired = ca.workload("default", "sleep").expired().issue();
    let window = info(&expired);
    assert!(window.not_after < SystemTime::now() - Duration::from_secs(86_000));
    assert_eq!(
        window.not_after.duration_since(window.not_before).unwrap(),
        WORKLOAD_VALIDITY
    );
    assert_eq!(window.days_until_expiration(SystemTime::now()), 0);
    let e = verify_client(&ca, &expired).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. }
            )
        ),
        "{e:?}"
    );
    let expired_server = ca.server(&["a.test"]).expired().issue();
    let e = verify_server(&ca, &expired_server, "a.test").unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. }
            )
        ),
        "{e:?}"
    );

    let early = ca.server(&["a.test"]).not_yet_valid().issue();
    let window = info(&early);
    assert!(window.not_before > SystemTime::now() + Duration::from_secs(86_000));
    let e = verify_server(&ca, &early, "a.test").unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidCertificate(
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. }
            )
        ),
        "{e:?}"
    );

    // Signed by another CA. One of the same trust domain has the same subject (`O=cluster.local`,
    // as two Istio meshes' self-signed roots do): webpki takes it for the issuer by name, and
    // the signature does not check out.
    let twin = Ca::new("cluster.local");
    let server = twin.server(&["a.test"]).issue();
    let workload = twin.workload("default", "sleep").issue();
    assert_eq!(
        info(&workload).issuer,
        info(&ca.workload("a", "b").issue()).issuer
    );
    for e in [
        verify_server(&ca, &server, "a.test").unwrap_err(),
        verify_client(&ca, &workload).unwrap_err(),
    ] {
        assert_eq!(e, Error::InvalidCertificate(CertificateError::BadSignature));
    }
    // One of another trust domain names another issuer: unknown issuer.
    let other = Ca::new("other.domain");
    let server = other.server(&["a.test"]).issue();
    let workload = other.workload("default", "sleep").issue();
    for e in [
        verify_server(&ca, &server, "a.test").unwrap_err(),
        verify_client(&ca, &workload).unwrap_err(),
    ] {
        assert_eq!(
            e,
            Error::InvalidCertificate(CertificateError::UnknownIssuer)
        );
    }
}

#[test]
fn rsa_and_p384_variants_have_their_keys_and_verify() {
    let ca = Ca::new("cluster.local");
    let rsa = ca.server(&["rsa.test"]).rsa2048().issue();
    assert_eq!(
        key_facts(&rsa.cert_der),
        (ECDSA_WITH_SHA256.into(), RSA_ENCRYPTION.into(), None, 2048)
    );
    verify_server(&ca, &rsa, "rsa.test").unwrap();

    let p384 = ca.workload("default", "sleep").p384().issue();
    assert_eq!(
        key_facts(&p384.cert_der),
        (
            ECDSA_WITH_SHA256.into(),
            EC_PUBLIC_KEY.into(),
            Some(P384.into()),
            384
        )
    );
    verify_client(&ca, &p384).unwrap();
}

/// Each key is the one its certificate certifies: rustls checks that when it builds a server
/// configuration from the pair.
#[test]
fn keys_match_their_certificates() {
    let ca = Ca::new("cluster.local");
    for issued in [
        ca.server(&["a.test"]).issue(),
        ca.server(&["a.test"]).rsa2048().issue(),
        ca.server(&["a.test"]).p384().issue(),
        ca.intermediate().workload("default", "sleep").issue(),
    ] {
        let chain: Vec<_> = CertificateDer::pem_slice_iter(issued.chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
    }
    let a = ca.server(&["a.test"]).issue();
    let b = ca.server(&["a.test"]).issue();
    let mismatched = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(a.cert_der.clone())],
            PrivateKeyDer::from_pem_slice(b.key_pem.as_bytes()).unwrap(),
        );
    assert!(
        mismatched.is_err(),
        "a key of another certificate is refused"
    );
}

#[test]
fn files_hold_the_chain_the_key_and_the_root() {
    let root = Ca::new("cluster.local");
    let ca = root.intermediate();
    let issued = ca.server(&["a.test"]).issue();
    let dir = CertDir::new();
    let files = issued.write_to(dir.path(), "server");
    let trusted = ca.write_root_to(dir.path(), "root");
    assert_eq!(files.chain, dir.path().join("server.pem"));
    assert_eq!(files.key, dir.path().join("server.key"));
    assert_eq!(trusted, dir.path().join("root.pem"));
    assert_eq!(
        std::fs::read_to_string(&files.chain).unwrap(),
        issued.chain_pem
    );
    assert_eq!(
        issued.chain_pem,
        format!("{}{}", issued.cert_pem, ca.cert_pem())
    );
    assert_eq!(std::fs::read_to_string(&files.key).unwrap(), issued.key_pem);
    assert_eq!(std::fs::read_to_string(&trusted).unwrap(), root.root_pem());
    let path = dir.path().to_owned();
    drop(dir);
    assert!(!path.exists(), "the directory goes with its CertDir");
}
