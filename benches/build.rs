//! Names revoy's binary for the mesh benchmark (`src/bin/mesh.rs`), which reuses the revoy
//! package's pods harness (`proxy/tests/istio_pods/`): that harness finds revoy through
//! `CARGO_BIN_EXE_revoy`, which cargo sets only for the revoy package's own tests. This crate
//! gets the same value: revoy's binary in the profile directory this crate is built into
//! (`target/release/revoy` for `cargo run --release`), which the benchmark builds or checks.

use std::path::Path;

fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    let profile = Path::new(&out)
        .ancestors()
        .nth(3)
        .expect("OUT_DIR is under the profile directory");
    println!(
        "cargo:rustc-env=CARGO_BIN_EXE_revoy={}",
        profile.join("revoy").display()
    );
    println!("cargo:rerun-if-changed=build.rs");
}
