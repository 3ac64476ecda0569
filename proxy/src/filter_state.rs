//! A connection's filter state: the named values a network filter sets on a connection for
//! later filters, RBAC and access logs to read. revoy's only ones are `istio_authn`'s two
//! principals. A leaf module, so that config/ (which checks keys), tls/ (which derives the
//! values) and access_log/ (which renders them) share it without importing each other.

/// The filter-state key of the peer's principal.
pub const PEER_PRINCIPAL: &str = "io.istio.peer_principal";

/// The filter-state key of this side's principal.
pub const LOCAL_PRINCIPAL: &str = "io.istio.local_principal";

/// Every key a revoy filter sets.
pub const KEYS: [&str; 2] = [PEER_PRINCIPAL, LOCAL_PRINCIPAL];

/// What holds a connection's filter state (its TLS session, for `istio_authn`).
pub trait FilterState: std::fmt::Debug + Send + Sync {
    /// The value of `key`, when the connection has one.
    fn filter_state(&self, key: &str) -> Option<&str>;
}
