//! Reading a proxy's admin stats and waiting for a condition, for the differential tests.
//! The test crate declares `support/http1.rs` as `http1` beside this module.
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The value of stat `name` in the `/stats` of the admin on 127.0.0.1:`admin`.
pub fn stat(admin: u16, name: &str) -> Option<u64> {
    let (_, body) = crate::http1::get(None, ([127, 0, 0, 1], admin).into(), "/stats").ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits (at most 10 s, else panics naming `what`) until `cond` holds.
pub fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
