use prost::Message;
use proto::pb::envoy::config::accesslog::v3 as pb;
use proto::pb::google::protobuf::Any;

use super::*;
use crate::config::context::FakeIo;

fn any<M: Message + prost::Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

fn log(typed: Any, filter: Option<pb::AccessLogFilter>) -> pb::AccessLog {
    pb::AccessLog {
        name: "l".into(),
        filter,
        config_type: Some(pb::access_log::ConfigType::TypedConfig(typed)),
    }
}

fn compile(logs: &[pb::AccessLog]) -> Result<AccessLogs, ConfigError> {
    let io = FakeIo::new();
    compile_access_logs(&Context::new(&io), logs)
}

fn file(path: &str) -> FileAccessLog {
    FileAccessLog {
        path: path.into(),
        access_log_format: None,
    }
}

#[test]
fn a_file_logger_without_format_uses_envoys_default() {
    let logs = compile(&[log(any(&file("/tmp/x.log")), None)]).unwrap();
    let l = &logs.logs()[0];
    assert_eq!(l.path, PathBuf::from("/tmp/x.log"));
    assert_eq!(
        l.format,
        LogFormat::default_text(&Context::new(&FakeIo::new()))
    );
}

#[test]
fn stream_loggers_write_to_the_process_streams() {
    let logs = compile(&[
        log(any(&StdoutAccessLog::default()), None),
        log(any(&StderrAccessLog::default()), None),
    ])
    .unwrap();
    assert_eq!(logs.logs()[0].path, PathBuf::from("/dev/stdout"));
    assert_eq!(logs.logs()[1].path, PathBuf::from("/dev/stderr"));
}

#[test]
fn an_unknown_logger_is_an_error_naming_it() {
    let other = Any {
        type_url:
            "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig"
                .into(),
        value: vec![],
    };
    let e = compile(&[log(any(&file("/tmp/x")), None), log(other, None)]).unwrap_err();
    assert_eq!(e.path, "[1].typed_config");
    assert!(
        e.message
            .contains("HttpGrpcAccessLogConfig is not implemented"),
        "{e}"
    );
}

#[test]
fn a_formatter_extension_is_an_error_naming_it() {
    let mut f = file("/tmp/x");
    f.access_log_format = Some(file_access_log::AccessLogFormat::LogFormat(
        SubstitutionFormatString {
            formatters: vec![proto::pb::envoy::config::core::v3::TypedExtensionConfig {
                name: "envoy.formatter.req_without_query".into(),
                typed_config: None,
            }],
            ..Default::default()
        },
    ));
    let e = compile(&[log(any(&f), None)]).unwrap_err();
    assert_eq!(e.path, "[0].typed_config.log_format.formatters[0]");
    assert!(
        e.message.contains("envoy.formatter.req_without_query"),
        "{e}"
    );
}

#[test]
fn a_bad_operator_names_its_field() {
    let mut f = file("/tmp/x");
    f.access_log_format = Some(file_access_log::AccessLogFormat::LogFormat(
        SubstitutionFormatString {
            format: Some(substitution_format_string::Format::TextFormatSource(
                proto::pb::envoy::config::core::v3::DataSource {
                    specifier: Some(
                        proto::pb::envoy::config::core::v3::data_source::Specifier::InlineString(
                            "%BOGUS%".into(),
                        ),
                    ),
                    ..Default::default()
                },
            )),
            ..Default::default()
        },
    ));
    let e = compile(&[log(any(&f), None)]).unwrap_err();
    assert_eq!(e.path, "[0].typed_config.log_format.text_format_source");
    assert!(e.message.contains("BOGUS"), "{e}");
}

#[test]
fn response_flag_filters_check_their_flags() {
    let filter = |flags: Vec<&str>| pb::AccessLogFilter {
        filter_specifier: Some(pb::access_log_filter::FilterSpecifier::ResponseFlagFilter(
            pb::ResponseFlagFilter {
                flags: flags.into_iter().map(String::from).collect(),
            },
        )),
    };
    let ok = compile(&[log(any(&file("/tmp/x")), Some(filter(vec!["NR", "UF"])))]).unwrap();
    assert!(matches!(
        &ok.logs()[0].filter,
        Some(Filter::ResponseFlags(f)) if f == &[ResponseFlag::NoRouteFound, ResponseFlag::UpstreamConnectionFailure]
    ));
    let e = compile(&[log(any(&file("/tmp/x")), Some(filter(vec!["NR", "ZZ"])))]).unwrap_err();
    assert_eq!(e.path, "[0].filter.response_flag_filter.flags[1]");
}

#[test]
fn filters_revoy_lacks_are_errors() {
    let f = pb::AccessLogFilter {
        filter_specifier: Some(pb::access_log_filter::FilterSpecifier::AndFilter(
            pb::AndFilter {
                filters: vec![pb::AccessLogFilter {
                    filter_specifier: Some(pb::access_log_filter::FilterSpecifier::MetadataFilter(
                        Default::default(),
                    )),
                }],
            },
        )),
    };
    let e = compile(&[log(any(&file("/tmp/x")), Some(f))]).unwrap_err();
    assert_eq!(e.path, "[0].filter.and_filter.filters[0].metadata_filter");
}

#[test]
fn equal_configurations_compare_equal() {
    let a = compile(&[log(any(&file("/tmp/x")), None)]).unwrap();
    let b = compile(&[log(any(&file("/tmp/x")), None)]).unwrap();
    let c = compile(&[log(any(&file("/tmp/y")), None)]).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
}
