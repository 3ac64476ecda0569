//! Reading a request head for the HTTP/1.1 fast path, and deciding whether the fast path may
//! serve it at all.

use std::mem::MaybeUninit;

#[cfg(test)]
use bytes::Bytes;
use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, Method, Request, Uri, Version};

use super::Asked;
use super::inbound::Inbound;
use crate::body::{self, Body};
use crate::config::hcm::HcmConfig;
use crate::http::wire_meter::ConnWire;
use crate::wire::{HeaderSpans, MAX_HEADERS, parsed_value};

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
    /// A request the fast path serves, what its client asked of the response, and the part
    /// of its body still to arrive.
    Served {
        request: Request<Body>,
        asked: Asked,
        inbound: Inbound,
    },
    /// Both `content-length` and `transfer-encoding` (without `allow_chunked_length`):
    /// answered 400 and closed, as by Envoy's codec.
    Ambiguous,
    /// Anything else: hyper's server takes the connection from this request on.
    HandOff,
}

/// Parses the request at the start of `buf`. The fast path takes only the common case: an
/// HTTP/1.1 request without `upgrade` or `expect`, in origin form, with a method Envoy's codec
/// knows, headers within the connection manager's limits, and either no body or one framed by
/// a single plain `content-length` (never `transfer-encoding`). On `Served` the head, and the
/// body when it arrived whole with the head, are removed from `buf`; a body still on its way
/// is left for the connection's reader to stream into the request ([`Inbound`]). Otherwise
/// `buf` is untouched so the connection can be handed off with it, except that a chunked
/// request's `content-length` lines are removed under `allow_chunked_length` (so hyper, which
/// would close the connection after such a request, sees a plain chunked one). A served head
/// is noted in `meter`, when the connection keeps one.
pub(super) fn parse(buf: &mut BytesMut, cfg: &HcmConfig, meter: Option<&ConnWire>) -> Head {
    let max_head = cfg.max_request_headers_kb as usize * 1024;
    let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut parsed,
        buf,
        &mut slots,
    ) {
        // A head longer than `max_request_headers_kb`, or a part of one that fills it, is
        // Envoy's codec's to refuse (431): the hand-off's framing follower answers it.
        Ok(httparse::Status::Complete(len)) if len <= max_head => len,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Head::Partial,
        _ => return Head::HandOff,
    };
    let (Some(method), Some(path), Some(1)) = (parsed.method, parsed.path, parsed.version) else {
        return Head::HandOff;
    };
    if !super::super::known_http1_method(method) || !path.starts_with('/') {
        return Head::HandOff;
    }
    let (mut close, mut body_len, mut header_bytes) = (false, None, 0);
    let (mut lengths, mut codings, mut chunked_only, mut unusual) = (0, 0, true, false);
    for h in parsed.headers.iter() {
        header_bytes += h.name.len() + h.value.len();
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(CONNECTION.as_str().as_bytes()) {
            close |= super::has_token(h.value, b"close");
        } else if name.eq_ignore_ascii_case(CONTENT_LENGTH.as_str().as_bytes()) {
            lengths += 1;
            body_len = plain_length(h.value);
        } else if name.eq_ignore_ascii_case(TRANSFER_ENCODING.as_str().as_bytes()) {
            codings += 1;
            chunked_only &= h.value.trim_ascii().eq_ignore_ascii_case(b"chunked");
        } else if [UPGRADE, EXPECT]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_str().as_bytes()))
        {
            unusual = true;
        }
    }
    if parsed.headers.len() > cfg.max_headers_count as usize {
        return Head::HandOff;
    }
    if lengths > 0 && codings > 0 {
        // Envoy's codec refuses the ambiguous framing request smuggling relies on, unless
        // `allow_chunked_length`, which takes the request as chunked without its length.
        if !(cfg.allow_chunked_length && codings == 1 && chunked_only) {
            return Head::Ambiguous;
        }
        let lines = header_lines(buf, parsed.headers, CONTENT_LENGTH.as_str());
        *buf = without(buf, &lines);
        return Head::HandOff;
    }
    if unusual || codings > 0 || lengths > 1 {
        return Head::HandOff;
    }
    let body_len = match (lengths, body_len) {
        (0, _) => 0,
        (_, Some(n)) => n,
        (_, None) => return Head::HandOff,
    };
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
    // What the buffer holds past the head came with it: the stream's, as Envoy's codec
    // charges the bytes it dispatches (a pipelined request's too).
    if let Some(m) = meter {
        m.read_head(len, count, header_bytes);
        m.read_body(buf.len() as u64);
    }
    let (body, inbound) = match body_len {
        0 => (body::empty(), Inbound::default()),
        n if buf.len() >= n => (body::full(buf.split_to(n).freeze()), Inbound::default()),
        n => {
            let (inbound, body) = Inbound::arriving(n as u64);
            (body, inbound)
        }
    };
    let asked = Asked {
        method: method.clone(),
        close,
        notice: false,
    };
    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Head::Served {
        request,
        asked,
        inbound,
    }
}

/// A `content-length` value of decimal digits without a leading zero (or `0`), as a length the
/// buffer could hold; anything else (signs, lists, spaces, leading zeros, huge values) is left
/// to hyper's reading and its errors.
fn plain_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 10 || (value.len() > 1 && value[0] == b'0') {
        return None;
    }
    value.iter().try_fold(0usize, |n, &d| {
        d.is_ascii_digit()
            .then_some(())
            .and_then(|()| n.checked_mul(10)?.checked_add(usize::from(d - b'0')))
    })
}

/// Where in `buf` each header line named `name` lies (name to line end, both included).
fn header_lines(
    buf: &[u8],
    headers: &[httparse::Header<'_>],
    name: &str,
) -> Vec<std::ops::Range<usize>> {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| {
            let start = h.name.as_ptr() as usize - buf.as_ptr() as usize;
            let value_end = h.value.as_ptr() as usize - buf.as_ptr() as usize + h.value.len();
            let end = buf[value_end..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(buf.len(), |i| value_end + i + 1);
            start..end
        })
        .collect()
}

/// `buf` without the byte ranges in `cut` (in order, not overlapping).
fn without(buf: &[u8], cut: &[std::ops::Range<usize>]) -> BytesMut {
    let mut out = BytesMut::with_capacity(buf.len());
    let mut at = 0;
    for r in cut {
        out.extend_from_slice(&buf[at..r.start]);
        at = r.end;
    }
    out.extend_from_slice(&buf[at..]);
    out
}

/// The head put back in front of the bytes read after it.
fn rejoin(head: bytes::Bytes, rest: BytesMut) -> BytesMut {
    let mut joined = BytesMut::with_capacity(head.len() + rest.len());
    joined.extend_from_slice(&head);
    joined.extend_from_slice(&rest);
    joined
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, http_connection_manager::RouteSpecifier,
    };

    use super::*;
    use crate::config::hcm::compile_hcm;

    fn cfg() -> HcmConfig {
        let hcm = HttpConnectionManager {
            stat_prefix: "test".into(),
            route_specifier: Some(RouteSpecifier::RouteConfig(Default::default())),
            ..Default::default()
        };
        compile_hcm(
            &crate::config::Context::new(&crate::config::FakeIo::new()),
            &hcm,
            None,
            &mut crate::config::Warnings::new(),
        )
        .unwrap()
    }

    async fn served_body(bytes: &[u8]) -> (Bytes, BytesMut) {
        let mut buf = BytesMut::from(bytes);
        let Head::Served { request, .. } = parse(&mut buf, &cfg(), None) else {
            panic!("not served: {}", String::from_utf8_lossy(bytes));
        };
        let body = request.into_body().collect().await.unwrap().to_bytes();
        (body, buf)
    }

    fn handed_off(bytes: &[u8]) -> bool {
        let mut buf = BytesMut::from(bytes);
        let off = matches!(parse(&mut buf, &cfg(), None), Head::HandOff);
        off && buf == bytes
    }

    #[tokio::test]
    async fn a_body_that_arrived_with_its_head_is_served_and_the_rest_stays() {
        let (body, rest) =
            served_body(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /b")
                .await;
        assert_eq!(body, "hello");
        assert_eq!(rest, "GET /b");
        let (body, rest) = served_body(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(body.is_empty() && rest.is_empty());
    }

    #[test]
    fn a_body_still_on_its_way_is_served_and_left_for_the_reader() {
        let mut buf =
            BytesMut::from(&b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nhello"[..]);
        let Head::Served {
            request, inbound, ..
        } = parse(&mut buf, &cfg(), None)
        else {
            panic!("not served");
        };
        assert!(inbound.incomplete());
        assert_eq!(buf, "hello", "the part that arrived waits for the reader");
        assert_eq!(http_body::Body::size_hint(request.body()).exact(), Some(6));
    }

    #[test]
    fn a_body_framed_unusually_is_handed_off_untouched() {
        for length in ["05", "+5", "5, 5", "99999999999"] {
            let req =
                format!("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\nhello");
            assert!(handed_off(req.as_bytes()), "{length}");
        }
        assert!(handed_off(
            b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"
        ));
        assert!(handed_off(
            b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        ));
    }

    #[test]
    fn a_length_with_a_coding_is_refused_unless_allow_chunked_length() {
        for req in [
            &b"POST /a HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            b"POST /a HTTP/1.1\r\nContent-Length: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        ] {
            let mut buf = BytesMut::from(req);
            assert!(matches!(parse(&mut buf, &cfg(), None), Head::Ambiguous));
        }
        let allowing = HcmConfig {
            allow_chunked_length: true,
            ..cfg()
        };
        let mut buf = BytesMut::from(
            &b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello"[..],
        );
        assert!(matches!(parse(&mut buf, &allowing, None), Head::HandOff));
        assert_eq!(
            buf,
            &b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello"[..]
        );
        let mut buf = BytesMut::from(
            &b"POST /a HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"[..],
        );
        assert!(matches!(parse(&mut buf, &allowing, None), Head::Ambiguous));
    }
}
