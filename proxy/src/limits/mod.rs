//! Rate limit state at run time, apart from configuration: token buckets (shared by every
//! worker), the buckets network rate limits share by `share_key`, the HTTP local rate
//! limiter's default and descriptor buckets, and what the HTTP local rate limit reports.

mod descriptor;
mod local_limiter;
mod shared_buckets;
mod token_bucket;

pub use descriptor::Descriptor;
pub use local_limiter::{Decision, LocalLimiter};
pub use shared_buckets::SharedBuckets;
pub use token_bucket::{TokenBucket, TokenBucketSpec};
