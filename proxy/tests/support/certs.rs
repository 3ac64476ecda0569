//! Test certificates made at run time (rcgen on ring) for TLS tests: a mesh CA (a root, and
//! intermediates under it) that issues Istio-like SPIFFE workload certificates and server
//! certificates, and the bad variants TLS tests need (expired, not yet valid, other key types;
//! a wrong SAN is a certificate issued for another name, and "signed by another CA" one issued
//! by a second `Ca`: of the same trust domain, hence the same subject, webpki reports a bad
//! signature; of another, an unknown issuer).
//!
//! ```ignore
//! let ca = Ca::new("cluster.local");
//! let sleep = ca.workload("default", "sleep").issue(); // spiffe://cluster.local/ns/default/sa/sleep
//! let server = ca.server(&["a.test", "b.test"]).rsa2048().issue();
//! let stale = ca.workload("default", "sleep").expired().issue();
//! let dir = CertDir::new();
//! let files = server.write_to(dir.path(), "server"); // server.pem (the chain), server.key
//! let trusted_ca = ca.write_root_to(dir.path(), "root"); // root.pem
//! ```
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_RSA_SHA256, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};

const HOUR: Duration = Duration::from_secs(3_600);
const DAY: Duration = Duration::from_secs(86_400);

/// Certificates are backdated by this much, so a verifier whose clock reads a little behind
/// the test's still sees them valid.
const BACKDATE: Duration = Duration::from_secs(60);

/// How long an Istio workload certificate lasts (Istio's default `workload-cert-ttl`).
pub const WORKLOAD_VALIDITY: Duration = DAY;

/// How long a server certificate lasts.
pub const SERVER_VALIDITY: Duration = Duration::from_secs(365 * 86_400);

/// How long a CA certificate lasts.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 86_400);

/// A certificate authority of one trust domain: a root, or an intermediate under one.
pub struct Ca {
    trust_domain: String,
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    /// This CA's certificate and those of the intermediates above it, this CA first, the root
    /// left out: what a certificate it issues is presented with.
    intermediates_pem: String,
    root_pem: String,
}

impl Ca {
    /// A self-signed root CA for `trust_domain` (like Istio's self-signed root: subject
    /// `O=<trust domain>`, ECDSA P-256, valid for ten years).
    pub fn new(trust_domain: &str) -> Ca {
        let key = key(KeyKind::EcdsaP256);
        let params = ca_params(trust_domain, None);
        let cert = params.self_signed(&key).expect("self-sign the root CA");
        let cert_pem = cert.pem();
        Ca {
            trust_domain: trust_domain.to_owned(),
            issuer: Issuer::new(params, key),
            root_pem: cert_pem.clone(),
            cert_pem,
            intermediates_pem: String::new(),
        }
    }

    /// An intermediate CA of the same trust domain, signed by this one.
    pub fn intermediate(&self) -> Ca {
        let key = key(KeyKind::EcdsaP256);
        let params = ca_params(&self.trust_domain, Some("Intermediate CA"));
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign the intermediate CA");
        let cert_pem = cert.pem();
        Ca {
            trust_domain: self.trust_domain.clone(),
            issuer: Issuer::new(params, key),
            intermediates_pem: format!("{cert_pem}{}", self.intermediates_pem),
            cert_pem,
            root_pem: self.root_pem.clone(),
        }
    }

    /// A workload certificate as Istio issues it: the URI SAN
    /// `spiffe://<trust domain>/ns/<namespace>/sa/<service account>` (critical, as the subject
    /// is empty), ECDSA P-256, valid for [`WORKLOAD_VALIDITY`], for both client and server
    /// authentication.
    pub fn workload(&self, namespace: &str, service_account: &str) -> Leaf<'_> {
        let uri = format!(
            "spiffe://{}/ns/{namespace}/sa/{service_account}",
            self.trust_domain
        );
        Leaf {
            ca: self,
            sans: vec![SanType::URI(uri.try_into().expect("a SPIFFE ID is IA5"))],
            common_name: None,
            validity: WORKLOAD_VALIDITY,
            when: When::Now,
            key: KeyKind::EcdsaP256,
        }
    }

    /// A server certificate for `dns_names` (its subject CN is the first), ECDSA P-256, valid
    /// for [`SERVER_VALIDITY`], for server authentication.
    pub fn server(&self, dns_names: &[&str]) -> Leaf<'_> {
        let sans = dns_names
            .iter()
            .map(|name| SanType::DnsName((*name).try_into().expect("a DNS name is IA5")))
            .collect();
        Leaf {
            ca: self,
            sans,
            common_name: dns_names.first().map(|name| (*name).to_owned()),
            validity: SERVER_VALIDITY,
            when: When::Now,
            key: KeyKind::EcdsaP256,
        }
    }

    /// The trust domain this CA issues SPIFFE IDs in.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// This CA's own certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The root certificate of this CA's hierarchy (this CA's own for a root), PEM: the trust
    /// anchor that verifies what it issues (`trusted_ca`, Istio's `root-cert.pem`).
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// A certificate revocation list signed by this CA, revoking `revoked` (issued by it), PEM;
    /// current from an hour ago for a day.
    pub fn crl(&self, revoked: &[&Issued]) -> String {
        let now = SystemTime::now();
        let params = CertificateRevocationListParams {
            this_update: (now - HOUR).into(),
            next_update: (now + DAY).into(),
            crl_number: serial(),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|issued| RevokedCertParams {
                    serial_number: issued.serial.clone(),
                    revocation_time: (now - HOUR).into(),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        params
            .signed_by(&self.issuer)
            .expect("sign the CRL")
            .pem()
            .expect("the CRL as PEM")
    }

    /// Writes [`Ca::root_pem`] to `<dir>/<name>.pem` and returns the path.
    pub fn write_root_to(&self, dir: &Path, name: &str) -> PathBuf {
        write(dir, &format!("{name}.pem"), &self.root_pem)
    }
}

/// A certificate about to be issued by a [`Ca`]; the methods pick a variant, [`Leaf::issue`]
/// signs it.
pub struct Leaf<'ca> {
    ca: &'ca Ca,
    sans: Vec<SanType>,
    common_name: Option<String>,
    validity: Duration,
    when: When,
    key: KeyKind,
}

/// When a certificate's validity window lies, relative to the moment it is issued.
#[derive(Clone, Copy)]
enum When {
    /// Valid from (just before) now.
    Now,
    /// Ended a day ago.
    Past,
    /// Starts in a day.
    Future,
}

/// The key a certificate certifies.
#[derive(Clone, Copy)]
enum KeyKind {
    /// ECDSA on P-256 (signed with SHA-256): the default, as Istio's.
    EcdsaP256,
    /// ECDSA on P-384 (signed with SHA-384).
    EcdsaP384,
    /// RSA 2048 (PKCS#1 v1.5 with SHA-256); always the same key, from
    /// `tests/data/cert-kit/rsa-2048.key`, as ring cannot generate RSA keys.
    Rsa2048,
}

impl Leaf<'_> {
    /// With the DNS name `name` added to its subject alternative names (a workload
    /// certificate a client can also check by name).
    pub fn dns(mut self, name: &str) -> Self {
        self.sans.push(SanType::DnsName(
            name.try_into().expect("a DNS name is IA5"),
        ));
        self
    }

    /// With the IP address `ip` added to its subject alternative names.
    pub fn ip(mut self, ip: std::net::IpAddr) -> Self {
        self.sans.push(SanType::IpAddress(ip));
        self
    }

    /// With the email address `email` added to its subject alternative names.
    pub fn email(mut self, email: &str) -> Self {
        self.sans.push(SanType::Rfc822Name(
            email.try_into().expect("an email address is IA5"),
        ));
        self
    }

    /// Valid for the usual length, but that window ended a day ago.
    pub fn expired(mut self) -> Self {
        self.when = When::Past;
        self
    }

    /// Valid for the usual length, starting a day from now.
    pub fn not_yet_valid(mut self) -> Self {
        self.when = When::Future;
        self
    }

    /// For an RSA 2048 key instead of ECDSA P-256.
    pub fn rsa2048(mut self) -> Self {
        self.key = KeyKind::Rsa2048;
        self
    }

    /// For an ECDSA P-384 key instead of P-256.
    pub fn p384(mut self) -> Self {
        self.key = KeyKind::EcdsaP384;
        self
    }

    /// Signs the certificate with the CA's key.
    pub fn issue(self) -> Issued {
        let key = key(self.key);
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        if let Some(cn) = &self.common_name {
            params
                .distinguished_name
                .push(DnType::CommonName, cn.as_str());
        }
        params.subject_alt_names = self.sans;
        let serial = serial();
        params.serial_number = Some(serial.clone());
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = match self.key {
            KeyKind::Rsa2048 => vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ],
            KeyKind::EcdsaP256 | KeyKind::EcdsaP384 => vec![KeyUsagePurpose::DigitalSignature],
        };
        params.extended_key_usages = if self.common_name.is_some() {
            vec![ExtendedKeyUsagePurpose::ServerAuth]
        } else {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        };
        let now = SystemTime::now();
        let not_before = match self.when {
            When::Now => now - BACKDATE,
            When::Past => now - DAY - self.validity,
            When::Future => now + DAY,
        };
        params.not_before = not_before.into();
        params.not_after = (not_before + self.validity).into();
        let cert = params
            .signed_by(&key, &self.ca.issuer)
            .expect("sign the certificate");
        let cert_pem = cert.pem();
        Issued {
            chain_pem: format!("{cert_pem}{}", self.ca.intermediates_pem),
            cert_der: cert.der().to_vec(),
            cert_pem,
            key_pem: key.serialize_pem(),
            serial,
        }
    }
}

/// An issued certificate with its key.
pub struct Issued {
    /// The certificate alone, PEM.
    pub cert_pem: String,
    /// The certificate alone, DER.
    pub cert_der: Vec<u8>,
    /// The private key, PKCS#8 PEM.
    pub key_pem: String,
    /// The certificate, then the intermediates up to (not including) the root, PEM: what a
    /// TLS peer presents (`certificate_chain`, Istio's `cert-chain.pem`).
    pub chain_pem: String,
    /// Its serial number (what a CRL names).
    pub serial: SerialNumber,
}

/// Where [`Issued::write_to`] put the files.
pub struct Files {
    /// `<dir>/<name>.pem`: the chain.
    pub chain: PathBuf,
    /// `<dir>/<name>.key`: the private key.
    pub key: PathBuf,
}

impl Issued {
    /// Writes the chain to `<dir>/<name>.pem` and the key to `<dir>/<name>.key`.
    pub fn write_to(&self, dir: &Path, name: &str) -> Files {
        Files {
            chain: write(dir, &format!("{name}.pem"), &self.chain_pem),
            key: write(dir, &format!("{name}.key"), &self.key_pem),
        }
    }
}

/// A TLS client configuration (ring) that trusts `<dir>/root.pem` and presents
/// `<dir>/<identity>.pem` with `<dir>/<identity>.key`, or no certificate without `identity`.
pub fn client_config(dir: &Path, identity: Option<&str>) -> rustls::ClientConfig {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots(dir));
    let Some(file) = identity else {
        return builder.with_no_client_auth();
    };
    let chain = CertificateDer::pem_file_iter(dir.join(format!("{file}.pem")))
        .expect("the client chain")
        .collect::<Result<Vec<_>, _>>()
        .expect("the chain parses");
    let key = PrivateKeyDer::from_pem_file(dir.join(format!("{file}.key"))).expect("key");
    builder
        .with_client_auth_cert(chain, key)
        .expect("certificate and key match")
}

/// A store holding `<dir>/root.pem`.
pub fn roots(dir: &Path) -> rustls::RootCertStore {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    let root = CertificateDer::from_pem_file(dir.join("root.pem")).expect("root.pem");
    roots.add(root).expect("the root is a CA");
    roots
}

/// A fresh directory under the system's temporary directory, removed (with its files) when
/// dropped.
pub struct CertDir {
    path: PathBuf,
}

impl CertDir {
    /// Creates `revoy-certs-<pid>-<n>` under the temporary directory.
    pub fn new() -> CertDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("revoy-certs-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        CertDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CertDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn write(dir: &Path, file: &str, contents: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// A CA certificate's parameters: subject `O=<trust domain>` (and `CN=<common name>` when
/// given), CA without a path length limit, for signing certificates, valid for
/// [`CA_VALIDITY`].
fn ca_params(trust_domain: &str, common_name: Option<&str>) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, trust_domain);
    if let Some(cn) = common_name {
        params.distinguished_name.push(DnType::CommonName, cn);
    }
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(serial());
    params.use_authority_key_identifier_extension = true;
    let not_before = SystemTime::now() - HOUR;
    params.not_before = not_before.into();
    params.not_after = (not_before + CA_VALIDITY).into();
    params
}

fn key(kind: KeyKind) -> KeyPair {
    match kind {
        KeyKind::EcdsaP256 => KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256),
        KeyKind::EcdsaP384 => KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384),
        KeyKind::Rsa2048 => KeyPair::from_pem_and_sign_algo(
            include_str!("../data/cert-kit/rsa-2048.key"),
            &PKCS_RSA_SHA256,
        ),
    }
    .expect("make the key")
}

/// A random positive 128-bit serial number, as Istio's CA uses.
fn serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] = bytes[0] & 0x7f | 0x40;
    SerialNumber::from_slice(&bytes)
}
