//! The HTTP local rate limiter: a default token bucket and one per configured descriptor,
//! consumed as Envoy's `LocalRateLimiterImpl` consumes them.

use std::sync::Arc;

use super::{Descriptor, TokenBucket, TokenBucketSpec};

/// The buckets of one local rate limit configuration (shared by every worker, or made per
/// connection).
#[derive(Debug)]
pub struct LocalLimiter {
    default: Option<Arc<TokenBucket>>,
    descriptors: Vec<(Descriptor, Arc<TokenBucket>)>,
    always_consume_default: bool,
}

/// The limiter's answer for one request.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Whether the request may go on.
    pub allowed: bool,
    /// The bucket the `x-ratelimit-*` headers describe: the one that refused, else the
    /// strictest matched descriptor's, else the default one.
    pub bucket: Option<Arc<TokenBucket>>,
}

impl LocalLimiter {
    /// Full buckets for `default` and `descriptors`.
    pub fn new(
        default: Option<TokenBucketSpec>,
        descriptors: &[(Descriptor, TokenBucketSpec)],
        always_consume_default: bool,
    ) -> Self {
        LocalLimiter {
            default: default.map(|s| Arc::new(TokenBucket::new(s))),
            descriptors: descriptors
                .iter()
                .map(|(d, s)| (d.clone(), Arc::new(TokenBucket::new(*s))))
                .collect(),
            always_consume_default,
        }
    }

    /// Takes the tokens of a request with `request` descriptors: each matched descriptor's
    /// bucket, slowest-filling first, until one is empty; then the default bucket when no
    /// descriptor matched or `always_consume_default`.
    pub fn request_allowed(&self, request: &[Descriptor]) -> Decision {
        let mut matched: Vec<&Arc<TokenBucket>> = request
            .iter()
            .filter_map(|r| {
                self.descriptors
                    .iter()
                    .find(|(d, _)| d == r)
                    .map(|(_, b)| b)
            })
            .collect();
        matched.sort_by(|a, b| a.fill_rate().total_cmp(&b.fill_rate()));
        for bucket in &matched {
            if !bucket.try_take() {
                return Decision {
                    allowed: false,
                    bucket: Some(Arc::clone(bucket)),
                };
            }
        }
        let first = matched.first().map(|b| Arc::clone(b));
        if !matched.is_empty() && !self.always_consume_default {
            return Decision {
                allowed: true,
                bucket: first,
            };
        }
        match &self.default {
            None => Decision {
                allowed: true,
                bucket: first,
            },
            Some(default) if !default.try_take() => Decision {
                allowed: false,
                bucket: Some(default.clone()),
            },
            Some(default) => Decision {
                allowed: true,
                bucket: first.or_else(|| Some(default.clone())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn spec(max_tokens: u32) -> TokenBucketSpec {
        TokenBucketSpec {
            max_tokens,
            tokens_per_fill: 1,
            fill_interval: Duration::from_secs(3600),
        }
    }

    fn d(v: &str) -> Descriptor {
        Descriptor(vec![("k".into(), v.into())])
    }

    #[test]
    fn descriptors_then_the_default_bucket() {
        let limiter = LocalLimiter::new(Some(spec(3)), &[(d("a"), spec(1))], true);
        let first = limiter.request_allowed(&[d("a")]);
        assert!(first.allowed);
        assert_eq!(first.bucket.unwrap().spec().max_tokens, 1);
        // The descriptor's bucket is empty: refused without touching the default.
        let refused = limiter.request_allowed(&[d("a")]);
        assert!(!refused.allowed);
        assert_eq!(refused.bucket.unwrap().spec().max_tokens, 1);
        // Unmatched requests take the default's two remaining tokens.
        assert!(limiter.request_allowed(&[d("b")]).allowed);
        assert!(limiter.request_allowed(&[]).allowed);
        assert!(!limiter.request_allowed(&[]).allowed);
    }

    #[test]
    fn a_matched_descriptor_spares_the_default_unless_told() {
        let limiter = LocalLimiter::new(Some(spec(1)), &[(d("a"), spec(5))], false);
        assert!((0..3).all(|_| limiter.request_allowed(&[d("a")]).allowed));
        assert!(limiter.request_allowed(&[]).allowed);
        assert!(!limiter.request_allowed(&[]).allowed);
        let no_default = LocalLimiter::new(None, &[], true);
        assert!(no_default.request_allowed(&[]).allowed);
    }
}
