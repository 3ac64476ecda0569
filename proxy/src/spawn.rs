//! Keeping tasks small: the executor hyper spawns its per-stream and per-connection tasks on,
//! and boxing large futures in place.
//!
//! Tokio stores a task's future inline in the task cell and moves it on spawn and again when it
//! completes. hyper's HTTP/2 client spawns every per-request task as one enum sized by the
//! connection task (≈ 1.4 KiB), and its HTTP/2 server one task per stream around the service
//! future (which `http::serve_io` boxes). Futures larger than [`INLINE_LIMIT`] are boxed first,
//! so spawning them moves a pointer instead of kilobytes.
//!
//! A connection's task is sized for the largest state it can reach: a request in flight is
//! kilobytes that an idle keep-alive connection would hold too. Such parts are [`boxed`] only
//! while they run.

use std::future::Future;
use std::pin::Pin;

/// Futures up to this many bytes are spawned inline; larger ones are boxed.
pub const INLINE_LIMIT: usize = 512;

/// The future `make` returns, built directly in its heap slot. `Box::pin(make())` builds it on
/// the stack and copies it, kilobytes for a request's future (callgrind: about 460 more
/// instructions per HTTP/1 request than building it in place).
#[inline(always)]
pub fn boxed<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

/// A [`hyper::rt::Executor`] for the current tokio runtime that boxes large futures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Executor;

impl<F> hyper::rt::Executor<F> for Executor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        if size_of::<F>() > INLINE_LIMIT {
            tokio::spawn(Box::pin(fut));
        } else {
            tokio::spawn(fut);
        }
    }
}
