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
    compile_access_logs(&Context::new(&io), logs, &mut Warnings::new())
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

fn other_logger(type_name: &str, name: &str, filter: Option<pb::AccessLogFilter>) -> pb::AccessLog {
    pb::AccessLog {
        name: name.into(),
        filter,
        config_type: Some(pb::access_log::ConfigType::TypedConfig(Any {
            type_url: format!("type.googleapis.com/{type_name}"),
            value: vec![],
        })),
    }
}

#[test]
fn loggers_revoy_lacks_are_skipped_with_a_warning_naming_them() {
    // Istio's telemetry providers: gRPC ALS and OpenTelemetry, the latter with a CEL filter
    // (an extension filter, which revoy lacks: a skipped logger's filter is not read).
    let cel = pb::AccessLogFilter {
        filter_specifier: Some(pb::access_log_filter::FilterSpecifier::ExtensionFilter(
            pb::ExtensionFilter {
                name: "envoy.access_loggers.extension_filters.cel".into(),
                config_type: None,
            },
        )),
    };
    let logs = [
        other_logger(
            "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "envoy.access_loggers.http_grpc",
            None,
        ),
        log(any(&file("/tmp/x")), None),
        other_logger(
            "envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig",
            "otel",
            Some(cel),
        ),
    ];
    let io = FakeIo::new();
    let mut warnings = Warnings::new();
    let compiled = compile_access_logs(&Context::new(&io), &logs, &mut warnings).unwrap();
    assert_eq!(compiled.logs().len(), 1);
    assert_eq!(compiled.logs()[0].path, PathBuf::from("/tmp/x"));
    let found: Vec<_> = warnings
        .iter()
        .map(|w| (w.severity, w.path.as_str(), w.message.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (
                crate::config::Severity::Skipped,
                "[0].typed_config",
                "access logger 'envoy.access_loggers.http_grpc' (envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig) is not implemented by revoy (it writes the file, stdout and stderr loggers); nothing is logged through it"
            ),
            (
                crate::config::Severity::Skipped,
                "[2].typed_config",
                "access logger 'otel' (envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig) is not implemented by revoy (it writes the file, stdout and stderr loggers); nothing is logged through it"
            ),
        ]
    );
}

#[test]
fn a_logger_without_typed_config_is_an_error() {
    let bare = pb::AccessLog {
        name: "bare".into(),
        ..Default::default()
    };
    let e = compile(&[bare]).unwrap_err();
    assert_eq!(e.path, "[0].typed_config");
}

#[test]
fn a_formatter_extension_revoy_lacks_is_an_error_naming_it() {
    let mut f = file("/tmp/x");
    f.access_log_format = Some(file_access_log::AccessLogFormat::LogFormat(
        SubstitutionFormatString {
            formatters: vec![proto::pb::envoy::config::core::v3::TypedExtensionConfig {
                name: "envoy.formatter.cel".into(),
                typed_config: Some(proto::pb::google::protobuf::Any {
                    type_url: "type.googleapis.com/envoy.extensions.formatter.cel.v3.Cel".into(),
                    value: Vec::new(),
                }),
            }],
            ..Default::default()
        },
    ));
    let e = compile(&[log(any(&f), None)]).unwrap_err();
    assert_eq!(e.path, "[0].typed_config.log_format.formatters[0]");
    assert!(e.message.contains("envoy.formatter.cel"), "{e}");
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
fn a_file_that_cannot_be_opened_is_an_error_naming_its_path() {
    let io = FakeIo::new().with_unopenable_log("/nope/x.log", std::io::ErrorKind::NotFound);
    let logs = [
        log(any(&file("/tmp/fine.log")), None),
        log(any(&file("/nope/x.log")), None),
    ];
    let e = compile_access_logs(&Context::new(&io), &logs, &mut Warnings::new()).unwrap_err();
    assert_eq!(e.path, "[1].typed_config.path");
    assert_eq!(
        e.message,
        format!(
            "unable to open file '/nope/x.log': {}",
            std::io::Error::from(std::io::ErrorKind::NotFound)
        )
    );
}

#[test]
fn os_errors_read_as_strerror() {
    let e = std::io::Error::from_raw_os_error(libc::ENOENT);
    assert_eq!(os_message(&e), "No such file or directory");
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
                    filter_specifier: Some(pb::access_log_filter::FilterSpecifier::LogTypeFilter(
                        Default::default(),
                    )),
                }],
            },
        )),
    };
    let e = compile(&[log(any(&file("/tmp/x")), Some(f))]).unwrap_err();
    assert_eq!(e.path, "[0].filter.and_filter.filters[0].log_type_filter");
}

#[test]
fn equal_configurations_compare_equal() {
    let a = compile(&[log(any(&file("/tmp/x")), None)]).unwrap();
    let b = compile(&[log(any(&file("/tmp/x")), None)]).unwrap();
    let c = compile(&[log(any(&file("/tmp/y")), None)]).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
}
