//! Links the release `revoy` binary with its data-path code grouped at the start of `.text`.
//!
//! A sidecar's resident set counts every 64 KiB the kernel maps around each page of code it
//! runs (fault-around), so request-path functions scattered among the configuration code cost
//! megabytes. `link/hot-code.order` lists the functions sampled on the request paths, and
//! `link/startup-code.order` the other functions a sidecar runs from its start until it is
//! configured (how both are made: benches/README.md, "Hot code order"); lld places them first,
//! in that order, so start-up, the resident-set peak, also touches one compact run. Only lld
//! has `--symbol-ordering-file`, and rustc links with its own lld by default only on
//! `x86_64-unknown-linux-gnu`; elsewhere, and in debug builds, the file is not used. Names the
//! build no longer has are skipped silently: a stale list costs memory, never a failed build.

use std::path::{Path, PathBuf};

fn main() {
    let link = Path::new(env!("CARGO_MANIFEST_DIR")).join("link");
    let lists = ["hot-code.order", "startup-code.order"].map(|name| link.join(name));
    let mut order = String::new();
    for list in &lists {
        println!("cargo:rerun-if-changed={}", list.display());
        let names = std::fs::read_to_string(list).unwrap_or_default();
        order += names.trim_end();
        order.push('\n');
    }
    let target = std::env::var("TARGET").unwrap_or_default();
    let profile = std::env::var("PROFILE").unwrap_or_default();
    if target == "x86_64-unknown-linux-gnu" && profile == "release" && !order.trim().is_empty() {
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        let order_file = out.join("code.order");
        std::fs::write(&order_file, order).expect("OUT_DIR is writable");
        println!(
            "cargo:rustc-link-arg-bin=revoy=-Wl,--symbol-ordering-file={}",
            order_file.display()
        );
        println!("cargo:rustc-link-arg-bin=revoy=-Wl,--no-warn-symbol-ordering");
    }
}
