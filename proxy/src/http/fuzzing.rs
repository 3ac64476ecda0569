//! The HTTP module's parsers of client bytes, reachable from [`crate::fuzzing`] (built only
//! under `--cfg fuzzing`).

use std::time::Duration;

use bytes::BytesMut;
use http::StatusCode;

use crate::config::hcm::HcmConfig;

/// The fast path's verdict on the request head at the start of `buf`.
pub(crate) fn request_head(buf: &mut BytesMut, cfg: &HcmConfig) -> &'static str {
    super::h1::parse_head_for_fuzzing(buf, cfg)
}

/// What the request-stream follower hands hyper when the client sends `pieces` and then
/// closes, and the refusal it made.
pub(crate) fn framing<'a>(
    allow_chunked_length: bool,
    max_head: usize,
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> (BytesMut, Option<(StatusCode, &'static str)>) {
    let mut f = super::framing::Framing::new(allow_chunked_length, max_head, None);
    let mut out = BytesMut::new();
    for piece in pieces {
        f.feed(piece, &mut out);
    }
    f.end(&mut out);
    (out, f.refusal())
}

/// A `grpc-timeout` value as the router reads it.
pub(crate) fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    super::grpc_timeout::parse(value)
}

/// The connection manager's path rules applied to `path_and_query`.
pub(crate) fn normalize_path(cfg: &HcmConfig, path_and_query: &str) -> super::path::PathVerdict {
    super::path::normalize(cfg, path_and_query)
}
