//! Why an upstream request or connection failed, with Envoy's reset-reason wording.

use std::net::SocketAddr;

/// Envoy's transport failure reason for a connection whose TLS context's SDS secrets have not
/// arrived.
pub const SECRETS_NOT_READY: &str = "TLS_error: Secret is not supplied by SDS";

/// A failure to get a response (or a connection) from a cluster.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The cluster has no host to send to.
    #[error("no healthy upstream")]
    NoHealthyUpstream,
    /// A circuit breaker (max_requests / max_connections) is open.
    #[error("upstream overflow")]
    Overflow,
    /// The TCP connection could not be established (refused, unreachable, ...).
    #[error("connect to {host} failed: {source}")]
    ConnectFailure {
        /// The host tried.
        host: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The socket could not be bound to the cluster's source address (one of another IP
    /// version than the host's, say): a local connection failure.
    #[error("connect to {host} failed: cannot bind to {source_address}: {source}")]
    BindFailure {
        /// The host tried.
        host: SocketAddr,
        /// The source address.
        source_address: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// No connection was attempted: the host's transport socket is one revoy does not
    /// implement (upstream TLS), and it is never replaced by plaintext.
    #[error("connection to {host} refused: {reason}")]
    TransportRefused {
        /// The host picked.
        host: SocketAddr,
        /// Why.
        reason: crate::config::upstream_transport::Refusal,
    },
    /// The TLS handshake with the host failed.
    #[error("TLS handshake with {host} failed: {reason}")]
    TlsFailure {
        /// The host tried.
        host: SocketAddr,
        /// Envoy's transport failure reason (`TLS_error:...`).
        reason: String,
    },
    /// The host's TLS context lacks an SDS secret (its `initial_fetch_timeout` passed without
    /// it): the TCP connection was closed before a byte was sent, as Envoy's transport socket
    /// for a context whose secrets are not ready closes it.
    #[error("connection to {host} closed: {}", SECRETS_NOT_READY)]
    SecretsNotReady {
        /// The host tried.
        host: SocketAddr,
    },
    /// The TCP connection did not complete within `connect_timeout`.
    #[error("connect to {host} timed out")]
    ConnectTimeout {
        /// The host tried.
        host: SocketAddr,
    },
    /// The downstream request body broke (e.g. invalid chunked framing) before the response
    /// head: a downstream protocol error, which Envoy's codec answers with 400.
    #[error("request body failed: {detail}")]
    RequestBody {
        /// The body's error, for logs.
        detail: String,
    },
    /// The connection or stream ended before a complete response head arrived.
    #[error("upstream {host} reset: {reason}")]
    Reset {
        /// The host used.
        host: SocketAddr,
        /// Why.
        reason: ResetReason,
        /// The underlying error, for logs.
        detail: String,
    },
}

/// Envoy's stream reset reasons that an upstream can cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// The connection closed before the response head.
    ConnectionTermination,
    /// The peer reset the stream (HTTP/2 RST_STREAM).
    RemoteReset,
    /// The peer refused the stream (HTTP/2 REFUSED_STREAM).
    RemoteRefusedStreamReset,
    /// The response could not be parsed.
    ProtocolError,
}

impl ResetReason {
    /// Envoy's text for the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::ConnectionTermination => "connection termination",
            ResetReason::RemoteReset => "remote reset",
            ResetReason::RemoteRefusedStreamReset => "remote refused stream reset",
            ResetReason::ProtocolError => "protocol error",
        }
    }
}

impl ResetReason {
    /// Envoy's response flag for a stream reset for this reason (its router's
    /// `streamResetReasonToResponseFlag`).
    pub fn response_flag(self) -> &'static str {
        match self {
            ResetReason::RemoteReset | ResetReason::RemoteRefusedStreamReset => "UR",
            ResetReason::ProtocolError => "UPE",
            ResetReason::ConnectionTermination => "UC",
        }
    }

    /// Why an upstream response body failed with `e` after its head came: an HTTP/2 stream
    /// reset by the peer, or by h2 for what the peer sent; an HTTP/1.1 body cut short by the connection's close or broken
    /// framing (a protocol error to Envoy's codec); else the connection ended.
    pub fn of_body_error(e: &(dyn std::error::Error + 'static)) -> ResetReason {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(h2) = err.downcast_ref::<h2::Error>() {
                return ResetReason::of_h2(h2);
            }
            if let Some(h1) = err.downcast_ref::<super::h1::BodyError>() {
                return match h1 {
                    super::h1::BodyError::Io(_) => ResetReason::ConnectionTermination,
                    _ => ResetReason::ProtocolError,
                };
            }
            cur = err.source();
        }
        ResetReason::ConnectionTermination
    }

    /// An HTTP/2 stream's end: refused by the peer (REFUSED_STREAM, or a GOAWAY whose last
    /// stream is below it: h2 gives a stream the GOAWAY's error only then, and those it
    /// processed the connection's close) or reset by it; reset (or its connection closed)
    /// by h2 itself for what the peer sent (malformed response headers, a body longer than
    /// its `content-length`, a frame the protocol forbids), which Envoy 1.40's codec calls a
    /// protocol error (`UPE`, not `LR`); else the connection ended.
    fn of_h2(h2: &h2::Error) -> ResetReason {
        match h2.reason() {
            Some(h2::Reason::REFUSED_STREAM) => ResetReason::RemoteRefusedStreamReset,
            Some(_) if h2.is_remote() && h2.is_go_away() => ResetReason::RemoteRefusedStreamReset,
            Some(_) if h2.is_remote() && !h2.is_go_away() => ResetReason::RemoteReset,
            Some(h2::Reason::NO_ERROR | h2::Reason::CANCEL) => ResetReason::ConnectionTermination,
            Some(_) if h2.is_library() => ResetReason::ProtocolError,
            _ => ResetReason::ConnectionTermination,
        }
    }

    /// Envoy's `%RESPONSE_CODE_DETAILS%` for a reset after the response head:
    /// `upstream_reset_after_response_started{remote_reset}`.
    pub fn details_after_response_started(self) -> String {
        format!(
            "upstream_reset_after_response_started{{{}}}",
            self.as_str().replace(' ', "_")
        )
    }
}

impl std::fmt::Display for ResetReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl UpstreamError {
    /// Whether nothing was sent because no connection could be asked for: no healthy host, or a
    /// circuit breaker full. Envoy finds both while routing, from the request head alone.
    pub fn not_started(&self) -> bool {
        matches!(
            self,
            UpstreamError::NoHealthyUpstream | UpstreamError::Overflow
        )
    }

    /// Envoy's reset reason text (`remote connection failure`, `connection timeout`, ...);
    /// `None` for "no healthy upstream" and a broken request body, which are not resets.
    pub fn reset_reason(&self) -> Option<&'static str> {
        match self {
            UpstreamError::NoHealthyUpstream | UpstreamError::RequestBody { .. } => None,
            UpstreamError::Overflow => Some("overflow"),
            UpstreamError::ConnectFailure { .. }
            | UpstreamError::TlsFailure { .. }
            | UpstreamError::SecretsNotReady { .. } => Some("remote connection failure"),
            UpstreamError::ConnectTimeout { .. } => Some("connection timeout"),
            UpstreamError::TransportRefused { .. } | UpstreamError::BindFailure { .. } => {
                Some("local connection failure")
            }
            UpstreamError::Reset { reason, .. } => Some(reason.as_str()),
        }
    }

    /// The body of Envoy's local reply for this failure (status 503), e.g.
    /// `upstream connect error or disconnect/reset before headers. reset reason: remote connection failure`.
    /// A failed handshake's body names its transport failure reason; a connection closed for
    /// want of SDS secrets names none (Envoy 1.40 answers so).
    pub fn local_reply_body(&self) -> String {
        match (self, self.reset_reason()) {
            (UpstreamError::RequestBody { .. }, _) => "Bad Request".to_owned(),
            (UpstreamError::TransportRefused { reason, .. }, Some(r)) => format!(
                "upstream connect error or disconnect/reset before headers. reset reason: {r}, transport failure reason: {reason}"
            ),
            (UpstreamError::TlsFailure { reason, .. }, Some(r)) => format!(
                "upstream connect error or disconnect/reset before headers. reset reason: {r}, transport failure reason: {reason}"
            ),
            (_, None) => "no healthy upstream".to_owned(),
            (_, Some(r)) => {
                format!(
                    "upstream connect error or disconnect/reset before headers. reset reason: {r}"
                )
            }
        }
    }

    /// Envoy's response flag for access logs (`UH`, `UF`, `UO`, `UC`, `UR`, `UPE`, `DPE`), as
    /// Envoy's router maps a stream reset reason to a flag.
    pub fn response_flag(&self) -> &'static str {
        match self {
            UpstreamError::NoHealthyUpstream => "UH",
            UpstreamError::RequestBody { .. } => "DPE",
            UpstreamError::Overflow => "UO",
            UpstreamError::ConnectFailure { .. }
            | UpstreamError::BindFailure { .. }
            | UpstreamError::ConnectTimeout { .. }
            | UpstreamError::TlsFailure { .. }
            | UpstreamError::SecretsNotReady { .. }
            | UpstreamError::TransportRefused { .. } => "UF",
            UpstreamError::Reset { reason, .. } => reason.response_flag(),
        }
    }

    /// Envoy's transport failure reason (`%UPSTREAM_TRANSPORT_FAILURE_REASON%`): the socket
    /// error of a failed connect (`delayed connect error: Connection refused`) or the TLS
    /// error.
    pub fn transport_failure_reason(&self) -> Option<String> {
        match self {
            UpstreamError::ConnectFailure { source, .. } => {
                Some(format!("delayed connect error: {}", os_error_text(source)))
            }
            UpstreamError::BindFailure {
                source_address,
                source,
                ..
            } => Some(format!(
                "failed to bind to {source_address}: {}",
                os_error_text(source)
            )),
            UpstreamError::TlsFailure { reason, .. } => Some(reason.clone()),
            UpstreamError::TransportRefused { reason, .. } => Some(reason.to_string()),
            UpstreamError::SecretsNotReady { .. } => Some(SECRETS_NOT_READY.to_owned()),
            _ => None,
        }
    }

    /// The host involved, if one was picked.
    pub fn host(&self) -> Option<SocketAddr> {
        match self {
            UpstreamError::ConnectFailure { host, .. }
            | UpstreamError::BindFailure { host, .. }
            | UpstreamError::TlsFailure { host, .. }
            | UpstreamError::ConnectTimeout { host }
            | UpstreamError::TransportRefused { host, .. }
            | UpstreamError::SecretsNotReady { host }
            | UpstreamError::Reset { host, .. } => Some(*host),
            _ => None,
        }
    }

    /// The local reply status: 400 for a broken request body (Envoy's codec), 502 for an
    /// upstream protocol error (e.g. response headers over the limit), else 503.
    pub fn local_reply_status(&self) -> http::StatusCode {
        match self {
            UpstreamError::RequestBody { .. } => http::StatusCode::BAD_REQUEST,
            UpstreamError::Reset {
                reason: ResetReason::ProtocolError,
                ..
            } => http::StatusCode::BAD_GATEWAY,
            _ => http::StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Classifies a hyper client error seen on `host`.
    pub(crate) fn from_hyper(host: SocketAddr, e: &hyper::Error) -> Self {
        if e.is_user() {
            // The only user errors a proxied request meets: its body stream failed.
            return UpstreamError::RequestBody {
                detail: e.to_string(),
            };
        }
        let reason = if e.is_parse() {
            ResetReason::ProtocolError
        } else if let Some(h2) = find_h2(e) {
            ResetReason::of_h2(h2)
        } else {
            ResetReason::ConnectionTermination
        };
        UpstreamError::Reset {
            host,
            reason,
            detail: e.to_string(),
        }
    }
}

/// A socket error's text without Rust's ` (os error N)` suffix, as Envoy words it.
fn os_error_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.split_once(" (os error") {
        Some((t, _)) => t.to_owned(),
        None => text,
    }
}

/// The HTTP/2 error `e` is or stems from.
fn find_h2<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e h2::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return Some(h2);
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_reply_bodies_use_envoys_words() {
        let host: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let refused = UpstreamError::ConnectFailure {
            host,
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(
            refused.local_reply_body(),
            "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
        );
        assert_eq!(
            UpstreamError::NoHealthyUpstream.local_reply_body(),
            "no healthy upstream"
        );
        assert_eq!(
            UpstreamError::ConnectTimeout { host }.reset_reason(),
            Some("connection timeout")
        );
        assert_eq!(UpstreamError::Overflow.response_flag(), "UO");
    }
}
