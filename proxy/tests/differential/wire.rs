//! A connection wrapper that records what the client read, so that an exchange that got no
//! HTTP response can say how it ended: a clean close, a reset, garbage, or nothing at all.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How many of the first bytes read are kept for the report.
const KEPT: usize = 48;

/// What one connection's reads and writes saw.
#[derive(Default, Debug)]
pub struct Wire {
    /// The first bytes read (at most [`KEPT`]).
    pub first: Vec<u8>,
    /// How many bytes were read in all.
    pub read: usize,
    /// The peer closed its side cleanly (a read returned no bytes).
    pub eof: bool,
    /// The first I/O error of a read or a write.
    pub error: Option<io::ErrorKind>,
}

impl Wire {
    fn saw(&mut self, bytes: &[u8]) {
        let room = KEPT.saturating_sub(self.first.len());
        self.first
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.read += bytes.len();
    }

    fn failed(&mut self, kind: io::ErrorKind) {
        self.error.get_or_insert(kind);
    }

    /// How the connection ended: `reset` (ECONNRESET, or a write the peer refused),
    /// `closed` (a clean EOF), another I/O error, or that it had not ended.
    pub fn ending(&self) -> String {
        match self.error {
            Some(kind) => io_ending(kind),
            None if self.eof => "closed".to_string(),
            None => "given up with the connection open".to_string(),
        }
    }

    /// The first bytes read, as `garbage: "..."` (see [`garbage`]).
    pub fn garbage(&self) -> String {
        garbage(&self.first)
    }
}

/// `garbage: "<bytes>"`, the bytes escaped and cut after the first line (how much more had
/// arrived when the client gave up varies).
pub fn garbage(first: &[u8]) -> String {
    let line = first
        .iter()
        .position(|b| *b == b'\n')
        .map_or(first, |end| &first[..=end]);
    let text = String::from_utf8_lossy(line).escape_debug().to_string();
    format!("garbage: \"{text}\"")
}

/// How an I/O error ended a connection: `reset` (ECONNRESET, or a write the peer refused), or
/// the error's kind.
pub fn io_ending(kind: io::ErrorKind) -> String {
    match kind {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted => "reset".to_string(),
        kind => format!("i/o error {kind:?}"),
    }
}

/// A shared handle on a connection's [`Wire`].
pub type WireLog = Arc<Mutex<Wire>>;

/// `inner`, with every read and I/O error recorded in `log`.
pub struct Watched<S> {
    inner: S,
    log: WireLog,
}

impl<S> Watched<S> {
    /// Wraps `inner`, recording into `log`.
    pub fn new(inner: S, log: WireLog) -> Self {
        Watched { inner, log }
    }

    fn record<T>(&self, result: &Poll<io::Result<T>>) {
        if let Poll::Ready(Err(e)) = result {
            self.log.lock().expect("wire log").failed(e.kind());
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let asked = buf.remaining() > 0;
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.record(&result);
        if let Poll::Ready(Ok(())) = result {
            let new = &buf.filled()[before..];
            let mut log = this.log.lock().expect("wire log");
            if new.is_empty() && asked {
                log.eof = true;
            }
            log.saw(new);
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.record(&result);
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.record(&result);
        result
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
