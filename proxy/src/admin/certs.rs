//! `/certs`: every TLS context in use (the listeners' chains, then the clusters' transport
//! sockets) with the CA certificates it trusts and the certificates it presents, in Envoy's
//! `envoy.admin.v3.Certificates` JSON. A context whose SDS secrets have not all arrived is left
//! out, as Envoy has not built it yet.

use std::time::SystemTime;

use proto::pb::envoy::admin::v3::subject_alternate_name::Name;
use serde_json::{Value, json};

use crate::process::Process;
use crate::tls::ContextCertificates;
use crate::tls::x509;

/// The `/certs` answer at `now`.
pub fn render(process: &Process, now: SystemTime) -> Value {
    let listeners = process.applier.listeners();
    let clusters = process.shared.clusters.clusters();
    let certificates: Vec<Value> = listeners
        .iter()
        .flat_map(|l| l.tls_contexts())
        .chain(clusters.iter().flat_map(|c| c.tls_contexts()))
        .filter_map(|context| entry(context, now))
        .collect();
    json!({ "certificates": certificates })
}

/// One context's entry: each trusted CA certificate (Envoy 1.40 lists the whole bundle) and
/// each presented certificate (its leaf).
fn entry(context: &ContextCertificates, now: SystemTime) -> Option<Value> {
    let (presented, trusted) = context.in_force()?;
    let ca_cert: Vec<Value> = trusted
        .map(|t| {
            t.certificates
                .iter()
                .filter_map(|der| details(der, &t.origin, now))
                .collect()
        })
        .unwrap_or_default();
    let cert_chain: Vec<Value> = presented
        .iter()
        .filter_map(|c| details(c.key.cert.first()?, &c.origin, now))
        .collect();
    Some(json!({ "ca_cert": ca_cert, "cert_chain": cert_chain }))
}

/// A certificate as `CertificateDetails` JSON with every primitive field written (Envoy
/// prints them even when empty); `None` when it does not parse.
fn details(der: &[u8], path: &str, now: SystemTime) -> Option<Value> {
    let info = x509::parse(der).ok()?;
    let d = info.certificate_details(path, now);
    let sans: Vec<Value> = d
        .subject_alt_names
        .iter()
        .filter_map(|san| {
            Some(match san.name.as_ref()? {
                Name::Dns(name) => json!({ "dns": name }),
                Name::Uri(uri) => json!({ "uri": uri }),
                Name::IpAddress(ip) => json!({ "ip_address": ip }),
            })
        })
        .collect();
    Some(json!({
        "path": d.path,
        "serial_number": d.serial_number,
        "subject_alt_names": sans,
        // A uint64: proto3 JSON writes it as a string.
        "days_until_expiration": d.days_until_expiration.to_string(),
        "valid_from": info.valid_from(),
        "expiration_time": info.expiration_time(),
    }))
}
