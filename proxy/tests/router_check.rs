//! Runs Envoy's router_check_tool test configs (`tests/data/envoy-router-check`, see
//! `tests/data/PROVENANCE.md`) through `revoy router-check`: every pair passes, and the
//! expected-failure files fail case by case exactly where upstream's test script expects.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn corpus() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/envoy-router-check");
    assert!(
        dir.is_dir(),
        "router-check corpus missing: expected Envoy's router_check test configs in {}",
        dir.display()
    );
    dir
}

/// Passing pairs in the corpus: one per test file outside `FAILURES`, and `ClusterHeader`'s
/// tests run a second time against the Bootstrap that carries the same routes.
const PASSING_PAIRS: usize = 12;

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
    ("TimeoutFailures.golden.proto.json", "Timeout.yaml", None),
    (
        "RouteMetadata.golden.proto.json",
        "RouteMetadata.yaml",
        Some(&["MetadataValueMismatch", "MetadataNamespaceMissing"]),
    ),
];

#[test]
fn corpus_pairs_pass() {
    let dir = corpus();
    let mut checked = 0;
    let mut entries: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    let mut unused: BTreeSet<&str> = entries.iter().map(String::as_str).collect();
    for (tests, config, _) in FAILURES {
        unused.remove(tests);
        unused.remove(config);
    }
    for name in &entries {
        let Some(stem) = name
            .strip_suffix(".golden.proto.json")
            .or_else(|| name.strip_suffix(".golden.proto.yaml"))
        else {
            continue;
        };
        if FAILURES.iter().any(|(f, _, _)| f == name) {
            continue;
        }
        let tests = dir.join(name);
        let mut configs = vec![format!("{stem}.yaml")];
        if stem == "ClusterHeader" {
            configs.push("ClusterHeaderBootstrap.yaml".to_owned());
        }
        unused.remove(name.as_str());
        for config in configs {
            unused.remove(config.as_str());
            let config = dir.join(config);
            assert!(
                config.is_file(),
                "{name}: its route config {} is missing",
                config.display()
            );
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
    assert!(unused.is_empty(), "corpus files no test uses: {unused:?}");
    assert_eq!(checked, PASSING_PAIRS, "router-check pairs run");
}

#[test]
fn expected_failures_fail() {
    let dir = corpus();
    for (tests, config, failing) in FAILURES {
        let (tests, config) = (dir.join(tests), dir.join(config));
        for file in [&tests, &config] {
            assert!(file.is_file(), "{} is missing", file.display());
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
    }
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
