//! Building the revoy binary the benchmark measures: a plain release build, or a
//! profile-guided one (an instrumented build is run on a training load, its profile merged with
//! the `llvm-profdata` of rustc's own LLVM, then the release build is redone with the profile).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a build's artifacts go, under the workspace's `target/`.
const INSTRUMENTED_DIR: &str = "target/pgo-generate";
const OPTIMIZED_DIR: &str = "target/pgo";

/// `cargo build --release -p revoy --bin revoy`, with `flag` added to the rustflags of the
/// environment (not to those of cargo config files, which any environment rustflags override),
/// into `target_dir` (`None`: cargo's default); returns the binary's path.
fn cargo_build(
    root: &Path,
    flag: Option<&str>,
    target_dir: Option<&str>,
) -> Result<PathBuf, String> {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    command
        .args(["build", "--release", "-p", "revoy", "--bin", "revoy"])
        .current_dir(root);
    if let Some(flag) = flag {
        // The encoded form (flags separated by 0x1f) takes precedence over RUSTFLAGS and keeps
        // a path with spaces in one flag.
        let mut flags: Vec<String> = match std::env::var("CARGO_ENCODED_RUSTFLAGS") {
            Ok(encoded) => encoded.split('\x1f').map(str::to_owned).collect(),
            Err(_) => std::env::var("RUSTFLAGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
        };
        flags.retain(|f| !f.is_empty());
        flags.push(flag.to_owned());
        command
            .env_remove("RUSTFLAGS")
            .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
    }
    if let Some(dir) = target_dir {
        command.env("CARGO_TARGET_DIR", root.join(dir));
    }
    let status = command.status().map_err(|e| format!("cargo: {e}"))?;
    if !status.success() {
        let with = flag.map_or(String::new(), |f| format!(" with {f}"));
        return Err(format!("cargo build --release -p revoy{with} failed"));
    }
    Ok(root
        .join(target_dir.unwrap_or("target"))
        .join("release/revoy"))
}

/// The plain release build.
pub fn plain(root: &Path) -> Result<PathBuf, String> {
    cargo_build(root, None, None)
}

/// A profile-guided build in progress: the instrumented binary and where its runs write their
/// raw profiles.
pub struct Instrumented {
    /// The instrumented revoy binary, to run on the training load.
    pub binary: PathBuf,
    raw: PathBuf,
    profdata_tool: PathBuf,
}

/// Builds the instrumented binary (after checking that a matching `llvm-profdata` exists, so a
/// missing tool fails before minutes of building), then empties its raw profile directory:
/// build scripts compiled with the same flags write profiles there while it builds.
pub fn instrumented(root: &Path) -> Result<Instrumented, String> {
    let profdata_tool = llvm_profdata()?;
    let raw = root.join(INSTRUMENTED_DIR).join("profiles");
    let binary = cargo_build(
        root,
        Some(&format!("-Cprofile-generate={}", raw.display())),
        Some(INSTRUMENTED_DIR),
    )?;
    let _ = fs::remove_dir_all(&raw);
    fs::create_dir_all(&raw).map_err(|e| format!("{}: {e}", raw.display()))?;
    Ok(Instrumented {
        binary,
        raw,
        profdata_tool,
    })
}

impl Instrumented {
    /// Merges the raw profiles the training wrote (its revoy processes must have exited) and
    /// rebuilds revoy with them; returns the optimized binary.
    pub fn optimize(self, root: &Path) -> Result<PathBuf, String> {
        let raws: Vec<PathBuf> = fs::read_dir(&self.raw)
            .map_err(|e| format!("{}: {e}", self.raw.display()))?
            .filter_map(|entry| Some(entry.ok()?.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "profraw"))
            .collect();
        if raws.is_empty() {
            return Err(format!(
                "the training run wrote no profile under {}",
                self.raw.display()
            ));
        }
        let merged = self.raw.join("merged.profdata");
        let status = Command::new(&self.profdata_tool)
            .arg("merge")
            .arg("-o")
            .arg(&merged)
            .args(&raws)
            .status()
            .map_err(|e| format!("{}: {e}", self.profdata_tool.display()))?;
        if !status.success() {
            return Err(format!("{} merge failed", self.profdata_tool.display()));
        }
        // Named by content: cargo rebuilds when RUSTFLAGS change, not when a file they name does.
        let bytes = fs::read(&merged).map_err(|e| format!("{}: {e}", merged.display()))?;
        let profile = root
            .join(INSTRUMENTED_DIR)
            .join(format!("revoy-{:016x}.profdata", fnv1a(&bytes)));
        fs::rename(&merged, &profile).map_err(|e| format!("{}: {e}", profile.display()))?;
        let binary = cargo_build(
            root,
            Some(&format!("-Cprofile-use={}", profile.display())),
            Some(OPTIMIZED_DIR),
        )?;
        remove_other_profiles(&profile);
        Ok(binary)
    }
}

/// Deletes the merged profiles of earlier builds beside `kept`.
fn remove_other_profiles(kept: &Path) {
    let Some(dir) = kept.parent() else { return };
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(|e| Some(e.ok()?.path())) {
        if path != kept && path.extension().is_some_and(|e| e == "profdata") {
            let _ = fs::remove_file(path);
        }
    }
}

/// 64-bit FNV-1a: a content fingerprint for file names.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// An `llvm-profdata` of rustc's LLVM major version (profiles are not readable across LLVM
/// versions): rustup's `llvm-tools` component, or a system one.
fn llvm_profdata() -> Result<PathBuf, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = |args: &[&str]| -> Result<String, String> {
        Command::new(&rustc)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .map_err(|e| format!("{rustc}: {e}"))
    };
    let version = output(&["-vV"])?;
    let major = llvm_major(&version).ok_or("rustc -vV names no LLVM version")?;
    let host = version
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .unwrap_or_default()
        .to_owned();
    let sysroot = output(&["--print", "sysroot"])?;
    let candidates = [
        Path::new(sysroot.trim()).join(format!("lib/rustlib/{host}/bin/llvm-profdata")),
        PathBuf::from(format!("llvm-profdata-{major}")),
        PathBuf::from(format!("/usr/lib/llvm-{major}/bin/llvm-profdata")),
        PathBuf::from("llvm-profdata"),
    ];
    candidates
        .into_iter()
        .find(|tool| {
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| llvm_major(&String::from_utf8_lossy(&o.stdout)) == Some(major))
        })
        .ok_or_else(|| {
            format!(
                "profile-guided build needs llvm-profdata for LLVM {major}, rustc's \
                 (rustup component add llvm-tools, or Debian: apt-get install llvm-{major}); \
                 or pass --no-pgo"
            )
        })
}

/// The major version in a `LLVM version: 22.1.2` line (rustc -vV and llvm-profdata --version).
fn llvm_major(text: &str) -> Option<u32> {
    let rest = &text[text.find("LLVM version")? + "LLVM version".len()..];
    let digits: String = rest
        .trim_start_matches([':', ' '])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_from_rustc_and_profdata() {
        let rustc =
            "rustc 1.95.0\nbinary: rustc\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.2\n";
        assert_eq!(llvm_major(rustc), Some(22));
        let tool = "Ubuntu LLVM version 14.0.6\n  Optimized build.\n";
        assert_eq!(llvm_major(tool), Some(14));
        assert_eq!(llvm_major("no version here"), None);
    }

    #[test]
    fn fingerprint_tells_contents_apart() {
        assert_ne!(fnv1a(b"profile a"), fnv1a(b"profile b"));
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
