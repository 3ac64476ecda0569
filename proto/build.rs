//! Copies envoy-types' FileDescriptorSet (not exported by the crate) into OUT_DIR, without
//! its source code info (comments and source locations: half the bytes, and nothing revoy
//! reads). The files are cut at the wire level: decoding them into `prost_types` would drop
//! the extensions in their options (`udpa.annotations.sensitive`, which `/config_dump`
//! redaction reads).
//!
//! The crate is pinned (`=0.7.7` in the workspace), so its sources are found in cargo's
//! registry first. `cargo metadata` is the fallback (vendored or path sources); it runs without
//! `--offline` when the offline call fails, because on a fresh machine a partial build (say
//! `cargo run -p revoy`) has not downloaded every package of the workspace yet.
use prost::Message;
use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

const ENVOY_TYPES: &str = "envoy-types-0.7.7";
const TYPES_BIN: &str = "src/generated/types.bin";

/// `$CARGO_HOME/registry/src/<index>/envoy-types-<version>/src/generated/types.bin`.
fn from_registry() -> Option<PathBuf> {
    let home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    fs::read_dir(home.join("registry/src"))
        .ok()?
        .filter_map(Result::ok)
        .map(|index| index.path().join(ENVOY_TYPES).join(TYPES_BIN))
        .find(|p| p.is_file())
}

/// The same file located through `cargo metadata`.
fn from_metadata() -> PathBuf {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = env::var("TARGET").expect("TARGET set by cargo");
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR set by cargo");
    let metadata = |offline: bool| {
        let mut cmd = Command::new(&cargo);
        cmd.args([
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            &target,
        ]);
        if offline {
            cmd.arg("--offline");
        }
        cmd.current_dir(&manifest)
            .output()
            .expect("run cargo metadata")
    };
    let mut out = metadata(true);
    if !out.status.success() {
        out = metadata(false);
    }
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
    manifest_path
        .parent()
        .expect("crate directory")
        .join(TYPES_BIN)
}

fn main() {
    println!("cargo:rerun-if-changed=../Cargo.lock");
    println!("cargo:rerun-if-changed=build.rs");
    let fds = from_registry().unwrap_or_else(from_metadata);
    let bytes = fs::read(&fds).unwrap_or_else(|e| panic!("read {}: {e}", fds.display()));
    let mut set = EncodedSet::decode(bytes.as_slice()).expect("a FileDescriptorSet");
    for file in &mut set.file {
        *file = without_field(file, SOURCE_CODE_INFO);
    }
    let dest = PathBuf::from(env::var("OUT_DIR").unwrap()).join("envoy_types.bin");
    fs::write(&dest, set.encode_to_vec())
        .unwrap_or_else(|e| panic!("write {}: {e}", dest.display()));
}

/// A FileDescriptorSet with its files still encoded.
#[derive(Clone, PartialEq, prost::Message)]
struct EncodedSet {
    #[prost(bytes = "vec", repeated, tag = "1")]
    file: Vec<Vec<u8>>,
}

/// `FileDescriptorProto.source_code_info`.
const SOURCE_CODE_INFO: u64 = 9;

/// `message` (encoded) without its top-level field `number`; every other byte as it was.
fn without_field(message: &[u8], number: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len());
    let mut rest = message;
    while !rest.is_empty() {
        let field = rest;
        let key = varint(&mut rest);
        let len = match key & 7 {
            0 => {
                varint(&mut rest);
                0
            }
            1 => 8,
            2 => usize::try_from(varint(&mut rest)).expect("a length fits usize"),
            5 => 4,
            wire => panic!("wire type {wire} in a FileDescriptorProto"),
        };
        rest = &rest[len..];
        if key >> 3 != number {
            out.extend_from_slice(&field[..field.len() - rest.len()]);
        }
    }
    out
}

/// Reads a varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> u64 {
    let mut value = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first().expect("a complete varint");
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
    }
    value
}
