//! Writes the LDS fuzz target's Istio seeds: each of the real sidecar listeners istiod sent
//! (`benches/data/istio-listeners.json`, origin in `benches/data/PROVENANCE.md`) as the
//! protobuf bytes of a `Listener`, one file per listener, into the directory given. With them
//! the mutations reach the filters and transport sockets istiod emits (connection managers
//! with RBAC, fault and CORS, Istio's own filters, TLS contexts, listener filters) rather than
//! what one hand-written listener has.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --bin istio_seeds -- fuzz/corpus/xds_lds`

use std::path::PathBuf;

use proto::pb::envoy::config::listener::v3::Listener;
use proto::{Codec, Format};
use prost::Message;
use serde_json::Value;

fn main() {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .expect("usage: istio_seeds <output directory>"),
    );
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/data/istio-listeners.json");
    let text = std::fs::read_to_string(path).expect("the Istio listeners are in the repository");
    let Value::Array(listeners) = Codec::parse_text(&text, Format::Json).expect("JSON") else {
        panic!("{path}: expected an array of listeners");
    };
    std::fs::create_dir_all(&out).expect("create the output directory");
    let codec = Codec::new();
    for (i, value) in listeners.into_iter().enumerate() {
        let listener: Listener = codec
            .decode(value, false)
            .unwrap_or_else(|e| panic!("listener {i}: {e}"))
            .message;
        let file = out.join(format!("istio-{i:03}"));
        std::fs::write(&file, listener.encode_to_vec())
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    }
}
