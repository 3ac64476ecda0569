//! Skipping (part of) a test whose environment is missing (Envoy, root, iptables, wrk, ...) so
//! that the skip shows in `cargo test`'s output: libtest keeps what a passing test prints with
//! `print!`/`eprintln!` to itself, so the banner is written to the process's stderr directly
//! (libtest captures only the print macros), and once libtest has printed its summary the
//! binary counts its skips and lists them again. Under `CI=true` a skip fails the test instead.

use std::io::Write as _;
use std::sync::Mutex;

/// What this test binary skipped so far, one entry per skip.
static SKIPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records that `what` (a test, or the named part of one) does not run because `missing` is
/// not there; `hint` says how to provide it. Panics under `CI=true`.
pub fn skip(what: &str, missing: &str, hint: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{what}: {missing}, and CI=true does not allow skipping. {hint}"
    );
    let banner = format!("\n### SKIPPED {what}: {missing}. {hint}\n");
    let _ = std::io::stderr().write_all(banner.as_bytes());
    let mut skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    if skipped.is_empty() {
        // SAFETY: `summary` is an `extern "C" fn()` that does not unwind.
        unsafe { libc::atexit(summary) };
    }
    skipped.push(format!("{what} ({missing})"));
}

/// Runs at exit, after libtest's `test result:` line: the number of skips, and each one.
extern "C" fn summary() {
    let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    let mut report = format!(
        "\nSKIPPED {} (not run; the test result above counts them as passed):\n",
        skipped.len()
    );
    for entry in skipped.iter() {
        report.push_str(&format!("    {entry}\n"));
    }
    let _ = std::io::stderr().write_all(report.as_bytes());
}
