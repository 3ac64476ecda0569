//! Jittered exponential back-off between reconnection attempts.

use std::time::Duration;

use rand::Rng;

/// Reconnection back-off: the delay before attempt `n` is drawn uniformly from
/// `[0, min(base * 2^n, max)]` (Envoy's `JitteredExponentialBackOffStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first ceiling.
    pub base: Duration,
    /// The largest ceiling.
    pub max: Duration,
}

impl Default for Backoff {
    /// Envoy's defaults for the xDS gRPC stream: 500 ms, then up to 30 s.
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

/// The attempts made since the last reset.
#[derive(Debug)]
pub(super) struct Attempts {
    backoff: Backoff,
    attempt: u32,
}

impl Attempts {
    pub(super) fn new(backoff: Backoff) -> Self {
        Attempts {
            backoff,
            attempt: 0,
        }
    }

    /// The ceiling of the next delay, without jitter.
    fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt).unwrap_or(u32::MAX);
        self.backoff
            .base
            .checked_mul(factor)
            .unwrap_or(self.backoff.max)
            .min(self.backoff.max)
    }

    /// The delay before the next attempt; grows the ceiling.
    pub(super) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        if ceiling < self.backoff.max {
            self.attempt += 1;
        }
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }

    /// Starts over from `base` (after a stream that received a response).
    pub(super) fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_up_to_max_and_resets() {
        let mut attempts = Attempts::new(Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_millis(350),
        });
        let mut ceilings = Vec::new();
        for _ in 0..5 {
            ceilings.push(attempts.ceiling());
            assert!(attempts.next_delay() <= *ceilings.last().unwrap());
        }
        let ms: Vec<u128> = ceilings.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 350, 350, 350]);
        attempts.reset();
        assert_eq!(attempts.ceiling(), Duration::from_millis(100));
    }
}
