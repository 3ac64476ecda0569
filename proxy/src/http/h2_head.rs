//! HTTP/2 request heads on the connections hyper serves, for Envoy's head timeouts: hyper's
//! server only sees a stream once its header block is whole, so a HEADERS frame whose
//! CONTINUATION never comes is invisible to it. Envoy starts the stream, and its
//! `request_headers_timeout` (or a shorter `request_timeout`), at the HEADERS frame, and
//! answers 408 on that stream when the block is still not whole: HEADERS, DATA with the text
//! and END_STREAM, then RST_STREAM (NO_ERROR), the connection left open. [`Inbound`] follows
//! the client's frames to see such a block; [`Outbound`] follows the server's, so that
//! [`reply_frames`] go out between two of hyper's frames; a block that ends after its 408 is
//! rewritten so that hyper's codec refuses the request ([`Inbound::rewrite`]). A connection
//! opened with the preface that never sends a HEADERS frame has no stream, and no timer, in
//! Envoy either.

use http::{HeaderMap, StatusCode};

/// The client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// DATA.
const DATA: u8 = 0x0;
/// HEADERS.
const HEADERS: u8 = 0x1;
/// RST_STREAM.
const RST_STREAM: u8 = 0x3;
/// PING.
const PING: u8 = 0x6;
/// CONTINUATION.
const CONTINUATION: u8 = 0x9;
/// The END_STREAM flag.
const END_STREAM: u8 = 0x1;
/// The END_HEADERS flag.
const END_HEADERS: u8 = 0x4;
/// The largest frame payload a peer always accepts (the initial SETTINGS_MAX_FRAME_SIZE).
const MAX_PAYLOAD: usize = 16_384;

/// Frame boundaries in one direction of a connection.
#[derive(Debug, Default, PartialEq)]
struct Frames {
    /// The frame header being read.
    head: [u8; 9],
    /// How much of `head` has come.
    have: usize,
    /// Payload bytes left in the current frame.
    left: usize,
}

impl Frames {
    /// Follows `bytes`, calling `on_head` with each frame header's type, flags and stream.
    fn feed(&mut self, mut bytes: &[u8], mut on_head: impl FnMut(u8, u8, u32)) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = self.left.min(bytes.len());
                self.left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == 9 {
                let h = self.head;
                self.have = 0;
                self.left = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                on_head(
                    h[3],
                    h[4],
                    u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                );
            }
        }
    }

    /// How many bytes may pass before the next frame boundary as far as is known (0 at one).
    fn room(&self) -> usize {
        if self.have > 0 {
            9 - self.have
        } else {
            self.left
        }
    }
}

/// Where the client's side of a connection is.
#[derive(Debug, PartialEq)]
enum Side {
    /// This much of the preface has come.
    Preface(usize),
    /// In frames.
    Frames(Frames),
    /// In frames, not followed (no head timeout to enforce).
    Unfollowed,
    /// Not HTTP/2.
    Off,
}

/// Follows what the client sends on a connection hyper serves, for a header block that is not
/// whole.
#[derive(Debug)]
pub(super) struct Inbound {
    side: Side,
    /// Whether the connection is HTTP/2 before its preface has come (hyper's HTTP/2-only
    /// server writes its SETTINGS at once).
    http2_only: bool,
    /// Whether the frames after the preface are followed.
    frames: bool,
    /// The stream whose header block has begun and not ended.
    open: Option<u32>,
    /// A stream answered 408 whose header block has not ended yet (see [`Inbound::rewrite`]).
    expired: Option<Expired>,
}

/// A timed-out stream whose header block may still end.
#[derive(Debug)]
struct Expired {
    /// The stream.
    stream: u32,
    /// How many bytes of the frame header being read hyper had before the timeout.
    passed: usize,
    /// Whether the current frame ends the block: the refusing frame follows its payload.
    ending: bool,
}

/// A header block fragment hyper's codec refuses after decoding the block (a
/// connection-specific field: a malformed request, a stream error).
const REFUSING_FIELD: &[u8] = b"\x00\x0aconnection\x05close";

impl Inbound {
    /// Follows a connection from its first byte: HTTP/2 when it starts with the preface, or
    /// from the start when `http2_only`.
    pub(super) fn new(http2_only: bool) -> Inbound {
        Inbound {
            side: Side::Preface(0),
            http2_only,
            frames: true,
            open: None,
            expired: None,
        }
    }

    /// Follows only the preface, which says whether the connection is HTTP/2 (no head timeout
    /// to enforce).
    pub(super) fn preface_only(self) -> Inbound {
        Inbound {
            frames: false,
            ..self
        }
    }

    /// Whether the connection speaks HTTP/2 (what hyper writes is frames).
    pub(super) fn is_http2(&self) -> bool {
        match self.side {
            Side::Preface(_) => self.http2_only,
            Side::Frames(_) | Side::Unfollowed => true,
            Side::Off => false,
        }
    }

    /// Whether the client's bytes are still followed.
    pub(super) fn following(&self) -> bool {
        matches!(self.side, Side::Preface(_) | Side::Frames(_))
    }

    /// Takes bytes hyper is about to read; whether a header block began in them.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) -> bool {
        if let Side::Preface(had) = self.side {
            let n = (PREFACE.len() - had).min(bytes.len());
            if bytes[..n] != PREFACE[had..had + n] {
                self.side = Side::Off;
                return false;
            }
            bytes = &bytes[n..];
            self.side = if had + n < PREFACE.len() {
                Side::Preface(had + n)
            } else if self.frames {
                Side::Frames(Frames::default())
            } else {
                Side::Unfollowed
            };
        }
        let Side::Frames(frames) = &mut self.side else {
            return false;
        };
        follow(frames, &mut self.open, bytes)
    }

    /// The stream whose header block is not whole yet.
    pub(super) fn open(&self) -> Option<u32> {
        self.open
    }

    /// The open header block's timeout was answered: its stream, if the block ends later, is
    /// refused (see [`Inbound::rewrite`]).
    pub(super) fn answered(&mut self) {
        let passed = match &self.side {
            Side::Frames(frames) => frames.have,
            _ => 0,
        };
        self.expired = self.open.take().map(|stream| Expired {
            stream,
            passed,
            ending: false,
        });
    }

    /// Whether what the client sends must go through [`Inbound::rewrite`].
    pub(super) fn rewriting(&self) -> bool {
        self.expired.is_some()
    }

    /// Takes bytes hyper is to read while a timed-out stream's header block may still end,
    /// and appends what hyper reads instead: the same, except that the CONTINUATION ending
    /// that block does not end it, and one more CONTINUATION follows, ending it with a
    /// connection-specific field. Envoy ignores a block that ends after its stream's 408;
    /// hyper's codec decodes it (HPACK state stays in step with the client's) and refuses the
    /// request as malformed, so the request never reaches the router. Frame headers are held
    /// here until whole, so the END_HEADERS flag can be cleared. Returns the stream whose
    /// refusing frame went out (it then gets hyper's RST_STREAM, see [`swallowed_reset`]),
    /// and whether a new header block began.
    pub(super) fn rewrite(
        &mut self,
        mut bytes: &[u8],
        out: &mut bytes::BytesMut,
    ) -> (Option<u32>, bool) {
        let (mut refused, mut began) = (None, false);
        let Side::Frames(frames) = &mut self.side else {
            out.extend_from_slice(bytes);
            return (None, false);
        };
        while !bytes.is_empty() {
            let Some(expired) = &mut self.expired else {
                began |= follow(frames, &mut self.open, bytes);
                out.extend_from_slice(bytes);
                break;
            };
            if frames.left > 0 {
                let n = frames.left.min(bytes.len());
                out.extend_from_slice(&bytes[..n]);
                frames.left -= n;
                bytes = &bytes[n..];
                if frames.left == 0 && expired.ending {
                    refused = Some(refuse(out, expired.stream));
                    self.expired = None;
                }
                continue;
            }
            let n = (9 - frames.have).min(bytes.len());
            frames.head[frames.have..frames.have + n].copy_from_slice(&bytes[..n]);
            frames.have += n;
            bytes = &bytes[n..];
            if frames.have < 9 {
                continue;
            }
            let mut head = frames.head;
            frames.have = 0;
            frames.left = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let (kind, flags) = (head[3], head[4]);
            let passed = std::mem::take(&mut expired.passed);
            if kind == CONTINUATION && stream == expired.stream && flags & END_HEADERS != 0 {
                if passed <= 4 {
                    head[4] &= !END_HEADERS;
                    expired.ending = true;
                } else {
                    self.expired = None;
                }
            } else if kind == HEADERS && flags & END_HEADERS == 0 {
                self.open = Some(stream);
                began = true;
            }
            out.extend_from_slice(&head[passed..]);
            if frames.left == 0
                && let Some(expired) = self.expired.take_if(|e| e.ending)
            {
                refused = Some(refuse(out, expired.stream));
            }
        }
        (refused, began)
    }
}

/// Follows `bytes` through `frames`, noting in `open` the stream whose header block has begun
/// and not ended; whether a block began.
fn follow(frames: &mut Frames, open: &mut Option<u32>, bytes: &[u8]) -> bool {
    let mut began = false;
    frames.feed(bytes, |kind, flags, stream| match kind {
        HEADERS if flags & END_HEADERS == 0 => {
            *open = Some(stream);
            began = true;
        }
        CONTINUATION if flags & END_HEADERS != 0 => *open = None,
        _ => {}
    });
    began
}

/// Appends the CONTINUATION that ends `stream`'s header block with [`REFUSING_FIELD`];
/// returns the stream.
fn refuse(out: &mut bytes::BytesMut, stream: u32) -> u32 {
    let mut f = Vec::with_capacity(9 + REFUSING_FIELD.len());
    frame(&mut f, CONTINUATION, END_HEADERS, stream, REFUSING_FIELD);
    out.extend_from_slice(&f);
    stream
}

/// How many bytes at the start of `buf`, which hyper is writing from a frame boundary, are
/// its RST_STREAM for the `refused` stream (see [`Inbound::rewrite`]): Envoy sends nothing
/// more on a stream it answered 408, so that frame is dropped.
pub(super) fn swallowed_reset(buf: &[u8], refused: u32) -> Option<usize> {
    let head = buf.get(..9)?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    (head[..4] == [0, 0, 4, RST_STREAM] && stream == refused && buf.len() >= 13).then_some(13)
}

/// Follows what hyper writes on an HTTP/2 connection, so bytes of our own go out between its
/// frames.
#[derive(Debug, Default)]
pub(super) struct Outbound(Frames);

/// The PING with which h2 starts a graceful shutdown (its `Ping::SHUTDOWN` payload), framed:
/// h2 sends its final GOAWAY once the client answers it.
const SHUTDOWN_PING: [u8; 17] = [
    0, 0, 8, PING, 0, 0, 0, 0, 0, 0x0b, 0x7b, 0xa2, 0xf0, 0x8b, 0x9b, 0xfe, 0x54,
];

impl Outbound {
    /// Where h2's shutdown PING begins in `buf`, which hyper is about to write, when it is
    /// there whole.
    pub(super) fn shutdown_ping(&self, buf: &[u8]) -> Option<usize> {
        let Frames { head, have, left } = &self.0;
        let mut at = if *have > 0 {
            let rest = 9 - have;
            let mut whole = *head;
            whole[*have..].copy_from_slice(buf.get(..rest)?);
            rest + u32::from_be_bytes([0, whole[0], whole[1], whole[2]]) as usize
        } else {
            *left
        };
        while let Some(frame) = buf.get(at..at + 9) {
            if buf[at..].starts_with(&SHUTDOWN_PING) {
                return Some(at);
            }
            at += 9 + u32::from_be_bytes([0, frame[0], frame[1], frame[2]]) as usize;
        }
        None
    }

    /// Takes bytes written.
    pub(super) fn wrote(&mut self, bytes: &[u8]) {
        self.0.feed(bytes, |_, _, _| {});
    }

    /// How many bytes may be written before the next frame boundary (0 at one).
    pub(super) fn room(&self) -> usize {
        self.0.room()
    }
}

/// The frames of a local reply on `stream`, as Envoy sends one to a stream whose request
/// has not ended: HEADERS (`:status`, then `headers`), DATA with `body` ending the stream,
/// then RST_STREAM with NO_ERROR. The fields are literals that no HPACK table keeps, so
/// neither the client's decoder nor hyper's encoder changes state.
pub(super) fn reply_frames(
    stream: u32,
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Vec<u8> {
    let mut block = Vec::new();
    literal(&mut block, b":status", status.as_str().as_bytes());
    for (name, value) in headers {
        literal(&mut block, name.as_str().as_bytes(), value.as_bytes());
    }
    let mut out = Vec::with_capacity(block.len() + body.len() + 64);
    let mut pieces = block.chunks(MAX_PAYLOAD).peekable();
    let mut kind = HEADERS;
    while let Some(piece) = pieces.next() {
        let mut flags = if pieces.peek().is_none() {
            END_HEADERS
        } else {
            0
        };
        if kind == HEADERS && body.is_empty() {
            flags |= END_STREAM;
        }
        frame(&mut out, kind, flags, stream, piece);
        kind = CONTINUATION;
    }
    let mut chunks = body.chunks(MAX_PAYLOAD).peekable();
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            END_STREAM
        } else {
            0
        };
        frame(&mut out, DATA, flags, stream, chunk);
    }
    frame(&mut out, RST_STREAM, 0, stream, &0u32.to_be_bytes());
    out
}

/// Appends one frame.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends a literal header field without indexing, with a literal name (RFC 7541 6.2.2).
fn literal(block: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    block.push(0);
    string(block, name);
    string(block, value);
}

/// Appends a string literal, not Huffman-coded (RFC 7541 5.2).
fn string(block: &mut Vec<u8>, s: &[u8]) {
    let mut len = s.len();
    if len < 127 {
        block.push(len as u8);
    } else {
        block.push(127);
        len -= 127;
        while len >= 128 {
            block.push((len % 128) as u8 | 0x80);
            len /= 128;
        }
        block.push(len as u8);
    }
    block.extend_from_slice(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(stream: u32, flags: u8) -> Vec<u8> {
        let mut out = Vec::new();
        frame(&mut out, HEADERS, flags, stream, b"\x82");
        out
    }

    #[test]
    fn a_header_block_is_open_from_headers_to_the_continuation_ending_it() {
        let mut watch = Inbound::new(false);
        let mut bytes = PREFACE.to_vec();
        frame(&mut bytes, 0x4, 0, 0, &[]);
        bytes.extend(headers(1, END_STREAM | END_HEADERS));
        bytes.extend(headers(3, END_STREAM));
        let (first, rest) = bytes.split_at(30);
        assert!(!watch.feed(first));
        assert!(watch.feed(rest));
        assert_eq!(watch.open(), Some(3));
        let mut cont = Vec::new();
        frame(&mut cont, CONTINUATION, 0, 3, b"\x84");
        assert!(!watch.feed(&cont));
        assert_eq!(watch.open(), Some(3));
        let mut end = Vec::new();
        frame(&mut end, CONTINUATION, END_HEADERS, 3, b"\x86");
        for b in &end {
            watch.feed(std::slice::from_ref(b));
        }
        assert_eq!(watch.open(), None);
        assert!(watch.is_http2());
    }

    #[test]
    fn a_block_ending_after_its_timeout_is_refused_and_its_reset_dropped() {
        let mut watch = Inbound::new(true);
        let mut bytes = PREFACE.to_vec();
        bytes.extend(headers(1, END_STREAM));
        assert!(watch.feed(&bytes));
        watch.answered();
        assert!(watch.rewriting() && watch.open().is_none());
        let mut late = Vec::new();
        frame(&mut late, CONTINUATION, END_HEADERS, 1, b"\x84");
        late.extend(headers(3, END_STREAM | END_HEADERS));
        let mut out = bytes::BytesMut::new();
        // A byte at a time: frame headers are held until whole.
        let mut refused = None;
        for b in &late {
            refused = refused.or(watch.rewrite(std::slice::from_ref(b), &mut out).0);
        }
        assert_eq!(refused, Some(1));
        assert!(!watch.rewriting());
        let mut seen = Vec::new();
        Frames::default().feed(&out, |k, f, s| seen.push((k, f, s)));
        assert_eq!(
            seen,
            [
                (CONTINUATION, 0, 1),
                (CONTINUATION, END_HEADERS, 1),
                (HEADERS, END_STREAM | END_HEADERS, 3)
            ]
        );
        let mut reset = Vec::new();
        frame(&mut reset, RST_STREAM, 0, 1, &1u32.to_be_bytes());
        assert_eq!(swallowed_reset(&reset, 1), Some(13));
        assert_eq!(swallowed_reset(&reset, 3), None);
        assert_eq!(swallowed_reset(&reset[..9], 1), None);
    }

    #[test]
    fn a_preface_only_watch_knows_http2_and_follows_no_frame() {
        let mut watch = Inbound::new(false).preface_only();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(headers(1, END_STREAM));
        assert!(!watch.feed(&bytes), "no header block is followed");
        assert!(watch.is_http2() && !watch.following());
        assert_eq!(watch.open(), None);
    }

    #[test]
    fn http1_turns_the_watch_off() {
        let mut watch = Inbound::new(false);
        assert!(!watch.feed(b"POST / HTTP/1.1\r\n"));
        assert!(!watch.is_http2() && !watch.following());
    }

    #[test]
    fn the_outbound_side_knows_its_frame_boundaries() {
        let mut out = Outbound::default();
        assert_eq!(out.room(), 0);
        let f = headers(1, END_HEADERS);
        out.wrote(&f[..4]);
        assert_eq!(out.room(), 5);
        out.wrote(&f[4..9]);
        assert_eq!(out.room(), 1);
        out.wrote(&f[9..]);
        assert_eq!(out.room(), 0);
    }

    #[test]
    fn the_shutdown_ping_is_found_between_frames() {
        let mut bytes = headers(1, END_HEADERS);
        let mut goaway = Vec::new();
        frame(
            &mut goaway,
            0x7,
            0,
            0,
            &[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0],
        );
        bytes.extend(&goaway);
        bytes.extend(SHUTDOWN_PING);
        let out = Outbound::default();
        assert_eq!(out.shutdown_ping(&bytes), Some(10 + 17));
        assert_eq!(out.shutdown_ping(&bytes[..30]), None, "not whole");
        let mut out = Outbound::default();
        out.wrote(&bytes[..4]);
        assert_eq!(out.shutdown_ping(&bytes[4..]), Some(10 + 17 - 4));
        out.wrote(&bytes[4..12]);
        assert_eq!(out.shutdown_ping(&bytes[12..]), Some(10 + 17 - 12));
        let mut user = SHUTDOWN_PING;
        user[16] ^= 1;
        assert_eq!(Outbound::default().shutdown_ping(&user), None);
    }

    #[test]
    fn a_reply_is_headers_data_and_a_reset() {
        let mut h = HeaderMap::new();
        h.insert("content-length", http::HeaderValue::from(2));
        let long = "x".repeat(200);
        h.insert("x-long", http::HeaderValue::from_str(&long).unwrap());
        let out = reply_frames(5, StatusCode::REQUEST_TIMEOUT, &h, b"hi");
        let mut seen = Vec::new();
        Frames::default().feed(&out, |k, f, s| seen.push((k, f, s)));
        assert_eq!(
            seen,
            [
                (HEADERS, END_HEADERS, 5),
                (DATA, END_STREAM, 5),
                (RST_STREAM, 0, 5)
            ]
        );
        // Each field: a zero byte, the name's length and name, the value's length and value.
        let block_len = (2 + 7 + 1 + 3) + (2 + 14 + 1 + 1) + (2 + 6 + 2 + 200);
        assert_eq!(&out[..3], &(block_len as u32).to_be_bytes()[1..]);
        assert!(out.windows(3).any(|w| w == [127, 73, b'x']));
    }
}
