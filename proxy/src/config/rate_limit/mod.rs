//! The HTTP rate limit filters' configurations: `local_ratelimit` ([`local`]) and the rate
//! limit service's `ratelimit` ([`service`]).

pub mod local;
pub mod service;
