//! Response bodies decoded from their `content-encoding`, for tests that compare what
//! compressors sent.

use std::io::Read;

/// `data` decoded from `coding` (empty: as is); `None` when it does not decode.
pub fn decode(coding: &str, data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match coding {
        "" => return Some(data.to_vec()),
        "gzip" => flate2::read::MultiGzDecoder::new(data)
            .read_to_end(&mut out)
            .ok()?,
        "br" => brotli::Decompressor::new(data, 4096)
            .read_to_end(&mut out)
            .ok()?,
        "zstd" => zstd::stream::read::Decoder::new(data)
            .ok()?
            .read_to_end(&mut out)
            .ok()?,
        _ => return None,
    };
    Some(out)
}
