//! A rate limit descriptor: what a request is counted by.

/// A rate limit descriptor: its `(key, value)` entries in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Descriptor(pub Vec<(String, String)>);
