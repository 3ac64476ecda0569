//! The body of an HTTP/1.1 response, read from its connection as the downstream asks for it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio_util::io::poll_read_buf;

use super::decode::{Chunked, DecodeError, Framing};
use super::{Connection, Release};
use crate::access_log::AttemptTarget;
use crate::upstream::pool::ActiveConnection;
use crate::upstream::stats::ClusterStats;

/// Why a response body could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The body's framing is broken.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// Reading from the upstream failed.
    #[error("upstream connection failed: {0}")]
    Io(#[from] io::Error),
    /// The upstream closed the connection before the body ended.
    #[error("upstream closed the connection before the response body ended")]
    Closed,
}

/// Where the body's bytes come from.
pub(super) enum Reader {
    /// The whole connection, which may go back to the pool at the end.
    Pooled(Connection),
    /// The read side of a connection whose request body is still being sent by another task.
    Half {
        read: tokio::io::ReadHalf<super::UpstreamIo>,
        active: ActiveConnection,
    },
}

enum State {
    Length(u64),
    Chunked(Chunked),
    UntilClose,
    Done,
}

/// An upstream HTTP/1.1 response body.
pub struct ResponseBody {
    reader: Option<Reader>,
    buf: BytesMut,
    state: State,
    /// Data already read to the body's end, handed out by the next poll.
    ready: Option<Bytes>,
    release: Option<Release>,
    /// Yield the chunked body's trailers (else it ends without them, like Envoy's HTTP/1 codec
    /// unless the cluster sets `enable_trailers`).
    trailers: bool,
    /// Since when `upstream_rq_time` counts, and whether the request was internal: recorded
    /// when the body ends.
    timing: Option<(Instant, bool)>,
    /// Counts the bytes read, for access logs.
    meter: Option<Arc<AttemptTarget>>,
}

impl ResponseBody {
    /// A body delimited by `framing`, starting with the bytes in `buf`. `release` is set when
    /// the connection may carry another request after this body; `trailers` keeps its trailers;
    /// `meter` counts what is read.
    pub(super) fn new(
        reader: Reader,
        mut buf: BytesMut,
        framing: Framing,
        release: Option<Release>,
        trailers: bool,
        meter: Option<Arc<AttemptTarget>>,
    ) -> Self {
        let (state, ready) = match framing {
            Framing::Empty => (State::Done, None),
            Framing::Length(0) => (State::Done, None),
            Framing::Length(n) if buf.len() as u64 >= n => {
                (State::Done, Some(buf.split_to(n as usize).freeze()))
            }
            Framing::Length(n) => (State::Length(n), None),
            Framing::Chunked => (State::Chunked(Chunked::Size), None),
            Framing::UntilClose => (State::UntilClose, None),
        };
        let mut body = ResponseBody {
            reader: Some(reader),
            buf,
            state,
            ready,
            release,
            trailers,
            timing: None,
            meter,
        };
        if matches!(body.state, State::Done) {
            body.finish();
        }
        body
    }

    /// Records `upstream_rq_time`, from `since` to the body's end (now, if it has ended: the
    /// whole body came with the head), as Envoy's router does when the upstream response
    /// completes; a body that fails records nothing.
    pub(crate) fn time(&mut self, stats: &ClusterStats, since: Instant, internal: bool) {
        if matches!(self.state, State::Done) {
            stats.record_rq_time(since.elapsed().as_millis() as u64, internal);
        } else {
            self.timing = Some((since, internal));
        }
    }

    /// The body ended: its `upstream_rq_time` is recorded; the connection goes back to its pool
    /// when it may be reused and holds nothing beyond this response; otherwise it closes.
    fn finish(&mut self) {
        self.state = State::Done;
        let active = match &self.reader {
            Some(Reader::Pooled(conn)) => Some(&conn.active),
            Some(Reader::Half { active, .. }) => Some(active),
            None => None,
        };
        if let (Some((since, internal)), Some(active)) = (self.timing.take(), active) {
            let ms = since.elapsed().as_millis() as u64;
            active.stats().record_rq_time(ms, internal);
        }
        let reader = self.reader.take();
        if let (Some(Reader::Pooled(conn)), Some(release)) = (reader, self.release.take())
            && self.buf.is_empty()
        {
            release.put(conn);
        }
        self.buf = BytesMut::new();
    }

    /// The body cannot end well: the connection is closed, and `e` is the body's last item.
    fn fail(&mut self, e: BodyError) -> BodyError {
        self.reader = None;
        self.state = State::Done;
        e
    }

    /// Reads more bytes into the buffer; `0` means the upstream closed the connection.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let want = match self.state {
            State::Length(left) => left.clamp(1024, 64 * 1024) as usize,
            _ => 16 * 1024,
        };
        if self.buf.capacity() - self.buf.len() < want.min(4096) {
            self.buf.reserve(want);
        }
        let read = match self.reader.as_mut() {
            Some(Reader::Pooled(conn)) => poll_read_buf(Pin::new(&mut conn.io), cx, &mut self.buf),
            Some(Reader::Half { read, .. }) => poll_read_buf(Pin::new(read), cx, &mut self.buf),
            None => Poll::Ready(Ok(0)),
        };
        if let (Poll::Ready(Ok(n)), Some(meter)) = (&read, &self.meter) {
            meter.wire().read(*n);
        }
        read
    }

    /// The next frame from the buffered bytes, if they hold one (or the end).
    fn decode(&mut self) -> Result<Option<Frame<Bytes>>, BodyError> {
        match &mut self.state {
            State::Length(left) => {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let take = self
                    .buf
                    .len()
                    .min(usize::try_from(*left).unwrap_or(usize::MAX));
                let data = self.buf.split_to(take).freeze();
                *left -= take as u64;
                if *left == 0 {
                    self.finish();
                }
                Ok(Some(Frame::data(data)))
            }
            State::Chunked(chunked) => {
                let frame = chunked.decode(&mut self.buf)?;
                if *chunked == Chunked::Done {
                    self.finish();
                }
                Ok(frame)
            }
            State::UntilClose if !self.buf.is_empty() => {
                Ok(Some(Frame::data(self.buf.split().freeze())))
            }
            State::UntilClose | State::Done => Ok(None),
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if let Some(data) = this.ready.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        loop {
            match this.decode() {
                // Trailers are the chunked body's last item: without them it has ended.
                Ok(Some(frame)) if frame.is_trailers() && !this.trailers => {
                    return Poll::Ready(None);
                }
                Ok(Some(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(None) if matches!(this.state, State::Done) => return Poll::Ready(None),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Some(Err(this.fail(e)))),
            }
            let read = ready!(this.poll_fill(cx));
            match read {
                Ok(0) if matches!(this.state, State::UntilClose) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(0) => return Poll::Ready(Some(Err(this.fail(BodyError::Closed)))),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(this.fail(e.into())))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ready.is_none() && matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        let ready = self.ready.as_ref().map_or(0, |d| d.len() as u64);
        match self.state {
            State::Length(left) => SizeHint::with_exact(left + ready),
            State::Done => SizeHint::with_exact(ready),
            State::Chunked(_) | State::UntilClose => SizeHint::default(),
        }
    }
}
