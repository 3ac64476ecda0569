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
    /// A gRPC call's message counts (`istio_request_messages_total` and the response's),
    /// which Istio records with the reporter's and the ends' labels only.
    GrpcMessages,
}

/// A series' labels, in order.
pub type Labels = Vec<(String, String)>;

/// The source's labels, in Istio's order.
const SOURCE_LABELS: [&str; 8] = [
    "source_workload",
    "source_canonical_service",
    "source_canonical_revision",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
];

/// The destination's labels, in Istio's order.
const DESTINATION_LABELS: [&str; 11] = [
    "destination_workload",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_service",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_service_name",
    "destination_service_namespace",
    "destination_cluster",
];

/// The values of a workload's labels as an end of a call, in [`SOURCE_LABELS`]' order.
fn end(w: &Workload) -> [String; 8] {
    let (app, version) = (w.app().to_owned(), VERSION.to_owned());
    [
        w.deployment(),
        app.clone(),
        version.clone(),
        NAMESPACE.to_owned(),
        config::spiffe(w.service_account),
        app,
        version,
        CLUSTER_ID.to_owned(),
    ]
}

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
    let [
        workload,
        canonical,
        revision,
        namespace,
        principal,
        app,
        version,
        cluster,
    ] = end(to);
    let destination = [
        workload,
        namespace.clone(),
        principal,
        app,
        version,
        service.host(),
        canonical,
        revision,
        service.name.to_owned(),
        namespace,
        cluster,
    ];
    let names = SOURCE_LABELS.iter().chain(&DESTINATION_LABELS).copied();
    let mut out: Vec<(&str, String)> = vec![("reporter", reporter_name.to_owned())];
    out.extend(names.zip(end(from).into_iter().chain(destination)));
    match call {
        Call::GrpcMessages => return labels_of(out),
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
    labels_of(out)
}

/// `labels` with owned names.
fn labels_of(labels: Vec<(&str, String)>) -> Labels {
    labels.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
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
