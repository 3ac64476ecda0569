//! Clients that note, in order, what a proxy did to their connection: each response (its
//! status, and whether it says `connection: close`), each HTTP/2 GOAWAY (last stream and code)
//! and the connection's close, what the proxy did on its own timers with the second it came
//! at (rounded), for the drain tests that compare revoy with Envoy.
//! The test crate declares `support/h2_frames.rs` as `h2_frames` beside this module.
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::h2_frames;

/// What one client saw, from the moment it connected.
pub struct Seen {
    start: Instant,
    /// What the client saw, in order.
    pub events: Vec<String>,
}

impl Seen {
    /// From now.
    pub fn new() -> Seen {
        Seen::from(Instant::now())
    }

    /// From `start` (a scenario's, shared by its clients).
    pub fn from(start: Instant) -> Seen {
        Seen {
            start,
            events: Vec::new(),
        }
    }

    /// Seconds since the connection began.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Waits until `secs` after the connection began.
    pub fn at(&self, secs: f64) {
        let until = self.start + Duration::from_secs_f64(secs);
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
    }

    /// Notes what the client saw.
    pub fn saw(&mut self, what: String) {
        self.events.push(what);
    }

    /// Notes what the proxy did on its own, with the second it came at.
    pub fn timed(&mut self, what: &str) {
        let secs = self.now().round();
        self.events.push(format!("{what} at {secs}s"));
    }
}

/// An HTTP/1.1 client.
pub struct H1 {
    conn: TcpStream,
    buf: Vec<u8>,
    /// What it saw.
    pub seen: Seen,
}

impl H1 {
    /// Connects to 127.0.0.1:`port`, which must accept.
    pub fn connect(port: u16) -> H1 {
        H1::try_connect(port).expect("proxy accepts")
    }

    /// Connects to 127.0.0.1:`port`; `None` when it refuses.
    pub fn try_connect(port: u16) -> Option<H1> {
        let conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
        Some(H1 {
            conn,
            buf: Vec::new(),
            seen: Seen::new(),
        })
    }

    /// Sends an HTTP/1.1 GET of `path` and notes its response: status, and whether it says
    /// `connection: close` (or `keep-alive`).
    pub fn get(&mut self, path: &str) {
        self.get_as(path, "HTTP/1.1", "");
    }

    /// [`H1::get`] in `version` (`HTTP/1.0` or `HTTP/1.1`) with `headers` (whole lines, each
    /// ending in `\r\n`).
    pub fn get_as(&mut self, path: &str, version: &str, headers: &str) {
        let head = format!("GET {path} {version}\r\nhost: limits\r\n{headers}\r\n");
        if self.conn.write_all(head.as_bytes()).is_err() {
            self.seen.saw(format!("GET {path}: not sent"));
            return;
        }
        self.conn
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let (head, body_at) = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break (
                    String::from_utf8_lossy(&self.buf[..end]).to_ascii_lowercase(),
                    end + 4,
                );
            }
            if !self.fill() {
                self.seen.saw(format!("GET {path}: no response"));
                return;
            }
        };
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while self.buf.len() < body_at + length {
            assert!(self.fill(), "response body cut short");
        }
        self.buf.drain(..body_at + length);
        let status = head.split(' ').nth(1).unwrap_or("?").to_owned();
        let connection = head
            .lines()
            .find(|l| l.starts_with("connection:"))
            .map_or_else(String::new, |l| format!(", {l}"));
        self.seen.saw(format!("GET {path}: {status}{connection}"));
    }

    /// Reads more; `false` at the end of the stream.
    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        match self.conn.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Waits (until `secs`) for the proxy to close the connection, and notes when it did.
    pub fn until_closed(mut self, secs: f64) -> Vec<String> {
        let until = self.seen.start + Duration::from_secs_f64(secs);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.seen.saw(format!("still open at {secs}s"));
                break;
            }
            self.conn.set_read_timeout(Some(left)).unwrap();
            let mut chunk = [0u8; 1024];
            match self.conn.read(&mut chunk) {
                Ok(0) => {
                    self.seen.timed("closed");
                    break;
                }
                Ok(n) => self
                    .seen
                    .saw(format!("unexpected bytes: {:?}", &chunk[..n])),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => {
                    self.seen.timed(&format!("failed ({:?})", e.kind()));
                    break;
                }
            }
        }
        self.seen.events
    }
}

/// An HTTP/2 (prior knowledge) client.
pub struct H2 {
    conn: TcpStream,
    /// What it saw.
    pub seen: Seen,
    closed: bool,
}

impl H2 {
    /// Connects to 127.0.0.1:`port` and sends the preface.
    pub fn connect(port: u16) -> H2 {
        let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
        conn.write_all(&h2_frames::preface()).unwrap();
        H2 {
            conn,
            seen: Seen::new(),
            closed: false,
        }
    }

    /// Opens stream `id` with a GET of `path`.
    pub fn get(&mut self, id: u32, path: &str) {
        if self
            .conn
            .write_all(&h2_frames::get(id, "limits", path))
            .is_err()
        {
            self.seen.saw(format!("stream {id}: not sent"));
        }
    }

    /// Reads frames until stream `id` ends (any stream when 0) or, at the latest, until `secs`,
    /// noting responses, GOAWAYs and the close; answers SETTINGS and PING.
    pub fn read(&mut self, id: u32, secs: f64) {
        let until = self.seen.start + Duration::from_secs_f64(secs);
        while !self.closed {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            self.conn.set_read_timeout(Some(left)).unwrap();
            let (kind, flags, stream, payload) = match h2_frames::read(&mut self.conn) {
                Ok(frame) => frame,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return;
                }
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                    self.closed = true;
                    self.seen.timed("closed");
                    return;
                }
                Err(e) => {
                    self.closed = true;
                    self.seen.timed(&format!("failed ({:?})", e.kind()));
                    return;
                }
            };
            let reply = match kind {
                h2_frames::SETTINGS if flags & 1 == 0 => {
                    Some(h2_frames::frame(h2_frames::SETTINGS, 1, 0, &[]))
                }
                h2_frames::PING if flags & 1 == 0 => {
                    Some(h2_frames::frame(h2_frames::PING, 1, 0, &payload))
                }
                _ => None,
            };
            if let Some(reply) = reply {
                let _ = self.conn.write_all(&reply);
            }
            match kind {
                h2_frames::HEADERS if payload.first() != Some(&0x88) => {
                    self.seen.saw(format!("stream {stream}: not 200"));
                }
                h2_frames::GOAWAY => {
                    let word =
                        |at: usize| u32::from_be_bytes(payload[at..at + 4].try_into().unwrap());
                    let what = format!("GOAWAY last={} code={}", word(0) & 0x7fff_ffff, word(4));
                    self.seen.timed(&what);
                }
                _ => {}
            }
            let data = matches!(kind, h2_frames::HEADERS | h2_frames::DATA);
            if data && flags & h2_frames::END_STREAM != 0 {
                self.seen.saw(format!("stream {stream}: ended"));
                if stream == id || id == 0 {
                    return;
                }
            }
        }
    }

    /// Reads until the proxy closes the connection (until `secs` at the latest).
    pub fn until_closed(mut self, secs: f64) -> Vec<String> {
        self.read(u32::MAX, secs);
        if !self.closed {
            self.seen.saw(format!("still open at {secs}s"));
        }
        self.seen.events
    }
}
