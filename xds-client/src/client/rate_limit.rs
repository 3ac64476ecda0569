//! The token bucket that limits the requests sent to the control plane.

use std::time::{Duration, Instant};

/// Rate limit of the requests sent on the ADS stream (Envoy's `rate_limit_settings`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Bucket size: requests that may be sent in a burst.
    pub max_tokens: u32,
    /// Tokens added per second.
    pub fill_rate: f64,
}

impl Default for RateLimit {
    /// Envoy's defaults: 100 tokens, 10 per second.
    fn default() -> Self {
        RateLimit {
            max_tokens: 100,
            fill_rate: 10.0,
        }
    }
}

/// A token bucket, full at start.
#[derive(Debug)]
pub(super) struct TokenBucket {
    limit: RateLimit,
    tokens: f64,
    filled_at: Instant,
}

impl TokenBucket {
    pub(super) fn new(limit: RateLimit) -> Self {
        TokenBucket {
            limit,
            tokens: f64::from(limit.max_tokens),
            filled_at: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.filled_at).as_secs_f64();
        self.tokens =
            (self.tokens + elapsed * self.limit.fill_rate).min(f64::from(self.limit.max_tokens));
        self.filled_at = now;
    }

    /// Takes a token if there is one; otherwise says how long until there is.
    pub(super) fn take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        if self.limit.fill_rate <= 0.0 {
            // A bucket that never refills would stall the stream forever: wait a second and
            // try again, as if one token a second were added.
            return Err(Duration::from_secs(1));
        }
        Err(Duration::from_secs_f64(
            (1.0 - self.tokens) / self.limit.fill_rate,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_wait_for_refill() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(RateLimit {
            max_tokens: 2,
            fill_rate: 4.0,
        });
        assert_eq!(bucket.take(start), Ok(()));
        assert_eq!(bucket.take(start), Ok(()));
        let wait = bucket.take(start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(250));
        assert_eq!(bucket.take(start + wait), Ok(()));
        // Never more than max_tokens after a long idle time.
        let later = start + Duration::from_secs(60);
        assert_eq!(bucket.take(later), Ok(()));
        assert_eq!(bucket.take(later), Ok(()));
        assert!(bucket.take(later).is_err());
    }
}
