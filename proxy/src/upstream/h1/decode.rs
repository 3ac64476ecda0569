//! Reading an HTTP/1.1 response: the head, how its body is delimited, whether the connection
//! stays open, and the chunked transfer coding.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, HeaderName, HeaderValue, TRANSFER_ENCODING};
use http::{HeaderMap, Response, StatusCode, Version};
use http_body::Frame;

use crate::wire::{HeaderSpans, MAX_HEADERS, parsed_value, tokens};

/// The response head size Envoy's upstream codec accepts by default (`max_response_headers_kb`
/// unset: 80 KiB; Envoy 1.40 takes a 70 KB head and resets on a 100 KB one).
pub(super) const MAX_HEAD: usize = 80 * 1024;

/// Room in a response's header map for what the proxy adds (`server`, `date`,
/// `x-envoy-upstream-service-time`, route headers), so it does not grow.
const EXTRA_HEADERS: usize = 4;

/// The longest chunk-size line accepted (size, extensions and CRLF).
const MAX_CHUNK_LINE: usize = 4096;

/// Why a response could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The head is not valid HTTP/1.x.
    #[error("invalid response head: {0}")]
    Head(&'static str),
    /// The head is over [`MAX_HEAD`] bytes.
    #[error("response headers over max_response_headers_kb")]
    HeadTooLarge,
    /// The chunked transfer coding is broken.
    #[error("invalid chunked body: {0}")]
    Chunked(&'static str),
}

/// How the response body is delimited (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body (HEAD request, 1xx, 204, 304).
    Empty,
    /// `content-length` bytes.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
    /// Everything until the upstream closes the connection.
    UntilClose,
}

/// A parsed response head. The connection-level fields (`connection` naming only `keep-alive`
/// or `close`, `keep-alive`, `proxy-connection`, `transfer-encoding`) are read here and left
/// out of the header map: the proxy would strip them anyway.
pub(super) struct Head {
    /// Status, version and the end-to-end headers.
    pub response: Response<()>,
    /// Its header bytes as Envoy's codec counts them: each field's name and value, plus 3.
    pub header_bytes: usize,
    close: bool,
    keep_alive: bool,
    transfer: Transfer,
    length: Length,
}

/// What the `content-length` fields said. Like Envoy 1.40, exactly one field holding one
/// decimal number is valid: a second field, even an equal one, or a list is not.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Length {
    Absent,
    Valid(u64),
    Invalid(&'static str),
}

impl Length {
    fn add(self, value: &[u8]) -> Length {
        match (self, parse_decimal(value.trim_ascii())) {
            (Length::Invalid(e), _) => Length::Invalid(e),
            (Length::Valid(_), _) => Length::Invalid("more than one content-length"),
            (Length::Absent, None) => Length::Invalid("invalid content-length"),
            (Length::Absent, Some(n)) => Length::Valid(n),
        }
    }
}

/// What the `transfer-encoding` fields said. Envoy 1.40 accepts exactly one field whose value
/// is `chunked` (any case) and refuses any other coding or list.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transfer {
    Absent,
    Chunked,
    Invalid(&'static str),
}

impl Transfer {
    fn add(self, value: &[u8]) -> Transfer {
        match self {
            Transfer::Absent if value.trim_ascii().eq_ignore_ascii_case(b"chunked") => {
                Transfer::Chunked
            }
            Transfer::Absent => Transfer::Invalid("transfer-encoding other than chunked"),
            Transfer::Chunked => Transfer::Invalid("more than one transfer-encoding"),
            Transfer::Invalid(e) => Transfer::Invalid(e),
        }
    }
}

/// A header value with obsolete line folding (CRLF then spaces or tabs) joined by single
/// spaces, as Envoy forwards it.
fn unfold(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    let mut folding = false;
    for &b in value {
        match b {
            b'\r' | b'\n' => folding = true,
            b' ' | b'\t' if folding => {}
            _ => {
                if folding {
                    out.push(b' ');
                    folding = false;
                }
                out.push(b);
            }
        }
    }
    out
}

/// Parses a response head at the start of `buf`. On success the head is removed from `buf`
/// (which then starts with the body); `None` means more bytes are needed.
pub(super) fn response_head(buf: &mut BytesMut) -> Result<Option<Head>, DecodeError> {
    match parse_head(buf, false) {
        // Obsolete line folding is rare: only a head the strict parser refuses pays for a second
        // parse that accepts it and for looking for folds in every value.
        Err(Refused::Parser(_)) => parse_head(buf, true),
        other => other,
    }
    .map_err(|refused| match refused {
        Refused::Parser(e) => DecodeError::Head(describe(e)),
        Refused::Decode(e) => e,
    })
}

/// Why [`parse_head`] gave up.
enum Refused {
    /// httparse refused the head; `buf` is untouched.
    Parser(httparse::Error),
    /// The head parsed but is not acceptable.
    Decode(DecodeError),
}

impl From<DecodeError> for Refused {
    fn from(e: DecodeError) -> Self {
        Refused::Decode(e)
    }
}

/// [`response_head`] with obsolete line folding refused or accepted (and unfolded).
fn parse_head(buf: &mut BytesMut, folding: bool) -> Result<Option<Head>, Refused> {
    let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .allow_obsolete_multiline_headers_in_responses(folding)
        .parse_response_with_uninit_headers(&mut parsed, buf, &mut slots)
    {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(DecodeError::HeadTooLarge.into());
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(Refused::Parser(e)),
    };
    if len > MAX_HEAD {
        return Err(DecodeError::HeadTooLarge.into());
    }
    let status = parsed
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(DecodeError::Head("invalid status code"))?;
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let spans = HeaderSpans::of(buf, parsed.headers);
    let count = parsed.headers.len();
    let head = buf.split_to(len).freeze();
    let mut parsed = Head {
        response: Response::new(()),
        header_bytes: 0,
        close: false,
        keep_alive: false,
        transfer: Transfer::Absent,
        length: Length::Absent,
    };
    let mut headers = HeaderMap::with_capacity(count + EXTRA_HEADERS);
    for (name, value) in spans.iter() {
        parsed.header_bytes += name.len() + value.len() + 3;
        let name = HeaderName::from_bytes(&head[name])
            .map_err(|_| DecodeError::Head("invalid header name"))?;
        let folded = (folding && head[value.clone()].contains(&b'\n'))
            .then(|| Bytes::from(unfold(&head[value.clone()])));
        let raw = folded.as_deref().unwrap_or(&head[value.clone()]);
        if name == CONNECTION {
            let mut only_connection_tokens = true;
            for t in tokens(raw) {
                if t.eq_ignore_ascii_case(b"close") {
                    parsed.close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    parsed.keep_alive = true;
                } else {
                    only_connection_tokens = false;
                }
            }
            if only_connection_tokens {
                continue;
            }
        } else if name == TRANSFER_ENCODING {
            parsed.transfer = parsed.transfer.add(raw);
            continue;
        } else if name == "keep-alive" || name == "proxy-connection" {
            continue;
        } else if name == CONTENT_LENGTH {
            parsed.length = parsed.length.add(raw);
        }
        let value = match folded {
            Some(unfolded) => HeaderValue::from_maybe_shared(unfolded)
                .map_err(|_| DecodeError::Head("invalid header value"))?,
            None => parsed_value(head.slice(value)),
        };
        headers.append(name, value);
    }
    *parsed.response.status_mut() = status;
    *parsed.response.version_mut() = version;
    *parsed.response.headers_mut() = headers;
    Ok(Some(parsed))
}

fn describe(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status line",
        httparse::Error::Token => "invalid token",
        httparse::Error::TooManyHeaders => "too many headers",
        httparse::Error::Version => "invalid HTTP version",
    }
}

impl Head {
    /// The response status.
    pub(super) fn status(&self) -> StatusCode {
        self.response.status()
    }

    /// How the body (of an answer to a HEAD request when `head_request`) is delimited. Framing
    /// Envoy 1.40 refuses is an error whatever the status: an invalid `content-length` or
    /// `transfer-encoding`, both at once, or a 204 declaring a body.
    pub(super) fn framing(&self, head_request: bool) -> Result<Framing, DecodeError> {
        let status = self.status();
        match (self.transfer, self.length) {
            (Transfer::Invalid(e), _) | (_, Length::Invalid(e)) => {
                return Err(DecodeError::Head(e));
            }
            (Transfer::Chunked, Length::Valid(_)) => {
                return Err(DecodeError::Head(
                    "both transfer-encoding and content-length",
                ));
            }
            (Transfer::Chunked, _) | (_, Length::Valid(1..))
                if status == StatusCode::NO_CONTENT =>
            {
                return Err(DecodeError::Head("204 response declaring a body"));
            }
            _ => {}
        }
        if head_request
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return Ok(Framing::Empty);
        }
        Ok(match (self.transfer, self.length) {
            (Transfer::Chunked, _) => Framing::Chunked,
            (_, Length::Valid(n)) => Framing::Length(n),
            _ => Framing::UntilClose,
        })
    }

    /// Whether the connection may carry another request after this response (and its body).
    pub(super) fn keeps_alive(&self, framing: Framing) -> bool {
        if framing == Framing::UntilClose {
            return false;
        }
        match self.response.version() {
            Version::HTTP_10 => self.keep_alive,
            _ => !self.close,
        }
    }
}

fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })
}

/// Decoding state of a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunked {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk with this many bytes left.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: trailer fields up to an empty line.
    Trailers,
    /// The body ended.
    Done,
}

impl Chunked {
    /// Decodes the next frame from `buf`: data, trailers, or `None` when more bytes are needed
    /// or the body ended ([`Chunked::Done`]).
    pub(super) fn decode(
        &mut self,
        buf: &mut BytesMut,
    ) -> Result<Option<Frame<Bytes>>, DecodeError> {
        loop {
            match *self {
                Chunked::Size => {
                    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
                        if buf.len() > MAX_CHUNK_LINE {
                            return Err(DecodeError::Chunked("chunk size line too long"));
                        }
                        return Ok(None);
                    };
                    let size = chunk_size(&buf[..end])?;
                    buf.advance(end + 1);
                    *self = if size == 0 {
                        Chunked::Trailers
                    } else {
                        Chunked::Data(size)
                    };
                }
                Chunked::Data(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let data = buf.split_to(take).freeze();
                    let left = left - take as u64;
                    *self = if left == 0 {
                        Chunked::DataEnd
                    } else {
                        Chunked::Data(left)
                    };
                    return Ok(Some(Frame::data(data)));
                }
                Chunked::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(DecodeError::Chunked("missing CRLF after chunk data"));
                    }
                    buf.advance(2);
                    *self = Chunked::Size;
                }
                Chunked::Trailers => return self.trailers(buf),
                Chunked::Done => return Ok(None),
            }
        }
    }

    fn trailers(&mut self, buf: &mut BytesMut) -> Result<Option<Frame<Bytes>>, DecodeError> {
        if buf.starts_with(b"\r\n") {
            buf.advance(2);
            *self = Chunked::Done;
            return Ok(None);
        }
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let (len, fields) = match httparse::parse_headers(buf, &mut slots) {
            Ok(httparse::Status::Complete(done)) => done,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(DecodeError::Chunked("trailers too large"));
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(DecodeError::Chunked("invalid trailers")),
        };
        let mut trailers = HeaderMap::with_capacity(fields.len());
        for f in fields.iter() {
            let name = HeaderName::from_bytes(f.name.as_bytes())
                .map_err(|_| DecodeError::Chunked("invalid trailer name"))?;
            let value = HeaderValue::from_bytes(f.value)
                .map_err(|_| DecodeError::Chunked("invalid trailer value"))?;
            trailers.append(name, value);
        }
        buf.advance(len);
        *self = Chunked::Done;
        Ok(Some(Frame::trailers(trailers)))
    }
}

/// The size on a chunk-size line (hex digits, then optional extensions), without its LF.
fn chunk_size(line: &[u8]) -> Result<u64, DecodeError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii_end();
    if digits.is_empty() || digits.len() > 16 {
        return Err(DecodeError::Chunked("invalid chunk size"));
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let v = (d as char)
            .to_digit(16)
            .ok_or(DecodeError::Chunked("invalid chunk size"))?;
        Ok((n << 4) | u64::from(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Option<Head>, DecodeError> {
        response_head(&mut BytesMut::from(raw))
    }

    fn decode_all(chunks: &[&[u8]]) -> Result<(Vec<u8>, Option<HeaderMap>, Chunked), DecodeError> {
        let mut state = Chunked::Size;
        let mut buf = BytesMut::new();
        let (mut data, mut trailers) = (Vec::new(), None);
        for piece in chunks {
            buf.extend_from_slice(piece);
            while let Some(frame) = state.decode(&mut buf)? {
                match frame.into_data() {
                    Ok(d) => data.extend_from_slice(&d),
                    Err(f) => trailers = f.into_trailers().ok(),
                }
            }
        }
        Ok((data, trailers, state))
    }

    #[test]
    fn a_complete_head_is_split_off_and_the_body_stays() {
        let mut buf = BytesMut::from(
            "HTTP/1.1 201 Whatever\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\nhi",
        );
        let head = response_head(&mut buf).unwrap().unwrap();
        assert_eq!(head.status(), StatusCode::CREATED);
        assert_eq!(head.response.version(), Version::HTTP_11);
        assert_eq!(head.response.headers().get_all("x-a").iter().count(), 2);
        assert_eq!(&buf[..], b"hi");
        assert_eq!(head.framing(false), Ok(Framing::Length(2)));
        assert_eq!(head.framing(true), Ok(Framing::Empty));
    }

    #[test]
    fn a_partial_head_needs_more_bytes_until_the_limit() {
        assert!(matches!(head("HTTP/1.1 200 OK\r\nA: b\r\n"), Ok(None)));
        let big = format!("HTTP/1.1 200 OK\r\nA: {}\r\n", "x".repeat(MAX_HEAD));
        assert!(matches!(head(&big), Err(DecodeError::HeadTooLarge)));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("h{i}: v\r\n")).collect();
        assert!(head(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")).is_err());
        assert!(head("HTTP/1.1 abc OK\r\n\r\n").is_err());
    }

    #[test]
    fn framing_follows_rfc_9112_as_strictly_as_envoy() {
        let of = |raw: &str| head(raw).unwrap().unwrap().framing(false);
        let refused = |raw: &str| assert!(of(raw).is_err(), "accepted: {raw:?}");
        assert_eq!(
            of("HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"),
            Ok(Framing::Empty)
        );
        assert_eq!(
            of("HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n"),
            Ok(Framing::Empty)
        );
        assert_eq!(
            of("HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n"),
            Ok(Framing::Chunked)
        );
        assert_eq!(
            of("HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n"),
            Ok(Framing::Length(7))
        );
        assert_eq!(of("HTTP/1.1 200 OK\r\n\r\n"), Ok(Framing::UntilClose));
        refused("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n");
        refused("HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n");
        refused("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n");
        refused("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n");
        refused("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n");
        refused(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
        );
        refused("HTTP/1.1 200 OK\r\ncontent-length: 7\r\ncontent-length: 7\r\n\r\n");
        refused("HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\n\r\n");
        refused("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n");
    }

    #[test]
    fn folded_header_values_are_joined_by_one_space() {
        let folded =
            head("HTTP/1.1 200 OK\r\nx-fold: a\r\n  b\r\n\tc\r\ncontent-length: 0\r\n\r\n")
                .unwrap()
                .unwrap();
        assert_eq!(folded.response.headers()["x-fold"], "a b c");
        assert!(head("HTTP/1.1 200 OK\r\n x-lead: 1\r\n\r\n").is_err());
    }

    #[test]
    fn keep_alive_depends_on_version_connection_and_framing() {
        let ka = |raw: &str| {
            let head = head(raw).unwrap().unwrap();
            head.keeps_alive(head.framing(false).unwrap())
        };
        assert!(ka("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(!ka(
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: Close\r\n\r\n"
        ));
        assert!(!ka("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"));
        assert!(ka(
            "HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n"
        ));
        assert!(!ka("HTTP/1.1 200 OK\r\n\r\n"));
        assert!(ka("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"));
    }

    #[test]
    fn connection_level_fields_stay_out_of_the_header_map() {
        let plain = head(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\
             Proxy-Connection: close\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        let names: Vec<_> = plain
            .response
            .headers()
            .keys()
            .map(|n| n.as_str())
            .collect();
        assert_eq!(names, ["x-a"]);
        assert_eq!(plain.framing(false), Ok(Framing::Chunked));
        let nominating = head("HTTP/1.1 200 OK\r\nConnection: close, x-a\r\nX-A: 1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(nominating.response.headers()["connection"], "close, x-a");
        assert!(!nominating.keeps_alive(Framing::Length(0)));
    }

    #[test]
    fn chunked_bodies_decode_across_any_split() {
        let wire: &[u8] = b"5;ext=1\r\nhello\r\n1\r\n \r\n6\r\nworld!\r\n0\r\nx-t: 1\r\n\r\n";
        for split in 0..wire.len() {
            let (data, trailers, state) = decode_all(&[&wire[..split], &wire[split..]]).unwrap();
            assert_eq!(data, b"hello world!", "split at {split}");
            assert_eq!(trailers.unwrap()["x-t"], "1");
            assert_eq!(state, Chunked::Done);
        }
        let (data, trailers, state) = decode_all(&[b"3\r\nabc\r\n0\r\n\r\n"]).unwrap();
        assert_eq!(
            (data.as_slice(), trailers, state),
            (&b"abc"[..], None, Chunked::Done)
        );
    }

    #[test]
    fn broken_chunked_bodies_are_errors() {
        assert!(decode_all(&[b"zz\r\n"]).is_err());
        assert!(decode_all(&[b"3\r\nabcX\r\n"]).is_err());
        assert!(decode_all(&[b"11111111111111111\r\n"]).is_err());
        assert!(decode_all(&[&[b'1'; MAX_CHUNK_LINE + 1]]).is_err());
    }
}
