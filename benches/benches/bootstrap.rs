//! Bootstrap parse and compile of the largest Istio golden bootstrap
//! (`secure_metrics_golden.json`, what pilot-agent renders as `envoy-rev.json`; one of the
//! goldens in `proxy/tests/data/istio-bootstrap`, see `proxy/tests/data/PROVENANCE.md`).

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use proto::pb::envoy::config::bootstrap::v3::Bootstrap;
use proto::{Codec, Format};
use revoy::config::bootstrap::compile_bootstrap;
use revoy::config::{Context, SystemIo, Warnings};

const GOLDEN: &str = "../proxy/tests/data/istio-bootstrap/secure_metrics_golden.json";

fn decode(codec: &Codec, text: &str) -> Bootstrap {
    let value = Codec::parse_text(text, Format::Json).expect("golden parses as JSON");
    codec
        .decode::<Bootstrap>(value, false)
        .expect("golden decodes as a Bootstrap")
        .message
}

fn bootstrap(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let codec = Codec::new();
    let parsed = decode(&codec, &text);
    c.bench_function("bootstrap/decode istio secure_metrics golden", |b| {
        b.iter(|| decode(&codec, black_box(&text)))
    });
    c.bench_function("bootstrap/compile istio secure_metrics golden", |b| {
        b.iter(|| {
            let mut warnings = Warnings::new();
            compile_bootstrap(&Context::new(&SystemIo), black_box(&parsed), &mut warnings)
                .expect("golden compiles")
        })
    });
}

criterion_group!(benches, bootstrap);
criterion_main!(benches);
