//! xDS decode and compile of 129 real Istio sidecar listeners
//! (`data/istio-listeners.json`, a JSON array of `Listener`s in proto3 JSON; where it comes
//! from: `data/PROVENANCE.md`).
//!
//! Measures, for all 129 listeners at once: building the JSON codec for the document, proto3
//! JSON decode (text parse + `@type` Any handling + transcode), binary protobuf decode (what an
//! xDS `DiscoveryResponse` carries), and `compile_listener`. Listeners revoy cannot compile are
//! listed with their errors before the measurements.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use prost::Message;
use proto::pb::envoy::config::listener::v3::Listener;
use proto::{Codec, Format};
use revoy::config::listener::compile_listener;
use revoy::config::{Context, SystemIo, Warnings};
use serde_json::Value;

const LISTENER: &str = "envoy.config.listener.v3.Listener";

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/istio-listeners.json")
}

fn parse(text: &str) -> Vec<Value> {
    match Codec::parse_text(text, Format::Json).expect("the corpus is JSON") {
        Value::Array(items) => items,
        other => panic!("expected a JSON array of listeners, got {}", kind(&other)),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "an object",
        Value::Array(_) => "an array",
        _ => "a scalar",
    }
}

fn decode_all(codec: &Codec, text: &str) -> Vec<Listener> {
    parse(text)
        .into_iter()
        .map(|v| {
            codec
                .decode::<Listener>(v, false)
                .expect("corpus listener decodes")
                .message
        })
        .collect()
}

/// Compiles every listener; returns how many compiled, the failures as `name: error`, and
/// the distinct warning messages (without their field path) with how often each occurred.
fn compile_report(listeners: &[Listener]) -> (usize, Vec<String>, BTreeMap<String, usize>) {
    let mut ok = 0;
    let mut failures = Vec::new();
    let mut distinct = BTreeMap::new();
    for l in listeners {
        let mut warnings = Warnings::new();
        let result = compile_listener(&Context::new(&SystemIo), l, None, &mut warnings);
        for w in &warnings {
            *distinct.entry(w.message.clone()).or_insert(0) += 1;
        }
        match result {
            Ok(_) => ok += 1,
            Err(e) => failures.push(format!("{}: {e}", l.name)),
        }
    }
    (ok, failures, distinct)
}

fn listeners(c: &mut Criterion) {
    let path = corpus();
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let document = Value::Array(parse(&text));
    let codec = Codec::for_document(LISTENER, &document);
    let decoded = decode_all(&codec, &text);
    let binary: Vec<Vec<u8>> = decoded.iter().map(Message::encode_to_vec).collect();
    let total_bytes: usize = binary.iter().map(Vec::len).sum();
    let (ok, failures, warnings) = compile_report(&decoded);
    eprintln!(
        "listeners: {} decoded ({} bytes JSON, {total_bytes} bytes protobuf); {ok} compile, {} fail",
        decoded.len(),
        text.len(),
        failures.len()
    );
    for f in &failures {
        eprintln!("  compile failure: {f}");
    }
    for (w, n) in &warnings {
        eprintln!("  compile warning (x{n}): {w}");
    }

    let mut group = c.benchmark_group(format!("listeners/istio pr-37071 x{}", decoded.len()));
    group.bench_function("codec for_document", |b| {
        b.iter(|| Codec::for_document(LISTENER, black_box(&document)))
    });
    group.bench_function("decode proto3 JSON", |b| {
        b.iter(|| decode_all(&codec, black_box(&text)))
    });
    group.bench_function("decode protobuf", |b| {
        b.iter(|| {
            binary
                .iter()
                .map(|bytes| Listener::decode(black_box(bytes.as_slice())).expect("round trip"))
                .collect::<Vec<_>>()
        })
    });
    group.bench_function("compile_listener", |b| {
        b.iter(|| {
            black_box(&decoded)
                .iter()
                .map(|l| {
                    let mut warnings = Warnings::new();
                    compile_listener(&Context::new(&SystemIo), l, None, &mut warnings).is_ok()
                })
                .filter(|ok| *ok)
                .count()
        })
    });
    group.finish();
}

criterion_group!(benches, listeners);
criterion_main!(benches);
