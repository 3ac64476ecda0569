//! Runs Envoy's router_check_tool corpus (`shared/corpus/envoy-router-check`) through
//! `revoy router-check`: every pair passes, and the expected-failure files fail case by case
//! exactly where upstream's test script expects.

use std::path::{Path, PathBuf};
use std::process::Command;

fn corpus() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus/envoy-router-check");
    assert!(
        dir.is_dir(),
        "router-check corpus missing: expected Envoy's router_check test configs in {}",
        dir.display()
    );
    dir
}

/// What `revoy router-check --details` reported: exit success, and `(test name, failure lines)`.
struct Report {
    success: bool,
    tests: Vec<(String, Vec<String>)>,
}

fn check(config: &Path, tests: &Path) -> Report {
    let out = Command::new(env!("CARGO_BIN_EXE_revoy"))
        .arg("router-check")
        .arg("-c")
        .arg(config)
        .arg("-t")
        .arg(tests)
        .arg("--details")
        .output()
        .expect("run revoy router-check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut report = Report {
        success: out.status.success(),
        tests: Vec::new(),
    };
    for line in stdout.lines() {
        let failure = ["expected: ", "actual: ", "invalid header matcher"]
            .iter()
            .any(|p| line.starts_with(p));
        match report.tests.last_mut() {
            Some((_, failures)) if failure => failures.push(line.to_owned()),
            _ if line.starts_with("Current route coverage: ") => {}
            _ => report.tests.push((line.to_owned(), Vec::new())),
        }
    }
    assert!(
        !report.tests.is_empty(),
        "{}: no test output; stderr: {stderr}",
        tests.display()
    );
    report
}

/// Test files that are expected to fail (all cases, or the named ones), with their config.
const FAILURES: &[(&str, &str, Option<&[&str]>)] = &[
    (
        "TestRoutesFailures.golden.proto.json",
        "TestRoutes.yaml",
        None,
    ),
    ("TimeoutFailures.golden.proto.json", "Timeout.yaml", None),
    (
        "RouteMetadata.golden.proto.json",
        "RouteMetadata.yaml",
        Some(&["MetadataValueMismatch", "MetadataNamespaceMissing"]),
    ),
    (
        "Weighted.golden.proto.json",
        "TestRoutes.yaml",
        Some(&["Test_2", "Test_3", "Test_4", "Test_5", "Test_6", "Test_7"]),
    ),
];

#[test]
fn corpus_pairs_pass() {
    let dir = corpus();
    let mut checked = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for tests in entries {
        let name = tests.file_name().unwrap().to_string_lossy().into_owned();
        let Some(stem) = name
            .strip_suffix(".golden.proto.json")
            .or_else(|| name.strip_suffix(".golden.proto.yaml"))
        else {
            continue;
        };
        if FAILURES.iter().any(|(f, _, _)| *f == name) {
            continue;
        }
        let mut configs = vec![dir.join(format!("{stem}.yaml"))];
        if stem == "ClusterHeader" {
            configs.push(dir.join("ClusterHeaderBootstrap.yaml"));
        }
        for config in configs.into_iter().filter(|c| c.is_file()) {
            let report = check(&config, &tests);
            assert!(
                report.success,
                "{name} ({}) exited with failure",
                config.display()
            );
            for (test, failures) in &report.tests {
                assert!(
                    failures.is_empty(),
                    "{name} ({}) {test}: {failures:?}",
                    config.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} router-check pairs found");
}

#[test]
fn expected_failures_fail() {
    let dir = corpus();
    let mut checked = 0;
    for (tests, config, failing) in FAILURES {
        let (tests, config) = (dir.join(tests), dir.join(config));
        if !tests.is_file() || !config.is_file() {
            continue;
        }
        let report = check(&config, &tests);
        assert!(!report.success, "{} should fail", tests.display());
        for (test, failures) in &report.tests {
            let should_fail = failing.is_none_or(|names| names.contains(&test.as_str()));
            assert_eq!(
                !failures.is_empty(),
                should_fail,
                "{} {test}: {failures:?}",
                tests.display()
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 2,
        "expected-failure files missing from the corpus"
    );
}

#[test]
fn main_exit_codes() {
    let dir = corpus();
    let arg = |p: &str| dir.join(p).display().to_string();
    let ok = vec![
        "-c".into(),
        arg("Timeout.yaml"),
        "-t".into(),
        arg("Timeout.golden.proto.json"),
    ];
    assert_eq!(revoy::router_check::main(ok.clone()), 0);
    let mut under = ok;
    under.extend(["--fail-under".into(), "101".into()]);
    assert_eq!(revoy::router_check::main(under), 1);
    let bad = vec![
        "-c".into(),
        arg("Timeout.yaml"),
        "-t".into(),
        arg("TimeoutFailures.golden.proto.json"),
    ];
    assert_eq!(revoy::router_check::main(bad), 1);
}
