//! Token buckets shared by `share_key`: the network local rate limit filters whose `share_key`
//! and token bucket are equal take from one bucket, as long as one of them is configured
//! (Envoy's shared rate limit singleton).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::{TokenBucket, TokenBucketSpec};

/// The shared buckets in use, by key and bucket.
#[derive(Debug, Default)]
pub struct SharedBuckets(Mutex<HashMap<(String, TokenBucketSpec), Weak<TokenBucket>>>);

impl SharedBuckets {
    /// The bucket for `spec`: a new one when `share_key` is empty, else the one other filters
    /// with that key and bucket hold (made when none does).
    pub fn get(&self, share_key: &str, spec: TokenBucketSpec) -> Arc<TokenBucket> {
        if share_key.is_empty() {
            return Arc::new(TokenBucket::new(spec));
        }
        let mut buckets = self.0.lock().unwrap_or_else(|e| e.into_inner());
        buckets.retain(|_, b| b.strong_count() > 0);
        let key = (share_key.to_owned(), spec);
        if let Some(bucket) = buckets.get(&key).and_then(Weak::upgrade) {
            return bucket;
        }
        let bucket = Arc::new(TokenBucket::new(spec));
        buckets.insert(key, Arc::downgrade(&bucket));
        bucket
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn shares_by_key_and_bucket_while_held() {
        let spec = |max_tokens| TokenBucketSpec {
            max_tokens,
            tokens_per_fill: 1,
            fill_interval: Duration::from_secs(60),
        };
        let shared = SharedBuckets::default();
        let a = shared.get("k", spec(1));
        assert!(Arc::ptr_eq(&a, &shared.get("k", spec(1))));
        assert!(!Arc::ptr_eq(&a, &shared.get("k", spec(2))));
        assert!(!Arc::ptr_eq(&a, &shared.get("", spec(1))));
        assert!(a.try_take());
        drop(a);
        assert!(
            shared.get("k", spec(1)).try_take(),
            "a fresh bucket once none holds it"
        );
    }
}
