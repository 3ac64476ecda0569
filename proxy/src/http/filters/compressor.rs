//! `envoy.filters.http.compressor`: response bodies (and, when configured, request bodies)
//! compressed as they stream, with the encoding negotiated from the request's
//! `accept-encoding` among all compressor filters of the chain, as Envoy chooses it.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, ETAG,
    TRANSFER_ENCODING, VARY,
};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use super::codec::Compressor;
use super::coded_body::{self, ByteCounters};
use super::{Encoder, Encoders, FilterRequest};
use crate::body::Body;
use crate::config::http_filter::compressor::{
    CompressorConfig, CompressorPerRouteConfig, Direction,
};
use crate::stats::{Counter, Store};

/// One compressor filter of a connection manager.
#[derive(Debug)]
pub(super) struct Compress {
    config: Arc<CompressorConfig>,
    response: DirectionStats,
    request: DirectionStats,
    header: HeaderStats,
}

/// `compressed`, `not_compressed`, byte totals and `content_length_too_small` of one
/// direction.
#[derive(Debug)]
struct DirectionStats {
    compressed: Counter,
    not_compressed: Counter,
    bytes: ByteCounters,
    content_length_too_small: Counter,
}

/// The response-only stats: what `accept-encoding` said, and ETags that stopped compression.
#[derive(Debug)]
struct HeaderStats {
    no_accept_header: Counter,
    header_identity: Counter,
    header_compressor_used: Counter,
    header_compressor_overshadowed: Counter,
    header_wildcard: Counter,
    header_not_valid: Counter,
    not_compressed_etag: Counter,
}

impl DirectionStats {
    fn new(store: &Store, prefix: &str) -> DirectionStats {
        let c = |n: &str| store.counter(&format!("{prefix}{n}"));
        DirectionStats {
            compressed: c("compressed"),
            not_compressed: c("not_compressed"),
            bytes: ByteCounters {
                uncompressed: c("total_uncompressed_bytes"),
                compressed: c("total_compressed_bytes"),
            },
            content_length_too_small: c("content_length_too_small"),
        }
    }
}

/// The compressor filters that saw a request, in chain order, and the encoding the first
/// of them to see the response chose for all (Envoy's `CompressorRegistry` and cached
/// `EncodingDecision`).
#[derive(Debug, Default)]
pub(super) struct Registry {
    filters: Vec<Arc<CompressorConfig>>,
    decision: Option<Decision>,
}

/// The encoding chosen for a response, and how `accept-encoding` led to it.
#[derive(Debug, Clone)]
struct Decision {
    encoding: String,
    stat: HeaderStat,
}

#[derive(Debug, Clone, Copy)]
enum HeaderStat {
    NotValid,
    Identity,
    Wildcard,
    ValidCompressor,
}

/// One request's compressor state, kept until its response.
#[derive(Debug)]
pub(super) struct Pending {
    filter: Arc<Compress>,
    /// The request's `accept-encoding`.
    accept_encoding: Option<String>,
    /// Whether responses are compressed here (the route's override, else the filter's).
    enabled: bool,
    /// A HEAD request: its response has no body.
    head: bool,
}

impl Compress {
    /// The filter with `config`, its stats under
    /// `http.<stat_prefix>.compressor.<library name>.<library>.`.
    pub(super) fn new(
        config: &Arc<CompressorConfig>,
        store: &Store,
        stat_prefix: &str,
    ) -> Compress {
        let prefix = format!(
            "http.{stat_prefix}.compressor.{}.{}.",
            config.library_name,
            config.library.stats_name()
        );
        let response_prefix = if config.response.own_section {
            format!("{prefix}response.")
        } else {
            prefix.clone()
        };
        let c = |n: &str| store.counter(&format!("{prefix}{n}"));
        Compress {
            response: DirectionStats::new(store, &response_prefix),
            request: DirectionStats::new(store, &format!("{prefix}request.")),
            header: HeaderStats {
                no_accept_header: c("no_accept_header"),
                header_identity: c("header_identity"),
                header_compressor_used: c("header_compressor_used"),
                header_compressor_overshadowed: c("header_compressor_overshadowed"),
                header_wildcard: c("header_wildcard"),
                header_not_valid: c("header_not_valid"),
                not_compressed_etag: c("not_compressed_etag"),
            },
            config: config.clone(),
        }
    }

    /// Notes the request's `accept-encoding` (removing it when configured), compresses its
    /// body when the request direction is configured and allows it, and leaves the state
    /// its response is compressed by.
    pub(super) fn decode(
        self: &Arc<Self>,
        req: &mut FilterRequest<'_>,
        route: Option<&CompressorPerRouteConfig>,
        encoders: &mut Encoders,
    ) {
        let accept_encoding = joined(req.headers, &ACCEPT_ENCODING);
        let response = &self.config.response;
        let runtime = &req.conn.shared.runtime;
        let (enabled, remove_accept) = match route {
            Some(CompressorPerRouteConfig::Disabled) => (false, false),
            Some(CompressorPerRouteConfig::Overrides {
                response_enabled,
                remove_accept_encoding_header,
            }) => (
                response_enabled.unwrap_or_else(|| runtime.flag(&response.common.enabled)),
                remove_accept_encoding_header.unwrap_or(response.remove_accept_encoding_header),
            ),
            None => (
                runtime.flag(&response.common.enabled),
                response.remove_accept_encoding_header,
            ),
        };
        if enabled && remove_accept {
            req.headers.remove(ACCEPT_ENCODING);
        }
        self.decode_request_body(req);
        encoders.1.filters.push(self.config.clone());
        encoders.0.push(Encoder::Compress(Pending {
            filter: self.clone(),
            accept_encoding,
            enabled,
            head: req.method == http::Method::HEAD,
        }));
    }

    /// Compresses the request body when the request direction allows it.
    fn decode_request_body(&self, req: &mut FilterRequest<'_>) {
        let body_follows = !http_body::Body::is_end_stream(req.body);
        let compress = match &self.config.request {
            Some(dir) => {
                req.conn.shared.runtime.flag(&dir.enabled)
                    && body_follows
                    && !is_upgrade(req.headers)
                    && min_length(dir, req.headers, &self.request)
                    && type_allowed(dir, req.headers)
                    && !req.headers.contains_key(CONTENT_ENCODING)
                    && self.transfer_encoding_allowed(req.headers)
            }
            None => false,
        };
        if !compress {
            self.request.not_compressed.inc();
            return;
        }
        let Ok(codec) = Compressor::new(&self.config.library) else {
            self.request.not_compressed.inc();
            return;
        };
        req.headers.remove(CONTENT_LENGTH);
        req.headers.insert(
            CONTENT_ENCODING,
            HeaderValue::from_static(self.config.library.encoding()),
        );
        self.request.compressed.inc();
        let body = std::mem::replace(req.body, crate::body::empty());
        *req.body = coded_body::compressed(body, codec, self.request.bytes.clone());
    }

    /// Whether `transfer-encoding` names no compression already applied.
    fn transfer_encoding_allowed(&self, headers: &HeaderMap) -> bool {
        const CODINGS: [&[u8]; 5] = [b"gzip", b"br", b"deflate", b"compress", b"zstd"];
        let own = self.config.library.encoding().as_bytes();
        !headers.get_all(TRANSFER_ENCODING).iter().any(|v| {
            crate::wire::tokens(v.as_bytes()).any(|t| {
                CODINGS
                    .iter()
                    .chain([&own])
                    .any(|c| t.eq_ignore_ascii_case(c))
            })
        })
    }
}

impl Pending {
    /// Compresses `resp` when everything allows it, as Envoy's `encodeHeaders` decides.
    pub(super) fn encode(&mut self, resp: &mut Response<Body>, registry: &mut Registry) {
        let f = &*self.filter;
        let dir = &f.config.response;
        let status = resp.status();
        let headers = resp.headers();
        let ends_at_head = self.head
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
            || http_body::Body::is_end_stream(resp.body());
        let enabled_and_long = self.enabled && min_length(&dir.common, headers, &f.response);
        let compressible = enabled_and_long
            && !is_upgrade(headers)
            && !dir.uncompressible_response_codes.contains(&status.as_u16())
            && type_allowed(&dir.common, headers)
            && !has_no_transform(headers)
            && self.etag_allowed(headers)
            && !headers.contains_key(CONTENT_ENCODING);
        let compress = !ends_at_head
            && self.accept_encoding_allowed(enabled_and_long, headers, registry)
            && compressible
            && f.transfer_encoding_allowed(headers);
        let codec = compress
            .then(|| Compressor::new(&f.config.library).ok())
            .flatten();
        let headers = resp.headers_mut();
        match codec {
            Some(codec) => {
                sanitize_etag(headers, dir.weaken_etag_on_compress);
                headers.remove(CONTENT_LENGTH);
                headers.insert(
                    CONTENT_ENCODING,
                    HeaderValue::from_static(f.config.library.encoding()),
                );
                f.response.compressed.inc();
                let body = std::mem::replace(resp.body_mut(), crate::body::empty());
                *resp.body_mut() = coded_body::compressed(body, codec, f.response.bytes.clone());
            }
            None => f.response.not_compressed.inc(),
        }
        if compressible {
            insert_vary(resp.headers_mut());
        }
    }

    /// Whether an ETag lets the response be compressed (counting `not_compressed_etag`).
    fn etag_allowed(&self, headers: &HeaderMap) -> bool {
        let allowed =
            !(self.filter.config.response.disable_on_etag_header && headers.contains_key(ETAG));
        if !allowed {
            self.filter.header.not_compressed_etag.inc();
        }
        allowed
    }

    /// Whether the request accepts this filter's encoding: the chain's decision, made by
    /// the first compressor filter to see the response and counted by each.
    fn accept_encoding_allowed(
        &self,
        maybe: bool,
        headers: &HeaderMap,
        registry: &mut Registry,
    ) -> bool {
        if !maybe {
            return false;
        }
        let h = &self.filter.header;
        let Some(accept) = self.accept_encoding.as_deref() else {
            h.no_accept_header.inc();
            return false;
        };
        let decision = registry
            .decision
            .get_or_insert_with(|| choose(accept, headers, &registry.filters))
            .clone();
        let ours = self
            .filter
            .config
            .library
            .encoding()
            .eq_ignore_ascii_case(&decision.encoding);
        match decision.stat {
            HeaderStat::ValidCompressor if ours => h.header_compressor_used.inc(),
            HeaderStat::ValidCompressor => h.header_compressor_overshadowed.inc(),
            HeaderStat::Identity => h.header_identity.inc(),
            HeaderStat::Wildcard => h.header_wildcard.inc(),
            HeaderStat::NotValid => h.header_not_valid.inc(),
        }
        ours
    }
}

/// Envoy's choice of encoding: among the chain's compressors whose content types allow the
/// response (the first filter per encoding), the accepted one with the highest q-value;
/// `*` picks the first registered; ties go to a `choose_first` filter.
fn choose(accept: &str, headers: &HeaderMap, filters: &[Arc<CompressorConfig>]) -> Decision {
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .filter(|v| !v.is_empty());
    // encoding -> (registration order, choose_first), ordered by name as Envoy's std::map.
    let mut allowed: BTreeMap<String, (u32, bool)> = BTreeMap::new();
    let mut count = 0;
    for f in filters {
        let types = &f.response.common.content_types;
        if let Some(ct) = &content_type
            && !types.is_empty()
            && !types.contains(ct)
        {
            continue;
        }
        let encoding = f.library.encoding().to_owned();
        if let std::collections::btree_map::Entry::Vacant(e) = allowed.entry(encoding) {
            e.insert((count, f.choose_first));
            count += 1;
        }
    }
    let mut pairs: Vec<(&str, f32)> = Vec::new();
    for token in accept.split(',').filter(|t| !t.is_empty()) {
        let (name, params) = match token.split_once(';') {
            Some((n, p)) => (n.trim(), Some(p)),
            None => (token.trim(), None),
        };
        let mut q = 1.0f32;
        if let Some((key, value)) = params.and_then(|p| p.split_once('='))
            && key.trim().eq_ignore_ascii_case("q")
        {
            match value.trim().parse::<f32>() {
                Ok(v) => q = v,
                Err(_) => continue,
            }
        }
        pairs.push((name, q));
        if q == 0.0 {
            allowed.remove(name);
        }
    }
    let not_valid = || Decision {
        encoding: "identity".to_owned(),
        stat: HeaderStat::NotValid,
    };
    if pairs.is_empty() || allowed.is_empty() {
        return not_valid();
    }
    let mut choice = ("identity", 0.0f32);
    for &(name, q) in &pairs {
        if allowed.contains_key(name) || name == "identity" || name == "*" {
            // Envoy reads the map with operator[], which adds a missing key.
            let wins = q > choice.1
                || (q == choice.1 && allowed.entry(name.to_owned()).or_insert((0, false)).1);
            if wins {
                choice = (name, q);
            }
        }
    }
    if choice.1 == 0.0 {
        return not_valid();
    }
    match choice.0 {
        "identity" => Decision {
            encoding: "identity".to_owned(),
            stat: HeaderStat::Identity,
        },
        "*" => Decision {
            encoding: allowed
                .iter()
                .min_by_key(|(_, (order, _))| *order)
                .map(|(name, _)| name.clone())
                .unwrap_or_default(),
            stat: HeaderStat::Wildcard,
        },
        name => Decision {
            encoding: name.to_owned(),
            stat: HeaderStat::ValidCompressor,
        },
    }
}

/// All values of header `name` joined with `,`, if any.
fn joined(headers: &HeaderMap, name: &http::HeaderName) -> Option<String> {
    let mut values = headers.get_all(name).iter();
    let first = String::from_utf8_lossy(values.next()?.as_bytes()).into_owned();
    Some(values.fold(first, |acc, v| {
        acc + "," + &String::from_utf8_lossy(v.as_bytes())
    }))
}

/// Whether the message is an upgrade (`connection: upgrade` with an `upgrade` header).
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(http::header::UPGRADE)
        && headers
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|v| crate::wire::has_token(v.as_bytes(), b"upgrade"))
}

/// Whether the message's `content-length`, if any, reaches the minimum (counting
/// `content_length_too_small` when it does not).
fn min_length(dir: &Direction, headers: &HeaderMap, stats: &DirectionStats) -> bool {
    let Some(v) = headers.get(CONTENT_LENGTH) else {
        return true;
    };
    let long = v
        .to_str()
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n >= dir.min_content_length);
    if !long {
        stats.content_length_too_small.inc();
    }
    long
}

/// Whether the message's content type, if any, is one the direction compresses.
fn type_allowed(dir: &Direction, headers: &HeaderMap) -> bool {
    match headers.get(CONTENT_TYPE) {
        Some(v) if !dir.content_types.is_empty() => {
            let value = String::from_utf8_lossy(v.as_bytes());
            let value = value.split(';').next().unwrap_or_default().trim();
            dir.content_types
                .iter()
                .any(|t| t.eq_ignore_ascii_case(value))
        }
        _ => true,
    }
}

/// Whether `cache-control` says `no-transform`.
fn has_no_transform(headers: &HeaderMap) -> bool {
    headers
        .get_all(CACHE_CONTROL)
        .iter()
        .any(|v| crate::wire::has_token(v.as_bytes(), b"no-transform"))
}

/// A strong ETag does not describe the compressed body: it is removed (Envoy), or made weak
/// under `weaken_etag_on_compress`.
fn sanitize_etag(headers: &mut HeaderMap, weaken: bool) {
    let Some(v) = headers.get(ETAG) else {
        return;
    };
    let bytes = v.as_bytes();
    let weak = bytes.len() > 2 && bytes[..2].eq_ignore_ascii_case(b"w/");
    if bytes.len() <= 2 || weak {
        return;
    }
    if weaken {
        let mut value = b"W/".to_vec();
        value.extend_from_slice(bytes);
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            headers.insert(ETAG, v);
        }
    } else {
        headers.remove(ETAG);
    }
}

/// Adds `accept-encoding` to `vary` unless it is there.
fn insert_vary(headers: &mut HeaderMap) {
    let Some(v) = headers.get(VARY) else {
        headers.insert(VARY, HeaderValue::from_static("Accept-Encoding"));
        return;
    };
    // Envoy compares the token with its case.
    if crate::wire::tokens(v.as_bytes()).any(|t| t == b"Accept-Encoding") {
        return;
    }
    let mut value = v.as_bytes().to_vec();
    value.extend_from_slice(b", Accept-Encoding");
    if let Ok(v) = HeaderValue::from_bytes(&value) {
        headers.insert(VARY, v);
    }
}
