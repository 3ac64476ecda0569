//! Links the release `revoy` binary with its data-path code grouped at the start of `.text`.
//!
//! A sidecar's resident set counts every 64 KiB the kernel maps around each page of code it
//! runs (fault-around), so request-path functions scattered among the configuration code cost
//! megabytes. `link/hot-code.order` lists the functions sampled on the request paths (how it is
//! made: benches/README.md, "Hot code order"); lld places them first, in that order. Only lld
//! has `--symbol-ordering-file`, and rustc links with its own lld by default only on
//! `x86_64-unknown-linux-gnu`; elsewhere, and in debug builds, the file is not used. Names the
//! build no longer has are skipped silently: a stale list costs memory, never a failed build.

use std::path::Path;

fn main() {
    let order = Path::new(env!("CARGO_MANIFEST_DIR")).join("link/hot-code.order");
    println!("cargo:rerun-if-changed={}", order.display());
    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    if target == "x86_64-unknown-linux-gnu" && profile == "release" && order.is_file() {
        println!(
            "cargo:rustc-link-arg-bin=revoy=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo:rustc-link-arg-bin=revoy=-Wl,--no-warn-symbol-ordering");
    }
}
