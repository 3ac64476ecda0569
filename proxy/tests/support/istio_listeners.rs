//! The listeners istiod sent (`benches/data/istio-listeners.json`, origin in
//! `benches/data/PROVENANCE.md`), for the tests that replay or mutate them.

use proto::{Codec, Format};
use serde_json::Value;

/// The listeners istiod sends: the file's named ones (its two nameless ones, on 15090 and
/// 15021, are the bootstrap's static listeners, never sent over LDS).
pub fn corpus() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../benches/data/istio-listeners.json"
    );
    let text = std::fs::read_to_string(path).expect("the Istio listeners are in the repository");
    match Codec::parse_text(&text, Format::Json).expect("JSON") {
        Value::Array(items) => items
            .into_iter()
            .filter(|l| l.get("name").is_some())
            .collect(),
        _ => panic!("expected an array of listeners"),
    }
}
