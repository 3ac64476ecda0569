//! Writing an HTTP/1.1 request: the head and the framing of its body.

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::request::Parts;
use http::{HeaderMap, HeaderValue};
use http_body::SizeHint;

use crate::wire::{ends_in_chunked, put_chunk_start, put_chunked_end, put_field};

/// How the request body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BodyFraming {
    /// No body follows the head.
    None,
    /// Exactly this many bytes (`content-length`).
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
}

/// Chooses the body framing and makes the framing headers say it: a body that has ended gets
/// none (a `content-length` the client sent stays); a `transfer-encoding` ends in `chunked`; a
/// `content-length` the client sent is kept; else a known size becomes `content-length` and
/// an unknown one `chunked`.
pub(super) fn framing(headers: &mut HeaderMap, ended: bool, hint: &SizeHint) -> BodyFraming {
    if ended {
        headers.remove(TRANSFER_ENCODING);
        return BodyFraming::None;
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        let chunked_last = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .next_back()
            .is_some_and(|v| ends_in_chunked(v.as_bytes()));
        if !chunked_last {
            headers.append(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        }
        headers.remove(CONTENT_LENGTH);
        return BodyFraming::Chunked;
    }
    let sent = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    match sent.or(hint.exact()) {
        Some(n) => {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
            BodyFraming::Length(n)
        }
        None => {
            headers.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
            BodyFraming::Chunked
        }
    }
}

/// Appends the request line and header block of `parts` to `out` (always `HTTP/1.1`, as Envoy
/// sends upstream).
pub(super) fn head(parts: &Parts, out: &mut Vec<u8>) {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(if target.is_empty() { "/" } else { target }.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        put_field(out, name.as_str(), value.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// The line that starts a chunk of `len` bytes.
pub(super) fn chunk_start(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(18);
    put_chunk_start(&mut out, len);
    out
}

/// The last chunk of a chunked body followed by `trailers` and the final empty line.
pub(super) fn chunked_end(trailers: Option<&HeaderMap>) -> Vec<u8> {
    let mut out = Vec::new();
    put_chunked_end(&mut out, trailers);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| {
                (
                    http::HeaderName::from_static(n),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn an_ended_body_sends_no_framing_but_keeps_a_sent_length() {
        let mut h = headers(&[("content-length", "0"), ("transfer-encoding", "chunked")]);
        assert_eq!(
            framing(&mut h, true, &SizeHint::with_exact(0)),
            BodyFraming::None
        );
        assert_eq!(h.get(TRANSFER_ENCODING), None);
        assert_eq!(h[CONTENT_LENGTH], "0");
    }

    #[test]
    fn lengths_come_from_the_client_then_the_body_else_chunked() {
        let mut h = headers(&[("content-length", "12")]);
        assert_eq!(
            framing(&mut h, false, &SizeHint::new()),
            BodyFraming::Length(12)
        );
        let mut h = HeaderMap::new();
        assert_eq!(
            framing(&mut h, false, &SizeHint::with_exact(5)),
            BodyFraming::Length(5)
        );
        assert_eq!(h[CONTENT_LENGTH], "5");
        let mut h = HeaderMap::new();
        assert_eq!(
            framing(&mut h, false, &SizeHint::new()),
            BodyFraming::Chunked
        );
        assert_eq!(h[TRANSFER_ENCODING], "chunked");
    }

    #[test]
    fn a_transfer_encoding_always_ends_in_chunked_and_drops_the_length() {
        let mut h = headers(&[("transfer-encoding", "gzip"), ("content-length", "3")]);
        assert_eq!(
            framing(&mut h, false, &SizeHint::new()),
            BodyFraming::Chunked
        );
        let codings: Vec<_> = h.get_all(TRANSFER_ENCODING).iter().collect();
        assert_eq!(codings, ["gzip", "chunked"]);
        assert_eq!(h.get(CONTENT_LENGTH), None);
    }

    #[test]
    fn the_head_is_origin_form_http_1_1() {
        let mut req = http::Request::post("/a?b=1")
            .header("host", "svc")
            .header("x-two", "1")
            .header("x-two", "2")
            .body(())
            .unwrap();
        *req.version_mut() = http::Version::HTTP_10;
        let (parts, ()) = req.into_parts();
        let mut out = Vec::new();
        head(&parts, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /a?b=1 HTTP/1.1\r\nhost: svc\r\nx-two: 1\r\nx-two: 2\r\n\r\n"
        );
        assert_eq!(chunk_start(255), b"ff\r\n");
        assert_eq!(
            chunked_end(Some(&headers(&[("x-t", "v")]))),
            b"0\r\nx-t: v\r\n\r\n"
        );
    }
}
