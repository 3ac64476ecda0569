//! Copies envoy-types' FileDescriptorSet (not exported by the crate) into OUT_DIR.
use std::{env, fs, path::PathBuf, process::Command};

fn main() {
    println!("cargo:rerun-if-changed=../Cargo.lock");
    println!("cargo:rerun-if-changed=build.rs");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = env::var("TARGET").expect("TARGET set by cargo");
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR set by cargo");
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &target,
        ])
        .current_dir(&manifest)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let pkg = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "envoy-types")
        .expect("envoy-types in the dependency graph");
    let manifest_path = PathBuf::from(pkg["manifest_path"].as_str().expect("manifest_path"));
    let fds = manifest_path
        .parent()
        .unwrap()
        .join("src/generated/types.bin");
    let dest = PathBuf::from(env::var("OUT_DIR").unwrap()).join("envoy_types.bin");
    fs::copy(&fds, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", fds.display()));
}
