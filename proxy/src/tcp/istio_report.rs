//! Istio's TCP metrics for one connection (`istio.stats` on its chain), reported as Istio's
//! stats filter reports them: `istio_tcp_connections_opened_total` once the peer's metadata is
//! known (at a periodic report, every `tcp_reporting_duration`) or else when the connection
//! closes, the bytes each way at every report since the one before, and
//! `istio_tcp_connections_closed_total` when it closes. A long-lived connection between
//! sidecars therefore shows its traffic while it lasts, not only once it ends.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::exchange::IstioFilters;
use super::{Activity, Peer};
use crate::access_log::Flags;
use crate::config::istio::IstioCluster;
use crate::istio_metrics::{Ends, count, destination_service};

/// Indices in `config::istio::stats::METRICS`.
const OPENED: usize = 6;
const CLOSED: usize = 7;
const SENT: usize = 8;
const RECEIVED: usize = 9;

/// Where a connection went, as Istio's TCP metrics label it.
pub(super) struct Target<'a> {
    /// The cluster (`None` when none was found) and its `istio` metadata.
    pub(super) cluster: Option<(&'a str, Option<&'a IstioCluster>)>,
    /// The upstream's certificate's first URI SAN (empty when unknown).
    pub(super) peer_san: String,
    /// This side's upstream certificate's first URI SAN (empty when unknown).
    pub(super) local_san: String,
}

impl<'a> Target<'a> {
    /// The connected cluster `cluster` with its `istio` metadata; this side's certificate
    /// names `local_san` (the upstream's is filled in once its handshake is known).
    pub(super) fn connected(
        cluster: &'a str,
        istio: Option<&'a IstioCluster>,
        local_san: String,
    ) -> Target<'a> {
        Target {
            cluster: Some((cluster, istio)),
            peer_san: String::new(),
            local_san,
        }
    }
}

/// One connection's report: what it is labelled with once opened, and the bytes reported.
pub(super) struct IstioTcpReport<'a> {
    istio: &'a IstioFilters<'a>,
    target: Target<'a>,
    /// Where the downstream's and the upstream's exchanged workloads go.
    peers: (Option<Peer>, Option<Peer>),
    /// Set when the connection is reported opened.
    labels: Option<Vec<(&'static str, String)>>,
    /// Bytes to and from the downstream reported so far.
    reported: (u64, u64),
}

impl<'a> IstioTcpReport<'a> {
    /// The report of a connection to `target`, `None` when the chain has no `istio.stats`.
    pub(super) fn new(
        istio: Option<&'a IstioFilters<'a>>,
        target: Target<'a>,
        peers: (Option<Peer>, Option<Peer>),
    ) -> Option<Self> {
        let istio = istio.filter(|i| i.stats.is_some())?;
        Some(IstioTcpReport {
            istio,
            target,
            peers,
            labels: None,
            reported: (0, 0),
        })
    }

    /// How often an open connection reports (`None`: only when it closes).
    pub(super) fn every(&self) -> Option<Duration> {
        self.istio.stats.and_then(|s| s.tcp_reporting)
    }

    /// A periodic report: once the peer is known the connection is reported opened (labelled
    /// with no flags, as Istio labels it then), then its bytes since the last report.
    pub(super) fn tick(&mut self, activity: &Activity<'_>) {
        if self.labels.is_none() {
            if self.peer().is_none() {
                return;
            }
            self.open(Flags::default());
        }
        self.bytes(Some(activity));
    }

    /// The report when the connection closes (`activity`: none when it never connected):
    /// opened if not yet, labelled with `flags` unless the peer was known, the bytes left, and
    /// closed.
    pub(super) fn close(mut self, activity: Option<&Activity<'_>>, flags: Flags) {
        if self.labels.is_none() {
            let flags = if self.peer().is_some() {
                Flags::default()
            } else {
                flags
            };
            self.open(flags);
        }
        self.bytes(activity);
        self.add(CLOSED, 1);
    }

    /// The peer's workload, as the exchange learned it: the downstream's on an inbound
    /// listener, the upstream's on an outbound one.
    fn peer(&self) -> Option<&crate::config::istio::workload::Workload> {
        let peer = if self.istio.inbound {
            &self.peers.0
        } else {
            &self.peers.1
        };
        peer.as_ref().and_then(|p| p.get())
    }

    fn open(&mut self, flags: Flags) {
        let istio = self.istio;
        let (service_host, service_name) = destination_service(
            String::new(),
            self.target.cluster.map(|(name, _)| name),
            "",
            self.target.cluster.and_then(|(_, istio)| istio),
        );
        let ends = Ends {
            server: istio.inbound,
            local: &istio.local.workload,
            peer: self.peer(),
            peer_san: if istio.inbound {
                &istio.sans.0
            } else {
                &self.target.peer_san
            },
            local_san: if istio.inbound {
                &istio.sans.1
            } else {
                &self.target.local_san
            },
            service_host: &service_host,
            service_name: &service_name,
        };
        let mut labels = ends.labels();
        labels.extend([
            ("request_protocol", "tcp".to_owned()),
            ("response_flags", flags.render(false)),
            (
                "connection_security_policy",
                ends.security_policy().to_owned(),
            ),
        ]);
        self.labels = Some(labels);
        self.add(OPENED, 1);
    }

    /// Counts the bytes moved since the last report.
    fn bytes(&mut self, activity: Option<&Activity<'_>>) {
        let (tx, rx) = activity.map_or((0, 0), |a| {
            (a.tx.load(Ordering::Relaxed), a.rx.load(Ordering::Relaxed))
        });
        let (sent, received) = self.reported;
        self.reported = (tx, rx);
        self.add(SENT, tx - sent);
        self.add(RECEIVED, rx - received);
    }

    fn add(&self, metric: usize, n: u64) {
        let (Some(config), Some(labels)) = (self.istio.stats, &self.labels) else {
            return;
        };
        count(self.istio.store, config, metric, labels, n);
    }
}
