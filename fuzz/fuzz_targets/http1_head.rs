//! The HTTP/1.1 fast path's request head parser on a connection's bytes (the first byte picks
//! the connection manager's options). A head the fast path does not serve leaves the buffer
//! as it was for hyper, except that `allow_chunked_length` may drop `content-length` lines.
#![no_main]

use std::sync::LazyLock;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use revoy::config::hcm::HcmConfig;

static CONFIGS: LazyLock<Vec<HcmConfig>> =
    LazyLock::new(|| (0..2).map(revoy::fuzzing::hcm).collect());

fuzz_target!(|data: &[u8]| {
    let Some((&flags, bytes)) = data.split_first() else {
        return;
    };
    let cfg = &CONFIGS[usize::from(flags & 1)];
    let mut buf = BytesMut::from(bytes);
    let verdict = revoy::fuzzing::http1_request_head(&mut buf, cfg);
    if verdict != "served" && !cfg.allow_chunked_length {
        assert_eq!(&buf[..], bytes, "a {verdict} head changed the buffer");
    }
});
