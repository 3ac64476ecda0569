//! `http.<stat_prefix>.*` stats of a connection manager.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;

use crate::body::{Body, BoxError};
use crate::stats::{Block, Connections, Counter, Gauge, Histogram, Open, Slot, Store};

/// Resolved handles for one connection manager's stats.
#[derive(Debug, Clone)]
pub struct HcmStats {
    /// `downstream_cx_total` and `downstream_cx_active` (see [`HcmStats::open`]).
    cx: Connections,
    /// `downstream_cx_destroy`: connections closed, whoever closed them.
    cx_destroy: Counter,
    /// `downstream_cx_protocol_error`: requests the HTTP/1 codec refused (see
    /// [`HcmStats::refused_by_http1_codec`]).
    cx_protocol_error: Counter,
    /// `downstream_rq_total`.
    pub rq_total: Counter,
    /// `downstream_rq_active`.
    pub rq_active: Gauge,
    /// `downstream_rq_1xx` .. `downstream_rq_5xx` and `downstream_rq_completed`, here and in
    /// the listener's scope.
    pub responses: ResponseClasses,
    /// `downstream_cx_drain_close`: connections told to close because the server drains.
    pub cx_drain_close: Counter,
    /// `downstream_cx_idle_timeout`: connections whose idle timeout fired (once per idle period).
    pub cx_idle_timeout: Counter,
    /// `downstream_cx_max_duration_reached`: connections that reached
    /// `max_connection_duration`.
    pub cx_max_duration_reached: Counter,
    /// `downstream_cx_max_requests_reached`: requests at or over
    /// `max_requests_per_connection`.
    pub cx_max_requests_reached: Counter,
    /// `downstream_cx_upgrades_total`: upgrades and CONNECTs allowed to go on.
    pub upgrades_total: Counter,
    /// `downstream_cx_upgrades_active`: those not finished yet (tunnels still open).
    pub upgrades_active: Gauge,
    /// `downstream_rq_ws_on_non_ws_route`: upgrades refused (403) by the route or manager.
    pub upgrades_refused: Counter,
    /// `downstream_rq_idle_timeout`: requests ended by their stream idle timeout.
    pub rq_idle_timeout: Counter,
    /// `downstream_rq_max_duration_reached`: requests ended by their time limit.
    pub rq_max_duration_reached: Counter,
    /// `downstream_rq_timeout`: requests ended by the connection manager's `request_timeout`.
    pub rq_timeout: Counter,
    /// `downstream_rq_header_timeout`: requests ended by `request_headers_timeout`.
    pub rq_header_timeout: Counter,
    /// `downstream_cx_http1_total`: connections whose codec turned out HTTP/1 (see
    /// [`HcmStats::codec`]).
    cx_http1_total: Counter,
    /// `downstream_cx_http2_total`: connections whose codec turned out HTTP/2.
    cx_http2_total: Counter,
    /// `downstream_cx_http1_active`: those HTTP/1 connections still open.
    cx_http1_active: Gauge,
    /// `downstream_cx_http2_active`: those HTTP/2 connections still open.
    cx_http2_active: Gauge,
    /// `downstream_rq_time`: from a request's head to the end of its stream (its response's
    /// last byte, or the stream cut short).
    pub rq_time: Histogram,
    /// `downstream_rq_http1_total`: requests over HTTP/1.x, those the codec refused too.
    pub rq_http1_total: Counter,
    /// `downstream_rq_http2_total`: requests over HTTP/2 (those refused with a reply too).
    pub rq_http2_total: Counter,
    /// The router's `http.<prefix>.*` stats.
    pub router: RouterStats,
    /// Holds the manager's [`ZEROS`].
    _zeros: Block,
}

/// A connection manager's count of the responses it sent, by class (`downstream_rq_1xx` ..
/// `downstream_rq_5xx`) and in all (`downstream_rq_completed`), under `http.<prefix>.` and
/// the listener's copies under `listener.<address>.http.<prefix>.`: Envoy charges a response
/// to both scopes, so two listeners sharing a prefix share `http.<prefix>.*` but each keeps
/// its own copy.
#[derive(Debug, Clone)]
pub struct ResponseClasses {
    classes: [Counter; 5],
    completed: Counter,
    listener_classes: [Counter; 5],
    listener_completed: Counter,
}

impl ResponseClasses {
    /// Resolves the handles of manager `prefix` on the listener whose stats are under
    /// `listener` (its `listener.<address>`).
    pub fn new(store: &Store, prefix: &str, listener: &str) -> Self {
        let classes = |scope: &str| {
            [1, 2, 3, 4, 5].map(|c| store.counter(&format!("{scope}.downstream_rq_{c}xx")))
        };
        let (manager, listener) = (
            format!("http.{prefix}"),
            format!("{listener}.http.{prefix}"),
        );
        ResponseClasses {
            classes: classes(&manager),
            completed: store.counter(&format!("{manager}.downstream_rq_completed")),
            listener_classes: classes(&listener),
            listener_completed: store.counter(&format!("{listener}.downstream_rq_completed")),
        }
    }

    /// Counts a response with `status` in its class, in both scopes.
    pub fn count(&self, status: u16) {
        let class = usize::from(status / 100).wrapping_sub(1);
        if let (Some(c), Some(l)) = (self.classes.get(class), self.listener_classes.get(class)) {
            c.inc();
            l.inc();
            self.completed.inc();
            self.listener_completed.inc();
        }
    }
}

/// The router filter's stats, under the connection manager's prefix.
#[derive(Clone, Debug)]
pub struct RouterStats {
    /// `rq_total`: requests the router decided (after the other filters let them through).
    pub total: Counter,
    /// `no_route`: requests no route matched.
    pub no_route: Counter,
    /// `no_cluster`: requests whose route's cluster does not exist.
    pub no_cluster: Counter,
    /// `rq_direct_response`: requests answered by a route's `direct_response`.
    pub direct_response: Counter,
    /// `rq_redirect`: requests answered by a route's `redirect`.
    pub redirect: Counter,
}

/// `http.<prefix>.*` stats Envoy lists for every connection manager that stay 0 in revoy,
/// which never has their events: no HTTP/3, no overload manager, no internal redirects, no
/// premature-reset protection, Envoy's flow-control events, `delayed_close_timeout` not
/// enforced,
/// `original_ip_detection_extensions` refused; and the tracing counters of a manager that
/// does not trace (one that traces counts them).
static ZEROS: [Slot; 22] = [
    Slot::counter("downstream_cx_delayed_close_timeout"),
    Slot::gauge("downstream_cx_http1_soft_drain"),
    Slot::gauge("downstream_cx_http3_active"),
    Slot::counter("downstream_cx_http3_total"),
    Slot::counter("downstream_cx_overload_disable_keepalive"),
    Slot::counter("downstream_flow_control_paused_reading_total"),
    Slot::counter("downstream_flow_control_resumed_reading_total"),
    Slot::counter("downstream_rq_http3_total"),
    Slot::counter("downstream_rq_overload_close"),
    Slot::counter("downstream_rq_rejected_via_ip_detection"),
    Slot::counter("downstream_rq_too_many_premature_resets"),
    Slot::counter("passthrough_internal_redirect_bad_location"),
    Slot::counter("passthrough_internal_redirect_no_route"),
    Slot::counter("passthrough_internal_redirect_predicate"),
    Slot::counter("passthrough_internal_redirect_too_many_redirects"),
    Slot::counter("passthrough_internal_redirect_unsafe_scheme"),
    Slot::counter("rq_overload_local_reply"),
    Slot::counter("tracing.client_enabled"),
    Slot::counter("tracing.health_check"),
    Slot::counter("tracing.not_traceable"),
    Slot::counter("tracing.random_sampling"),
    Slot::counter("tracing.service_forced"),
];

/// A request's `downstream_rq_time`, recorded when dropped: where revoy's own HTTP/1.1 path
/// has written the response (or given up on it).
#[derive(Debug)]
pub struct RqTimer<'a> {
    histogram: &'a Histogram,
    since: Instant,
}

impl RqTimer<'_> {
    /// Records the request's time now; the instant it ended.
    pub fn end(self) -> Instant {
        let now = Instant::now();
        self.histogram
            .record(now.saturating_duration_since(self.since).as_millis() as u64);
        std::mem::forget(self);
        now
    }
}

impl Drop for RqTimer<'_> {
    fn drop(&mut self) {
        self.histogram
            .record(self.since.elapsed().as_millis() as u64);
    }
}

/// A response body that records `downstream_rq_time` when dropped: hyper drops a body once
/// it has sent it, or when the stream ends without it. The stream ends for the connection's
/// limits then too.
struct Timed {
    inner: Body,
    histogram: Histogram,
    since: Instant,
    _stream: super::conn_limits::StreamEnd,
}

impl Drop for Timed {
    fn drop(&mut self) {
        self.histogram
            .record(self.since.elapsed().as_millis() as u64);
    }
}

impl http_body::Body for Timed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection counted open in its manager's stats (`downstream_cx_total`,
/// `downstream_cx_active`) until dropped, when it counts in `downstream_cx_destroy` and its
/// length is recorded.
#[derive(Debug)]
pub struct OpenConnection<'a> {
    _open: Open<'a>,
    destroy: &'a Counter,
}

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.destroy.inc();
    }
}

/// The codec a connection was counted under: it stays in `downstream_cx_http1_active` or
/// `downstream_cx_http2_active` until this drops with the connection's context.
#[derive(Debug, Default)]
pub struct CodecCounted(std::sync::OnceLock<Gauge>);

impl Drop for CodecCounted {
    fn drop(&mut self) {
        if let Some(active) = self.0.get() {
            active.dec();
        }
    }
}

/// One allowed upgrade in `downstream_cx_upgrades_active`, until dropped (with the tunnel,
/// or with the request when nothing is tunnelled).
#[derive(Debug)]
pub struct ActiveUpgrade(Gauge);

impl Drop for ActiveUpgrade {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl HcmStats {
    /// Resolves the handles under `http.<prefix>.`, and the listener's copies under
    /// `<listener>.http.<prefix>.` (`listener` is the listener's `listener.<address>`).
    pub fn new(store: &Store, prefix: &str, listener: &str) -> Self {
        let name = |s: &str| format!("http.{prefix}.{s}");
        HcmStats {
            responses: ResponseClasses::new(store, prefix, listener),
            cx: Connections::timed(store, &format!("http.{prefix}")),
            cx_destroy: store.counter(&name("downstream_cx_destroy")),
            cx_protocol_error: store.counter(&name("downstream_cx_protocol_error")),
            rq_time: store.histogram(&name("downstream_rq_time")),
            rq_total: store.counter(&name("downstream_rq_total")),
            rq_active: store.gauge(&name("downstream_rq_active")),
            cx_drain_close: store.counter(&name("downstream_cx_drain_close")),
            cx_idle_timeout: store.counter(&name("downstream_cx_idle_timeout")),
            cx_max_duration_reached: store.counter(&name("downstream_cx_max_duration_reached")),
            cx_max_requests_reached: store.counter(&name("downstream_cx_max_requests_reached")),
            upgrades_total: store.counter(&name("downstream_cx_upgrades_total")),
            upgrades_active: store.gauge(&name("downstream_cx_upgrades_active")),
            upgrades_refused: store.counter(&name("downstream_rq_ws_on_non_ws_route")),
            rq_idle_timeout: store.counter(&name("downstream_rq_idle_timeout")),
            rq_max_duration_reached: store.counter(&name("downstream_rq_max_duration_reached")),
            rq_timeout: store.counter(&name("downstream_rq_timeout")),
            rq_header_timeout: store.counter(&name("downstream_rq_header_timeout")),
            cx_http1_total: store.counter(&name("downstream_cx_http1_total")),
            cx_http2_total: store.counter(&name("downstream_cx_http2_total")),
            cx_http1_active: store.gauge(&name("downstream_cx_http1_active")),
            cx_http2_active: store.gauge(&name("downstream_cx_http2_active")),
            rq_http1_total: store.counter(&name("downstream_rq_http1_total")),
            rq_http2_total: store.counter(&name("downstream_rq_http2_total")),
            router: RouterStats {
                total: store.counter(&name("rq_total")),
                no_route: store.counter(&name("no_route")),
                no_cluster: store.counter(&name("no_cluster")),
                direct_response: store.counter(&name("rq_direct_response")),
                redirect: store.counter(&name("rq_redirect")),
            },
            _zeros: store.block_with_zeros(&format!("http.{prefix}."), &[], &ZEROS),
        }
    }

    /// Counts a connection whose codec turned out HTTP/2 (`http2`) or HTTP/1, as Envoy counts
    /// it when it makes the codec at the first bytes; active until `counted` drops.
    pub fn codec(&self, http2: bool, counted: &CodecCounted) {
        let (total, active) = if http2 {
            (&self.cx_http2_total, &self.cx_http2_active)
        } else {
            (&self.cx_http1_total, &self.cx_http1_active)
        };
        total.inc();
        if counted.0.set(active.clone()).is_ok() {
            active.inc();
        }
    }

    /// Counts a connection open; it closes when the guard drops (also when its task is
    /// cancelled).
    pub fn open(&self) -> OpenConnection<'_> {
        OpenConnection {
            _open: self.cx.open(),
            destroy: &self.cx_destroy,
        }
    }

    /// Starts a request's `downstream_rq_time`, recorded when the timer drops.
    pub fn time_request(&self) -> RqTimer<'_> {
        RqTimer {
            histogram: &self.rq_time,
            since: Instant::now(),
        }
    }

    /// `body`, recording the `downstream_rq_time` of a request that began at `since` when
    /// it is dropped (sent, or abandoned), and ending `stream` then.
    pub(super) fn timed_body(
        &self,
        body: Body,
        since: Instant,
        stream: super::conn_limits::StreamEnd,
    ) -> Body {
        Timed {
            inner: body,
            histogram: self.rq_time.clone(),
            since,
            _stream: stream,
        }
        .boxed_unsync()
    }

    /// Counts an allowed upgrade; it stays active while the returned guard lives.
    pub fn upgrade(&self) -> ActiveUpgrade {
        self.upgrades_total.inc();
        self.upgrades_active.inc();
        ActiveUpgrade(self.upgrades_active.clone())
    }

    /// Counts a request the HTTP/1 codec refused with `status` before routing (over the
    /// header limits, ambiguous framing, a version, method, target or transfer coding it does
    /// not take), as Envoy's codec error: a request, a protocol error and the response.
    pub fn refused_by_http1_codec(&self, status: u16) {
        self.refused_http1(status);
        self.cx_protocol_error.inc();
    }

    /// Counts an HTTP/1 request the connection manager refused with `status` before routing
    /// (a `QUERY`): a request and the response, not a protocol error.
    pub fn refused_http1(&self, status: u16) {
        self.rq_total.inc();
        self.rq_http1_total.inc();
        self.response(status);
    }

    /// Counts a response with `status` in its class, in the manager's scope and the
    /// listener's.
    pub fn response(&self, status: u16) {
        self.responses.count(status);
    }
}
