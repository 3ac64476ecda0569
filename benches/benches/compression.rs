//! What the compressor filter's gzip costs: the load bench's 64 KiB JSON response body compressed
//! with Envoy's default gzip settings (level 6, window bits 12) through revoy's codec, in
//! the 16 KiB data frames an upstream read hands it, each flushed (as Envoy flushes at the
//! end of every data frame), the stream finished with the last one. Throughput is per byte
//! of input, so criterion's MiB/s gives the µs per MiB.

use std::hint::black_box;

use benches::upstream::json_body;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use revoy::config::http_filter::compressor::{Gzip, Library};
use revoy::http::filters::codec::Compressor;

fn gzip(c: &mut Criterion) {
    let body = json_body();
    let library = Library::Gzip(Gzip::default());
    let mut group = c.benchmark_group("compression");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("gzip 64 KiB in 16 KiB frames, Envoy's defaults", |b| {
        b.iter(|| {
            let mut codec = Compressor::new(&library).expect("gzip compressor");
            let mut out = 0;
            let frames: Vec<&[u8]> = body.chunks(16 * 1024).collect();
            for (i, frame) in frames.iter().enumerate() {
                let last = i + 1 == frames.len();
                out += codec
                    .compress(black_box(frame), last)
                    .expect("compresses")
                    .len();
            }
            out
        })
    });
    group.finish();
}

criterion_group!(benches, gzip);
criterion_main!(benches);
