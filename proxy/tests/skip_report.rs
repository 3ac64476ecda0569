//! A skip (`support/skip.rs`) shows in a plain `cargo test` run and fails under `CI=true`:
//! this binary runs its own probe test in a child process, with libtest's default output
//! capture, and reads what the child printed.

#[path = "support/skip.rs"]
mod skip;

use std::io::Read as _;
use std::process::{Command, Stdio};

const PROBE: &str = "probe_skips";

/// Set in the child only, so that `--include-ignored` in a CI run does not skip for real.
const PROBE_ENV: &str = "REVOY_SKIP_PROBE";

#[test]
#[ignore = "run by the other tests of this file, in a child process"]
fn probe_skips() {
    if std::env::var_os(PROBE_ENV).is_none() {
        return;
    }
    skip::skip(
        "skip_report::probe_skips",
        "a probe's missing tool",
        "Nothing to install.",
    );
}

/// Runs the probe with `CI` set to `ci` (or unset); returns whether it passed and its stdout
/// and stderr as one stream, in the order they were written.
fn run_probe(ci: Option<&str>) -> (bool, String) {
    let (mut reader, writer) = std::io::pipe().expect("pipe");
    let mut command = Command::new(std::env::current_exe().expect("test executable"));
    command
        .args(["--ignored", "--exact", PROBE, "--test-threads", "1"])
        .env(PROBE_ENV, "1")
        .stdin(Stdio::null())
        .stdout(writer.try_clone().expect("clone pipe"))
        .stderr(writer);
    match ci {
        Some(value) => command.env("CI", value),
        None => command.env_remove("CI"),
    };
    let mut child = command.spawn().expect("run the probe");
    drop(command);
    let mut output = String::new();
    reader.read_to_string(&mut output).expect("read the probe");
    let status = child.wait().expect("wait for the probe");
    (status.success(), output)
}

#[test]
fn a_skip_is_shown_and_counted_after_the_summary() {
    let (passed, output) = run_probe(None);
    assert!(passed, "the probe should pass, as a skip:\n{output}");
    assert!(
        output.contains(
            "### SKIPPED skip_report::probe_skips: a probe's missing tool. Nothing to install."
        ),
        "banner missing:\n{output}"
    );
    let summary = output.find("test result: ok.").expect("libtest's summary");
    let count = output
        .find("SKIPPED 1 (not run; the test result above counts them as passed):")
        .unwrap_or_else(|| panic!("skip count missing:\n{output}"));
    assert!(
        count > summary,
        "the count comes after the summary:\n{output}"
    );
    assert!(
        output[count..].contains("    skip_report::probe_skips (a probe's missing tool)"),
        "the skipped test is not listed:\n{output}"
    );
}

#[test]
fn a_skip_fails_under_ci() {
    let (passed, output) = run_probe(Some("true"));
    assert!(!passed, "the probe should fail under CI=true:\n{output}");
    assert!(
        output.contains("CI=true does not allow skipping"),
        "reason missing:\n{output}"
    );
    assert!(
        !output.contains("SKIPPED 1"),
        "a failed skip is not counted as one:\n{output}"
    );
}
