//! The connection manager's `local_reply_config` -> [`LocalReplyConfig`]: mappers (an
//! access-log filter choosing the local replies each rewrites: status, headers, body, body
//! format) and the body format every local reply is rendered with.

use std::sync::Arc;

use http::StatusCode;
use proto::pb::envoy::config::core::v3::SubstitutionFormatString;
use proto::pb::envoy::config::core::v3::substitution_format_string::Format;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    LocalReplyConfig as LocalReplyProto, ResponseMapper,
};

use super::{ConfigError, Context};
use crate::access_log::{Filter, LogFormat};
use crate::route::headers::HeaderMutations;

/// A compiled `local_reply_config`.
#[derive(Debug, Clone)]
pub struct LocalReplyConfig {
    /// `mappers`, in order: the first whose filter passes rewrites the reply.
    pub mappers: Vec<Mapper>,
    /// `body_format`; `None`: the body as the proxy wrote it, `text/plain`.
    pub body_format: Option<BodyFormat>,
}

/// One `ResponseMapper`.
#[derive(Debug, Clone)]
pub struct Mapper {
    /// `filter`: which local replies it rewrites.
    pub filter: Filter,
    /// `status_code`: the status it gives them.
    pub status: Option<StatusCode>,
    /// `body`: the body (`%LOCAL_REPLY_BODY%`) it gives them.
    pub body: Option<String>,
    /// `headers_to_add`.
    pub headers: HeaderMutations,
    /// `body_format_override`.
    pub body_format: Option<BodyFormat>,
}

/// A body format: the formatter and the content type it produces.
#[derive(Debug, Clone)]
pub struct BodyFormat {
    /// The format (`%LOCAL_REPLY_BODY%` is the reply's body).
    pub format: LogFormat,
    /// `content_type`, else `application/json` for a JSON format and `text/plain` otherwise.
    pub content_type: Arc<str>,
}

/// Compiles a `local_reply_config`.
pub fn compile(ctx: &Context<'_>, c: &LocalReplyProto) -> Result<LocalReplyConfig, ConfigError> {
    let mappers = c
        .mappers
        .iter()
        .enumerate()
        .map(|(i, m)| mapper(ctx, m).map_err(|e| e.within(&format!("mappers[{i}]"))))
        .collect::<Result<_, _>>()?;
    let body_format = c
        .body_format
        .as_ref()
        .map(|f| body_format(ctx, f).map_err(|e| e.within("body_format")))
        .transpose()?;
    Ok(LocalReplyConfig {
        mappers,
        body_format,
    })
}

fn mapper(ctx: &Context<'_>, m: &ResponseMapper) -> Result<Mapper, ConfigError> {
    let filter = m
        .filter
        .as_ref()
        .ok_or_else(|| ConfigError::new("filter", "value is required"))?;
    let filter = super::access_log::compile_filter(ctx, filter).map_err(|e| e.within("filter"))?;
    let status = m
        .status_code
        .map(|s| match s.value {
            v @ 200..600 => Ok(StatusCode::from_u16(v as u16).expect("a status in range")),
            v => Err(ConfigError::new(
                "status_code",
                format!("value must be inside range [200, 600), got {v}"),
            )),
        })
        .transpose()?;
    let body = m
        .body
        .as_ref()
        .map(|b| {
            let bytes = super::tls::source::data(ctx, Some(b), "body")?;
            String::from_utf8(bytes)
                .map_err(|_| ConfigError::new("body", "the body is not valid UTF-8"))
        })
        .transpose()?;
    let headers = super::route::header_mutations(ctx, &m.headers_to_add, &[])
        .map_err(|e| e.within("headers_to_add"))?;
    let body_format = m
        .body_format_override
        .as_ref()
        .map(|f| body_format(ctx, f).map_err(|e| e.within("body_format_override")))
        .transpose()?;
    Ok(Mapper {
        filter,
        status,
        body,
        headers,
        body_format,
    })
}

fn body_format(ctx: &Context<'_>, f: &SubstitutionFormatString) -> Result<BodyFormat, ConfigError> {
    let content_type = if !f.content_type.is_empty() {
        f.content_type.as_str()
    } else if matches!(f.format, Some(Format::JsonFormat(_))) {
        "application/json"
    } else {
        "text/plain"
    };
    Ok(BodyFormat {
        format: super::access_log::substitution(ctx, f)?,
        content_type: Arc::from(content_type),
    })
}

#[cfg(test)]
mod tests {
    use proto::pb::envoy::config::accesslog::v3::{AccessLogFilter, access_log_filter};
    use proto::pb::google::protobuf::{Struct, UInt32Value};

    use super::*;
    use crate::config::FakeIo;

    fn not_health_check() -> AccessLogFilter {
        AccessLogFilter {
            filter_specifier: Some(access_log_filter::FilterSpecifier::NotHealthCheckFilter(
                Default::default(),
            )),
        }
    }

    #[test]
    fn mappers_need_a_filter_and_a_status_in_range() {
        let io = FakeIo::new();
        let ctx = Context::new(&io);
        let config = LocalReplyProto {
            mappers: vec![ResponseMapper::default()],
            ..Default::default()
        };
        assert_eq!(
            compile(&ctx, &config).unwrap_err().path,
            "mappers[0].filter"
        );
        let config = LocalReplyProto {
            mappers: vec![ResponseMapper {
                filter: Some(not_health_check()),
                status_code: Some(UInt32Value { value: 700 }),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            compile(&ctx, &config).unwrap_err().path,
            "mappers[0].status_code"
        );
    }

    #[test]
    fn a_json_body_format_is_application_json_unless_told() {
        let io = FakeIo::new();
        let ctx = Context::new(&io);
        let json = |content_type: &str| LocalReplyProto {
            body_format: Some(SubstitutionFormatString {
                format: Some(Format::JsonFormat(Struct::default())),
                content_type: content_type.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = compile(&ctx, &json("")).unwrap();
        assert_eq!(&*c.body_format.unwrap().content_type, "application/json");
        let c = compile(&ctx, &json("text/x-json")).unwrap();
        assert_eq!(&*c.body_format.unwrap().content_type, "text/x-json");
    }
}
