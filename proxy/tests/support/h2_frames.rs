//! HTTP/2 by hand, for tests that watch the frames themselves (a GOAWAY and its code, a
//! stream that completes after it): frames written and read on a plain `TcpStream`, request
//! headers as literal fields (no HPACK state), and a reader that answers SETTINGS and PING.
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;

/// DATA.
pub const DATA: u8 = 0;
/// HEADERS.
pub const HEADERS: u8 = 1;
/// SETTINGS.
pub const SETTINGS: u8 = 4;
/// PING.
pub const PING: u8 = 6;
/// GOAWAY.
pub const GOAWAY: u8 = 7;
/// The END_STREAM flag.
pub const END_STREAM: u8 = 0x1;
/// The END_HEADERS flag.
pub const END_HEADERS: u8 = 0x4;

/// One HTTP/2 frame: type, flags, stream id, payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// Reads the next HTTP/2 frame from `conn`: type, flags, stream id, payload.
pub fn read(conn: &mut TcpStream) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    conn.read_exact(&mut head)?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0; len];
    conn.read_exact(&mut payload)?;
    Ok((head[3], head[4], stream, payload))
}

/// A header block of `fields`, each a literal field without indexing with a new name (RFC
/// 7541 6.2.2), so no HPACK state is needed.
pub fn literal_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in fields {
        block.push(0);
        block.push(n.len() as u8);
        block.extend(n.as_bytes());
        block.push(v.len() as u8);
        block.extend(v.as_bytes());
    }
    block
}

/// The client connection preface and an empty SETTINGS frame.
pub fn preface() -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out
}

/// A bodiless GET of `path` for `authority` on `stream`, ending the stream.
pub fn get(stream: u32, authority: &str, path: &str) -> Vec<u8> {
    let block = literal_block(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", authority),
        (":path", path),
    ]);
    frame(HEADERS, END_STREAM | END_HEADERS, stream, &block)
}

/// What a [`Reader`] has seen of one stream.
#[derive(Debug, Default, Clone)]
pub struct Stream {
    /// Whether its response headers began with `:status: 200` (index 8 of the static table).
    pub ok: Option<bool>,
    /// Its response body.
    pub body: Vec<u8>,
    /// Whether the server ended it.
    pub ended: bool,
}

/// Reads a connection's frames, answering the server's SETTINGS and PING.
pub struct Reader<'c> {
    conn: &'c mut TcpStream,
    /// The GOAWAY's error code, once one came.
    pub goaway: Option<u32>,
}

impl<'c> Reader<'c> {
    /// Reads from `conn`.
    pub fn new(conn: &'c mut TcpStream) -> Reader<'c> {
        Reader { conn, goaway: None }
    }

    /// Reads frames until `done` holds for stream `id` and the GOAWAY seen so far (or the
    /// connection fails: its error); what was seen of the stream.
    pub fn until(
        &mut self,
        id: u32,
        mut done: impl FnMut(&Stream, Option<u32>) -> bool,
    ) -> Result<Stream, String> {
        let mut seen = Stream::default();
        while !done(&seen, self.goaway) {
            let (kind, flags, stream, payload) =
                read(self.conn).map_err(|e| format!("read: {e} after {seen:?}"))?;
            match kind {
                SETTINGS if flags & 0x1 == 0 => self.write(&frame(SETTINGS, 0x1, 0, &[]))?,
                PING if flags & 0x1 == 0 => self.write(&frame(PING, 0x1, 0, &payload))?,
                HEADERS if stream == id => {
                    seen.ok.get_or_insert(payload.first() == Some(&0x88));
                    seen.ended |= flags & END_STREAM != 0;
                }
                DATA if stream == id => {
                    seen.body.extend(&payload);
                    seen.ended |= flags & END_STREAM != 0;
                }
                GOAWAY => {
                    let code = payload
                        .get(4..8)
                        .and_then(|c| c.try_into().ok())
                        .map(u32::from_be_bytes);
                    self.goaway = Some(code.ok_or("a short GOAWAY")?);
                }
                _ => {}
            }
        }
        Ok(seen)
    }

    /// Writes `bytes` on the connection.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.conn
            .write_all(bytes)
            .map_err(|e| format!("write: {e}"))
    }
}
