//! The admin server's own stats, as Envoy keeps them for its admin listener and connection
//! manager: `listener.admin.*` (connections, `main_thread.*`, the manager's response classes
//! under `listener.admin.http.admin.*`) and `http.admin.*` (connections and requests).
//! Envoy's stats for events the admin server never has are listed at 0.

use std::cell::Cell;
use std::time::Instant;

use crate::http::ResponseClasses;
use crate::stats::{Block, Connections, Counter, Gauge, Histogram, Open, Slot, Store};

/// `listener.admin.*` Envoy lists that stay 0: the admin listener has no connection limits,
/// listener filters or filter chains to miss, and no overload manager.
static LISTENER_ZEROS: [Slot; 9] = [
    Slot::counter("downstream_cx_overflow"),
    Slot::counter("downstream_cx_overload_reject"),
    Slot::counter("downstream_cx_transport_socket_connect_timeout"),
    Slot::counter("downstream_global_cx_overflow"),
    Slot::counter("downstream_listener_filter_error"),
    Slot::counter("downstream_listener_filter_remote_close"),
    Slot::gauge("downstream_pre_cx_active"),
    Slot::counter("downstream_pre_cx_timeout"),
    Slot::counter("no_filter_chain_match"),
];

/// `http.admin.*` Envoy lists that stay 0 on revoy's admin server: it speaks HTTP/1.1 alone
/// without TLS, upgrades, timeouts, connection limits, drains, path normalization or flow
/// control.
static HCM_ZEROS: [Slot; 29] = [
    Slot::counter("downstream_cx_delayed_close_timeout"),
    Slot::counter("downstream_cx_drain_close"),
    Slot::gauge("downstream_cx_http1_soft_drain"),
    Slot::gauge("downstream_cx_http2_active"),
    Slot::counter("downstream_cx_http2_total"),
    Slot::gauge("downstream_cx_http3_active"),
    Slot::counter("downstream_cx_http3_total"),
    Slot::counter("downstream_cx_idle_timeout"),
    Slot::counter("downstream_cx_max_duration_reached"),
    Slot::counter("downstream_cx_max_requests_reached"),
    Slot::counter("downstream_cx_overload_disable_keepalive"),
    Slot::gauge("downstream_cx_ssl_active"),
    Slot::counter("downstream_cx_ssl_total"),
    Slot::gauge("downstream_cx_upgrades_active"),
    Slot::counter("downstream_cx_upgrades_total"),
    Slot::counter("downstream_flow_control_paused_reading_total"),
    Slot::counter("downstream_flow_control_resumed_reading_total"),
    Slot::counter("downstream_rq_failed_path_normalization"),
    Slot::counter("downstream_rq_header_timeout"),
    Slot::counter("downstream_rq_http2_total"),
    Slot::counter("downstream_rq_http3_total"),
    Slot::counter("downstream_rq_idle_timeout"),
    Slot::counter("downstream_rq_max_duration_reached"),
    Slot::counter("downstream_rq_overload_close"),
    Slot::counter("downstream_rq_redirected_with_normalized_path"),
    Slot::counter("downstream_rq_rejected_via_ip_detection"),
    Slot::counter("downstream_rq_timeout"),
    Slot::counter("downstream_rq_too_many_premature_resets"),
    Slot::counter("downstream_rq_ws_on_non_ws_route"),
];

/// Resolved handles for the admin server's stats, made when it starts.
#[derive(Debug)]
pub struct AdminStats {
    /// `listener.admin.downstream_cx_{total,active,length_ms}`.
    listener: Connections,
    /// `listener.admin.main_thread.downstream_cx_{total,active}`: Envoy's admin listener
    /// runs on its main thread.
    main_thread: Connections,
    /// `listener.admin.downstream_cx_destroy`.
    cx_destroy: Counter,
    /// `listener.admin.connections_accepted_per_socket_event`: 1 per accepted connection.
    accepted: Histogram,
    /// `http.admin.downstream_cx_{total,active,length_ms}`.
    manager: Connections,
    /// `http.admin.downstream_cx_destroy`.
    manager_cx_destroy: Counter,
    /// `http.admin.downstream_cx_protocol_error`: HTTP/1.0 requests refused (426).
    protocol_error: Counter,
    /// `http.admin.downstream_cx_http1_total`: connections that sent a request.
    cx_http1_total: Counter,
    /// `http.admin.downstream_cx_http1_active`: those still open.
    cx_http1_active: Gauge,
    /// `http.admin.downstream_rq_total`.
    rq_total: Counter,
    /// `http.admin.downstream_rq_http1_total`.
    rq_http1_total: Counter,
    /// `http.admin.downstream_rq_active`.
    rq_active: Gauge,
    /// `http.admin.downstream_rq_time`.
    rq_time: Histogram,
    /// The classes, here and under `listener.admin.http.admin.`.
    responses: ResponseClasses,
    /// Holds the zeros of both scopes.
    _zeros: [Block; 2],
}

impl AdminStats {
    /// Resolves the handles in `store`.
    pub fn new(store: &Store) -> Self {
        AdminStats {
            listener: Connections::timed(store, "listener.admin"),
            main_thread: Connections::new(store, "listener.admin.main_thread"),
            cx_destroy: store.counter("listener.admin.downstream_cx_destroy"),
            accepted: store.histogram("listener.admin.connections_accepted_per_socket_event"),
            manager: Connections::timed(store, "http.admin"),
            manager_cx_destroy: store.counter("http.admin.downstream_cx_destroy"),
            protocol_error: store.counter("http.admin.downstream_cx_protocol_error"),
            cx_http1_total: store.counter("http.admin.downstream_cx_http1_total"),
            cx_http1_active: store.gauge("http.admin.downstream_cx_http1_active"),
            rq_total: store.counter("http.admin.downstream_rq_total"),
            rq_http1_total: store.counter("http.admin.downstream_rq_http1_total"),
            rq_active: store.gauge("http.admin.downstream_rq_active"),
            rq_time: store.histogram("http.admin.downstream_rq_time"),
            responses: ResponseClasses::new(store, "admin", "listener.admin"),
            _zeros: [
                store.block_with_zeros("listener.admin.", &[], &LISTENER_ZEROS),
                store.block_with_zeros("http.admin.", &[], &HCM_ZEROS),
            ],
        }
    }

    /// Counts an accepted connection, open until the guard drops.
    pub fn connection(&self) -> AdminConnection<'_> {
        self.accepted.record(1);
        AdminConnection {
            stats: self,
            _listener: self.listener.open(),
            _main_thread: self.main_thread.open(),
            _manager: self.manager.open(),
            requests: 0,
        }
    }
}

/// An admin connection counted open by [`AdminStats::connection`]; dropped when it closes.
#[derive(Debug)]
pub struct AdminConnection<'a> {
    stats: &'a AdminStats,
    _listener: Open<'a>,
    _main_thread: Open<'a>,
    _manager: Open<'a>,
    requests: u64,
}

impl<'a> AdminConnection<'a> {
    /// Counts a request read on the connection (its first makes the connection an HTTP/1
    /// one), active until the returned stream drops.
    pub fn request(&mut self) -> AdminStream<'a> {
        let stats = self.stats;
        if self.requests == 0 {
            stats.cx_http1_total.inc();
            stats.cx_http1_active.inc();
        }
        self.requests += 1;
        stats.rq_total.inc();
        stats.rq_http1_total.inc();
        stats.rq_active.inc();
        AdminStream {
            stats,
            since: Instant::now(),
            answered: Cell::new(false),
        }
    }
}

impl Drop for AdminConnection<'_> {
    fn drop(&mut self) {
        self.stats.cx_destroy.inc();
        self.stats.manager_cx_destroy.inc();
        if self.requests > 0 {
            self.stats.cx_http1_active.dec();
        }
    }
}

/// One admin request being answered: active, and timed into `downstream_rq_time`, until
/// dropped.
#[derive(Debug)]
pub struct AdminStream<'a> {
    stats: &'a AdminStats,
    since: Instant,
    answered: Cell<bool>,
}

impl AdminStream<'_> {
    /// Counts the request as refused by the codec with `status` (Envoy's codec error).
    pub fn refused(&self, status: u16) {
        self.stats.protocol_error.inc();
        self.head(status);
    }

    /// Counts the response's status in its class when its head goes out; once, whoever
    /// calls it first (`/stats` before it renders, as Envoy streams its head first and so
    /// counts the request in what it shows).
    pub fn head(&self, status: u16) {
        if !self.answered.replace(true) {
            self.stats.responses.count(status);
        }
    }
}

impl Drop for AdminStream<'_> {
    fn drop(&mut self) {
        self.stats.rq_active.dec();
        self.stats
            .rq_time
            .record(self.since.elapsed().as_millis() as u64);
    }
}
