//! Bodies passed through a codec as they stream: each data frame compressed (and flushed)
//! or decompressed on its own, the compressed stream finished at the body's end (before its
//! trailers, which pass unchanged), with the bytes in and out counted.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::codec::{Compressor, Decompressor};
use crate::body::{Body, BoxError};
use crate::stats::Counter;

/// The counters of bytes into and out of a codec.
#[derive(Debug, Clone)]
pub(super) struct ByteCounters {
    /// Bytes before compression (after decompression).
    pub uncompressed: Counter,
    /// Bytes after compression (before decompression).
    pub compressed: Counter,
}

/// What a coded body runs its frames through.
#[derive(Debug)]
enum Codec {
    Compress(Compressor),
    /// A decompressor, `None` after it failed (counted in the counter): the rest of the
    /// body is dropped.
    Decompress(Option<Decompressor>, Counter),
}

/// `body` compressed by `codec` as it streams.
pub(super) fn compressed(body: Body, codec: Compressor, counters: ByteCounters) -> Body {
    Coded::wrap(body, Codec::Compress(codec), counters)
}

/// `body` decompressed by `codec` as it streams; a failure is counted in `errors`.
pub(super) fn decompressed(
    body: Body,
    codec: Decompressor,
    counters: ByteCounters,
    errors: Counter,
) -> Body {
    Coded::wrap(body, Codec::Decompress(Some(codec), errors), counters)
}

/// See [`compressed`] and [`decompressed`].
struct Coded {
    inner: Body,
    codec: Codec,
    counters: ByteCounters,
    /// Trailers read while the compressed stream's end was still to be sent.
    trailers: Option<http::HeaderMap>,
    done: bool,
}

impl Coded {
    fn wrap(inner: Body, codec: Codec, counters: ByteCounters) -> Body {
        http_body_util::BodyExt::boxed_unsync(Coded {
            inner,
            codec,
            counters,
            trailers: None,
            done: false,
        })
    }

    /// Runs `input` through the codec (`last`: the body ends with it).
    fn code(&mut self, input: &[u8], last: bool) -> Result<Vec<u8>, BoxError> {
        match &mut self.codec {
            Codec::Compress(c) => {
                self.counters.uncompressed.add(input.len() as u64);
                let out = c.compress(input, last)?;
                self.counters.compressed.add(out.len() as u64);
                Ok(out)
            }
            Codec::Decompress(slot, errors) => {
                let Some(d) = slot.as_mut() else {
                    return Ok(Vec::new());
                };
                match d.decompress(input) {
                    Ok(out) => {
                        self.counters.compressed.add(input.len() as u64);
                        self.counters.uncompressed.add(out.len() as u64);
                        Ok(out)
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "decompression failed; the rest of the body is dropped");
                        errors.inc();
                        *slot = None;
                        Ok(Vec::new())
                    }
                }
            }
        }
    }

    /// Whether the codec has output to add at the end of the body.
    fn finishes(&self) -> bool {
        matches!(self.codec, Codec::Compress(_))
    }
}

impl http_body::Body for Coded {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(None) => {
                    this.done = true;
                    if !this.finishes() {
                        return Poll::Ready(None);
                    }
                    let out = this.code(&[], true)?;
                    return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out.into()))));
                }
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    // Trailers end the body: the compressed stream ends before them.
                    this.done = true;
                    this.trailers = frame.into_trailers().ok();
                    if !this.finishes() {
                        continue;
                    }
                    let out = this.code(&[], true)?;
                    if out.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(out.into()))));
                }
            };
            let last = this.inner.is_end_stream();
            let out = this.code(&data, last)?;
            this.done = last;
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(out.into()))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
