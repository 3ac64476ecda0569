//! The HTTP/2 keep-alive of the ADS channel: the xDS cluster's
//! `http2_protocol_options.connection_keepalive` (`envoy_grpc`), or a `google_grpc` service's
//! gRPC keep-alive channel arguments.

use std::time::Duration;

use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::grpc_service::google_grpc::ChannelArgs;
use proto::pb::envoy::config::core::v3::grpc_service::google_grpc::channel_args::value::ValueSpecifier;
use proto::pb::envoy::config::core::v3::{Http2ProtocolOptions, KeepaliveSettings};
use proto::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
};

use crate::config::ConfigError;
use crate::config::cluster::{HTTP_PROTOCOL_OPTIONS, duration, typed_http_options};

/// How the ADS channel checks that the control plane is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Nothing configured: revoy's own (a PING every 30 s, 10 s to answer; Envoy sends none).
    Default,
    /// Configured without an interval: no PINGs, as Envoy.
    Off,
    /// A PING every `interval`; the connection is dropped (and the stream re-established)
    /// when one goes unanswered for `timeout`.
    Every {
        /// `interval` (`grpc.keepalive_time_ms`).
        interval: Duration,
        /// `timeout` (`grpc.keepalive_timeout_ms`).
        timeout: Duration,
    },
}

/// gRPC's default keep-alive timeout (`grpc.keepalive_timeout_ms` unset).
const GRPC_DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// The keep-alive of an `envoy_grpc` ADS channel through cluster `c`: its
/// `typed_extension_protocol_options` HTTP/2 options, else the deprecated
/// `http2_protocol_options`. Errors name the field path within the cluster.
#[allow(deprecated)] // `http2_protocol_options` on the cluster is what older bootstraps use.
pub fn of_cluster(c: &Cluster) -> Result<KeepAlive, ConfigError> {
    let typed_path = format!(
        "typed_extension_protocol_options[\"{HTTP_PROTOCOL_OPTIONS}\"].explicit_http_config.http2_protocol_options"
    );
    let typed = typed_http_options(c)?;
    let h2: Option<(&Http2ProtocolOptions, &str)> = match typed
        .as_ref()
        .and_then(|t| t.upstream_protocol_options.as_ref())
    {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(e)) => match &e.protocol_config {
            Some(ProtocolConfig::Http2ProtocolOptions(h2)) => Some((h2, typed_path.as_str())),
            _ => None,
        },
        _ => c
            .http2_protocol_options
            .as_ref()
            .map(|h2| (h2, "http2_protocol_options")),
    };
    match h2.and_then(|(h2, path)| h2.connection_keepalive.as_ref().map(|k| (k, path))) {
        None => Ok(KeepAlive::Default),
        Some((k, path)) => settings(k, &format!("{path}.connection_keepalive")),
    }
}

fn settings(k: &KeepaliveSettings, path: &str) -> Result<KeepAlive, ConfigError> {
    let timeout = match &k.timeout {
        Some(t) => duration(t, &format!("{path}.timeout"))?,
        None => {
            return Err(ConfigError::new(
                format!("{path}.timeout"),
                "a keep-alive needs a timeout (Envoy requires it)",
            ));
        }
    };
    if k.connection_idle_interval.is_some() {
        return Err(ConfigError::new(
            format!("{path}.connection_idle_interval"),
            "PINGs before reusing an idle connection are not implemented by revoy for the xDS channel",
        ));
    }
    match &k.interval {
        Some(i) => {
            let interval = duration(i, &format!("{path}.interval"))?;
            if interval.is_zero() {
                return Ok(KeepAlive::Off);
            }
            // interval_jitter: hyper's PINGs have no jitter; one stream per proxy needs none.
            Ok(KeepAlive::Every { interval, timeout })
        }
        None => Ok(KeepAlive::Off),
    }
}

/// The keep-alive a `google_grpc` service's `channel_args` ask for (`grpc.keepalive_time_ms`,
/// `grpc.keepalive_timeout_ms`); any other argument is refused, naming it.
pub fn of_channel_args(args: Option<&ChannelArgs>) -> Result<KeepAlive, ConfigError> {
    let Some(args) = args else {
        return Ok(KeepAlive::Default);
    };
    let mut names: Vec<&String> = args.args.keys().collect();
    names.sort();
    let (mut time, mut timeout) = (None, None);
    for name in names {
        let path = format!("channel_args.args[\"{name}\"]");
        let ms = match args.args[name].value_specifier {
            Some(ValueSpecifier::IntValue(v)) if v >= 0 => Duration::from_millis(v as u64),
            _ => {
                return Err(ConfigError::new(
                    path,
                    "a keep-alive argument is a non-negative int_value (milliseconds)",
                ));
            }
        };
        match name.as_str() {
            "grpc.keepalive_time_ms" => time = Some(ms),
            "grpc.keepalive_timeout_ms" => timeout = Some(ms),
            _ => {
                return Err(ConfigError::new(
                    path,
                    "revoy's ADS client takes only grpc.keepalive_time_ms and grpc.keepalive_timeout_ms",
                ));
            }
        }
    }
    Ok(match time {
        None => KeepAlive::Default,
        Some(t) if t.is_zero() => KeepAlive::Off,
        Some(interval) => KeepAlive::Every {
            interval,
            timeout: timeout.unwrap_or(GRPC_DEFAULT_TIMEOUT),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(yaml: &str) -> Cluster {
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).expect("yaml");
        proto::Codec::new()
            .decode(value, false)
            .expect("cluster decodes")
            .message
    }

    #[test]
    fn pilot_agent_style_options_set_the_interval_and_timeout() {
        let c = cluster(
            r#"
name: xds-grpc
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config:
      http2_protocol_options: {connection_keepalive: {interval: 30s, timeout: 10s}}
"#,
        );
        assert_eq!(
            of_cluster(&c),
            Ok(KeepAlive::Every {
                interval: Duration::from_secs(30),
                timeout: Duration::from_secs(10)
            })
        );
    }

    #[test]
    fn the_deprecated_field_counts_and_no_interval_means_no_pings() {
        let c = cluster("name: x\nhttp2_protocol_options: {connection_keepalive: {timeout: 1s}}");
        assert_eq!(of_cluster(&c), Ok(KeepAlive::Off));
        assert_eq!(of_cluster(&cluster("name: x")), Ok(KeepAlive::Default));
        let e = of_cluster(&cluster(
            "name: x\nhttp2_protocol_options: {connection_keepalive: {interval: 1s}}",
        ))
        .unwrap_err();
        assert_eq!(
            e.path,
            "http2_protocol_options.connection_keepalive.timeout"
        );
    }

    #[test]
    fn google_grpc_channel_args_give_the_keep_alive_and_others_are_refused() {
        use proto::pb::envoy::config::core::v3::grpc_service::google_grpc::channel_args::Value;
        let args = |pairs: &[(&str, i64)]| ChannelArgs {
            args: pairs
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        Value {
                            value_specifier: Some(ValueSpecifier::IntValue(*v)),
                        },
                    )
                })
                .collect(),
        };
        assert_eq!(
            of_channel_args(Some(&args(&[("grpc.keepalive_time_ms", 500)]))),
            Ok(KeepAlive::Every {
                interval: Duration::from_millis(500),
                timeout: GRPC_DEFAULT_TIMEOUT
            })
        );
        let e =
            of_channel_args(Some(&args(&[("grpc.max_receive_message_length", 5)]))).unwrap_err();
        assert_eq!(
            e.path,
            "channel_args.args[\"grpc.max_receive_message_length\"]"
        );
    }
}
