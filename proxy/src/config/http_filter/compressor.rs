//! `envoy.filters.http.compressor` (`Compressor`, route-level `CompressorPerRoute`) and its
//! `compressor_library` (gzip, brotli, zstd) -> [`CompressorConfig`].

use proto::pb::envoy::config::core::v3::{RuntimeFeatureFlag, TypedExtensionConfig};

use crate::config::runtime::RuntimeFlag;
use proto::pb::envoy::extensions::compression::brotli::compressor::v3::{
    Brotli as BrotliProto, brotli::EncoderMode,
};
use proto::pb::envoy::extensions::compression::gzip::compressor::v3::Gzip as GzipProto;
use proto::pb::envoy::extensions::compression::zstd::compressor::v3::Zstd as ZstdProto;
use proto::pb::envoy::extensions::filters::http::compressor::v3::{
    Compressor, CompressorPerRoute, compressor::CommonDirectionConfig,
    compressor_per_route::Override,
};

use crate::config::{ConfigError, Warnings};

const GZIP: &str = "envoy.extensions.compression.gzip.compressor.v3.Gzip";
const BROTLI: &str = "envoy.extensions.compression.brotli.compressor.v3.Brotli";
const ZSTD: &str = "envoy.extensions.compression.zstd.compressor.v3.Zstd";

/// Envoy's content types compressed when a direction names none.
const DEFAULT_CONTENT_TYPES: &[&str] = &[
    "text/html",
    "text/plain",
    "text/css",
    "application/javascript",
    "application/x-javascript",
    "text/javascript",
    "text/x-javascript",
    "text/ecmascript",
    "text/js",
    "text/jscript",
    "text/x-js",
    "application/ecmascript",
    "application/x-json",
    "application/xml",
    "application/json",
    "image/svg+xml",
    "text/xml",
    "application/xhtml+xml",
    "application/grpc-web",
    "application/grpc-web+proto",
];

/// One compressor filter.
#[derive(Debug, Clone)]
pub struct CompressorConfig {
    /// `compressor_library.name`: the filter's stats are under it.
    pub library_name: String,
    /// The codec and its settings.
    pub library: Library,
    /// How responses are compressed.
    pub response: ResponseDirection,
    /// How request bodies are compressed (`None`: they are not).
    pub request: Option<Direction>,
    /// `choose_first`: wins a tie of q-values among compressor filters.
    pub choose_first: bool,
}

/// What both directions check before compressing.
#[derive(Debug, Clone)]
pub struct Direction {
    /// `common_config.enabled` (on when unset).
    pub enabled: RuntimeFlag,
    /// `min_content_length` (0 or unset: 30): a shorter `content-length` is not compressed.
    pub min_content_length: u64,
    /// `content_type` (Envoy's list when empty), lower-cased: what is compressed.
    pub content_types: Vec<String>,
}

/// The response direction.
#[derive(Debug, Clone)]
pub struct ResponseDirection {
    /// The checks both directions make.
    pub common: Direction,
    /// Whether `response_direction_config` is set (then the direction's common stats are
    /// under `response.`; with the deprecated top-level fields they are not).
    pub own_section: bool,
    /// `disable_on_etag_header`.
    pub disable_on_etag_header: bool,
    /// `weaken_etag_on_compress`: a strong ETag becomes weak instead of being removed.
    pub weaken_etag_on_compress: bool,
    /// `remove_accept_encoding_header`.
    pub remove_accept_encoding_header: bool,
    /// `uncompressible_response_codes`.
    pub uncompressible_response_codes: Vec<u16>,
}

/// A compression codec with its settings.
#[derive(Debug, Clone)]
pub enum Library {
    /// `envoy.compression.gzip.compressor`.
    Gzip(Gzip),
    /// `envoy.compression.brotli.compressor`.
    Brotli(Brotli),
    /// `envoy.compression.zstd.compressor`.
    Zstd(Zstd),
}

impl Library {
    /// The `content-encoding` the codec produces.
    pub fn encoding(&self) -> &'static str {
        match self {
            Library::Gzip(_) => "gzip",
            Library::Brotli(_) => "br",
            Library::Zstd(_) => "zstd",
        }
    }

    /// The codec's name in stats.
    pub fn stats_name(&self) -> &'static str {
        match self {
            Library::Gzip(_) => "gzip",
            Library::Brotli(_) => "brotli",
            Library::Zstd(_) => "zstd",
        }
    }
}

/// gzip settings.
#[derive(Debug, Clone, Copy)]
pub struct Gzip {
    /// zlib's level (Envoy's `DEFAULT_COMPRESSION` is zlib's 6).
    pub level: u32,
    /// `window_bits` (default 12).
    pub window_bits: u8,
}

impl Default for Gzip {
    fn default() -> Self {
        Gzip {
            level: 6,
            window_bits: 12,
        }
    }
}

/// brotli settings.
#[derive(Debug, Clone, Copy)]
pub struct Brotli {
    /// `quality` (default 3).
    pub quality: u32,
    /// `window_bits` (default 18).
    pub window_bits: u32,
    /// `input_block_bits` (default 24).
    pub input_block_bits: u32,
    /// `encoder_mode`.
    pub mode: brotli::enc::backward_references::BrotliEncoderMode,
    /// `disable_literal_context_modeling`.
    pub disable_literal_context_modeling: bool,
    /// `chunk_size` (default 4096): the encoder's buffer.
    pub chunk_size: u32,
}

impl Default for Brotli {
    fn default() -> Self {
        Brotli {
            quality: 3,
            window_bits: 18,
            input_block_bits: 24,
            mode: brotli::enc::backward_references::BrotliEncoderMode::BROTLI_MODE_GENERIC,
            disable_literal_context_modeling: false,
            chunk_size: 4096,
        }
    }
}

/// zstd settings.
#[derive(Debug, Clone, Copy)]
pub struct Zstd {
    /// `compression_level` (default 3).
    pub level: i32,
    /// `enable_checksum`.
    pub checksum: bool,
    /// `strategy` (`None`: zstd's choice for the level).
    pub strategy: Option<zstd::zstd_safe::Strategy>,
}

impl Default for Zstd {
    fn default() -> Self {
        Zstd {
            level: 3,
            checksum: false,
            strategy: None,
        }
    }
}

/// What a route says about a compressor filter.
#[derive(Debug, Clone, Copy)]
pub enum CompressorPerRouteConfig {
    /// `disabled: true`: responses on the route are not compressed.
    Disabled,
    /// `overrides`.
    Overrides {
        /// `Some(true)` when `response_direction_config` is set: responses are compressed
        /// even where the filter's own direction is disabled.
        response_enabled: Option<bool>,
        /// `response_direction_config.remove_accept_encoding_header`, when set.
        remove_accept_encoding_header: Option<bool>,
    },
}

/// Compiles a `Compressor`.
#[allow(deprecated)]
pub fn compile(c: &Compressor, warnings: &mut Warnings) -> Result<CompressorConfig, ConfigError> {
    let lib = c
        .compressor_library
        .as_ref()
        .ok_or_else(|| ConfigError::new("compressor_library", "value is required"))?;
    let mark = warnings.len();
    let library = compile_library(lib, warnings).map_err(|e| e.within("compressor_library"))?;
    warnings.prefix_since(mark, "compressor_library.typed_config");
    let response = match &c.response_direction_config {
        Some(r) => {
            let default = CommonDirectionConfig::default();
            let common = r.common_config.as_ref().unwrap_or(&default);
            let mut codes = Vec::with_capacity(r.uncompressible_response_codes.len());
            for (i, code) in r.uncompressible_response_codes.iter().enumerate() {
                if !(200..600).contains(code) || codes.contains(&(*code as u16)) {
                    return Err(ConfigError::new(
                        format!("response_direction_config.uncompressible_response_codes[{i}]"),
                        format!("value must be unique and inside range [200, 600), got {code}"),
                    ));
                }
                codes.push(*code as u16);
            }
            if r.status_header_enabled {
                warnings.skipped(
                    "response_direction_config.status_header_enabled",
                    "the x-envoy-compression-status header is not implemented by revoy; responses go without it",
                );
            }
            ResponseDirection {
                common: direction(common, "response_direction_config.common_config")?,
                own_section: true,
                disable_on_etag_header: r.disable_on_etag_header,
                weaken_etag_on_compress: r.weaken_etag_on_compress,
                remove_accept_encoding_header: r.remove_accept_encoding_header,
                uncompressible_response_codes: codes,
            }
        }
        None => ResponseDirection {
            common: Direction {
                enabled: enabled(c.runtime_enabled.as_ref()),
                min_content_length: min_length(c.content_length.map(|v| v.value)),
                content_types: content_types(&c.content_type),
            },
            own_section: false,
            disable_on_etag_header: c.disable_on_etag_header,
            weaken_etag_on_compress: false,
            remove_accept_encoding_header: c.remove_accept_encoding_header,
            uncompressible_response_codes: Vec::new(),
        },
    };
    let request = match &c.request_direction_config {
        Some(r) => {
            let default = CommonDirectionConfig::default();
            let common = r.common_config.as_ref().unwrap_or(&default);
            Some(direction(common, "request_direction_config.common_config")?)
        }
        None => None,
    };
    Ok(CompressorConfig {
        library_name: lib.name.clone(),
        library,
        response,
        request,
        choose_first: c.choose_first,
    })
}

/// Compiles a `CompressorPerRoute`.
pub fn compile_per_route(c: &CompressorPerRoute) -> Result<CompressorPerRouteConfig, ConfigError> {
    match &c.r#override {
        Some(Override::Disabled(true)) => Ok(CompressorPerRouteConfig::Disabled),
        Some(Override::Disabled(false)) => {
            Err(ConfigError::new("disabled", "value must equal true"))
        }
        Some(Override::Overrides(o)) => {
            if o.compressor_library.is_some() {
                return Err(ConfigError::new(
                    "overrides.compressor_library",
                    "a per-route compressor library is not implemented by revoy",
                ));
            }
            let response = o.response_direction_config.as_ref();
            Ok(CompressorPerRouteConfig::Overrides {
                response_enabled: response.map(|_| true),
                remove_accept_encoding_header: response
                    .and_then(|r| r.remove_accept_encoding_header)
                    .map(|v| v.value),
            })
        }
        None => Err(ConfigError::new(
            "override",
            "one of disabled, overrides is required",
        )),
    }
}

/// A direction's `common_config`.
#[allow(deprecated)]
fn direction(c: &CommonDirectionConfig, at: &str) -> Result<Direction, ConfigError> {
    if !c.content_type_matcher.is_empty() {
        return Err(ConfigError::new(
            format!("{at}.content_type_matcher"),
            "content_type_matcher is not implemented by revoy (use content_type)",
        ));
    }
    Ok(Direction {
        enabled: enabled(c.enabled.as_ref()),
        min_content_length: min_length(c.min_content_length.map(|v| v.value)),
        content_types: content_types(&c.content_type),
    })
}

/// A runtime feature flag (unset, or without a default: on).
fn enabled(flag: Option<&RuntimeFeatureFlag>) -> RuntimeFlag {
    flag.map_or_else(RuntimeFlag::on, |f| RuntimeFlag {
        key: f.runtime_key.clone(),
        default: f.default_value.is_none_or(|v| v.value),
    })
}

/// Envoy's minimum content length: 0 and unset mean 30.
fn min_length(v: Option<u32>) -> u64 {
    u64::from(v.filter(|&v| v > 0).unwrap_or(30))
}

/// The content types compressed, lower-cased (Envoy's list when none is given).
fn content_types(types: &[String]) -> Vec<String> {
    if types.is_empty() {
        DEFAULT_CONTENT_TYPES
            .iter()
            .map(|t| (*t).to_owned())
            .collect()
    } else {
        types.iter().map(|t| t.to_ascii_lowercase()).collect()
    }
}

/// Compiles a `compressor_library`.
fn compile_library(
    lib: &TypedExtensionConfig,
    warnings: &mut Warnings,
) -> Result<Library, ConfigError> {
    let any = lib
        .typed_config
        .as_ref()
        .ok_or_else(|| ConfigError::new("typed_config", "value is required"))?;
    let unpack_err = |e: proto::UnpackError| ConfigError::new("typed_config", e.to_string());
    Ok(match proto::type_name_of(&any.type_url) {
        GZIP => {
            let g: GzipProto = proto::unpack(any).map_err(unpack_err)?;
            gzip(&g, warnings).map_err(|e| e.within("typed_config"))?
        }
        BROTLI => {
            let b: BrotliProto = proto::unpack(any).map_err(unpack_err)?;
            brotli(&b).map_err(|e| e.within("typed_config"))?
        }
        ZSTD => {
            let z: ZstdProto = proto::unpack(any).map_err(unpack_err)?;
            zstd(&z).map_err(|e| e.within("typed_config"))?
        }
        other => {
            return Err(ConfigError::new(
                "typed_config",
                format!("compressor library {other} is not implemented by revoy"),
            ));
        }
    })
}

/// `chunk_size`, checked as Envoy's validation does.
fn chunk_size(v: Option<u32>) -> Result<u32, ConfigError> {
    match v {
        Some(n) if !(4096..=65536).contains(&n) => Err(ConfigError::new(
            "chunk_size",
            format!("value must be inside range [4096, 65536], got {n}"),
        )),
        Some(n) => Ok(n),
        None => Ok(4096),
    }
}

fn gzip(g: &GzipProto, warnings: &mut Warnings) -> Result<Library, ConfigError> {
    let level = match g.compression_level {
        0 => 6,
        l @ 1..=9 => l as u32,
        l => {
            return Err(ConfigError::new(
                "compression_level",
                format!("value must be one of the defined enum values, got {l}"),
            ));
        }
    };
    let window_bits = match g.window_bits.map(|v| v.value) {
        None => 12,
        Some(w @ 9..=15) => w as u8,
        Some(w) => {
            return Err(ConfigError::new(
                "window_bits",
                format!("value must be inside range [9, 15], got {w}"),
            ));
        }
    };
    if let Some(m) = g.memory_level.map(|v| v.value)
        && !(1..=9).contains(&m)
    {
        return Err(ConfigError::new(
            "memory_level",
            format!("value must be inside range [1, 9], got {m}"),
        ));
    }
    if g.memory_level.is_some() {
        warnings.note(
            "memory_level",
            "revoy's gzip (zlib-rs) always uses memory level 8; the output is valid gzip either way",
        );
    }
    if g.compression_strategy != 0 {
        warnings.note(
            "compression_strategy",
            "revoy's gzip (zlib-rs) always uses the default strategy; the output is valid gzip either way",
        );
    }
    chunk_size(g.chunk_size.map(|v| v.value))?;
    Ok(Library::Gzip(Gzip { level, window_bits }))
}

fn brotli(b: &BrotliProto) -> Result<Library, ConfigError> {
    use brotli::enc::backward_references::BrotliEncoderMode as Mode;
    let d = Brotli::default();
    let ranged = |v: Option<u32>, name: &str, lo: u32, hi: u32, default: u32| match v {
        None => Ok(default),
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        Some(n) => Err(ConfigError::new(
            name,
            format!("value must be inside range [{lo}, {hi}], got {n}"),
        )),
    };
    let mode = match EncoderMode::try_from(b.encoder_mode) {
        Ok(EncoderMode::Default | EncoderMode::Generic) => Mode::BROTLI_MODE_GENERIC,
        Ok(EncoderMode::Text) => Mode::BROTLI_MODE_TEXT,
        Ok(EncoderMode::Font) => Mode::BROTLI_MODE_FONT,
        Err(_) => {
            return Err(ConfigError::new(
                "encoder_mode",
                format!(
                    "value must be one of the defined enum values, got {}",
                    b.encoder_mode
                ),
            ));
        }
    };
    Ok(Library::Brotli(Brotli {
        quality: ranged(b.quality.map(|v| v.value), "quality", 0, 11, d.quality)?,
        window_bits: ranged(
            b.window_bits.map(|v| v.value),
            "window_bits",
            10,
            24,
            d.window_bits,
        )?,
        input_block_bits: ranged(
            b.input_block_bits.map(|v| v.value),
            "input_block_bits",
            16,
            24,
            d.input_block_bits,
        )?,
        mode,
        disable_literal_context_modeling: b.disable_literal_context_modeling,
        chunk_size: chunk_size(b.chunk_size.map(|v| v.value))?,
    }))
}

fn zstd(z: &ZstdProto) -> Result<Library, ConfigError> {
    use zstd::zstd_safe::Strategy as S;
    if z.dictionary.is_some() {
        return Err(ConfigError::new(
            "dictionary",
            "zstd dictionaries are not implemented by revoy",
        ));
    }
    chunk_size(z.chunk_size.map(|v| v.value))?;
    let strategy = match z.strategy {
        0 => None,
        1 => Some(S::ZSTD_fast),
        2 => Some(S::ZSTD_dfast),
        3 => Some(S::ZSTD_greedy),
        4 => Some(S::ZSTD_lazy),
        5 => Some(S::ZSTD_lazy2),
        6 => Some(S::ZSTD_btlazy2),
        7 => Some(S::ZSTD_btopt),
        8 => Some(S::ZSTD_btultra),
        9 => Some(S::ZSTD_btultra2),
        s => {
            return Err(ConfigError::new(
                "strategy",
                format!("value must be one of the defined enum values, got {s}"),
            ));
        }
    };
    Ok(Library::Zstd(Zstd {
        level: z.compression_level.map_or(3, |v| v.value as i32),
        checksum: z.enable_checksum,
        strategy,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::extensions::filters::http::compressor::v3::compressor::ResponseDirectionConfig;
    use proto::pb::google::protobuf::UInt32Value;

    fn with_library(any: proto::pb::google::protobuf::Any) -> Compressor {
        Compressor {
            compressor_library: Some(TypedExtensionConfig {
                name: "lib".into(),
                typed_config: Some(any),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn envoy_defaults_and_the_deprecated_fields_apply() {
        let mut c = with_library(proto::pack(&GzipProto::default()));
        #[allow(deprecated)]
        {
            c.content_length = Some(UInt32Value { value: 100 });
            c.content_type = vec!["Text/Plain".into()];
        }
        let compiled = compile(&c, &mut Warnings::new()).unwrap();
        let Library::Gzip(g) = compiled.library else {
            panic!("gzip expected");
        };
        assert_eq!((g.level, g.window_bits), (6, 12));
        assert!(!compiled.response.own_section);
        assert_eq!(compiled.response.common.min_content_length, 100);
        assert_eq!(compiled.response.common.content_types, ["text/plain"]);
        assert!(compiled.request.is_none());

        c.response_direction_config = Some(ResponseDirectionConfig::default());
        let compiled = compile(&c, &mut Warnings::new()).unwrap();
        assert!(compiled.response.own_section);
        assert_eq!(compiled.response.common.min_content_length, 30);
        assert!(compiled.response.common.content_types.len() > 10);
    }

    #[test]
    fn bad_settings_are_refused_with_their_path() {
        let bad = GzipProto {
            window_bits: Some(UInt32Value { value: 16 }),
            ..Default::default()
        };
        let e = compile(&with_library(proto::pack(&bad)), &mut Warnings::new()).unwrap_err();
        assert_eq!(e.path, "compressor_library.typed_config.window_bits");
        let unknown = proto::pack(&proto::pb::google::protobuf::Duration::default());
        let e = compile(&with_library(unknown), &mut Warnings::new()).unwrap_err();
        assert_eq!(e.path, "compressor_library.typed_config");
        let e = compile_per_route(&CompressorPerRoute {
            r#override: Some(Override::Disabled(false)),
        })
        .unwrap_err();
        assert_eq!(e.path, "disabled");
    }

    #[test]
    fn settings_revoy_cannot_apply_are_reported() {
        let g = GzipProto {
            memory_level: Some(UInt32Value { value: 9 }),
            compression_strategy: 2,
            ..Default::default()
        };
        let mut warnings = Warnings::new();
        compile(&with_library(proto::pack(&g)), &mut warnings).unwrap();
        let paths: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        assert_eq!(paths.len(), 2, "{paths:?}");
        assert!(
            paths[0].starts_with("compressor_library.typed_config.memory_level: "),
            "{paths:?}"
        );
    }
}
