//! The one HTTP body type that flows between downstream and upstream connections.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full, combinators::UnsyncBoxBody};

/// Any error a body can fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed HTTP body: requests sent upstream and responses sent downstream.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A body holding `data`.
pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Boxes any body whose error converts into [`BoxError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// Whether a body watched by [`watched`] failed (`Default`: a body not watched, which never
/// fails).
#[derive(Clone, Debug, Default)]
pub struct Failed(Option<Arc<AtomicBool>>);

impl Failed {
    /// Whether the body returned an error.
    pub fn get(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
    }
}

/// `body` unchanged, and a flag that turns true when it returns an error: how the router tells
/// a request whose own body broke (a client's bad chunking) from an upstream failure, whichever
/// upstream protocol carried it.
pub fn watched(body: Body) -> (Body, Failed) {
    let flag = Arc::new(AtomicBool::new(false));
    let failed = Failed(Some(flag.clone()));
    let body = body
        .map_err(move |e| {
            flag.store(true, Ordering::Relaxed);
            e
        })
        .boxed_unsync();
    (body, failed)
}

/// Whether a body watched by [`tracked`] has been read to its end.
#[derive(Clone, Debug)]
pub struct Finished(Arc<AtomicBool>);

impl Finished {
    /// Whether the body has ended.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// `body` unchanged, and a flag that turns true once it has been read to its end: how an
/// answer tells a request still arriving (Envoy then closes an HTTP/1 connection).
pub fn tracked(body: Body) -> (Body, Finished) {
    let flag = Arc::new(AtomicBool::new(http_body::Body::is_end_stream(&body)));
    let finished = Finished(flag.clone());
    let body = at_end(body, move || flag.store(true, Ordering::Relaxed));
    (body, finished)
}

/// `body` unchanged, running `then` once when its last frame is handed out (never when the
/// body is dropped first, nor when it starts ended).
fn at_end<F: FnOnce() + Send + Unpin + 'static>(body: Body, then: F) -> Body {
    let then = (!http_body::Body::is_end_stream(&body)).then_some(then);
    AtEnd { inner: body, then }.boxed_unsync()
}

/// See [`at_end`].
struct AtEnd<F> {
    inner: Body,
    then: Option<F>,
}

impl<F: FnOnce() + Send + Unpin + 'static> http_body::Body for AtEnd<F> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        // Trailers are the last frame: a reader need not poll again to see the end.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(frame))) => frame.is_trailers() || this.inner.is_end_stream(),
            _ => false,
        };
        if ended && let Some(then) = this.then.take() {
            then();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `body` ending where its trailers would come, which are dropped (its data unchanged): what
/// Envoy's HTTP/1 codec does with trailers unless `enable_trailers` is set.
pub fn without_trailers(body: Body) -> Body {
    UntilTrailers {
        inner: body,
        ended: false,
    }
    .boxed_unsync()
}

/// See [`without_trailers`].
struct UntilTrailers {
    inner: Body,
    ended: bool,
}

impl http_body::Body for UntilTrailers {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() => {
                this.ended = true;
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// `body` unchanged but for its size hint, which no longer tells its length: what a filter
/// that removed the request's `content-length` hands on, so that no length is sent upstream.
pub fn without_length(body: Body) -> Body {
    Unsized(body).boxed_unsync()
}

/// See [`without_length`].
struct Unsized(Body);

impl http_body::Body for Unsized {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// `first` (one data frame, none when empty), then `rest`: a body some of which was read
/// already.
pub fn prefixed(first: Bytes, rest: Body) -> Body {
    Prefixed {
        first: (!first.is_empty()).then_some(first),
        rest,
    }
    .boxed_unsync()
}

/// See [`prefixed`].
struct Prefixed {
    first: Option<Bytes>,
    rest: Body,
}

impl http_body::Body for Prefixed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let me = self.get_mut();
        if let Some(first) = me.first.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(first))));
        }
        Pin::new(&mut me.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let first = self.first.as_ref().map_or(0, |b| b.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(rest.lower() + first);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + first);
        }
        hint
    }
}

/// `body` unchanged, keeping `held` alive until the body's last frame is handed out (or the
/// body is dropped first): per-request state that ends with the response's end, as Envoy's
/// ends when the stream completes, not when the connection lets the body go.
pub fn holding_until_end<T: Send + Unpin + 'static>(body: Body, held: T) -> Body {
    at_end(body, move || drop(held))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watched_body_reports_its_failure() {
        let frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"ok"))),
            Err("bad chunk".into()),
        ];
        let (body, failed) = watched(boxed(http_body_util::StreamBody::new(tokio_stream::iter(
            frames,
        ))));
        assert!(!failed.get());
        assert!(body.collect().await.is_err());
        assert!(failed.get());
        assert!(!Failed::default().get());
    }

    #[tokio::test]
    async fn held_state_ends_with_the_last_frame() {
        let held = Arc::new(());
        let mut body = holding_until_end(full(Bytes::from_static(b"ok")), held.clone());
        assert_eq!(Arc::strong_count(&held), 2);
        assert!(body.frame().await.is_some());
        // The body is still alive; what it held is not.
        assert_eq!(Arc::strong_count(&held), 1);
        drop(holding_until_end(empty(), held.clone()));
        let unread = holding_until_end(full(Bytes::from_static(b"ok")), held.clone());
        drop(unread);
        assert_eq!(Arc::strong_count(&held), 1);
    }

    #[tokio::test]
    async fn a_tracked_body_reports_its_end() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(2);
        let (mut body, finished) = tracked(boxed(http_body_util::StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )));
        tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"ok"))))
            .await
            .unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        assert!(!finished.get(), "more may come");
        drop(tx);
        assert!(body.frame().await.is_none());
        assert!(finished.get());
        assert!(
            tracked(empty()).1.get(),
            "an empty body has ended from the start"
        );

        let frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> =
            vec![Ok(http_body::Frame::trailers(http::HeaderMap::new()))];
        let (mut body, finished) = tracked(boxed(http_body_util::StreamBody::new(
            tokio_stream::iter(frames),
        )));
        assert!(body.frame().await.unwrap().unwrap().is_trailers());
        assert!(finished.get(), "trailers are the last frame");
    }

    #[tokio::test]
    async fn trailers_end_the_body_and_are_dropped() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-sum", http::HeaderValue::from_static("42"));
        let frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"ok"))),
            Ok(http_body::Frame::trailers(trailers)),
        ];
        let body = boxed(http_body_util::StreamBody::new(tokio_stream::iter(frames)));
        let collected = without_trailers(body).collect().await.unwrap();
        assert!(collected.trailers().is_none());
        assert_eq!(collected.to_bytes(), "ok");
    }
}
