//! A token bucket shared by every worker: lock-free, refilled continuously at
//! `tokens_per_fill / fill_interval` (Envoy's local rate limiters refill the same way), full
//! when made.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A compiled token bucket: it starts full and refills `tokens_per_fill` tokens every
/// `fill_interval`, never above `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketSpec {
    /// `max_tokens`: the bucket's size and its initial content.
    pub max_tokens: u32,
    /// `tokens_per_fill` (default 1).
    pub tokens_per_fill: u32,
    /// `fill_interval`, in whole milliseconds as Envoy reads it.
    pub fill_interval: Duration,
}

/// Slack for the floating-point sums: a token that is there up to rounding counts as there.
const ROUNDING: f64 = 1e-9;

/// A token bucket. The state is one number: the moment (seconds since `start`, as `f64` bits)
/// at which the bucket was empty, so the tokens at `now` are `(now - empty_at) * rate`, capped
/// at `max`, and taking one moves that moment forward by `1 / rate`.
#[derive(Debug)]
pub struct TokenBucket {
    spec: TokenBucketSpec,
    max: f64,
    /// Tokens per second.
    rate: f64,
    start: Instant,
    empty_at: AtomicU64,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(spec: TokenBucketSpec) -> Self {
        let max = f64::from(spec.max_tokens);
        let rate = f64::from(spec.tokens_per_fill) / spec.fill_interval.as_secs_f64();
        TokenBucket {
            spec,
            max,
            rate,
            start: Instant::now(),
            empty_at: AtomicU64::new((-max / rate).to_bits()),
        }
    }

    /// What the bucket was made from.
    pub fn spec(&self) -> &TokenBucketSpec {
        &self.spec
    }

    /// Tokens added per second.
    pub fn fill_rate(&self) -> f64 {
        self.rate
    }

    /// Whole seconds (rounded up) until the bucket has a token again: 0 while it has one.
    pub fn reset_seconds(&self) -> u64 {
        let now = self.start.elapsed().as_secs_f64();
        let tokens = self.tokens_at(f64::from_bits(self.empty_at.load(Ordering::Relaxed)), now);
        if tokens + ROUNDING >= 1.0 {
            return 0;
        }
        ((1.0 - tokens) / self.rate).ceil() as u64
    }

    /// Takes a token if there is one.
    pub fn try_take(&self) -> bool {
        self.take_at(self.start.elapsed().as_secs_f64())
    }

    /// The whole tokens left now.
    pub fn remaining(&self) -> u32 {
        let now = self.start.elapsed().as_secs_f64();
        let tokens = self.tokens_at(f64::from_bits(self.empty_at.load(Ordering::Relaxed)), now);
        (tokens + ROUNDING).floor() as u32
    }

    fn tokens_at(&self, empty_at: f64, now: f64) -> f64 {
        ((now - empty_at) * self.rate).min(self.max)
    }

    fn take_at(&self, now: f64) -> bool {
        let mut current = self.empty_at.load(Ordering::Relaxed);
        loop {
            let empty_at = f64::from_bits(current).max(now - self.max / self.rate);
            if self.tokens_at(empty_at, now) + ROUNDING < 1.0 {
                return false;
            }
            let next = (empty_at + 1.0 / self.rate).to_bits();
            match self.empty_at.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn bucket(max_tokens: u32, tokens_per_fill: u32, secs: u64) -> TokenBucket {
        TokenBucket::new(TokenBucketSpec {
            max_tokens,
            tokens_per_fill,
            fill_interval: Duration::from_secs(secs),
        })
    }

    #[test]
    fn starts_full_and_empties() {
        let b = bucket(3, 3, 3600);
        assert!((0..3).all(|_| b.take_at(0.0)));
        assert!(!b.take_at(0.0));
        assert_eq!(b.remaining(), 0);
    }

    #[test]
    fn refills_at_its_rate_up_to_its_size() {
        let b = bucket(2, 1, 10);
        assert!(b.take_at(0.0) && b.take_at(0.0));
        assert!(!b.take_at(9.9));
        assert!(b.take_at(10.0));
        assert!(!b.take_at(10.0));
        // A long pause fills it to its size, not beyond.
        assert!(b.take_at(1000.0) && b.take_at(1000.0));
        assert!(!b.take_at(1000.0));
    }
}
