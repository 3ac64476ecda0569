//! Follows the HTTP/1 requests a client sends on a connection hyper's server serves, to apply
//! Envoy's codec rules hyper lacks:
//! - a request with both `content-length` and `transfer-encoding`, which hyper takes as
//!   chunked (and then closes the connection): Envoy's codec answers it 400 and closes, or,
//!   under `allow_chunked_length`, takes it as chunked without its `content-length` and keeps
//!   the connection;
//! - a request whose `transfer-encoding` does not end in `chunked` (`gzip`), which hyper answers
//!   400: Envoy's codec answers 501, as it does any coding but a single `chunked`. Such a head
//!   goes on with a `transfer-encoding: chunked` line added, so hyper parses it and the
//!   connection manager's early checks answer Envoy's 501;
//! - a request line whose version is `HTTP/<digit>.<digit>` but not `HTTP/1.0` or `HTTP/1.1`
//!   (`HTTP/9.1`, `HTTP/2.0`), which hyper answers 400: Envoy's codec answers 426
//!   (`low_version`), as it does an HTTP/1.0 request it does not accept;
//! - a head longer than `max_request_headers_kb` (request line, headers and line ends, as
//!   Envoy's codec counts it), or a part of one that already fills it, which Envoy's codec
//!   answers 431 before it judges the version or the framing (hyper and the connection
//!   manager would see those first, and count only names and values).
//!
//! The bytes pass through on their way to hyper: bodies at once (their framing followed, so
//! the next head is found), each head held until it is whole, then handed on as it was, without
//! its `content-length` lines (`allow_chunked_length`), with a `chunked` coding added, or
//! replaced by a line hyper's parser refuses, so hyper answers the 400 (made Envoy's, with the
//! status and details of [`Framing::refusal`], by `envoy_errors`) and closes. Anything this
//! does not follow (an upgrade, CONNECT, a head it cannot parse, an HTTP/2 preface) ends the
//! following: the rest passes untouched.

use bytes::{Buf, BufMut, BytesMut};
use http::StatusCode;

use std::sync::Arc;

use super::HcmStats;
use super::head_scan::HeadScan;
use super::wire_meter::ConnWire;

/// What hyper's parser refuses (a control character in the method) in place of a head Envoy's
/// codec refuses.
const REFUSED_HEAD: &[u8] = b"\x01\r\n\r\n";

/// Where in the request stream the next byte is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In a head (held until whole).
    Head,
    /// In a `content-length` body: this many bytes left.
    Body(u64),
    /// In a chunk-size line.
    ChunkSize,
    /// In chunk data: this many bytes left.
    ChunkData(u64),
    /// After chunk data, up to its line end.
    ChunkEnd,
    /// In the trailer section after the last chunk; `true` at the start of a line.
    Trailers(bool),
    /// No longer followed: everything passes.
    Off,
    /// After a refused head: nothing more goes to hyper.
    Refused,
}

/// The request-stream follower of one connection.
pub(super) struct Framing {
    state: State,
    allow_chunked_length: bool,
    /// The head (or chunk-size line) read so far.
    held: BytesMut,
    /// Whether the last byte of a chunk-size line, a chunk's line end or the trailers was a
    /// `\r` (hyper takes only CRLF line ends there).
    cr: bool,
    /// When the held head is parsed again.
    scan: HeadScan,
    /// `max_request_headers_kb` in bytes: a longer head, or a part of one that fills it, is
    /// refused 431 before any framing rule.
    max_head: usize,
    /// Where a refused request is counted (under its status, as Envoy counts it).
    stats: Option<HcmStats>,
    /// Envoy's status and response details for the head refused, once one is.
    refusal: Option<(StatusCode, &'static str)>,
    /// Where each request's head and body bytes (with their chunk framing) are noted, for
    /// its wire bytes.
    meter: Option<Arc<ConnWire>>,
    /// Everything passing untouched is noted too: it follows a head this could not follow,
    /// which hyper refuses.
    meter_rest: bool,
}

impl Framing {
    /// Follows a connection's requests from its first byte, counting refused ones in `stats`.
    pub(super) fn new(
        allow_chunked_length: bool,
        max_head: usize,
        stats: Option<HcmStats>,
    ) -> Framing {
        Framing {
            state: State::Head,
            allow_chunked_length,
            held: BytesMut::new(),
            cr: false,
            scan: HeadScan::default(),
            max_head,
            stats,
            refusal: None,
            meter: None,
            meter_rest: false,
        }
    }

    /// Notes each request's head and body bytes (with their chunk framing) in `meter`.
    pub(super) fn metered(mut self, meter: Option<Arc<ConnWire>>) -> Framing {
        self.meter = meter;
        self
    }

    /// Follows nothing (an HTTP/2 connection).
    pub(super) fn off() -> Framing {
        Framing {
            state: State::Off,
            allow_chunked_length: false,
            held: BytesMut::new(),
            cr: false,
            scan: HeadScan::default(),
            max_head: 0,
            stats: None,
            refusal: None,
            meter: None,
            meter_rest: false,
        }
    }

    /// Envoy's status and response details for the head this refused (hyper answers it 400).
    pub(super) fn refusal(&self) -> Option<(StatusCode, &'static str)> {
        self.refusal
    }

    /// Whether a head has begun and is held until it is whole.
    pub(super) fn head_in_progress(&self) -> bool {
        self.state == State::Head && !self.held.is_empty()
    }

    /// Passes nothing more to hyper (the connection is being closed).
    pub(super) fn stop(&mut self) {
        self.held.clear();
        self.state = State::Refused;
    }

    /// Whether everything passes untouched from here on.
    pub(super) fn is_off(&self) -> bool {
        self.state == State::Off
    }

    /// The client closed (or the head is not one to follow): a head still held goes to hyper
    /// as it is, and so does everything after it.
    pub(super) fn end(&mut self, out: &mut BytesMut) {
        if self.state == State::Head && !self.held.is_empty() {
            // A head not followed further: its bytes (and what follows) are the request
            // hyper answers, no header bytes parsed, as Envoy's codec counts a head it
            // refuses.
            self.note_refused_head();
            self.meter_rest = true;
        }
        if self.state != State::Refused {
            out.extend_from_slice(&self.held);
            self.state = State::Off;
        }
        self.held.clear();
    }

    /// Notes the held head as a request's whole head, with no header bytes.
    fn note_refused_head(&self) {
        if let Some(m) = &self.meter {
            m.read_head(self.held.len(), 0, 0);
        }
    }

    /// Takes bytes the client sent and appends what hyper is to read.
    pub(super) fn feed(&mut self, input: &[u8], out: &mut BytesMut) {
        // A loop, not recursion: each whole head hands back what follows it, and a read may
        // carry hundreds of pipelined requests. A read is followed as it is borrowed; what
        // follows a whole head is handed back without a copy (see [`Input`]).
        let mut rest = self.step(input, out);
        while let Some(more) = rest {
            rest = self.step(more, out);
        }
    }

    /// Takes bytes up to the end of the next whole head (or all of them); returns what follows
    /// that head, still to be fed.
    fn step(&mut self, mut input: impl Input, out: &mut BytesMut) -> Option<BytesMut> {
        while !input.is_empty() {
            match self.state {
                State::Off => {
                    if let Some(m) = self.meter.as_ref().filter(|_| self.meter_rest) {
                        m.read_body(input.len() as u64);
                    }
                    out.extend_from_slice(&input);
                    return None;
                }
                State::Refused => return None,
                State::Head => return self.hold(input, out),
                State::Body(left) => {
                    let n = input.len().min(left.try_into().unwrap_or(usize::MAX));
                    if let Some(m) = &self.meter {
                        m.read_body(n as u64);
                    }
                    out.extend_from_slice(&input[..n]);
                    input.skip(n);
                    self.state = if n as u64 == left {
                        State::Head
                    } else {
                        State::Body(left - n as u64)
                    };
                    // What follows a body is a head: held from here.
                    if self.state == State::Head && !input.is_empty() {
                        return self.hold(input, out);
                    }
                }
                State::ChunkData(left) => {
                    let n = input.len().min(left.try_into().unwrap_or(usize::MAX));
                    if let Some(m) = &self.meter {
                        m.read_body(n as u64);
                    }
                    out.extend_from_slice(&input[..n]);
                    input.skip(n);
                    self.state = if n as u64 == left {
                        State::ChunkEnd
                    } else {
                        State::ChunkData(left - n as u64)
                    };
                }
                State::ChunkSize | State::ChunkEnd | State::Trailers(_) => {
                    let b = input[0];
                    out.put_u8(b);
                    input.skip(1);
                    if let Some(m) = &self.meter {
                        m.read_body(1);
                    }
                    self.chunk_byte(b);
                    if self.state == State::Head && !input.is_empty() {
                        return self.hold(input, out);
                    }
                }
            }
        }
        None
    }

    /// Holds `input` as (more of) the head being read, and looks at it.
    fn hold(&mut self, input: impl Input, out: &mut BytesMut) -> Option<BytesMut> {
        if self.held.is_empty() {
            self.held = input.into_held();
        } else {
            self.held.extend_from_slice(&input);
        }
        self.head(out)
    }

    /// One byte of a chunk-size line, a chunk's line end or the trailer section. A line end
    /// that is not CRLF, or anything but CRLF after a chunk's data, is where hyper (which
    /// reads the request behind) stops agreeing on where the body ends: nothing is followed
    /// (nor rewritten) from there on.
    fn chunk_byte(&mut self, b: u8) {
        let after_cr = std::mem::replace(&mut self.cr, b == b'\r');
        if b == b'\n' && !after_cr {
            self.held.clear();
            self.state = State::Off;
            return;
        }
        self.state = match (self.state, b) {
            (State::ChunkEnd, b'\n') => State::ChunkSize,
            (State::ChunkEnd, b'\r') if !after_cr => State::ChunkEnd,
            (State::ChunkEnd, _) => State::Off,
            (State::ChunkSize, b'\n') => {
                let line = std::mem::take(&mut self.held);
                match chunk_size(&line) {
                    Some(0) => State::Trailers(true),
                    Some(n) => State::ChunkData(n),
                    None => State::Off,
                }
            }
            (State::ChunkSize, _) => {
                if self.held.len() < 256 {
                    self.held.put_u8(b);
                    State::ChunkSize
                } else {
                    State::Off
                }
            }
            (State::Trailers(true), b'\n') => State::Head,
            (State::Trailers(_), b'\n') => State::Trailers(true),
            (State::Trailers(start), b'\r') => State::Trailers(start),
            (State::Trailers(_), _) => State::Trailers(false),
            (other, _) => other,
        };
    }

    /// Looks at the held head: while incomplete it stays held; once whole it goes out (as it
    /// is, without its lengths, or refused) and the state follows its body. Returns the bytes
    /// after a whole head.
    fn head(&mut self, out: &mut BytesMut) -> Option<BytesMut> {
        if !self.scan.due(&self.held, self.max_head) {
            return None;
        }
        // As many fields as hyper's parser behind takes: a head with more is refused here,
        // where it is counted as Envoy's codec counts it.
        let mut headers = [httparse::EMPTY_HEADER; crate::wire::MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let (max, held) = (self.max_head, self.held.len());
        let len = match req.parse(&self.held) {
            Ok(httparse::Status::Complete(len)) if len > max => {
                self.too_large(out);
                return None;
            }
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if held >= max => {
                self.too_large(out);
                return None;
            }
            Ok(httparse::Status::Partial) => return None,
            Err(httparse::Error::Version) => {
                // The version is judged once the head is whole and within the limit, as
                // Envoy's codec does.
                match (unsupported_version(&self.held), head_end(&self.held)) {
                    (Some(true), Some(end)) if end > max => self.too_large(out),
                    (Some(true), Some(_)) => {
                        self.note_refused_head();
                        self.refuse(StatusCode::UPGRADE_REQUIRED, "low_version", out);
                    }
                    (None | Some(true), None) if held >= max => self.too_large(out),
                    (None | Some(true), None) => {}
                    _ => self.end(out),
                }
                return None;
            }
            Err(e) => {
                // hyper's parser (httparse too) refuses it as well and answers, 431 for too
                // many headers and 400 otherwise: a codec error, as Envoy's codec counts it.
                if let Some(stats) = &self.stats {
                    let too_many = e == httparse::Error::TooManyHeaders;
                    stats.refused_by_http1_codec(if too_many { 431 } else { 400 });
                }
                self.end(out);
                return None;
            }
        };
        let name_values: usize = req
            .headers
            .iter()
            .map(|h| h.name.len() + h.value.len())
            .sum();
        if let Some(m) = &self.meter {
            m.read_head(len, req.headers.len(), name_values);
        }
        let (mut lengths, mut length, mut codings, mut chunked_only, mut opaque) =
            (Vec::new(), None, 0, true, req.method == Some("CONNECT"));
        let mut ends_chunked = false;
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let start = h.name.as_ptr() as usize - self.held.as_ptr() as usize;
                let value_end =
                    h.value.as_ptr() as usize - self.held.as_ptr() as usize + h.value.len();
                let end = self.held[value_end..len]
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(len, |i| value_end + i + 1);
                lengths.push(start..end);
                length = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok());
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                codings += 1;
                chunked_only &= h.value.trim_ascii().eq_ignore_ascii_case(b"chunked");
                ends_chunked = h
                    .value
                    .rsplit(|b| *b == b',')
                    .next()
                    .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if h.name.eq_ignore_ascii_case("upgrade") {
                opaque = true;
            }
        }
        let rest = self.held.split_off(len);
        let head = std::mem::take(&mut self.held);
        self.scan.reset();
        self.state = if !lengths.is_empty() && codings > 0 {
            if self.allow_chunked_length && codings == 1 && chunked_only {
                let mut at = 0;
                for r in &lengths {
                    out.extend_from_slice(&head[at..r.start]);
                    at = r.end;
                }
                out.extend_from_slice(&head[at..]);
                State::ChunkSize
            } else {
                self.refuse(
                    StatusCode::BAD_REQUEST,
                    "http1.content_length_and_chunked_not_allowed",
                    out,
                );
                return None;
            }
        } else if codings > 0 && !ends_chunked {
            // The line goes before the blank line that ends the head (CRLF or bare LF).
            let blank = if head.ends_with(b"\r\n\r\n") { 2 } else { 1 };
            let (fields, end) = head.split_at(head.len() - blank);
            out.extend_from_slice(fields);
            out.extend_from_slice(b"transfer-encoding: chunked");
            out.extend_from_slice(end);
            out.extend_from_slice(end);
            State::Off
        } else {
            out.extend_from_slice(&head);
            match (opaque, codings, lengths.len(), length) {
                (true, _, _, _) => State::Off,
                (_, 0, 0, _) => State::Head,
                (_, 0, 1, Some(0)) => State::Head,
                (_, 0, 1, Some(n)) => State::Body(n),
                (_, 1, 0, _) if chunked_only => State::ChunkSize,
                // Anything else is hyper's to refuse or frame.
                _ => State::Off,
            }
        };
        (!rest.is_empty()).then_some(rest)
    }
}

impl Framing {
    /// Refuses the held head for being over the limit (431), as Envoy's codec does while it
    /// reads it, before it judges the version and the framing at the head's end.
    fn too_large(&mut self, out: &mut BytesMut) {
        self.note_refused_head();
        self.refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "http1.headers_too_large",
            out,
        );
    }

    /// Refuses the held head as Envoy's codec does (`status`, `details`): hyper gets a line
    /// it answers 400, and nothing after it goes on.
    fn refuse(&mut self, status: StatusCode, details: &'static str, out: &mut BytesMut) {
        if let Some(stats) = &self.stats {
            stats.refused_by_http1_codec(status.as_u16());
        }
        out.extend_from_slice(REFUSED_HEAD);
        self.held.clear();
        self.state = State::Refused;
        self.refusal = Some((status, details));
    }
}

/// Whether the request line at the start of `head`, which httparse refused for its version,
/// is a method, a target and a version Envoy's codec answers 426 (`HTTP/` and a digit, a dot
/// and a digit); `None` while the line is not whole.
fn unsupported_version(head: &[u8]) -> Option<bool> {
    // The HTTP/2 connection preface is hyper's to serve (or refuse).
    if head.starts_with(b"PRI * HTTP/2.0") {
        return Some(false);
    }
    let line = &head[..head.iter().position(|b| *b == b'\n')?];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.split(|b| *b == b' ');
    let version = parts.nth(2).filter(|_| parts.next().is_none());
    Some(matches!(
        version,
        Some([b'H', b'T', b'T', b'P', b'/', major, b'.', minor])
            if major.is_ascii_digit() && minor.is_ascii_digit()
    ))
}

/// What [`Framing::step`] reads: a read's bytes, borrowed, or what followed a whole head,
/// owned, which becomes the next held head as it is (so a buffer of many pipelined requests is
/// not copied once per request).
trait Input: std::ops::Deref<Target = [u8]> {
    /// Drops the first `n` bytes.
    fn skip(&mut self, n: usize);
    /// The bytes as the held head.
    fn into_held(self) -> BytesMut;
}

impl Input for &[u8] {
    fn skip(&mut self, n: usize) {
        *self = &self[n..];
    }

    fn into_held(self) -> BytesMut {
        BytesMut::from(self)
    }
}

impl Input for BytesMut {
    fn skip(&mut self, n: usize) {
        self.advance(n);
    }

    fn into_held(self) -> BytesMut {
        self
    }
}

/// Where the head at the start of `d` ends (after its blank line), once it has.
fn head_end(d: &[u8]) -> Option<usize> {
    let mut from = 0;
    loop {
        let at = from
            + d[from..]
                .windows(2)
                .position(|w| w == b"\n\n" || w == b"\n\r")?;
        match &d[at + 1..] {
            [b'\n', ..] => return Some(at + 2),
            [b'\r', b'\n', ..] => return Some(at + 3),
            _ => from = at + 2,
        }
    }
}

/// The size of a chunk-size line (hex digits, then extensions, `\r` and whitespace ignored).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits: &[u8] = line
        .split(|b| *b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(allow: bool, parts: &[&[u8]]) -> String {
        let mut f = Framing::new(allow, 64 * 1024, None);
        let mut out = BytesMut::new();
        for p in parts {
            f.feed(p, &mut out);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    const CHUNKED: &[u8] =
        b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    const AMBIGUOUS: &[u8] = b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    const GET: &[u8] = b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n";

    #[test]
    fn plain_requests_pass_untouched_however_they_are_cut() {
        let all = [
            CHUNKED,
            GET,
            b"POST /d HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            GET,
        ]
        .concat();
        for cut in 1..all.len() {
            let (a, b) = all.split_at(cut);
            assert_eq!(
                through(false, &[a, b]),
                String::from_utf8_lossy(&all),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn an_unknown_version_is_refused_426_once_its_head_is_whole() {
        let all = [GET, b"GET / HTTP/9.1\r\nHost: x\r\n\r\n", GET].concat();
        for cut in 1..all.len() {
            let (a, b) = all.split_at(cut);
            let mut f = Framing::new(false, 64 * 1024, None);
            let mut out = BytesMut::new();
            f.feed(a, &mut out);
            f.feed(b, &mut out);
            let expected = [GET, REFUSED_HEAD].concat();
            assert_eq!(&out[..], &expected[..], "cut at {cut}");
            assert_eq!(
                f.refusal(),
                Some((StatusCode::UPGRADE_REQUIRED, "low_version"))
            );
        }
        // Not a digit, a dot and a digit: hyper's 400, as Envoy's codec answers.
        for line in [
            "GET / HTTP/1.10",
            "GET / HTTP/x.y",
            "GET / HTTX/1.1",
            "GET / HTTP/1",
            "GET /a b HTTP/1.1",
            "PRI * HTTP/2.0",
        ] {
            let head = format!("{line}\r\n\r\n");
            let mut f = Framing::new(false, 64 * 1024, None);
            assert_eq!(through(false, &[head.as_bytes()]), head, "{line}");
            f.feed(head.as_bytes(), &mut BytesMut::new());
            assert_eq!(f.refusal(), None, "{line}");
        }
    }

    #[test]
    fn headers_over_the_limit_are_refused_431_before_the_framing_however_they_arrive() {
        // Found by fuzzing (`http1_framing`): a whole head over the limit in one read was
        // refused for its framing (400) or its version (426), or given a chunked line, where
        // in pieces it passed on untouched; Envoy's codec answers 431 first.
        let filler = format!("x: {}\r\n", "a".repeat(100));
        for (line, coding) in [
            (
                "POST / HTTP/1.1",
                "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            ),
            ("POST / HTTP/1.1", "Transfer-Encoding: gzip\r\n"),
            ("GET / HTTP/9.1", ""),
            ("GET / HTTP/1.1", ""),
        ] {
            let head = format!("{line}\r\nHost: x\r\n{filler}{coding}\r\n0\r\n\r\n");
            for cut in [head.len(), 64, 1] {
                let mut f = Framing::new(false, 100, None);
                let mut out = BytesMut::new();
                for piece in head.as_bytes().chunks(cut) {
                    f.feed(piece, &mut out);
                }
                assert_eq!(
                    &out[..],
                    REFUSED_HEAD,
                    "{line} {coding}, in pieces of {cut}"
                );
                assert_eq!(
                    f.refusal(),
                    Some((
                        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                        "http1.headers_too_large"
                    )),
                    "{line} {coding}, in pieces of {cut}"
                );
            }
        }
        // Within the limit the framing rules apply.
        let head =
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut f = Framing::new(false, 100, None);
        f.feed(head.as_bytes(), &mut BytesMut::new());
        assert_eq!(f.refusal().map(|r| r.0), Some(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn many_pipelined_requests_in_one_read_pass_without_recursion() {
        // Each whole head used to feed what followed it recursively: a few thousand requests
        // in one read overflowed the thread's stack.
        let all = GET.repeat(20_000);
        assert_eq!(through(false, &[&all]), String::from_utf8_lossy(&all));
    }

    #[test]
    fn a_head_of_many_line_ends_that_end_nothing_is_looked_at_without_recursion() {
        // `\n\r` not followed by `\n` used to make the search for the head's end recurse
        // once each: a head of an unknown version full of them overflowed the stack and took
        // the process down.
        let mut head = b"GET / HTTP/9.1\r\n".to_vec();
        head.extend(b"X\n\r".repeat(300_000));
        assert_eq!(head_end(&head), None);
        head.extend_from_slice(b"\n");
        assert_eq!(head_end(&head), Some(head.len()));
        let mut f = Framing::new(false, 2 << 20, None);
        f.feed(&head, &mut BytesMut::new());
        assert_eq!(f.refusal().map(|r| r.0), Some(StatusCode::UPGRADE_REQUIRED));
    }

    #[test]
    fn a_bare_line_feed_in_chunked_framing_ends_the_following() {
        // hyper takes the line after `0\r\n\n` for a trailer (it wants CRLF): were the
        // follower to take `/b` for a request, it would read `/c`'s head as `/b`'s body and
        // rewrite `/c`'s body as a head. Nothing is changed from the bare LF on.
        let smuggled = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\nGET /b HTTP/1.1\r\nHost: x\r\nContent-Length: 49\r\n\r\nPOST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 58\r\n\r\nGET /d HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nPADDINGPADDING";
        assert_eq!(
            through(false, &[smuggled]),
            String::from_utf8_lossy(smuggled)
        );
        for bare in [
            &b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"[..],
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n",
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXY0\r\n\r\n",
        ] {
            let mut f = Framing::new(false, 64 * 1024, None);
            f.feed(bare, &mut BytesMut::new());
            assert_eq!(f.state, State::Off, "{}", String::from_utf8_lossy(bare));
        }
    }

    #[test]
    fn a_coding_not_ending_in_chunked_gets_a_chunked_line_hyper_accepts() {
        let gzip = b"POST /g HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nxyz";
        let bare = b"POST /g HTTP/1.1\nTransfer-Encoding: chunked, gzip\n\nxyz";
        let all = [CHUNKED, gzip].concat();
        for cut in 1..all.len() {
            let (a, b) = all.split_at(cut);
            assert_eq!(
                through(false, &[a, b]),
                format!(
                    "{}POST /g HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\nxyz",
                    String::from_utf8_lossy(CHUNKED)
                ),
                "cut at {cut}"
            );
        }
        assert_eq!(
            through(false, &[bare]),
            "POST /g HTTP/1.1\nTransfer-Encoding: chunked, gzip\ntransfer-encoding: chunked\n\nxyz"
        );
        let ending_chunked = b"POST /g HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        assert_eq!(
            through(false, &[ending_chunked]),
            String::from_utf8_lossy(ending_chunked)
        );
    }

    #[test]
    fn an_ambiguous_request_after_a_chunked_one_is_refused_and_nothing_follows() {
        let all = [CHUNKED, AMBIGUOUS, GET].concat();
        let expected = [CHUNKED, REFUSED_HEAD].concat();
        for cut in 1..all.len() {
            let (a, b) = all.split_at(cut);
            assert_eq!(
                through(false, &[a, b]),
                String::from_utf8_lossy(&expected),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn allow_chunked_length_drops_the_length_and_goes_on() {
        let all = [CHUNKED, AMBIGUOUS, GET].concat();
        let without = String::from_utf8_lossy(AMBIGUOUS).replace("Content-Length: 5\r\n", "");
        let expected = format!(
            "{}{without}{}",
            String::from_utf8_lossy(CHUNKED),
            String::from_utf8_lossy(GET)
        );
        assert_eq!(through(true, &[&all]), expected);
        let gzip = String::from_utf8_lossy(AMBIGUOUS).replace("chunked", "gzip, chunked");
        assert_eq!(
            through(true, &[gzip.as_bytes()]),
            String::from_utf8_lossy(REFUSED_HEAD)
        );
    }

    #[test]
    fn a_body_that_looks_like_a_head_is_a_body() {
        let body = b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let all = [
            format!("POST /a HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
            body,
            GET,
        ]
        .concat();
        assert_eq!(through(false, &[&all]), String::from_utf8_lossy(&all));
    }

    #[test]
    fn upgrades_and_http2_end_the_following() {
        let upgrade = [
            &b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"[..],
            AMBIGUOUS,
        ]
        .concat();
        assert_eq!(
            through(false, &[&upgrade]),
            String::from_utf8_lossy(&upgrade)
        );
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00";
        assert_eq!(through(false, &[preface]), String::from_utf8_lossy(preface));
    }
}
