//! Istio's standard metrics as a pod's sidecar exports them in `/stats/prometheus`, and the
//! labels Istio's stats filter gives a call between two pods of the test's topology (istio/proxy
//! `source/extensions/filters/http/istio_stats/istio_stats.cc`): both reporters name both ends —
//! the local workload from its node metadata, the peer's from the metadata exchange, the
//! principals from the mTLS certificates (the client's from its upstream connection), the
//! service from the cluster's `istio` metadata — and only the destination knows the connection
//! was mutual TLS.

use super::config::{self, CLUSTER_ID, NAMESPACE, Service, VERSION, Workload};
use crate::netns::{self, Netns};
use crate::prometheus;

/// Which sidecar reports a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reporter {
    /// The caller's (its outbound listener).
    Source,
    /// The callee's (its inbound listener).
    Destination,
}

/// What kind of call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// An HTTP request answered 200 (with `grpc-status: 0` for gRPC).
    Http {
        /// Whether it is gRPC.
        grpc: bool,
    },
    /// A TCP connection.
    Tcp,
}

/// A series' labels, in order.
pub type Labels = Vec<(String, String)>;

/// The labels, in Istio's order, of a call from `from` to `to` through `service`, as
/// `reporter` reports it.
pub fn labels(
    reporter: Reporter,
    from: &Workload,
    to: &Workload,
    service: &Service,
    call: Call,
) -> Labels {
    let reporter_name = match reporter {
        Reporter::Source => "source",
        Reporter::Destination => "destination",
    };
    let (source, destination) = (from.app(), to.app());
    let mut out: Vec<(&str, String)> = vec![
        ("reporter", reporter_name.to_owned()),
        ("source_workload", from.deployment()),
        ("source_canonical_service", source.to_owned()),
        ("source_canonical_revision", VERSION.to_owned()),
        ("source_workload_namespace", NAMESPACE.to_owned()),
        ("source_principal", config::spiffe(from.service_account)),
        ("source_app", source.to_owned()),
        ("source_version", VERSION.to_owned()),
        ("source_cluster", CLUSTER_ID.to_owned()),
        ("destination_workload", to.deployment()),
        ("destination_workload_namespace", NAMESPACE.to_owned()),
        ("destination_principal", config::spiffe(to.service_account)),
        ("destination_app", destination.to_owned()),
        ("destination_version", VERSION.to_owned()),
        ("destination_service", service.host()),
        ("destination_canonical_service", destination.to_owned()),
        ("destination_canonical_revision", VERSION.to_owned()),
        ("destination_service_name", service.name.to_owned()),
        ("destination_service_namespace", NAMESPACE.to_owned()),
        ("destination_cluster", CLUSTER_ID.to_owned()),
    ];
    match call {
        Call::Http { grpc } => out.extend([
            (
                "request_protocol",
                if grpc { "grpc" } else { "http" }.to_owned(),
            ),
            ("response_code", "200".to_owned()),
            (
                "grpc_response_status",
                if grpc { "0" } else { "" }.to_owned(),
            ),
        ]),
        Call::Tcp => out.push(("request_protocol", "tcp".to_owned())),
    }
    let security = match reporter {
        Reporter::Source => "unknown",
        Reporter::Destination => "mutual_tls",
    };
    out.extend([
        ("response_flags", "-".to_owned()),
        ("connection_security_policy", security.to_owned()),
    ]);
    out.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The sidecar's `/stats/prometheus` text in `ns`.
pub fn scrape(ns: &Netns) -> String {
    match ns.get(None, netns::ADMIN, "/stats/prometheus") {
        Ok((200, text)) => text,
        other => panic!("/stats/prometheus: {other:?}"),
    }
}

/// The value of `family`'s series with exactly `labels` in `text` (0 when there is none).
pub fn value(text: &str, family: &str, labels: &Labels) -> u64 {
    prometheus::series(text, family)
        .into_iter()
        .find(|(l, _)| l == labels)
        .map_or(0, |(_, v)| v.parse().expect("a whole number"))
}

/// Every series of `family` in `text` (for a failure message).
pub fn all(text: &str, family: &str) -> String {
    text.lines()
        .filter(|l| l.starts_with(family))
        .collect::<Vec<_>>()
        .join("\n")
}
