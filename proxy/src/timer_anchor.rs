//! Keeps a timer armed on every worker runtime so that arming a request's timer does not make
//! the worker wake itself.
//!
//! tokio's timer wheel wakes its runtime's driver (a `write(2)` to an eventfd, then an extra
//! `epoll_wait` return) whenever a timer is registered that expires before the driver's
//! planned wake-up. The planned wake-up is computed when the driver parks, and is "never" when
//! the wheel was empty then. On a busy worker whose in-flight requests all finished before it
//! parked, every new request's route timeout then paid that wake: one extra syscall per
//! request. With an anchor timer always pending at most [`PERIOD`] ahead, the planned wake-up
//! is never further than that, so longer timers register silently.

use std::time::Duration;

/// How far ahead the anchor timer is set; timers shorter than this still wake the driver.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Re-arms the anchor timer forever; run it as the worker thread's `block_on` future.
pub async fn hold() {
    loop {
        tokio::time::sleep(PERIOD).await;
    }
}
