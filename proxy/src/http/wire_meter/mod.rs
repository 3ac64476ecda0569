//! Envoy's bytes meter of an HTTP stream on its downstream connection (what
//! `%DOWNSTREAM_WIRE_BYTES_*%`, `%DOWNSTREAM_HEADER_BYTES_*%` and Istio's request and response
//! sizes read). HTTP/1 carries one stream at a time, so its reader and writer note the message
//! in flight in the connection's [`ConnWire`]: the request's head and what is read while it is
//! the connection's current request (fast path), or its head and body with their chunk framing
//! ([`super::framing`], before hyper); the response's head as written (the fast path's, or the
//! one hyper's encoder writes, computed by the same rules). HTTP/2 frames
//! are hidden inside h2: a stream counts 9 bytes per frame and its header blocks as an HPACK
//! encoder writes them ([`hpack`]), each side's dynamic table followed per connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use http::{HeaderMap, Request, Response, header};

use crate::access_log::record::WireBytes;
use crate::wire::hpack::{self, FRAME_HEADER, MAX_FRAME};

/// A connection's notes for its streams' meters: what an HTTP/1 connection's reader and
/// writer note of the message in flight; the two HPACK dynamic tables of an HTTP/2
/// connection (the client's encoder's, Envoy's).
#[derive(Debug, Default)]
pub struct ConnWire {
    rx_head: AtomicU64,
    rx_headers: AtomicU64,
    rx_body: AtomicU64,
    tx_head: AtomicU64,
    tx_headers: AtomicU64,
    tx_chunked: AtomicBool,
    tables: Mutex<[hpack::Table; 2]>,
}

/// Which of an HTTP/2 connection's encoders writes a header block.
#[derive(Debug, Clone, Copy)]
enum Side {
    /// The client's (requests).
    Client = 0,
    /// This proxy's (responses).
    Proxy = 1,
}

impl ConnWire {
    /// The bytes of a header block `side` sends: `pseudo` then `headers`, then `extra`.
    fn block(
        &self,
        side: Side,
        pseudo: &[(&str, &[u8])],
        headers: &HeaderMap,
        extra: &[(&str, &[u8])],
    ) -> u64 {
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        let table = &mut tables[side as usize];
        hpack::block_len(table, pseudo, headers)
            + extra
                .iter()
                .map(|(n, v)| hpack::field_len(table, n, v))
                .sum::<u64>()
    }
}

impl ConnWire {
    /// A request head of `len` bytes was read, with `fields` header fields of `name_values`
    /// bytes of names and values: Envoy's codec counts 3 bytes more per field as its header
    /// bytes (`:`, CRLF).
    pub(super) fn read_head(&self, len: usize, fields: usize, name_values: usize) {
        self.rx_head.store(len as u64, Ordering::Relaxed);
        self.rx_headers
            .store((name_values + 3 * fields) as u64, Ordering::Relaxed);
        self.rx_body.store(0, Ordering::Relaxed);
    }

    /// `n` more bytes of the current request were read (body, chunk framing, or on the fast
    /// path anything read while it is current).
    pub(super) fn read_body(&self, n: u64) {
        self.rx_body.fetch_add(n, Ordering::Relaxed);
    }

    /// A response head `head` is written: its status line, its fields and the blank line;
    /// `chunked`: its body goes in chunks.
    pub(super) fn wrote_head(&self, head: &[u8], chunked: bool) {
        let status_line = head
            .iter()
            .position(|b| *b == b'\n')
            .map_or(head.len(), |i| i + 1);
        self.tx_head.store(head.len() as u64, Ordering::Relaxed);
        self.tx_headers.store(
            head.len().saturating_sub(status_line + 2) as u64,
            Ordering::Relaxed,
        );
        self.tx_chunked.store(chunked, Ordering::Relaxed);
    }

    /// The wire bytes of a request the connection answered before any stream began (a head
    /// its codec refused, or one too slow to come): what was read of it, and the answer
    /// whose head was noted last, with a `body`-byte body.
    pub(super) fn answered(&self, body: u64) -> WireBytes {
        WireBytes {
            received: self.rx_head.load(Ordering::Relaxed) + self.rx_body.load(Ordering::Relaxed),
            sent: self.tx_head.load(Ordering::Relaxed) + body,
            header_received: self.rx_headers.load(Ordering::Relaxed),
            header_sent: self.tx_headers.load(Ordering::Relaxed),
        }
    }
}

/// One stream's meter, kept with its access-log record while it is served.
#[derive(Debug)]
pub(super) struct StreamWire {
    /// The connection's notes.
    conn: Arc<ConnWire>,
    /// The stream is HTTP/2's.
    h2: bool,
    /// The request's head (HTTP/2: its HEADERS frame).
    rx_head: u64,
    /// The request's header bytes.
    rx_headers: u64,
    /// The response's HEADERS frame (HTTP/2).
    tx_head: u64,
    /// The response body's framing so far: chunk lines, or DATA frame headers.
    tx_framing: u64,
    /// HTTP/2: the stream ends in an empty DATA frame of its own, as Envoy ends a response
    /// an HTTP/1 upstream sent (its codec tells the end apart from the last data).
    end_apart: bool,
    /// HTTP/1: a chunked response's trailers are written (`enable_trailers`).
    h1_trailers: bool,
}

impl StreamWire {
    /// The meter of `req`, as it came from the client (before the connection manager changes
    /// its headers); `conn`: the connection's notes; an HTTP/1 connection's chunked responses
    /// carry their trailers when `h1_trailers` (`enable_trailers`).
    pub(super) fn start<B>(
        req: &Request<B>,
        conn: &Arc<ConnWire>,
        h1_trailers: bool,
    ) -> StreamWire {
        if req.version() == http::Version::HTTP_2 {
            let uri = req.uri();
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            let authority = uri.authority().map_or("", |a| a.as_str());
            let scheme = uri.scheme_str().unwrap_or("http");
            let pseudo: [(&str, &[u8]); 4] = [
                (":method", req.method().as_str().as_bytes()),
                (":scheme", scheme.as_bytes()),
                (":authority", authority.as_bytes()),
                (":path", path.as_bytes()),
            ];
            let frame = FRAME_HEADER + conn.block(Side::Client, &pseudo, req.headers(), &[]);
            return StreamWire {
                conn: conn.clone(),
                h2: true,
                rx_head: frame,
                rx_headers: frame,
                tx_head: 0,
                tx_framing: 0,
                end_apart: false,
                h1_trailers,
            };
        }
        // The response head noted is the last stream's until this one's is written.
        conn.wrote_head(&[], false);
        StreamWire {
            rx_head: conn.rx_head.load(Ordering::Relaxed),
            rx_headers: conn.rx_headers.load(Ordering::Relaxed),
            conn: conn.clone(),
            h2: false,
            tx_head: 0,
            tx_framing: 0,
            end_apart: false,
            h1_trailers,
        }
    }

    /// Notes the response head about to be sent: HTTP/2's HEADERS frame, with the `date` and
    /// `content-length` hyper adds when absent (HTTP/1's writer notes its own head).
    /// `h1_upstream`: the response came from an HTTP/1 upstream.
    pub(super) fn respond<B: http_body::Body>(&mut self, resp: &Response<B>, h1_upstream: bool) {
        if !self.h2 {
            return;
        }
        self.end_apart = h1_upstream;
        let status = resp.status();
        let pseudo: [(&str, &[u8]); 1] = [(":status", status.as_str().as_bytes())];
        let headers = resp.headers();
        let mut digits = [0u8; 20];
        let length = (!headers.contains_key(header::CONTENT_LENGTH))
            .then(|| resp.body().size_hint().exact())
            .flatten()
            .map(|n| decimal(n, &mut digits));
        let block = super::h1::date::with(|d| {
            let mut added: [(&str, &[u8]); 2] = [("", b""); 2];
            let mut n = 0;
            for field in [
                length.map(|l| ("content-length", l)),
                (!headers.contains_key(header::DATE)).then_some(("date", d)),
            ]
            .into_iter()
            .flatten()
            {
                added[n] = field;
                n += 1;
            }
            self.conn.block(Side::Proxy, &pseudo, headers, &added[..n])
        });
        self.tx_head = FRAME_HEADER + block;
    }

    /// A response data frame of `len` bytes is sent.
    pub(super) fn sent_data(&mut self, len: usize) {
        if len == 0 {
            return;
        }
        let len = len as u64;
        self.tx_framing += if self.h2 {
            FRAME_HEADER * len.div_ceil(MAX_FRAME)
        } else if self.conn.tx_chunked.load(Ordering::Relaxed) {
            // `<hex size>\r\n` ... `\r\n`
            u64::from(len.ilog(16) + 1) + 4
        } else {
            0
        };
    }

    /// The response body ended: with `trailers`, or, when `end_frame`, after its last data
    /// frame went out without the end of the stream (HTTP/2 then sends an empty DATA frame).
    pub(super) fn sent_end(&mut self, trailers: Option<&HeaderMap>, end_frame: bool) {
        self.tx_framing += if self.h2 {
            match trailers {
                Some(t) => FRAME_HEADER + self.conn.block(Side::Proxy, &[], t, &[]),
                None if end_frame || self.end_apart => FRAME_HEADER,
                None => 0,
            }
        } else if self.conn.tx_chunked.load(Ordering::Relaxed) {
            // `0\r\n`, the trailer fields (when written), `\r\n`.
            5 + trailers.filter(|_| self.h1_trailers).map_or(0, |t| {
                t.iter()
                    .map(|(n, v)| (n.as_str().len() + v.len() + 4) as u64)
                    .sum()
            })
        } else {
            0
        };
    }

    /// The stream's wire bytes, given its body bytes each way and the request's data frames.
    pub(super) fn bytes(
        &self,
        body_received: u64,
        frames_received: u64,
        body_sent: u64,
    ) -> WireBytes {
        if self.h2 {
            return WireBytes {
                received: self.rx_head + body_received + FRAME_HEADER * frames_received,
                sent: self.tx_head + body_sent + self.tx_framing,
                header_received: self.rx_headers,
                header_sent: self.tx_head,
            };
        }
        // The body as read off the connection, what the stream's consumer took or not.
        let conn = &self.conn;
        WireBytes {
            received: self.rx_head + conn.rx_body.load(Ordering::Relaxed),
            sent: conn.tx_head.load(Ordering::Relaxed) + body_sent + self.tx_framing,
            header_received: self.rx_headers,
            header_sent: conn.tx_headers.load(Ordering::Relaxed),
        }
    }
}

/// `n` in decimal, written at the end of `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: http::Version) -> Request<()> {
        let mut req = Request::new(());
        *req.version_mut() = version;
        req
    }

    #[test]
    fn an_http1_stream_is_its_head_body_and_chunk_framing_each_way() {
        let conn = Arc::new(ConnWire::default());
        conn.read_head(40, 2, 20);
        conn.read_body(10);
        let mut wire = StreamWire::start(&request(http::Version::HTTP_11), &conn, false);
        let head = b"HTTP/1.1 200 OK\r\na: b\r\n\r\n";
        conn.wrote_head(head, true);
        // `ff\r\n` + 255 bytes + `\r\n`, then `0\r\n\r\n`.
        wire.sent_data(255);
        wire.sent_end(None, true);
        assert_eq!(
            wire.bytes(10, 1, 255),
            WireBytes {
                received: 50,
                sent: head.len() as u64 + 255 + 6 + 5,
                header_received: 26,
                header_sent: 6,
            }
        );
    }

    #[test]
    fn the_next_http1_stream_starts_without_the_last_response_head() {
        let conn = Arc::new(ConnWire::default());
        conn.wrote_head(b"HTTP/1.1 200 OK\r\n\r\n", false);
        let wire = StreamWire::start(&request(http::Version::HTTP_11), &conn, false);
        assert_eq!(wire.bytes(0, 0, 0).sent, 0);
    }

    #[test]
    fn http2_data_goes_in_frames_of_at_most_16_kib_each_with_its_header() {
        let conn = Arc::new(ConnWire::default());
        let mut wire = StreamWire::start(&request(http::Version::HTTP_2), &conn, false);
        wire.sent_data(20_000);
        // An end after the last data frame went out: an empty DATA frame of its own.
        wire.sent_end(None, true);
        let bytes = wire.bytes(5, 1, 20_000);
        assert_eq!(bytes.sent, 20_000 + 3 * FRAME_HEADER);
        assert_eq!(
            bytes.received,
            bytes.header_received + 5 + FRAME_HEADER,
            "the request's HEADERS frame and one DATA frame"
        );
    }

    #[test]
    fn decimal_writes_the_digits() {
        let mut buf = [0u8; 20];
        assert_eq!(decimal(0, &mut buf), b"0");
        assert_eq!(decimal(1_000, &mut buf), b"1000");
        assert_eq!(decimal(u64::MAX, &mut buf), b"18446744073709551615");
    }
}
