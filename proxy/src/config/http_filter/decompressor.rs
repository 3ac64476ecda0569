//! `envoy.filters.http.decompressor` (`Decompressor`) and its `decompressor_library` (gzip,
//! brotli, zstd) -> [`DecompressorConfig`].

use proto::pb::envoy::config::core::v3::TypedExtensionConfig;
use proto::pb::envoy::extensions::compression::brotli::decompressor::v3::Brotli;
use proto::pb::envoy::extensions::compression::gzip::decompressor::v3::Gzip;
use proto::pb::envoy::extensions::compression::zstd::decompressor::v3::Zstd;
use proto::pb::envoy::extensions::filters::http::decompressor::v3::{
    Decompressor, decompressor::CommonDirectionConfig,
};

use crate::config::ConfigError;

const GZIP: &str = "envoy.extensions.compression.gzip.decompressor.v3.Gzip";
const BROTLI: &str = "envoy.extensions.compression.brotli.decompressor.v3.Brotli";
const ZSTD: &str = "envoy.extensions.compression.zstd.decompressor.v3.Zstd";

/// One decompressor filter.
#[derive(Debug, Clone)]
pub struct DecompressorConfig {
    /// `decompressor_library.name`: the filter's stats are under it.
    pub library_name: String,
    /// The codec and its settings.
    pub library: DecompressorLibrary,
    /// Request bodies.
    pub request: DecompressDirection,
    /// `request_direction_config.advertise_accept_encoding` (default true): the codec is added
    /// to the request's `accept-encoding` while responses are decompressed.
    pub advertise_accept_encoding: bool,
    /// Response bodies.
    pub response: DecompressDirection,
}

/// One direction of a decompressor filter.
#[derive(Debug, Clone, Copy)]
pub struct DecompressDirection {
    /// `common_config.enabled`'s default value (unset: enabled).
    pub enabled: bool,
    /// `common_config.ignore_no_transform_header`: decompress despite
    /// `cache-control: no-transform`.
    pub ignore_no_transform_header: bool,
}

/// A decompression codec with its settings.
#[derive(Debug, Clone, Copy)]
pub enum DecompressorLibrary {
    /// `envoy.compression.gzip.decompressor`.
    Gzip {
        /// `window_bits` (default 15).
        window_bits: u8,
        /// `max_inflate_ratio` (default 100): more output per input byte fails the stream.
        max_inflate_ratio: u32,
    },
    /// `envoy.compression.brotli.decompressor`.
    Brotli {
        /// `chunk_size` (default 4096): the decoder's buffer.
        chunk_size: u32,
    },
    /// `envoy.compression.zstd.decompressor`.
    Zstd,
}

impl DecompressorLibrary {
    /// The `content-encoding` the codec reads.
    pub fn encoding(&self) -> &'static str {
        match self {
            DecompressorLibrary::Gzip { .. } => "gzip",
            DecompressorLibrary::Brotli { .. } => "br",
            DecompressorLibrary::Zstd => "zstd",
        }
    }

    /// The codec's name in stats.
    pub fn stats_name(&self) -> &'static str {
        match self {
            DecompressorLibrary::Gzip { .. } => "gzip",
            DecompressorLibrary::Brotli { .. } => "brotli",
            DecompressorLibrary::Zstd => "zstd",
        }
    }
}

/// Compiles a `Decompressor`.
pub fn compile(d: &Decompressor) -> Result<DecompressorConfig, ConfigError> {
    let lib = d
        .decompressor_library
        .as_ref()
        .ok_or_else(|| ConfigError::new("decompressor_library", "value is required"))?;
    let library = library(lib).map_err(|e| e.within("decompressor_library"))?;
    let request = d.request_direction_config.as_ref();
    Ok(DecompressorConfig {
        library_name: lib.name.clone(),
        library,
        request: direction(request.and_then(|r| r.common_config.as_ref())),
        advertise_accept_encoding: request
            .and_then(|r| r.advertise_accept_encoding)
            .is_none_or(|v| v.value),
        response: direction(
            d.response_direction_config
                .as_ref()
                .and_then(|r| r.common_config.as_ref()),
        ),
    })
}

fn direction(c: Option<&CommonDirectionConfig>) -> DecompressDirection {
    DecompressDirection {
        enabled: c
            .and_then(|c| c.enabled.as_ref())
            .and_then(|f| f.default_value)
            .is_none_or(|v| v.value),
        ignore_no_transform_header: c.is_some_and(|c| c.ignore_no_transform_header),
    }
}

fn library(lib: &TypedExtensionConfig) -> Result<DecompressorLibrary, ConfigError> {
    let any = lib
        .typed_config
        .as_ref()
        .ok_or_else(|| ConfigError::new("typed_config", "value is required"))?;
    let unpack_err = |e: proto::UnpackError| ConfigError::new("typed_config", e.to_string());
    let ranged = |v: Option<u32>, name: &str, lo: u32, hi: u32, default: u32| match v {
        None => Ok(default),
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        Some(n) => Err(ConfigError::new(
            format!("typed_config.{name}"),
            format!("value must be inside range [{lo}, {hi}], got {n}"),
        )),
    };
    Ok(match proto::type_name_of(&any.type_url) {
        GZIP => {
            let g: Gzip = proto::unpack(any).map_err(unpack_err)?;
            ranged(
                g.chunk_size.map(|v| v.value),
                "chunk_size",
                4096,
                65536,
                4096,
            )?;
            DecompressorLibrary::Gzip {
                window_bits: ranged(g.window_bits.map(|v| v.value), "window_bits", 9, 15, 15)?
                    as u8,
                max_inflate_ratio: ranged(
                    g.max_inflate_ratio.map(|v| v.value),
                    "max_inflate_ratio",
                    1,
                    1032,
                    100,
                )?,
            }
        }
        BROTLI => {
            let b: Brotli = proto::unpack(any).map_err(unpack_err)?;
            DecompressorLibrary::Brotli {
                chunk_size: ranged(
                    b.chunk_size.map(|v| v.value),
                    "chunk_size",
                    4096,
                    65536,
                    4096,
                )?,
            }
        }
        ZSTD => {
            let z: Zstd = proto::unpack(any).map_err(unpack_err)?;
            if !z.dictionaries.is_empty() {
                return Err(ConfigError::new(
                    "typed_config.dictionaries",
                    "zstd dictionaries are not implemented by revoy",
                ));
            }
            ranged(
                z.chunk_size.map(|v| v.value),
                "chunk_size",
                4096,
                65536,
                4096,
            )?;
            DecompressorLibrary::Zstd
        }
        other => {
            return Err(ConfigError::new(
                "typed_config",
                format!("decompressor library {other} is not implemented by revoy"),
            ));
        }
    })
}
