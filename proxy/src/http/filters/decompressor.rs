//! `envoy.filters.http.decompressor`: request and response bodies whose first
//! `content-encoding` is the filter's codec are decompressed as they stream, and the
//! codec is advertised upstream in `accept-encoding`.

use std::sync::{Arc, OnceLock};

use http::header::{ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH};
use http::{HeaderMap, HeaderValue, Response};

use super::codec::Decompressor;
use super::coded_body::{self, ByteCounters};
use super::{Encoder, Encoders, FilterRequest};
use crate::body::Body;
use crate::config::http_filter::decompressor::{
    DecompressDirection, DecompressorConfig, DecompressorLibrary,
};
use crate::stats::{Counter, Store};

/// One decompressor filter of a connection manager.
#[derive(Debug)]
pub(super) struct Decompress {
    config: Arc<DecompressorConfig>,
    request: Stats,
    response: Stats,
    /// `decompressor_library.*`: the codec's error counters, made (as by Envoy) when the
    /// first body is decompressed; the first one counts a failed body.
    library: OnceLock<Vec<Counter>>,
    store: Store,
    prefix: String,
}

/// The codec's error counters under `decompressor_library.`, the one revoy counts first.
fn library_stats(library: &DecompressorLibrary) -> &'static [&'static str] {
    match library {
        DecompressorLibrary::Gzip { .. } => &[
            "zlib_data_error",
            "zlib_errno",
            "zlib_stream_error",
            "zlib_mem_error",
            "zlib_buf_error",
            "zlib_version_error",
        ],
        DecompressorLibrary::Brotli { .. } => &[
            "brotli_error",
            "brotli_output_overflow",
            "brotli_redundant_input",
        ],
        DecompressorLibrary::Zstd => &[
            "zstd_generic_error",
            "zstd_dictionary_error",
            "zstd_checksum_wrong_error",
            "zstd_memory_error",
        ],
    }
}

/// `<direction>.decompressed`, `.not_decompressed` and the byte totals.
#[derive(Debug)]
struct Stats {
    decompressed: Counter,
    not_decompressed: Counter,
    bytes: ByteCounters,
}

impl Stats {
    fn new(store: &Store, prefix: &str) -> Stats {
        let c = |n: &str| store.counter(&format!("{prefix}{n}"));
        Stats {
            decompressed: c("decompressed"),
            not_decompressed: c("not_decompressed"),
            bytes: ByteCounters {
                uncompressed: c("total_uncompressed_bytes"),
                compressed: c("total_compressed_bytes"),
            },
        }
    }
}

/// One request's decompressor state, kept until its response.
#[derive(Debug)]
pub(super) struct Pending {
    filter: Arc<Decompress>,
}

impl Decompress {
    /// The filter with `config`, its stats under
    /// `http.<stat_prefix>.decompressor.<library name>.<library>.`.
    pub(super) fn new(
        config: &Arc<DecompressorConfig>,
        store: &Store,
        stat_prefix: &str,
    ) -> Decompress {
        let prefix = format!(
            "http.{stat_prefix}.decompressor.{}.{}.",
            config.library_name,
            config.library.stats_name()
        );
        Decompress {
            request: Stats::new(store, &format!("{prefix}request.")),
            response: Stats::new(store, &format!("{prefix}response.")),
            config: config.clone(),
            library: OnceLock::new(),
            store: store.clone(),
            prefix,
        }
    }

    /// Advertises the codec upstream, decompresses the request body when it is encoded with
    /// it, and leaves the state its response is decompressed by.
    pub(super) fn decode(self: &Arc<Self>, req: &mut FilterRequest<'_>, encoders: &mut Encoders) {
        let c = &self.config;
        if c.response.enabled && c.advertise_accept_encoding {
            advertise(req.headers, c.library.encoding());
        }
        if !http_body::Body::is_end_stream(req.body)
            && let Some(codec) = self.start(&c.request, &self.request, req.headers)
        {
            let body = std::mem::replace(req.body, crate::body::empty());
            *req.body =
                coded_body::decompressed(body, codec, self.request.bytes.clone(), self.errors());
        }
        encoders.0.push(Encoder::Decompress(Pending {
            filter: self.clone(),
        }));
    }

    /// The counter of failed bodies (making the library's counters on first use).
    fn errors(&self) -> Counter {
        self.library.get_or_init(|| {
            library_stats(&self.config.library)
                .iter()
                .map(|n| {
                    self.store
                        .counter(&format!("{}decompressor_library.{n}", self.prefix))
                })
                .collect()
        })[0]
            .clone()
    }

    /// The decompressor for a message whose headers allow it (headers updated, counted).
    fn start(
        &self,
        dir: &DecompressDirection,
        stats: &Stats,
        headers: &mut HeaderMap,
    ) -> Option<Decompressor> {
        let encoding = self.config.library.encoding();
        let matches = headers
            .get(CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(',')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .eq_ignore_ascii_case(encoding)
            });
        let no_transform = headers
            .get_all(CACHE_CONTROL)
            .iter()
            .any(|v| crate::wire::has_token(v.as_bytes(), b"no-transform"));
        let codec = (dir.enabled && (dir.ignore_no_transform_header || !no_transform) && matches)
            .then(|| Decompressor::new(&self.config.library).ok())
            .flatten();
        let Some(codec) = codec else {
            stats.not_decompressed.inc();
            return None;
        };
        stats.decompressed.inc();
        headers.remove(CONTENT_LENGTH);
        drop_first_coding(headers);
        Some(codec)
    }
}

impl Pending {
    /// Decompresses `resp` when it is encoded with the filter's codec.
    pub(super) fn encode(&mut self, resp: &mut Response<Body>) {
        if http_body::Body::is_end_stream(resp.body()) {
            return;
        }
        let f = &*self.filter;
        if let Some(codec) = f.start(&f.config.response, &f.response, resp.headers_mut()) {
            let body = std::mem::replace(resp.body_mut(), crate::body::empty());
            *resp.body_mut() =
                coded_body::decompressed(body, codec, f.response.bytes.clone(), f.errors());
        }
    }
}

/// Adds `encoding` to `accept-encoding`, as Envoy's `addEncodingToAcceptEncoding`: the
/// encoding's own entries are replaced by one at the end.
fn advertise(headers: &mut HeaderMap, encoding: &str) {
    let mut kept: Vec<String> = Vec::new();
    for v in headers.get_all(ACCEPT_ENCODING) {
        for token in String::from_utf8_lossy(v.as_bytes()).split(',') {
            let token = token.trim();
            let name = token.split(';').next().unwrap_or_default().trim();
            if !token.is_empty() && !name.eq_ignore_ascii_case(encoding) {
                kept.push(token.to_owned());
            }
        }
    }
    kept.push(encoding.to_owned());
    if let Ok(v) = HeaderValue::from_str(&kept.join(",")) {
        headers.insert(ACCEPT_ENCODING, v);
    }
}

/// Removes the first coding of `content-encoding` (the header, when it was the only one).
fn drop_first_coding(headers: &mut HeaderMap) {
    let Some(all) = headers.get(CONTENT_ENCODING).and_then(|v| v.to_str().ok()) else {
        return;
    };
    let all = all.trim();
    let rest = all.split_once(',').map(|(_, r)| r.trim());
    match rest.and_then(|r| HeaderValue::from_str(r).ok()) {
        Some(v) => {
            headers.insert(CONTENT_ENCODING, v);
        }
        None => {
            headers.remove(CONTENT_ENCODING);
        }
    }
}
