//! The record of one request or connection that access logs read (Envoy's "stream info"):
//! times, byte counts, addresses, the response and why it was given. Built only when some
//! access log will read it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;

/// Where a request's latest attempt went: its host, its connection's local address and, over
/// TLS, the two certificates' identities, noted by the upstream pool as soon as the attempt
/// has a connection, so they are known even when the attempt never completes (a route
/// timeout, a client that leaves), as Envoy's access logs and Istio's stats filter know them.
#[derive(Debug, Default)]
pub struct AttemptTarget {
    attempt: Mutex<Option<Attempt>>,
    /// The cluster the router picked.
    cluster: std::sync::OnceLock<Arc<str>>,
    /// The request's bytes on its upstream connections, every attempt's.
    wire: UpstreamWire,
}

/// A request's bytes as they crossed its upstream connections, Envoy's upstream bytes meter
/// (`%UPSTREAM_WIRE_BYTES_*%`, `%UPSTREAM_HEADER_BYTES_*%`): over HTTP/1.1 the request
/// written (request line, headers, body with its chunk framing), every byte read while it was
/// the connection's, and each head's header bytes; over HTTP/2 its frames as Envoy's codec
/// counts them (`upstream/h2_wire.rs`). Attempts add up, as Envoy's router carries the meter
/// from one attempt to the next.
#[derive(Debug, Default)]
pub struct UpstreamWire {
    sent: AtomicU64,
    received: AtomicU64,
    header_sent: AtomicU64,
    header_received: AtomicU64,
}

impl UpstreamWire {
    /// A request head of `head` bytes was written, `headers` of them its header bytes.
    pub fn wrote_head(&self, head: usize, headers: usize) {
        self.sent.fetch_add(head as u64, Ordering::Relaxed);
        self.header_sent
            .fetch_add(headers as u64, Ordering::Relaxed);
    }

    /// `n` bytes of the request's body (with their framing) were written.
    pub fn wrote(&self, n: usize) {
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` bytes were read from the connection while the request was its own.
    pub fn read(&self, n: usize) {
        self.received.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A response head with `headers` header bytes was read.
    pub fn read_head(&self, headers: usize) {
        self.header_received
            .fetch_add(headers as u64, Ordering::Relaxed);
    }

    /// A request head written in pieces ended: `headers` of its bytes were header bytes.
    pub fn wrote_headers(&self, headers: usize) {
        self.header_sent
            .fetch_add(headers as u64, Ordering::Relaxed);
    }

    /// The counts.
    pub(crate) fn bytes(&self) -> WireBytes {
        WireBytes {
            received: self.received.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
            header_received: self.header_received.load(Ordering::Relaxed),
            header_sent: self.header_sent.load(Ordering::Relaxed),
        }
    }
}

/// What [`AttemptTarget`] notes of an attempt: the host, the address its connection reached,
/// the connection's local address and TLS identities.
type Attempt = (
    SocketAddr,
    SocketAddr,
    Option<SocketAddr>,
    Option<Arc<UpstreamSans>>,
);

/// The first URI SANs of an upstream TLS connection's two certificates (empty when a
/// certificate has none).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct UpstreamSans {
    /// The upstream's certificate's.
    pub peer: String,
    /// The one this side presented.
    pub local: String,
}

impl AttemptTarget {
    /// Notes an attempt to `host` on a connection from `local` to `remote` (the host's
    /// address, or one of its additional addresses), with `sans` over TLS.
    pub fn note(
        &self,
        host: SocketAddr,
        remote: SocketAddr,
        local: Option<SocketAddr>,
        sans: Option<&Arc<UpstreamSans>>,
    ) {
        *self.attempt.lock().expect("attempt target lock") =
            Some((host, remote, local, sans.cloned()));
    }

    /// Notes the cluster the router picked for the request (the first noted stays).
    pub fn note_cluster(&self, name: &str) {
        let _ = self.cluster.set(Arc::from(name));
    }

    /// The cluster the router picked.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.get().map(|c| &**c)
    }

    /// The latest attempt's host, the address its connection reached, and its local address.
    pub fn get(&self) -> Option<(SocketAddr, SocketAddr, Option<SocketAddr>)> {
        let at = self.attempt.lock().expect("attempt target lock");
        at.as_ref()
            .map(|(host, remote, local, _)| (*host, *remote, *local))
    }

    /// The meter of the request's bytes on its upstream connections.
    pub fn wire(&self) -> &UpstreamWire {
        &self.wire
    }

    /// The latest attempt's TLS identities (`None` before one, or in plaintext).
    pub fn sans(&self) -> Option<Arc<UpstreamSans>> {
        let at = self.attempt.lock().expect("attempt target lock");
        at.as_ref().and_then(|(_, _, _, sans)| sans.clone())
    }
}

/// Envoy's response flags (`%RESPONSE_FLAGS%`), with their short and long names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResponseFlag {
    /// `LH`: the local health check failed.
    FailedLocalHealthCheck,
    /// `UH`: no healthy upstream host.
    NoHealthyUpstream,
    /// `UT`: the upstream request timed out.
    UpstreamRequestTimeout,
    /// `LR`: reset locally.
    LocalReset,
    /// `UR`: the upstream reset the stream.
    UpstreamRemoteReset,
    /// `UF`: the upstream connection failed.
    UpstreamConnectionFailure,
    /// `UC`: the upstream connection ended.
    UpstreamConnectionTermination,
    /// `UO`: a circuit breaker overflowed.
    UpstreamOverflow,
    /// `NR`: no route (or no filter chain) matched.
    NoRouteFound,
    /// `DI`: a fault filter delayed the request.
    DelayInjected,
    /// `FI`: a fault filter aborted the request.
    FaultInjected,
    /// `RL`: rate limited.
    RateLimited,
    /// `UAEX`: the external authorization service denied the request.
    UnauthorizedExternalService,
    /// `RLSE`: the rate limit service failed.
    RateLimitServiceError,
    /// `DC`: the downstream connection ended before the stream did.
    DownstreamConnectionTermination,
    /// `URX`: the retry (or connect attempt) limit was reached.
    UpstreamRetryLimitExceeded,
    /// `SI`: the stream idle timeout passed.
    StreamIdleTimeout,
    /// `IH`: invalid `x-envoy-*` request headers.
    InvalidEnvoyRequestHeaders,
    /// `DPE`: the downstream broke the HTTP protocol.
    DownstreamProtocolError,
    /// `UMSDR`: the upstream stream reached its maximum duration.
    UpstreamMaxStreamDurationReached,
    /// `RFCF`: answered from cache.
    ResponseFromCacheFilter,
    /// `NFCF`: no filter configuration found.
    NoFilterConfigFound,
    /// `DT`: the request or connection reached its maximum duration.
    DurationTimeout,
    /// `UPE`: the upstream broke the HTTP protocol.
    UpstreamProtocolError,
    /// `NC`: the route's cluster does not exist.
    NoClusterFound,
    /// `OM`: the overload manager ended the request.
    OverloadManager,
    /// `DF`: DNS resolution failed.
    DnsResolutionFailed,
    /// `DO`: dropped by the overload policy.
    DropOverLoad,
    /// `DR`: the downstream reset the stream.
    DownstreamRemoteReset,
}

/// Every flag, in Envoy's table order (what filters name them by).
pub const ALL_FLAGS: [ResponseFlag; 29] = {
    use ResponseFlag::*;
    [
        FailedLocalHealthCheck,
        NoHealthyUpstream,
        UpstreamRequestTimeout,
        LocalReset,
        UpstreamRemoteReset,
        UpstreamConnectionFailure,
        UpstreamConnectionTermination,
        UpstreamOverflow,
        NoRouteFound,
        DelayInjected,
        FaultInjected,
        RateLimited,
        UnauthorizedExternalService,
        RateLimitServiceError,
        DownstreamConnectionTermination,
        UpstreamRetryLimitExceeded,
        StreamIdleTimeout,
        InvalidEnvoyRequestHeaders,
        DownstreamProtocolError,
        UpstreamMaxStreamDurationReached,
        ResponseFromCacheFilter,
        NoFilterConfigFound,
        DurationTimeout,
        UpstreamProtocolError,
        NoClusterFound,
        OverloadManager,
        DnsResolutionFailed,
        DropOverLoad,
        DownstreamRemoteReset,
    ]
};

impl ResponseFlag {
    /// The short name (`UF`).
    pub fn short(self) -> &'static str {
        use ResponseFlag::*;
        match self {
            FailedLocalHealthCheck => "LH",
            NoHealthyUpstream => "UH",
            UpstreamRequestTimeout => "UT",
            LocalReset => "LR",
            UpstreamRemoteReset => "UR",
            UpstreamConnectionFailure => "UF",
            UpstreamConnectionTermination => "UC",
            UpstreamOverflow => "UO",
            NoRouteFound => "NR",
            DelayInjected => "DI",
            FaultInjected => "FI",
            RateLimited => "RL",
            UnauthorizedExternalService => "UAEX",
            RateLimitServiceError => "RLSE",
            DownstreamConnectionTermination => "DC",
            UpstreamRetryLimitExceeded => "URX",
            StreamIdleTimeout => "SI",
            InvalidEnvoyRequestHeaders => "IH",
            DownstreamProtocolError => "DPE",
            UpstreamMaxStreamDurationReached => "UMSDR",
            ResponseFromCacheFilter => "RFCF",
            NoFilterConfigFound => "NFCF",
            DurationTimeout => "DT",
            UpstreamProtocolError => "UPE",
            NoClusterFound => "NC",
            OverloadManager => "OM",
            DnsResolutionFailed => "DF",
            DropOverLoad => "DO",
            DownstreamRemoteReset => "DR",
        }
    }

    /// The long name (`UpstreamConnectionFailure`).
    pub fn long(self) -> &'static str {
        use ResponseFlag::*;
        match self {
            FailedLocalHealthCheck => "FailedLocalHealthCheck",
            NoHealthyUpstream => "NoHealthyUpstream",
            UpstreamRequestTimeout => "UpstreamRequestTimeout",
            LocalReset => "LocalReset",
            UpstreamRemoteReset => "UpstreamRemoteReset",
            UpstreamConnectionFailure => "UpstreamConnectionFailure",
            UpstreamConnectionTermination => "UpstreamConnectionTermination",
            UpstreamOverflow => "UpstreamOverflow",
            NoRouteFound => "NoRouteFound",
            DelayInjected => "DelayInjected",
            FaultInjected => "FaultInjected",
            RateLimited => "RateLimited",
            UnauthorizedExternalService => "UnauthorizedExternalService",
            RateLimitServiceError => "RateLimitServiceError",
            DownstreamConnectionTermination => "DownstreamConnectionTermination",
            UpstreamRetryLimitExceeded => "UpstreamRetryLimitExceeded",
            StreamIdleTimeout => "StreamIdleTimeout",
            InvalidEnvoyRequestHeaders => "InvalidEnvoyRequestHeaders",
            DownstreamProtocolError => "DownstreamProtocolError",
            UpstreamMaxStreamDurationReached => "UpstreamMaxStreamDurationReached",
            ResponseFromCacheFilter => "ResponseFromCacheFilter",
            NoFilterConfigFound => "NoFilterConfigFound",
            DurationTimeout => "DurationTimeout",
            UpstreamProtocolError => "UpstreamProtocolError",
            NoClusterFound => "NoClusterFound",
            OverloadManager => "OverloadManagerTerminated",
            DnsResolutionFailed => "DnsResolutionFailed",
            DropOverLoad => "DropOverload",
            DownstreamRemoteReset => "DownstreamRemoteReset",
        }
    }

    /// The flag with short name `name`.
    pub fn from_short(name: &str) -> Option<ResponseFlag> {
        ALL_FLAGS.into_iter().find(|f| f.short() == name)
    }
}

/// The flags set on a stream, in the order they were set (how Envoy lists them), each once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    set: [Option<ResponseFlag>; 6],
}

impl Flags {
    /// Sets `flag` (a flag already set keeps its place).
    pub fn set(&mut self, flag: ResponseFlag) {
        for slot in &mut self.set {
            match slot {
                Some(f) if *f == flag => return,
                Some(_) => {}
                None => {
                    *slot = Some(flag);
                    return;
                }
            }
        }
    }

    /// Whether `flag` is set.
    pub fn has(&self, flag: ResponseFlag) -> bool {
        self.iter().any(|f| f == flag)
    }

    /// Whether no flag is set.
    pub fn is_empty(&self) -> bool {
        self.set[0].is_none()
    }

    /// The flags in the order they were set.
    pub fn iter(&self) -> impl Iterator<Item = ResponseFlag> + '_ {
        self.set.iter().map_while(|f| *f)
    }

    /// Envoy's rendering: names joined with `,`, `-` when none.
    pub fn render(&self, long: bool) -> String {
        if self.is_empty() {
            return "-".to_owned();
        }
        let names: Vec<&str> = self
            .iter()
            .map(|f| if long { f.long() } else { f.short() })
            .collect();
        names.join(",")
    }
}

/// The downstream side of a connection, as logs see it.
#[derive(Debug, Clone, Default)]
pub struct Downstream {
    /// The client address (the trusted `x-forwarded-for` one when the connection manager
    /// uses it, else the peer).
    pub remote: Option<SocketAddr>,
    /// The TCP peer.
    pub direct_remote: Option<SocketAddr>,
    /// The local address the connection arrived on (the original destination when
    /// redirected).
    pub local: Option<SocketAddr>,
    /// The TLS SNI.
    pub server_name: Option<Arc<str>>,
    /// The connection's filter state (its TLS session, whose principals `istio_authn` sets),
    /// when a log reads it.
    pub filter_state: Option<Arc<dyn crate::filter_state::FilterState>>,
}

/// What a request looked like when it was logged: pseudo-headers and headers.
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    /// `:method`.
    pub method: String,
    /// `:path` (with the query), as sent upstream.
    pub path: String,
    /// `:authority` / `host`.
    pub authority: String,
    /// `:scheme`.
    pub scheme: &'static str,
    /// The other headers.
    pub headers: HeaderMap,
}

/// What waits for an upgraded request's stream to end (its tunnel to close) to act on the
/// settled record then, as Envoy's access-log hooks (Istio's stats filter among them) see an
/// upgrade once its stream ends. Handed to the record through [`Record::at_tunnel_end`].
pub trait AtTunnelEnd: Send + std::fmt::Debug {
    /// The stream ended: `Some` with its settled record, once its tunnel has closed; `None`
    /// when the record never reached a tunnel (the upgrade was refused, or the request cut
    /// short first), so the stream ended with its response.
    fn ended(self: Box<Self>, rec: Option<&Record>);
}

/// One request's or connection's record.
#[derive(Debug)]
pub struct Record {
    /// When the stream started (wall clock).
    pub start_time: SystemTime,
    /// When the stream started (monotonic, for durations).
    pub start: Instant,
    /// When the last request byte arrived.
    pub last_downstream_rx: Option<Instant>,
    /// When the first byte of the upstream's response arrived.
    pub first_upstream_rx: Option<Instant>,
    /// When the stream ended (the last response byte was sent, or it was cut short).
    pub end: Option<Instant>,
    /// `HTTP/1.1`, `HTTP/2`...; `None` for TCP.
    pub protocol: Option<&'static str>,
    /// The downstream connection.
    pub downstream: Downstream,
    /// The request, for `%REQ(..)%` (HTTP only).
    pub request: Option<RequestHead>,
    /// The response status, once known.
    pub response_code: Option<u16>,
    /// The response headers sent.
    pub response_headers: Option<HeaderMap>,
    /// The response trailers sent.
    pub response_trailers: Option<HeaderMap>,
    /// `%RESPONSE_CODE_DETAILS%`.
    pub details: Option<String>,
    /// `%CONNECTION_TERMINATION_DETAILS%`.
    pub termination_details: Option<String>,
    /// Response flags.
    pub flags: Flags,
    /// Request body bytes (HTTP) or bytes from the downstream (TCP).
    pub bytes_received: u64,
    /// Response body bytes (HTTP) or bytes to the downstream (TCP).
    pub bytes_sent: u64,
    /// The stream's bytes as they crossed the downstream connection (HTTP).
    pub downstream_wire: WireBytes,
    /// The request's (or TCP connection's) bytes as they crossed its upstream connections
    /// (zero when it had none); `None` when nothing counted them (a TCP connection tunnelled
    /// over HTTP).
    pub upstream_wire: Option<WireBytes>,
    /// The route's name.
    pub route_name: Option<Arc<str>>,
    /// The upstream cluster chosen.
    pub upstream_cluster: Option<Arc<str>>,
    /// The upstream host of the last attempt.
    pub upstream_host: Option<SocketAddr>,
    /// The local address of the upstream connection.
    pub upstream_local: Option<SocketAddr>,
    /// The address the upstream connection reached, when not the host's own (a host reached
    /// at one of its additional addresses).
    pub upstream_remote: Option<SocketAddr>,
    /// Where the upstream attempts note their host and connection, read by [`Record::settle`]
    /// (so an attempt cut short still shows them).
    pub attempt_target: Option<Arc<AttemptTarget>>,
    /// Why the upstream connection failed (Envoy's transport failure reason).
    pub upstream_transport_failure: Option<String>,
    /// How many upstream attempts were made.
    pub attempts: u32,
    /// Whether the request was a health check (for `not_health_check_filter`).
    pub health_check: bool,
    /// Whether the connection manager traces the request because a service forced it (for
    /// `traceable_filter`).
    pub service_forced_trace: bool,
    /// `%LOCAL_REPLY_BODY%`: the body of the local reply being formatted.
    pub local_reply_body: Option<String>,
    /// The request's dynamic metadata, for `%DYNAMIC_METADATA(..)%` (moved here from the
    /// filters once the request is routed; response filters write it here).
    pub metadata: crate::route::metadata::DynamicMetadata,
    /// Where the flags and wire bytes are published when the record is settled, for
    /// `istio.stats` (which labels its metrics with the flags and records the bytes once the
    /// request ends).
    pub flags_out: Option<Arc<super::FlagsOut>>,
    /// An upgrade's: where what acts once its tunnel closes is handed in (see
    /// [`AtTunnelEnd`]); the tunnel takes it when it writes the record.
    pub at_tunnel_end: Option<tokio::sync::oneshot::Receiver<Box<dyn AtTunnelEnd>>>,
}

/// A stream's bytes as they crossed its connection, Envoy's bytes meter
/// (`%DOWNSTREAM_WIRE_BYTES_*%`, `%DOWNSTREAM_HEADER_BYTES_*%`): HTTP/1's whole message
/// (request or status line, headers, body with its chunk framing), HTTP/2's stream frames
/// with their 9-byte headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireBytes {
    /// Every byte of the stream received.
    pub received: u64,
    /// Every byte of the stream sent.
    pub sent: u64,
    /// The header bytes received.
    pub header_received: u64,
    /// The header bytes sent.
    pub header_sent: u64,
}

/// What a settled record publishes through [`Record::flags_out`].
#[derive(Debug, Clone, Copy)]
pub struct Settled {
    /// The final response flags.
    pub flags: Flags,
    /// The stream's downstream wire bytes.
    pub wire: WireBytes,
}

impl Record {
    /// Fills in, before the record is written, the upstream host and the addresses of the
    /// connection the last attempt noted, where nothing else said them, and the request's
    /// upstream wire bytes: a host already known (a connect failure's) keeps its place, and
    /// takes the addresses only when it is the noted host's. The flags, final now, are
    /// published to [`Record::flags_out`].
    pub fn settle(&mut self) {
        if let Some(t) = &self.attempt_target {
            self.upstream_wire = Some(t.wire.bytes());
        }
        if let Some(out) = &self.flags_out {
            out.publish(Settled {
                flags: self.flags,
                wire: self.downstream_wire,
            });
        }
        let Some((host, remote, local)) = self.attempt_target.as_ref().and_then(|t| t.get()) else {
            return;
        };
        let shown = *self.upstream_host.get_or_insert(host);
        if shown == host {
            if self.upstream_local.is_none() {
                self.upstream_local = local;
            }
            self.upstream_remote.get_or_insert(remote);
        }
    }

    /// A record of a stream starting now.
    pub fn new(downstream: Downstream) -> Record {
        Record {
            start_time: SystemTime::now(),
            start: Instant::now(),
            last_downstream_rx: None,
            first_upstream_rx: None,
            end: None,
            protocol: None,
            downstream,
            request: None,
            response_code: None,
            response_headers: None,
            response_trailers: None,
            details: None,
            termination_details: None,
            flags: Flags::default(),
            bytes_received: 0,
            bytes_sent: 0,
            downstream_wire: WireBytes::default(),
            upstream_wire: Some(WireBytes::default()),
            route_name: None,
            upstream_cluster: None,
            upstream_host: None,
            upstream_remote: None,
            upstream_local: None,
            attempt_target: None,
            upstream_transport_failure: None,
            attempts: 0,
            health_check: false,
            service_forced_trace: false,
            local_reply_body: None,
            metadata: Default::default(),
            flags_out: None,
            at_tunnel_end: None,
        }
    }

    /// `%DURATION%`: start to end.
    pub fn duration(&self) -> Option<Duration> {
        self.end.map(|e| e.saturating_duration_since(self.start))
    }

    /// `%REQUEST_DURATION%`: start to the last request byte.
    pub fn request_duration(&self) -> Option<Duration> {
        self.last_downstream_rx
            .map(|e| e.saturating_duration_since(self.start))
    }

    /// `%RESPONSE_DURATION%`: start to the first upstream response byte.
    pub fn response_duration(&self) -> Option<Duration> {
        self.first_upstream_rx
            .map(|e| e.saturating_duration_since(self.start))
    }

    /// `%RESPONSE_TX_DURATION%`: first upstream response byte to the end.
    pub fn response_tx_duration(&self) -> Option<Duration> {
        let first = self.first_upstream_rx?;
        Some(self.end?.saturating_duration_since(first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_takes_the_noted_attempt_unless_a_later_failure_named_another_host() {
        let (a, b, local): (SocketAddr, SocketAddr, SocketAddr) = (
            "127.0.0.11:80".parse().unwrap(),
            "127.0.0.12:80".parse().unwrap(),
            "127.0.0.19:4000".parse().unwrap(),
        );
        let target = Arc::new(AttemptTarget::default());
        target.note(a, a, Some(local), None);
        let mut cut_short = Record::new(Downstream::default());
        cut_short.attempt_target = Some(target.clone());
        cut_short.settle();
        assert_eq!(
            (cut_short.upstream_host, cut_short.upstream_local),
            (Some(a), Some(local))
        );
        let mut failed_later = Record::new(Downstream::default());
        failed_later.attempt_target = Some(target);
        failed_later.upstream_host = Some(b);
        failed_later.settle();
        assert_eq!(
            (failed_later.upstream_host, failed_later.upstream_local),
            (Some(b), None)
        );
    }

    #[test]
    fn settling_publishes_the_flags_and_wire_bytes_set_until_then() {
        let out = Arc::new(crate::access_log::FlagsOut::default());
        let mut rec = Record::new(Downstream::default());
        rec.flags_out = Some(out.clone());
        rec.flags.set(ResponseFlag::NoHealthyUpstream);
        rec.downstream_wire.sent = 7;
        assert!(out.get().is_none());
        rec.settle();
        let settled = out.get().expect("published");
        assert_eq!(settled.flags.render(false), "UH");
        assert_eq!(settled.wire.sent, 7);
    }

    #[test]
    fn flags_keep_the_order_they_were_set_in_once_each() {
        let mut f = Flags::default();
        assert_eq!(f.render(false), "-");
        f.set(ResponseFlag::UpstreamRetryLimitExceeded);
        f.set(ResponseFlag::UpstreamConnectionFailure);
        f.set(ResponseFlag::UpstreamRetryLimitExceeded);
        assert_eq!(f.render(false), "URX,UF");
        assert_eq!(
            f.render(true),
            "UpstreamRetryLimitExceeded,UpstreamConnectionFailure"
        );
        assert!(f.has(ResponseFlag::UpstreamConnectionFailure));
        assert!(!f.has(ResponseFlag::NoRouteFound));
    }

    #[test]
    fn short_names_are_unique_and_found() {
        for f in ALL_FLAGS {
            assert_eq!(ResponseFlag::from_short(f.short()), Some(f));
        }
        assert_eq!(ResponseFlag::from_short("XX"), None);
    }
}
