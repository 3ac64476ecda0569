//! The request-stream follower in front of hyper's server (heads held until whole, bodies and
//! chunk framing followed, heads over the limit refused). The same bytes read whole and read
//! in pieces (sizes from the input's second byte) must reach hyper alike while they are
//! within the head limit (the first byte picks 64 bytes or 60 KiB); past it, where the
//! follower hands a head it holds no longer to hyper as it is, only a panic is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [flags, split, bytes @ ..] = data else {
        return;
    };
    let allow = flags & 1 != 0;
    let max_head = if flags & 2 != 0 { 60 * 1024 } else { 64 };
    let whole = revoy::fuzzing::http1_framing(allow, max_head, [bytes]);
    let piece = usize::from(split % 16) + 1;
    let pieces = revoy::fuzzing::http1_framing(allow, max_head, bytes.chunks(piece));
    if bytes.len() <= max_head {
        assert_eq!(whole, pieces, "read in pieces of {piece}");
    }
});
