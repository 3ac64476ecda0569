//! The repository stands on its own: no tracked file refers to a path outside the checkout, so
//! a fresh clone with nothing beside it runs its tests, benches and scripts.
//!
//! Flagged, each as `file:line`:
//! - a relative path (`../x`, where the `../` starts a word) that, taken from the file's
//!   directory and from its crate's root (what `CARGO_MANIFEST_DIR` joins start from), never
//!   names something inside the checkout; inside means an existing file or directory, or a
//!   build output under `target/`;
//! - a machine's absolute paths (`/work/`, `/home/`, `/Users/`, `/root/`) in code, scripts, CI
//!   and data files (Markdown and the load bench's reports in `benches/results/` may quote where
//!   a measured tool was installed; `/work/` is flagged there too);
//! - the folder the test data was once read from beside the repository (`shared/corpus`).
//!
//! This file itself is not scanned: it spells out what it looks for.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the proxy crate sits in the workspace")
        .to_path_buf()
}

/// The tracked files (`git ls-files`); outside a git checkout, every file except `target/`
/// and `.git/`.
fn tracked_files(root: &Path) -> Vec<PathBuf> {
    let listed = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output();
    match listed {
        Ok(out) if out.status.success() => String::from_utf8(out.stdout)
            .expect("git ls-files prints UTF-8 paths")
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect(),
        _ => {
            let mut files = Vec::new();
            walk(root, Path::new(""), &mut files);
            files
        }
    }
}

fn walk(root: &Path, dir: &Path, files: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(root.join(dir))
        .unwrap_or_else(|e| panic!("read {}: {e}", root.join(dir).display()));
    for entry in entries {
        let entry = entry.expect("dir entry");
        let rel = dir.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            if rel != Path::new("target") && rel != Path::new(".git") {
                walk(root, &rel, files);
            }
        } else {
            files.push(rel);
        }
    }
}

/// `base` joined with `rel`, `..` applied lexically; `None` when it climbs above `root`.
fn resolve(root: &Path, base: &Path, rel: &str) -> Option<PathBuf> {
    let mut parts: Vec<Component> = base.components().collect();
    for c in Path::new(rel).components() {
        match c {
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            other => parts.push(other),
        }
    }
    let inside: PathBuf = parts.iter().collect();
    let path = root.join(&inside);
    (path.exists() || inside.starts_with("target")).then_some(inside)
}

/// The directory of the nearest `Cargo.toml` at or above `dir` (the checkout's root at worst).
fn crate_root(root: &Path, dir: &Path) -> PathBuf {
    let mut dir = dir.to_path_buf();
    while !dir.as_os_str().is_empty() && !root.join(&dir).join("Cargo.toml").is_file() {
        dir.pop();
    }
    dir
}

/// The relative paths in `line` that start with `../` at the beginning of a word.
fn relative_paths(line: &str) -> Vec<&str> {
    let word_start = |i: usize| {
        line[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || "/._-~".contains(c)))
    };
    line.match_indices("../")
        .filter(|(i, _)| word_start(*i))
        .map(|(i, _)| {
            let rest = &line[i..];
            let end = rest
                .find(|c: char| c.is_whitespace() || "\"'`()[]<>,;|".contains(c))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

const THIS_FILE: &str = "proxy/tests/self_contained.rs";

const MACHINE_PATHS: [&str; 4] = ["/work/", "/home/", "/Users/", "/root/"];

/// Every reference in `file` (relative to `root`) to a path outside the checkout, as
/// `file:line: what`.
fn outside_references(root: &Path, file: &Path, text: &str) -> Vec<String> {
    let dir = file.parent().unwrap_or(Path::new(""));
    let bases = [dir.to_path_buf(), crate_root(root, dir)];
    let is_report =
        file.extension().is_some_and(|e| e == "md") || file.starts_with("benches/results");
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = format!("{}:{}", file.display(), n + 1);
        for rel in relative_paths(line) {
            if bases.iter().all(|b| resolve(root, b, rel).is_none()) {
                found.push(format!("{at}: {rel} is outside the repository"));
            }
        }
        if line.contains("shared/corpus") {
            found.push(format!("{at}: names shared/corpus, outside the repository"));
        }
        for abs in MACHINE_PATHS {
            if line.contains(abs) && (!is_report || abs == "/work/") {
                found.push(format!("{at}: absolute path {abs}"));
            }
        }
    }
    found
}

#[test]
fn no_tracked_file_refers_outside_the_repository() {
    let root = repo_root();
    let files = tracked_files(&root);
    assert!(
        files.iter().any(|f| f == Path::new("proxy/Cargo.toml")),
        "the file list misses proxy/Cargo.toml: {} files under {}",
        files.len(),
        root.display()
    );
    let mut found = Vec::new();
    for file in files.iter().filter(|f| **f != Path::new(THIS_FILE)) {
        let Ok(bytes) = std::fs::read(root.join(file)) else {
            // Listed by git but deleted in the work tree: nothing to check.
            continue;
        };
        if let Ok(text) = String::from_utf8(bytes) {
            found.extend(outside_references(&root, file, &text));
        }
    }
    assert!(
        found.is_empty(),
        "references to paths outside the repository:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_flags_what_it_should() {
    let root = repo_root();
    let test = Path::new("proxy/tests/example.rs");
    let flagged = |line: &str| !outside_references(&root, test, line).is_empty();
    // Put together at run time, so this file holds no such reference itself.
    let up = "../..";
    for bad in [
        format!(r#"join("{up}/shared/corpus/istio")"#),
        format!(r#"const P: &str = "/{}/elsewhere/x.json";"#, "work"),
        format!("cat {up}/../etc/passwd"),
        format!(r#"join("{up}/nothing-here/file")"#),
        format!("see /{}/someone/data", "home"),
    ] {
        assert!(flagged(&bad), "not flagged: {bad}");
    }
    for good in [
        r#"#[path = "../src/main.rs"]"#,
        r#"join("../target/release/revoy")"#,
        r#"Case::get("dots", "/a/../exact")"#,
        r#"include_str!("../../examples/front-proxy.yaml")"#,
    ] {
        assert!(!flagged(good), "flagged: {good}");
    }
}
