//! Istio's standard metrics (what `istio.stats` records, HTTP and TCP): their labels, in the
//! order Istio's stats filter adds them, from what is known of the local workload and the
//! peer, and the metrics themselves in the custom stat namespace `istiocustom` (exported to
//! Prometheus as `istio_*`).

use crate::config::istio::stats::{IstioStatsConfig, METRICS};
use crate::config::istio::workload::Workload;

use crate::stats::keyed::Keyed;
use crate::stats::{Counter, Histogram, Store};

const UNKNOWN: &str = "unknown";

/// What a connection or request knows of its two ends.
#[derive(Debug)]
pub struct Ends<'a> {
    /// Whether the destination reports it (an inbound listener), else the source.
    pub server: bool,
    /// This proxy's workload.
    pub local: &'a Workload,
    /// The peer's, when discovered.
    pub peer: Option<&'a Workload>,
    /// The peer's certificate's first URI SAN (empty when unknown).
    pub peer_san: &'a str,
    /// This side's certificate's first URI SAN (empty when unknown).
    pub local_san: &'a str,
    /// `destination_service` as found (empty when not).
    pub service_host: &'a str,
    /// `destination_service_name` as found (empty when not).
    pub service_name: &'a str,
}

/// `v`, or `default` when empty.
fn or<'v>(v: &'v str, default: &'v str) -> &'v str {
    if v.is_empty() { default } else { v }
}

impl Ends<'_> {
    /// The reporter and the source and destination labels, owned.
    pub fn labels(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(20);
        self.visit(&mut |name, value| out.push((name, value.to_owned())));
        out
    }

    /// Hands `f` the reporter and the source and destination labels (name, value), in
    /// Istio's order, without making them.
    pub fn visit(&self, f: &mut dyn FnMut(&'static str, &str)) {
        let local = self.local;
        let none = Workload::default();
        let p = self.peer.unwrap_or(&none);
        let peer_namespace = namespace_of(self.peer_san).unwrap_or(&p.namespace);
        f(
            "reporter",
            if self.server { "destination" } else { "source" },
        );
        if self.server {
            f("source_workload", or(&p.workload, UNKNOWN));
            f("source_canonical_service", or(&p.canonical_name, UNKNOWN));
            f(
                "source_canonical_revision",
                or(&p.canonical_revision, "latest"),
            );
            f("source_workload_namespace", or(peer_namespace, UNKNOWN));
            f("source_principal", or(self.peer_san, UNKNOWN));
            f("source_app", or(&p.app, UNKNOWN));
            f("source_version", or(&p.version, UNKNOWN));
            f("source_cluster", or(&p.cluster, UNKNOWN));
            f("destination_workload", &local.workload);
            f("destination_workload_namespace", &local.namespace);
            f("destination_principal", or(self.local_san, UNKNOWN));
            f("destination_app", &local.app);
            f("destination_version", &local.version);
            f(
                "destination_service",
                or(self.service_host, &local.canonical_name),
            );
            f("destination_canonical_service", &local.canonical_name);
            f("destination_canonical_revision", &local.canonical_revision);
            f(
                "destination_service_name",
                or(self.service_name, &local.canonical_name),
            );
            f("destination_service_namespace", &local.namespace);
            f("destination_cluster", &local.cluster);
        } else {
            f("source_workload", &local.workload);
            f("source_canonical_service", &local.canonical_name);
            f("source_canonical_revision", &local.canonical_revision);
            f("source_workload_namespace", &local.namespace);
            f("source_principal", or(self.local_san, UNKNOWN));
            f("source_app", &local.app);
            f("source_version", &local.version);
            f("source_cluster", &local.cluster);
            f("destination_workload", or(&p.workload, UNKNOWN));
            f(
                "destination_workload_namespace",
                or(peer_namespace, UNKNOWN),
            );
            f("destination_principal", or(self.peer_san, UNKNOWN));
            f("destination_app", or(&p.app, UNKNOWN));
            f("destination_version", or(&p.version, UNKNOWN));
            f("destination_service", or(self.service_host, UNKNOWN));
            f(
                "destination_canonical_service",
                or(&p.canonical_name, UNKNOWN),
            );
            f(
                "destination_canonical_revision",
                or(&p.canonical_revision, "latest"),
            );
            f("destination_service_name", or(self.service_name, UNKNOWN));
            f("destination_service_namespace", or(peer_namespace, UNKNOWN));
            f("destination_cluster", or(&p.cluster, UNKNOWN));
        }
    }

    /// `connection_security_policy`: a server knows whether both sides presented
    /// certificates; a client reports `unknown`.
    pub fn security_policy(&self) -> &'static str {
        if !self.server {
            UNKNOWN
        } else if !self.peer_san.is_empty() && !self.local_san.is_empty() {
            "mutual_tls"
        } else {
            "none"
        }
    }
}

/// `destination_service` and `destination_service_name` as Istio's stats filter finds them:
/// the Host header (unless disabled), then the special clusters' names, then the cluster's
/// `istio` service (its host, and its name or the host's first label).
pub fn destination_service(
    host: String,
    cluster: Option<&str>,
    route_name: &str,
    istio: Option<&crate::config::istio::IstioCluster>,
) -> (String, String) {
    const SPECIAL: [&str; 5] = [
        "BlackHoleCluster",
        "PassthroughCluster",
        "InboundPassthroughCluster",
        "InboundPassthroughClusterIpv4",
        "InboundPassthroughClusterIpv6",
    ];
    let mut service_host = host.clone();
    let mut service_name = host;
    match (route_name, cluster) {
        ("block_all", _) => service_name = "BlackHoleCluster".into(),
        ("allow_any", _) => service_name = "PassthroughCluster".into(),
        (_, Some(c)) if SPECIAL.contains(&c) => service_name = c.into(),
        _ => {
            if let Some(i) = istio.filter(|i| !i.service_host.is_empty()) {
                service_host.clone_from(&i.service_host);
                service_name = if i.service_name.is_empty() {
                    i.service_host
                        .split('.')
                        .next()
                        .unwrap_or_default()
                        .to_owned()
                } else {
                    i.service_name.clone()
                };
            }
        }
    }
    (service_host, service_name)
}

/// The namespace in a SPIFFE principal (`<domain>/ns/<namespace>/sa/<account>`).
fn namespace_of(principal: &str) -> Option<&str> {
    let at = principal.find("/ns/")? + 4;
    let rest = &principal[at..];
    Some(rest.split('/').next().unwrap_or(rest))
}

/// A metric of [`METRICS`] (by index) as `config` keeps it: `None` when dropped, else
/// `labels` less those it removes.
fn kept<'l>(
    config: &IstioStatsConfig,
    i: usize,
    labels: &'l [(&'static str, String)],
) -> Option<Vec<(&'l str, &'l str)>> {
    if config.dropped[i] {
        return None;
    }
    let removed = &config.removed_tags[i];
    Some(
        labels
            .iter()
            .filter(|(k, _)| !removed.iter().any(|r| r == k))
            .map(|(k, v)| (*k, v.as_str()))
            .collect(),
    )
}

/// The stat name of metric `i` of [`METRICS`].
fn name(i: usize) -> String {
    format!("istiocustom.istio_{}", METRICS[i])
}

/// Adds `n` to counter `i` of [`METRICS`] with `labels`.
pub fn count(
    store: &Store,
    config: &IstioStatsConfig,
    i: usize,
    labels: &[(&'static str, String)],
    n: u64,
) {
    if let Some(tags) = kept(config, i, labels) {
        store.tagged_counter(&name(i), &tags).add(n);
    }
}

/// Istio's HTTP metrics (the first four of [`METRICS`]) for one label set, `None` where
/// dropped.
#[derive(Debug, Clone)]
pub struct HttpMetrics {
    requests: Option<Counter>,
    histograms: [Option<Histogram>; 3],
}

/// Hands a visitor a metric's labels (name, value), always the same names in the same order.
pub type VisitLabels<'a> = dyn Fn(&mut dyn FnMut(&'static str, &str)) + 'a;

/// Counts a request in `istio_requests_total` and records `values` (duration, request bytes,
/// response bytes) in the three histograms, all with the labels `labels` visits; a label
/// set's handles are made once and kept in `cache`, so a request neither names nor looks up
/// its metrics again, and makes only its key.
pub fn record_http(
    cache: &Keyed<HttpMetrics>,
    store: &Store,
    config: &IstioStatsConfig,
    labels: &VisitLabels<'_>,
    values: [u64; 3],
) {
    // The label names come in a fixed order: their values alone tell label sets apart.
    let mut key = String::with_capacity(512);
    labels(&mut |_, value| {
        key.push_str(value);
        key.push('\0');
    });
    let metrics = cache.get(&key, || {
        let mut owned = Vec::with_capacity(24);
        labels(&mut |name, value| owned.push((name, value.to_owned())));
        HttpMetrics {
            requests: kept(config, 0, &owned).map(|t| store.tagged_counter(&name(0), &t)),
            histograms: [1, 2, 3]
                .map(|i| kept(config, i, &owned).map(|t| store.tagged_histogram(&name(i), &t))),
        }
    });
    if let Some(requests) = &metrics.requests {
        requests.inc();
    }
    for (histogram, value) in metrics.histograms.iter().zip(values) {
        if let Some(histogram) = histogram {
            histogram.record(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_comes_from_a_spiffe_principal() {
        assert_eq!(
            namespace_of("spiffe://cluster.local/ns/default/sa/bookinfo"),
            Some("default")
        );
        assert_eq!(namespace_of("spiffe://cluster.local/ns/last"), Some("last"));
        assert_eq!(namespace_of("spiffe://cluster.local/sa/x"), None);
    }

    #[test]
    fn a_server_names_an_unknown_peer_unknown_and_itself_from_its_node() {
        let local = Workload {
            workload: "ratings-v1".into(),
            ..Default::default()
        };
        let ends = Ends {
            server: true,
            local: &local,
            peer: None,
            peer_san: "spiffe://cluster.local/ns/foo/sa/bar",
            local_san: "",
            service_host: "",
            service_name: "",
        };
        let labels = ends.labels();
        assert_eq!(labels.len(), 20);
        assert_eq!(labels[0], ("reporter", "destination".to_owned()));
        assert_eq!(
            labels[3],
            ("source_canonical_revision", "latest".to_owned())
        );
        assert_eq!(labels[4], ("source_workload_namespace", "foo".to_owned()));
        assert_eq!(labels[9], ("destination_workload", "ratings-v1".to_owned()));
        assert_eq!(ends.security_policy(), "none");
    }

    #[test]
    fn the_destination_service_prefers_the_clusters_istio_service() {
        let istio = crate::config::istio::IstioCluster {
            service_host: "server.default.svc.cluster.local".into(),
            ..Default::default()
        };
        assert_eq!(
            destination_service("host:80".into(), Some("c"), "", Some(&istio)),
            (
                "server.default.svc.cluster.local".to_owned(),
                "server".to_owned()
            )
        );
        assert_eq!(
            destination_service("host:80".into(), Some("PassthroughCluster"), "", None),
            ("host:80".to_owned(), "PassthroughCluster".to_owned())
        );
        assert_eq!(
            destination_service("h".into(), Some("c"), "allow_any", Some(&istio)),
            ("h".to_owned(), "PassthroughCluster".to_owned())
        );
    }
}
