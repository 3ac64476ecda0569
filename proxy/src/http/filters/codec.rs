//! The compression codecs the compressor and decompressor filters stream bodies through:
//! gzip (zlib-rs through flate2), brotli and zstd, each fed one data frame at a time and
//! flushed at its end (Envoy's `Flush` state), finished at the end of the body.

use std::io::Write;

use brotli::enc::StandardAlloc;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::config::http_filter::compressor::Library;
use crate::config::http_filter::decompressor::DecompressorLibrary;

/// A streaming compressor of one body.
pub enum Compressor {
    /// gzip: zlib's deflate with a gzip wrapper.
    Gzip(Compress),
    /// brotli (`None` once finished).
    Brotli(Option<Box<brotli::CompressorWriter<Vec<u8>>>>),
    /// zstd (`None` once finished).
    Zstd(Option<zstd::stream::write::Encoder<'static, Vec<u8>>>),
}

impl std::fmt::Debug for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compressor::Gzip(_) => "Compressor::Gzip",
            Compressor::Brotli(_) => "Compressor::Brotli",
            Compressor::Zstd(_) => "Compressor::Zstd",
        })
    }
}

impl Compressor {
    /// A compressor configured as `library` says.
    pub fn new(library: &Library) -> std::io::Result<Compressor> {
        Ok(match library {
            Library::Gzip(g) => {
                Compressor::Gzip(Compress::new_gzip(Compression::new(g.level), g.window_bits))
            }
            Library::Brotli(b) => {
                let params = brotli::enc::BrotliEncoderParams {
                    quality: b.quality as i32,
                    lgwin: b.window_bits as i32,
                    lgblock: b.input_block_bits as i32,
                    mode: b.mode,
                    disable_literal_context_modeling: i32::from(b.disable_literal_context_modeling),
                    ..Default::default()
                };
                Compressor::Brotli(Some(Box::new(brotli::CompressorWriter::with_params(
                    Vec::new(),
                    b.chunk_size as usize,
                    &params,
                ))))
            }
            Library::Zstd(z) => {
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), z.level)?;
                e.include_checksum(z.checksum)?;
                if let Some(s) = z.strategy {
                    e.set_parameter(zstd::stream::raw::CParameter::Strategy(s))?;
                }
                Compressor::Zstd(Some(e))
            }
        })
    }

    /// Compresses `input` and returns what is ready: everything so far when `finish` is
    /// false (a flush), the rest of the stream when it is true.
    pub fn compress(&mut self, input: &[u8], finish: bool) -> std::io::Result<Vec<u8>> {
        match self {
            Compressor::Gzip(c) => deflate(c, input, finish),
            Compressor::Brotli(slot) => {
                let Some(w) = slot.as_mut() else {
                    return Ok(Vec::new());
                };
                w.write_all(input)?;
                if finish {
                    return Ok(slot.take().map(|w| w.into_inner()).unwrap_or_default());
                }
                w.flush()?;
                Ok(std::mem::take(w.get_mut()))
            }
            Compressor::Zstd(slot) => {
                let Some(e) = slot.as_mut() else {
                    return Ok(Vec::new());
                };
                e.write_all(input)?;
                if finish {
                    return slot.take().map_or(Ok(Vec::new()), |e| e.finish());
                }
                e.flush()?;
                Ok(std::mem::take(e.get_mut()))
            }
        }
    }
}

/// Runs zlib's deflate over all of `input`, then a sync flush (or the finish).
fn deflate(c: &mut Compress, input: &[u8], finish: bool) -> std::io::Result<Vec<u8>> {
    let flush = if finish {
        FlushCompress::Finish
    } else {
        FlushCompress::Sync
    };
    let mut out = Vec::with_capacity(input.len() / 2 + 64);
    let mut at = 0;
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.capacity().max(4096));
        }
        let before = c.total_in();
        let status = c
            .compress_vec(&input[at..], &mut out, flush)
            .map_err(std::io::Error::other)?;
        at += (c.total_in() - before) as usize;
        let room_left = out.capacity() > out.len();
        match status {
            Status::StreamEnd => return Ok(out),
            _ if at == input.len() && room_left && !finish => return Ok(out),
            Status::BufError if room_left => return Ok(out),
            _ => {}
        }
    }
}

/// A streaming decompressor of one body.
pub enum Decompressor {
    /// gzip, with the ratio of output to input it may reach.
    Gzip {
        /// zlib's inflate.
        state: Decompress,
        /// `max_inflate_ratio`.
        max_ratio: u64,
    },
    /// brotli, with the size of the output pieces it writes.
    Brotli(Box<BrotliDecoder>, usize),
    /// zstd.
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
}

impl std::fmt::Debug for Decompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Decompressor::Gzip { .. } => "Decompressor::Gzip",
            Decompressor::Brotli(..) => "Decompressor::Brotli",
            Decompressor::Zstd(_) => "Decompressor::Zstd",
        })
    }
}

impl Decompressor {
    /// A decompressor configured as `library` says.
    pub fn new(library: &DecompressorLibrary) -> std::io::Result<Decompressor> {
        Ok(match library {
            DecompressorLibrary::Gzip {
                window_bits,
                max_inflate_ratio,
            } => Decompressor::Gzip {
                state: Decompress::new_gzip(*window_bits),
                max_ratio: u64::from(*max_inflate_ratio),
            },
            DecompressorLibrary::Brotli { chunk_size } => Decompressor::Brotli(
                Box::new(brotli::BrotliState::new(
                    StandardAlloc::default(),
                    StandardAlloc::default(),
                    StandardAlloc::default(),
                )),
                *chunk_size as usize,
            ),
            DecompressorLibrary::Zstd => {
                Decompressor::Zstd(zstd::stream::write::Decoder::new(Vec::new())?)
            }
        })
    }

    /// Decompresses `input`, returning what it inflates to.
    pub fn decompress(&mut self, input: &[u8]) -> std::io::Result<Vec<u8>> {
        match self {
            Decompressor::Gzip { state, max_ratio } => inflate(state, *max_ratio, input),
            Decompressor::Brotli(state, chunk) => unbrotli(state, *chunk, input),
            Decompressor::Zstd(d) => {
                d.write_all(input)?;
                d.flush()?;
                Ok(std::mem::take(d.get_mut()))
            }
        }
    }
}

/// brotli's decoder state.
pub type BrotliDecoder = brotli::BrotliState<StandardAlloc, StandardAlloc, StandardAlloc>;

/// Runs brotli's decoder over all of `input`, `chunk` bytes of output at a time (driven
/// here: the brotli crate's decompressing writer stops when its buffer fills as the decoder
/// asks for input, leaving a flushed stream's output behind).
fn unbrotli(state: &mut BrotliDecoder, chunk: usize, input: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let (mut available_in, mut input_offset, mut total_out) = (input.len(), 0, 0);
    let mut buf = vec![0u8; chunk];
    loop {
        let (mut available_out, mut output_offset) = (buf.len(), 0);
        let result = brotli::BrotliDecompressStream(
            &mut available_in,
            &mut input_offset,
            input,
            &mut available_out,
            &mut output_offset,
            &mut buf,
            &mut total_out,
            state,
        );
        out.extend_from_slice(&buf[..output_offset]);
        match result {
            brotli::BrotliResult::NeedsMoreOutput => {}
            // A full buffer may leave output behind even when the decoder asks for input.
            brotli::BrotliResult::NeedsMoreInput if output_offset == buf.len() => {}
            brotli::BrotliResult::NeedsMoreInput | brotli::BrotliResult::ResultSuccess => {
                return Ok(out);
            }
            brotli::BrotliResult::ResultFailure => {
                return Err(std::io::Error::other("brotli: invalid data"));
            }
        }
    }
}

/// Runs zlib's inflate over all of `input`; an output over `max_ratio` times the stream's
/// input so far is an error (a decompression bomb).
fn inflate(d: &mut Decompress, max_ratio: u64, input: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(input.len() * 4 + 64);
    let mut at = 0;
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.capacity());
        }
        let before = d.total_in();
        let status = d
            .decompress_vec(&input[at..], &mut out, FlushDecompress::Sync)
            .map_err(std::io::Error::other)?;
        at += (d.total_in() - before) as usize;
        if d.total_out() > d.total_in().saturating_mul(max_ratio) {
            return Err(std::io::Error::other("gzip: max_inflate_ratio exceeded"));
        }
        let room_left = out.capacity() > out.len();
        match status {
            Status::StreamEnd => return Ok(out),
            _ if at == input.len() && room_left => return Ok(out),
            Status::BufError if room_left => return Ok(out),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::http_filter::compressor::{Brotli, Gzip, Zstd};

    fn round_trip(library: Library, decoder: DecompressorLibrary) {
        let body: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("{{\"id\":{i},\"name\":\"item\"}},").into_bytes())
            .take(200_000)
            .collect();
        let mut c = Compressor::new(&library).unwrap();
        let mut d = Decompressor::new(&decoder).unwrap();
        let mut inflated = Vec::new();
        let mut compressed = 0;
        for (i, chunk) in body.chunks(7_000).enumerate() {
            let out = c.compress(chunk, false).unwrap();
            compressed += out.len();
            // A flush makes everything so far decodable.
            inflated.extend(d.decompress(&out).unwrap());
            assert_eq!(
                inflated.len(),
                (i * 7_000 + chunk.len()).min(body.len()),
                "{library:?}"
            );
        }
        let tail = c.compress(&[], true).unwrap();
        compressed += tail.len();
        inflated.extend(d.decompress(&tail).unwrap());
        assert_eq!(inflated, body);
        assert!(compressed < body.len() / 4, "{library:?}: {compressed}");
    }

    #[test]
    fn each_codec_round_trips_flushed_chunks() {
        round_trip(
            Library::Gzip(Gzip::default()),
            DecompressorLibrary::Gzip {
                window_bits: 15,
                max_inflate_ratio: 100,
            },
        );
        round_trip(
            Library::Brotli(Brotli::default()),
            DecompressorLibrary::Brotli { chunk_size: 4096 },
        );
        round_trip(Library::Zstd(Zstd::default()), DecompressorLibrary::Zstd);
    }

    #[test]
    fn a_gzip_bomb_is_refused() {
        let mut c = Compressor::new(&Library::Gzip(Gzip::default())).unwrap();
        let zeros = vec![0u8; 1 << 20];
        let bomb = c.compress(&zeros, true).unwrap();
        let mut d = Decompressor::new(&DecompressorLibrary::Gzip {
            window_bits: 15,
            max_inflate_ratio: 100,
        })
        .unwrap();
        assert!(d.decompress(&bomb).is_err());
    }
}
