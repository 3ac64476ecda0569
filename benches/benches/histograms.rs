//! What a proxied request's histograms cost on the data path: the three values a request
//! records (`upstream_rq_time` of its cluster and its `external.` twin, the connection
//! manager's `downstream_rq_time`), on a worker's own shard; and a stats flush merging them.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use revoy::stats::Store;
use revoy::stats::histogram::enter_worker;

fn record(c: &mut Criterion) {
    let store = Store::new();
    store.set_workers(1);
    enter_worker(0);
    static CLUSTER: [&str; 2] = ["upstream_rq_time", "upstream_cx_connect_ms"];
    let cluster = store.histogram_block("cluster.backend.", &CLUSTER);
    let external = store.histogram("cluster.backend.external.upstream_rq_time");
    let downstream = store.histogram("http.ingress.downstream_rq_time");
    let mut ms = 0u64;
    c.bench_function("histograms: one request's three values", |b| {
        b.iter(|| {
            // Latencies spread over three decades, as real traffic is.
            ms = (ms + 7) % 1500;
            let v = black_box(ms);
            cluster.get(0).record(v);
            external.record(v);
            downstream.record(v + 1);
        })
    });
    c.bench_function("histograms: flush of 3 used histograms", |b| {
        b.iter(|| store.flush_histograms())
    });
}

criterion_group!(benches, record);
criterion_main!(benches);
