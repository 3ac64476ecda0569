//! `access_log` lists (on connection managers, tcp_proxies and listeners) -> [`AccessLogs`]:
//! the file and stream loggers with their formats and filters. Another logger (gRPC ALS,
//! OpenTelemetry, Wasm, ...) is skipped with a warning naming it, as such loggers only
//! report; a file or stream logger that revoy cannot write as Envoy would (a formatter
//! extension, an operator or a filter it lacks) is an error naming it.

use std::path::PathBuf;

use prost::Message;
use proto::pb::envoy::config::accesslog::v3 as pb;
use proto::pb::envoy::config::core::v3::{SubstitutionFormatString, substitution_format_string};
use proto::pb::envoy::extensions::access_loggers::file::v3::{FileAccessLog, file_access_log};
use proto::pb::envoy::extensions::access_loggers::stream::v3::{
    StderrAccessLog, StdoutAccessLog, stderr_access_log, stdout_access_log,
};
use proto::pb::google::protobuf as gpb;

use super::{ConfigError, Context, Warnings};
use crate::access_log::filter::Comparison;
use crate::access_log::format::{Formatters, JsonValue, Template};
use crate::access_log::{AccessLog, AccessLogs, Filter, LogFormat, ResponseFlag};

const FILE: &str = "envoy.extensions.access_loggers.file.v3.FileAccessLog";
const STDOUT: &str = "envoy.extensions.access_loggers.stream.v3.StdoutAccessLog";
const STDERR: &str = "envoy.extensions.access_loggers.stream.v3.StderrAccessLog";

/// Compiles an `access_log` list; errors and the warnings for skipped loggers are relative
/// to the list (`[1].typed_config.path`).
pub fn compile_access_logs(
    ctx: &Context<'_>,
    logs: &[pb::AccessLog],
    warnings: &mut Warnings,
) -> Result<AccessLogs, ConfigError> {
    if logs.is_empty() {
        return Ok(AccessLogs::default());
    }
    let mut compiled = Vec::with_capacity(logs.len());
    let mut source = Vec::new();
    for (i, log) in logs.iter().enumerate() {
        let at = format!("[{i}]");
        let before = warnings.len();
        let one = compile_one(ctx, log, warnings).map_err(|e| e.within(&at));
        warnings.prefix_since(before, &at);
        compiled.extend(one?);
        log.encode(&mut source)
            .map_err(|e| ConfigError::new(at, e.to_string()))?;
    }
    Ok(AccessLogs::new(compiled, source))
}

/// One logger, or `None` for a logger revoy does not write: it is skipped with a warning
/// and its filter is not read.
fn compile_one(
    ctx: &Context<'_>,
    log: &pb::AccessLog,
    warnings: &mut Warnings,
) -> Result<Option<AccessLog>, ConfigError> {
    let Some(pb::access_log::ConfigType::TypedConfig(any)) = &log.config_type else {
        return Err(ConfigError::new(
            "typed_config",
            format!("access log '{}' has no typed_config", log.name),
        ));
    };
    let type_name = proto::type_name_of(&any.type_url);
    if ![FILE, STDOUT, STDERR].contains(&type_name) {
        warnings.skipped(
            "typed_config",
            format!(
                "access logger '{}' ({type_name}) is not implemented by revoy (it writes the file, stdout and stderr loggers); nothing is logged through it",
                log.name
            ),
        );
        return Ok(None);
    }
    // Envoy builds a logger's filter before the logger.
    let filter = log
        .filter
        .as_ref()
        .map(|f| compile_filter(ctx, f).map_err(|e| e.within("filter")))
        .transpose()?;
    let at = |e: proto::UnpackError| ConfigError::new("typed_config", e.to_string());
    let (path, format) = match type_name {
        FILE => {
            let f: FileAccessLog = proto::unpack(any).map_err(at)?;
            if f.path.is_empty() {
                return Err(ConfigError::new(
                    "typed_config.path",
                    "value length must be at least 1 characters",
                ));
            }
            let format = file_format(ctx, &f).map_err(|e| e.within("typed_config"))?;
            ctx.io().open_log(&f.path).map_err(|e| {
                ConfigError::new(
                    "typed_config.path",
                    format!("unable to open file '{}': {}", f.path, os_message(&e)),
                )
            })?;
            (PathBuf::from(&f.path), format)
        }
        STDOUT => {
            let f: StdoutAccessLog = proto::unpack(any).map_err(at)?;
            let format = match &f.access_log_format {
                Some(stdout_access_log::AccessLogFormat::LogFormat(s)) => {
                    substitution(ctx, s).map_err(|e| e.within("typed_config.log_format"))?
                }
                None => LogFormat::default_text(ctx),
            };
            (PathBuf::from("/dev/stdout"), format)
        }
        // STDERR, the one left.
        _ => {
            let f: StderrAccessLog = proto::unpack(any).map_err(at)?;
            let format = match &f.access_log_format {
                Some(stderr_access_log::AccessLogFormat::LogFormat(s)) => {
                    substitution(ctx, s).map_err(|e| e.within("typed_config.log_format"))?
                }
                None => LogFormat::default_text(ctx),
            };
            (PathBuf::from("/dev/stderr"), format)
        }
    };
    Ok(Some(AccessLog::new(filter, format, path)))
}

/// An I/O error as `strerror` words it (Envoy's message), without Rust's `(os error N)`.
fn os_message(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

#[allow(deprecated)]
fn file_format(ctx: &Context<'_>, f: &FileAccessLog) -> Result<LogFormat, ConfigError> {
    use file_access_log::AccessLogFormat as F;
    Ok(match &f.access_log_format {
        None => LogFormat::default_text(ctx),
        Some(F::LogFormat(s)) => substitution(ctx, s).map_err(|e| e.within("log_format"))?,
        Some(F::Format(text)) => text_format(ctx, text, false, NONE, "format")?,
        Some(F::JsonFormat(s)) => {
            json_format(ctx, s, false, NONE).map_err(|e| e.within("json_format"))?
        }
        Some(F::TypedJsonFormat(s)) => {
            json_format(ctx, s, false, NONE).map_err(|e| e.within("typed_json_format"))?
        }
    })
}

/// What every access-log and local-reply format has: the connection's filter state, and no
/// formatter extension (formats outside a `SubstitutionFormatString` have none).
const NONE: Formatters = Formatters {
    req_without_query: false,
    metadata: false,
    filter_state: true,
};

fn text_format(
    ctx: &Context<'_>,
    text: &str,
    omit_empty: bool,
    formatters: Formatters,
    field: &str,
) -> Result<LogFormat, ConfigError> {
    if text.is_empty() {
        return Ok(LogFormat::default_text(ctx));
    }
    let template =
        Template::parse_with(text, ctx, formatters).map_err(|m| ConfigError::new(field, m))?;
    Ok(LogFormat::Text {
        template,
        omit_empty,
    })
}

/// A `SubstitutionFormatString` (`log_format`, or a local reply's `body_format`).
#[allow(deprecated)]
pub(super) fn substitution(
    ctx: &Context<'_>,
    s: &SubstitutionFormatString,
) -> Result<LogFormat, ConfigError> {
    let mut formatters = NONE;
    for (i, f) in s.formatters.iter().enumerate() {
        let type_name = f
            .typed_config
            .as_ref()
            .map_or("", |a| proto::type_name_of(&a.type_url));
        match type_name {
            "envoy.extensions.formatter.req_without_query.v3.ReqWithoutQuery" => {
                formatters.req_without_query = true;
            }
            "envoy.extensions.formatter.metadata.v3.Metadata" => formatters.metadata = true,
            _ => {
                return Err(ConfigError::new(
                    format!("formatters[{i}]"),
                    format!(
                        "formatter extension '{}' ({type_name}) is not implemented by revoy",
                        f.name
                    ),
                ));
            }
        }
    }
    use substitution_format_string::Format as F;
    let omit = s.omit_empty_values;
    match &s.format {
        None => Ok(LogFormat::default_text(ctx)),
        Some(F::TextFormat(t)) => text_format(ctx, t, omit, formatters, "text_format"),
        Some(F::TextFormatSource(src)) => {
            let bytes = super::tls::source::data(ctx, Some(src), "text_format_source")?;
            let text = String::from_utf8(bytes).map_err(|_| {
                ConfigError::new("text_format_source", "the format is not valid UTF-8")
            })?;
            text_format(ctx, &text, omit, formatters, "text_format_source")
        }
        Some(F::JsonFormat(j)) => {
            json_format(ctx, j, omit, formatters).map_err(|e| e.within("json_format"))
        }
    }
}

fn json_format(
    ctx: &Context<'_>,
    s: &gpb::Struct,
    omit_empty: bool,
    formatters: Formatters,
) -> Result<LogFormat, ConfigError> {
    Ok(LogFormat::Json {
        members: json_members(ctx, s, formatters)?,
        omit_empty,
    })
}

fn json_members(
    ctx: &Context<'_>,
    s: &gpb::Struct,
    formatters: Formatters,
) -> Result<Vec<(String, JsonValue)>, ConfigError> {
    use gpb::value::Kind;
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let value = match &s.fields[k].kind {
                Some(Kind::StringValue(t)) => JsonValue::Template(
                    Template::parse_with(t, ctx, formatters)
                        .map_err(|m| ConfigError::new(k.as_str(), m))?,
                ),
                Some(Kind::NumberValue(n)) => JsonValue::Constant(number(*n)),
                Some(Kind::BoolValue(b)) => JsonValue::Constant(b.to_string()),
                Some(Kind::StructValue(inner)) => {
                    JsonValue::Object(json_members(ctx, inner, formatters).map_err(|e| e.within(k))?)
                }
                Some(Kind::NullValue(_)) | None => JsonValue::Constant("null".to_owned()),
                Some(Kind::ListValue(_)) => {
                    return Err(ConfigError::new(
                        k.as_str(),
                        "Only string values, nested structs, list values and number values are supported in structured access log format. (lists are not implemented by revoy)",
                    ));
                }
            };
            Ok((k.clone(), value))
        })
        .collect()
}

/// A JSON number as Envoy writes a configured one (integers without a fraction).
fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

fn comparison(c: &pb::ComparisonFilter) -> Result<Comparison, ConfigError> {
    use pb::comparison_filter::Op;
    let v = u64::from(c.value.as_ref().map_or(0, |v| v.default_value));
    Ok(match Op::try_from(c.op) {
        Ok(Op::Eq) => Comparison::Eq(v),
        Ok(Op::Ge) => Comparison::Ge(v),
        Ok(Op::Le) => Comparison::Le(v),
        Ok(Op::Ne) => Comparison::Ne(v),
        Err(_) => {
            return Err(ConfigError::new(
                "op",
                format!("unknown comparison {}", c.op),
            ));
        }
    })
}

pub(super) fn compile_filter(
    ctx: &Context<'_>,
    f: &pb::AccessLogFilter,
) -> Result<Filter, ConfigError> {
    use pb::access_log_filter::FilterSpecifier as S;
    let list = |fs: &[pb::AccessLogFilter], field: &str| {
        fs.iter()
            .enumerate()
            .map(|(i, f)| {
                compile_filter(ctx, f).map_err(|e| e.within(&format!("{field}.filters[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match &f.filter_specifier {
        None => {
            return Err(ConfigError::new(
                "",
                "an access log filter needs a filter_specifier",
            ));
        }
        Some(S::StatusCodeFilter(s)) => Filter::StatusCode(
            comparison(s.comparison.as_ref().ok_or_else(|| {
                ConfigError::new("status_code_filter.comparison", "value is required")
            })?)
            .map_err(|e| e.within("status_code_filter.comparison"))?,
        ),
        Some(S::DurationFilter(d)) => Filter::Duration(
            comparison(d.comparison.as_ref().ok_or_else(|| {
                ConfigError::new("duration_filter.comparison", "value is required")
            })?)
            .map_err(|e| e.within("duration_filter.comparison"))?,
        ),
        Some(S::NotHealthCheckFilter(_)) => Filter::NotHealthCheck,
        Some(S::TraceableFilter(_)) => Filter::Traceable,
        Some(S::RuntimeFilter(r)) => {
            let (numerator, denominator) = match &r.percent_sampled {
                // Without a runtime override (revoy has none) and without a default, 0%.
                None => (0, 100),
                Some(p) => (
                    u64::from(p.numerator),
                    match p.denominator {
                        1 => 10_000,
                        2 => 1_000_000,
                        _ => 100,
                    },
                ),
            };
            Filter::Runtime {
                numerator: numerator.min(denominator),
                denominator,
                independent: r.use_independent_randomness,
            }
        }
        Some(S::AndFilter(a)) => Filter::And(list(&a.filters, "and_filter")?),
        Some(S::OrFilter(o)) => Filter::Or(list(&o.filters, "or_filter")?),
        Some(S::HeaderFilter(h)) => {
            let m = h
                .header
                .as_ref()
                .ok_or_else(|| ConfigError::new("header_filter.header", "value is required"))?;
            Filter::Header(Box::new(
                super::route::matchers::header_matcher(ctx, m)
                    .map_err(|e| e.within("header_filter.header"))?,
            ))
        }
        Some(S::ResponseFlagFilter(r)) => Filter::ResponseFlags(
            r.flags
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    ResponseFlag::from_short(name).ok_or_else(|| {
                        ConfigError::new(
                            format!("response_flag_filter.flags[{i}]"),
                            format!("unknown response flag '{name}'"),
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(S::GrpcStatusFilter(g)) => Filter::GrpcStatus {
            statuses: g.statuses.iter().map(|s| *s as u32).collect(),
            exclude: g.exclude,
        },
        Some(S::ExtensionFilter(e)) => {
            return Err(ConfigError::new(
                "extension_filter",
                format!(
                    "access log extension filter '{}' is not implemented by revoy",
                    e.name
                ),
            ));
        }
        Some(S::MetadataFilter(m)) => Filter::Metadata {
            matcher: m
                .matcher
                .as_ref()
                .map(|md| {
                    crate::config::metadata_matcher::metadata_matcher(ctx, md)
                        .map_err(|e| e.within("metadata_filter.matcher"))
                })
                .transpose()?,
            match_if_key_not_found: m.match_if_key_not_found.is_none_or(|b| b.value),
        },
        Some(S::LogTypeFilter(_)) => {
            return Err(ConfigError::new(
                "log_type_filter",
                "the access log log_type_filter is not implemented by revoy",
            ));
        }
    })
}

#[cfg(test)]
mod tests;
