//! The executor hyper spawns its per-stream and per-connection tasks on.
//!
//! Tokio stores a task's future inline in the task cell and moves it on spawn and again when it
//! completes. hyper's HTTP/2 client spawns every per-request task as one enum sized by the
//! connection task (≈ 1.4 KiB), and its HTTP/2 server one task per stream around the service
//! future (which `http::serve_io` boxes). Futures larger than [`INLINE_LIMIT`] are boxed first,
//! so spawning them moves a pointer instead of kilobytes.

use std::future::Future;

/// Futures up to this many bytes are spawned inline; larger ones are boxed.
pub const INLINE_LIMIT: usize = 512;

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
