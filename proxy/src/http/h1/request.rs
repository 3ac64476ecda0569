//! Reading a request head for the HTTP/1.1 fast path, and deciding whether the fast path may
//! serve it at all.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, Method, Request, Uri, Version};

use super::Asked;
use crate::body::{self, Body};
use crate::config::hcm::HcmConfig;
use crate::http::wire::{HeaderSpans, MAX_HEADERS, parsed_value};

/// Room in the header map for what the connection manager adds before forwarding
/// (`x-forwarded-proto`, `x-request-id`, `x-envoy-expected-rq-timeout-ms`, ...).
const ADDED_HEADERS: usize = 4;

/// What the head at the start of the read buffer is.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per request and taken apart at once; a box would allocate"
)]
pub(super) enum Head {
    /// Incomplete: more bytes are needed.
    Partial,
    /// A request the fast path serves, and what its client asked of the response.
    Served {
        request: Request<Body>,
        asked: Asked,
    },
    /// Anything else: hyper's server takes the connection from this request on.
    HandOff,
}

/// Parses the request head at the start of `buf`. The fast path takes only the common case: an
/// HTTP/1.1 request without a body (no `transfer-encoding`, no `content-length` but `0`) and
/// without `upgrade` or `expect`, in origin form, with a method Envoy's codec knows, and
/// headers within the connection manager's limits. On `Served` the head is removed from `buf`;
/// otherwise `buf` is untouched so the connection can be handed off with it.
pub(super) fn parse(buf: &mut BytesMut, cfg: &HcmConfig) -> Head {
    let max_head = cfg.max_request_headers_kb as usize * 1024;
    let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut parsed,
        buf,
        &mut slots,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() <= max_head => return Head::Partial,
        _ => return Head::HandOff,
    };
    let (Some(method), Some(path), Some(1)) = (parsed.method, parsed.path, parsed.version) else {
        return Head::HandOff;
    };
    if !super::super::known_http1_method(method) || !path.starts_with('/') {
        return Head::HandOff;
    }
    let (mut close, mut lengths, mut header_bytes) = (false, 0, 0);
    for h in parsed.headers.iter() {
        header_bytes += h.name.len() + h.value.len();
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(CONNECTION.as_str().as_bytes()) {
            close |= super::has_token(h.value, b"close");
        } else if name.eq_ignore_ascii_case(CONTENT_LENGTH.as_str().as_bytes()) {
            lengths += 1;
            if h.value != b"0" || lengths > 1 {
                return Head::HandOff;
            }
        } else if [TRANSFER_ENCODING, UPGRADE, EXPECT]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_str().as_bytes()))
        {
            return Head::HandOff;
        }
    }
    if header_bytes > max_head || parsed.headers.len() > cfg.max_headers_count as usize {
        return Head::HandOff;
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Head::HandOff;
    };
    // A head with more than MAX_HEADERS fields failed to parse above and was handed off (and
    // is refused there when over the configured limit).
    let path_at = path.as_ptr() as usize - buf.as_ptr() as usize;
    let path_range = path_at..path_at + path.len();
    let spans = HeaderSpans::of(buf, parsed.headers);
    let count = parsed.headers.len();
    let head = buf.split_to(len).freeze();
    let Ok(uri) = Uri::from_maybe_shared(head.slice(path_range)) else {
        *buf = rejoin(head, std::mem::take(buf));
        return Head::HandOff;
    };
    let mut headers = HeaderMap::with_capacity(count + ADDED_HEADERS);
    for (name, value) in spans.iter() {
        let Ok(name) = HeaderName::from_bytes(&head[name]) else {
            *buf = rejoin(head, std::mem::take(buf));
            return Head::HandOff;
        };
        headers.append(name, parsed_value(head.slice(value)));
    }
    let asked = Asked {
        method: method.clone(),
        close,
    };
    let mut request = Request::new(body::empty());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Head::Served { request, asked }
}

/// The head put back in front of the bytes read after it.
fn rejoin(head: bytes::Bytes, rest: BytesMut) -> BytesMut {
    let mut joined = BytesMut::with_capacity(head.len() + rest.len());
    joined.extend_from_slice(&head);
    joined.extend_from_slice(&rest);
    joined
}
