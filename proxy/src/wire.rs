//! HTTP wire helpers shared by the connection manager (`http/`) and the upstream client
//! (`upstream/`), so neither imports the other: comma-separated header values, where a parsed
//! head's headers sit, room in a read buffer, the connection-scoped headers that never
//! cross the proxy, and the size of an HTTP/2 header block ([`hpack`]).

pub mod hpack;

use std::cell::RefCell;
use std::io::Write as _;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue};

/// How many headers a head may carry for httparse: Envoy's default `max_headers_count`.
pub const MAX_HEADERS: usize = 100;

/// The read buffer's first size, and how much it grows when nearly full.
pub const READ_BUFFER: usize = 8 * 1024;

/// How many empty read buffers a worker thread keeps for its connections to take.
const SPARE_BUFFERS: usize = 64;

thread_local! {
    /// Empty read buffers given back by this worker's idle connections.
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// A read buffer for a connection that has bytes to read: one an idle connection of this
/// thread gave back, else a new one.
pub fn take_buffer() -> BytesMut {
    SPARE
        .with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| BytesMut::with_capacity(READ_BUFFER))
}

/// Takes an idle connection's empty read buffer for the next connection of this thread to
/// receive bytes (one that grew past twice [`READ_BUFFER`], or has little room left, is freed).
pub fn give_back(buf: BytesMut) {
    if buf.is_empty() && (1024..=2 * READ_BUFFER).contains(&buf.capacity()) {
        SPARE.with_borrow_mut(|spare| {
            if spare.len() < SPARE_BUFFERS {
                spare.push(buf);
            }
        });
    }
}

/// `buf` with room for at least one more read (1 KiB, else it grows by [`READ_BUFFER`]).
pub fn with_room(buf: &mut BytesMut) -> &mut BytesMut {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(READ_BUFFER);
    }
    buf
}

/// How many header spans sit inline in [`HeaderSpans`]; heads with more spill into a `Vec`.
const INLINE_SPANS: usize = 16;

/// Where each header's name and value sit in a parsed head, as byte ranges from its start. The
/// parser borrows the read buffer; once the ranges are taken it can let go, and the header map
/// is built from slices of the frozen head (no copies). Common heads fit inline, so taking the
/// spans neither allocates nor clears or moves room for [`MAX_HEADERS`] of them.
pub struct HeaderSpans {
    inline: [[u32; 4]; INLINE_SPANS],
    spilled: Vec<[u32; 4]>,
    count: usize,
}

impl HeaderSpans {
    /// The spans of `headers`, parsed from `head` (offsets fit in `u32`: heads are limited to
    /// tens of KiB).
    pub fn of(head: &[u8], headers: &[httparse::Header<'_>]) -> Self {
        let base = head.as_ptr() as usize;
        let offset = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        let span = |h: &httparse::Header<'_>| {
            let (n, v) = (offset(h.name.as_bytes()), offset(h.value));
            [n, n + h.name.len() as u32, v, v + h.value.len() as u32]
        };
        let mut inline = [[0u32; 4]; INLINE_SPANS];
        for (slot, h) in inline.iter_mut().zip(headers) {
            *slot = span(h);
        }
        HeaderSpans {
            inline,
            spilled: headers.iter().skip(INLINE_SPANS).map(span).collect(),
            count: headers.len(),
        }
    }

    /// The (name, value) ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = (Range<usize>, Range<usize>)> + '_ {
        self.inline[..self.count.min(INLINE_SPANS)]
            .iter()
            .chain(&self.spilled)
            .map(|[ns, ne, vs, ve]| (*ns as usize..*ne as usize, *vs as usize..*ve as usize))
    }
}

/// A header value httparse accepted, without checking its bytes again.
pub fn parsed_value(bytes: Bytes) -> HeaderValue {
    // SAFETY: not a memory-safety contract: `HeaderValue` requires bytes free of controls
    // other than HTAB and of DEL. httparse's value grammar (HTAB, SP to `~`, obs-text; scalar
    // and SIMD paths alike) accepts exactly those bytes, and `http` re-checks them in debug
    // builds.
    unsafe { HeaderValue::from_maybe_shared_unchecked(bytes) }
}

/// Appends the header line `name: value`.
pub fn put_field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends the line that starts a chunk of `len` bytes.
pub fn put_chunk_start(out: &mut Vec<u8>, len: usize) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{len:x}\r\n");
}

/// Whether a `transfer-encoding` value's last coding is `chunked` (any case).
pub fn ends_in_chunked(value: &[u8]) -> bool {
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// Appends the last chunk of a chunked body, the `trailers` and the final empty line.
pub fn put_chunked_end(out: &mut Vec<u8>, trailers: Option<&HeaderMap>) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        put_field(out, name.as_str(), value.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// The comma-separated tokens of a header value (`connection`, `transfer-encoding`, ...),
/// trimmed, empty ones skipped.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Whether `value` lists `token` (compared without case).
pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    tokens(value).any(|t| t.eq_ignore_ascii_case(token))
}

/// Headers that describe one hop and never cross the proxy.
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Removes a request's connection-scoped headers, with those its `connection` header names;
/// keeps `te: trailers` (gRPC needs it).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    strip_connection_scoped(headers, true);
}

/// Removes the connection-scoped headers; `named_too`: also those the `connection` header
/// names (a request's; a response's stay, as in Envoy).
pub fn strip_connection_scoped(headers: &mut HeaderMap, named_too: bool) {
    // One pass over the names first: most requests carry none of these (gRPC ones carry only
    // `te: trailers`), and a removal of an absent header still costs a hash and a probe.
    let mut present = [false; CONNECTION_SCOPED.len()];
    let mut te = false;
    for n in headers.keys() {
        match n.as_str() {
            "te" => te = true,
            name => {
                if let Some(i) = CONNECTION_SCOPED.iter().position(|h| h.as_str() == name) {
                    present[i] = true;
                }
            }
        }
    }
    if !te && !present.contains(&true) {
        return;
    }
    if named_too
        && present[0]
        && let Some(conn) = headers.get(header::CONNECTION).cloned()
        && let Ok(list) = conn.to_str()
    {
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !name.eq_ignore_ascii_case("upgrade")
                && !name.eq_ignore_ascii_case("close")
                && !name.eq_ignore_ascii_case("keep-alive")
                && let Ok(n) = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                && n != header::TE
            {
                headers.remove(n);
            }
        }
    }
    for (name, _) in CONNECTION_SCOPED.iter().zip(present).filter(|(_, p)| *p) {
        headers.remove(*name);
    }
    let mut values = headers.get_all(header::TE).iter();
    if !te || (values.next().is_some_and(|v| v == "trailers") && values.next().is_none()) {
        return;
    }
    let keep_te = headers
        .get_all(header::TE)
        .iter()
        .any(|v| has_token(v.as_bytes(), b"trailers"));
    if keep_te {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    } else {
        headers.remove(header::TE);
    }
}

/// The connection-scoped headers removed when forwarding (`connection` first).
static CONNECTION_SCOPED: [&HeaderName; 5] = [
    &header::CONNECTION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
    &header::TRANSFER_ENCODING,
    &header::UPGRADE,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_point_at_names_and_values() {
        let head = b"GET / HTTP/1.1\r\nhost: a.test\r\nx-empty:\r\n\r\n";
        let mut slots = [httparse::EMPTY_HEADER; 4];
        let mut req = httparse::Request::new(&mut slots);
        req.parse(head).unwrap();
        let spans = HeaderSpans::of(head, req.headers);
        let found: Vec<_> = spans.iter().map(|(n, v)| (&head[n], &head[v])).collect();
        assert_eq!(
            found,
            [(&b"host"[..], &b"a.test"[..]), (&b"x-empty"[..], &b""[..])]
        );
    }

    #[test]
    fn spans_past_the_inline_ones_keep_their_order() {
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..INLINE_SPANS + 3 {
            head.extend_from_slice(format!("h{i}: v{i}\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        let mut slots = [httparse::EMPTY_HEADER; INLINE_SPANS + 3];
        let mut req = httparse::Request::new(&mut slots);
        req.parse(&head).unwrap();
        let spans = HeaderSpans::of(&head, req.headers);
        let found: Vec<_> = spans
            .iter()
            .map(|(n, v)| (head[n].to_vec(), head[v].to_vec()))
            .collect();
        let expected: Vec<_> = (0..INLINE_SPANS + 3)
            .map(|i| (format!("h{i}").into_bytes(), format!("v{i}").into_bytes()))
            .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn an_idle_connections_buffer_goes_to_the_next_one_unless_it_grew() {
        let given = BytesMut::with_capacity(READ_BUFFER);
        let at = given.as_ptr();
        give_back(given);
        assert_eq!(take_buffer().as_ptr(), at, "the spare buffer is reused");
        let grown = BytesMut::with_capacity(4 * READ_BUFFER);
        let at = grown.as_ptr();
        give_back(grown);
        let taken = take_buffer();
        assert_ne!(taken.as_ptr(), at, "a grown buffer is freed, not kept");
        assert_eq!(taken.capacity(), READ_BUFFER);
    }

    #[test]
    fn tokens_are_trimmed_and_compared_without_case() {
        assert!(has_token(b"keep-alive, Close", b"close"));
        assert!(!has_token(b"closed, x-close", b"close"));
        assert_eq!(tokens(b" a ,, b").collect::<Vec<_>>(), [&b"a"[..], b"b"]);
    }
}
