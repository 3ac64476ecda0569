//! Rate and connection limits at run time: token buckets, the buckets shared by `share_key`,
//! and the network filters that close connections over a limit.

pub mod http_local;
mod local_limiter;
mod network;
pub mod rls;
mod shared_buckets;
mod token_bucket;

pub use local_limiter::{Decision, LocalLimiter};
pub use network::{Admitted, NetworkLimiters};
pub use shared_buckets::SharedBuckets;
pub use token_bucket::TokenBucket;
