//! Bootstrap parse and compile of the largest Istio golden bootstrap
//! (`secure_metrics_golden.json`, what pilot-agent renders as `envoy-rev.json`).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use proto::pb::envoy::config::bootstrap::v3::Bootstrap;
use proto::{Codec, Format};
use revoy::config::Warnings;
use revoy::config::bootstrap::compile_bootstrap;

const GOLDEN: &str = "/work/shared/corpus/istio/pkg/bootstrap/testdata/secure_metrics_golden.json";

fn decode(codec: &Codec, text: &str) -> Bootstrap {
    let value = Codec::parse_text(text, Format::Json).expect("golden parses as JSON");
    codec
        .decode::<Bootstrap>(value, false)
        .expect("golden decodes as a Bootstrap")
        .message
}

fn bootstrap(c: &mut Criterion) {
    let text = std::fs::read_to_string(GOLDEN).expect("the Istio corpus is present");
    let codec = Codec::new();
    let parsed = decode(&codec, &text);
    c.bench_function("bootstrap/decode istio secure_metrics golden", |b| {
        b.iter(|| decode(&codec, black_box(&text)))
    });
    c.bench_function("bootstrap/compile istio secure_metrics golden", |b| {
        b.iter(|| {
            let mut warnings = Warnings::new();
            compile_bootstrap(black_box(&parsed), &mut warnings).expect("golden compiles")
        })
    });
}

criterion_group!(benches, bootstrap);
criterion_main!(benches);
