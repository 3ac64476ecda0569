//! `istio.stats` (stats.PluginConfig, istio/api `envoy/extensions/stats/config.proto`): Istio's
//! standard metrics (`istio_requests_total` and the rest) with its labels, which the HTTP
//! filter records per request. revoy keeps the reporter, `disable_host_header_fallback`,
//! `tcp_reporting_duration` and the `metrics` entries that drop metrics or remove labels; labels defined by CEL
//! expressions (`dimensions`, `definitions`) are not evaluated, with a note.

use std::time::Duration;

use serde_json::Value;

use super::{Fields, field};
use crate::config::{ConfigError, Warnings};

/// The message's fully qualified name.
pub const PLUGIN_CONFIG: &str = "stats.PluginConfig";

#[derive(Clone, PartialEq, prost::Message)]
struct PluginConfigProto {
    #[prost(bool, tag = "6")]
    disable_host_header_fallback: bool,
    #[prost(message, optional, tag = "7")]
    tcp_reporting_duration: Option<proto::pb::google::protobuf::Duration>,
    #[prost(message, repeated, tag = "8")]
    metrics: Vec<MetricConfigProto>,
    #[prost(message, repeated, tag = "9")]
    definitions: Vec<DefinitionProto>,
    /// UNSPECIFIED = 0, SERVER_GATEWAY = 1.
    #[prost(int32, tag = "10")]
    reporter: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct MetricConfigProto {
    #[prost(map = "string, string", tag = "1")]
    dimensions: std::collections::HashMap<String, String>,
    #[prost(string, tag = "2")]
    name: String,
    #[prost(string, repeated, tag = "3")]
    tags_to_remove: Vec<String>,
    #[prost(string, tag = "4")]
    r#match: String,
    #[prost(bool, tag = "5")]
    drop: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DefinitionProto {
    #[prost(string, tag = "1")]
    name: String,
}

/// Istio's standard metrics, by the names `metrics[].name` uses.
pub const METRICS: [&str; 10] = [
    "requests_total",
    "request_duration_milliseconds",
    "request_bytes",
    "response_bytes",
    "request_messages_total",
    "response_messages_total",
    "tcp_connections_opened_total",
    "tcp_connections_closed_total",
    "tcp_sent_bytes_total",
    "tcp_received_bytes_total",
];

/// The compiled filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IstioStatsConfig {
    /// `disable_host_header_fallback`: `destination_service` is not taken from the Host header.
    pub disable_host_header_fallback: bool,
    /// `reporter: SERVER_GATEWAY` (else the listener's direction decides).
    pub server_gateway: bool,
    /// Metrics dropped, by index in [`METRICS`].
    pub dropped: [bool; 10],
    /// Labels removed, per metric in [`METRICS`] order.
    pub removed_tags: [Vec<String>; 10],
    /// `tcp_reporting_duration`: how often an open TCP connection whose peer is known reports
    /// its bytes (Istio's proxy: 5 s when unset; `None` for 0, reports at close only).
    pub tcp_reporting: Option<Duration>,
}

/// Istio's proxy's `tcp_reporting_duration` when none is given (its code's default; the
/// proto's comment says 15 s).
const TCP_REPORTING_DEFAULT: Duration = Duration::from_secs(5);

/// Compiles the filter's config.
pub fn compile(
    fields: Fields<'_>,
    warnings: &mut Warnings,
) -> Result<IstioStatsConfig, ConfigError> {
    let proto: PluginConfigProto = match fields {
        Fields::Proto(bytes) => {
            prost::Message::decode(bytes).map_err(|e| super::decode_error(PLUGIN_CONFIG, e))?
        }
        Fields::Json(value) => from_json(&value)?,
    };
    let mut out = IstioStatsConfig {
        disable_host_header_fallback: proto.disable_host_header_fallback,
        server_gateway: proto.reporter == 1,
        tcp_reporting: proto
            .tcp_reporting_duration
            .as_ref()
            .map_or(Some(TCP_REPORTING_DEFAULT), |d| {
                crate::config::route::nonzero(Some(d))
            }),
        ..Default::default()
    };
    if out.server_gateway {
        warnings.note(
            "reporter",
            "SERVER_GATEWAY (waypoint) reporting is not implemented by revoy; it reports as a sidecar",
        );
    }
    if !proto.definitions.is_empty() {
        warnings.note(
            "definitions",
            "custom metrics are CEL expressions, which revoy does not evaluate; they are not recorded",
        );
    }
    for (i, m) in proto.metrics.iter().enumerate() {
        let at = format!("metrics[{i}]");
        let targets: Vec<usize> = if m.name.is_empty() {
            (0..METRICS.len()).collect()
        } else {
            match METRICS.iter().position(|n| *n == m.name) {
                Some(i) => vec![i],
                None => {
                    warnings.note(
                        format!("{at}.name"),
                        format!(
                            "'{}' is not one of Istio's standard metrics; ignored",
                            m.name
                        ),
                    );
                    continue;
                }
            }
        };
        if !m.dimensions.is_empty() || !m.r#match.is_empty() {
            warnings.note(
                at.clone(),
                "labels and matches defined by CEL expressions are not evaluated by revoy; the standard labels are kept",
            );
        }
        for t in targets {
            out.dropped[t] |= m.drop;
            out.removed_tags[t].extend(m.tags_to_remove.iter().cloned());
        }
    }
    Ok(out)
}

/// The proto form of the JSON fields.
fn from_json(value: &Value) -> Result<PluginConfigProto, ConfigError> {
    let text = |v: &Value, name: &str| {
        field(v, name)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let metrics = match field(value, "metrics") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, m)| {
                Ok(MetricConfigProto {
                    dimensions: field(m, "dimensions")
                        .and_then(Value::as_object)
                        .map(|o| {
                            o.iter()
                                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                                .collect()
                        })
                        .unwrap_or_default(),
                    name: text(m, "name"),
                    tags_to_remove: match field(m, "tags_to_remove") {
                        None => Vec::new(),
                        Some(v) => super::strings(v, &format!("metrics[{i}].tags_to_remove"))?,
                    },
                    r#match: text(m, "match"),
                    drop: field(m, "drop").and_then(Value::as_bool).unwrap_or(false),
                })
            })
            .collect::<Result<_, ConfigError>>()?,
        Some(_) => return Err(ConfigError::new("metrics", "expected a list")),
    };
    let definitions = match field(value, "definitions") {
        Some(Value::Array(list)) => list
            .iter()
            .map(|d| DefinitionProto {
                name: text(d, "name"),
            })
            .collect(),
        _ => Vec::new(),
    };
    let tcp_reporting_duration = match field(value, "tcp_reporting_duration") {
        None => None,
        Some(v) => Some(json_duration(v).ok_or_else(|| {
            ConfigError::new(
                "tcp_reporting_duration",
                format!("expected a duration such as \"5s\", got {v}"),
            )
        })?),
    };
    Ok(PluginConfigProto {
        disable_host_header_fallback: field(value, "disable_host_header_fallback")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        tcp_reporting_duration,
        metrics,
        definitions,
        reporter: match field(value, "reporter") {
            Some(Value::String(s)) if s == "SERVER_GATEWAY" => 1,
            Some(Value::Number(n)) => n.as_i64().unwrap_or(0) as i32,
            _ => 0,
        },
    })
}

/// A Duration in protobuf's JSON form (`"5s"`, `"0.250s"`).
fn json_duration(v: &Value) -> Option<proto::pb::google::protobuf::Duration> {
    let seconds: f64 = v.as_str()?.strip_suffix('s')?.parse().ok()?;
    if !(0.0..=315_576_000_000.0).contains(&seconds) {
        return None;
    }
    let d = Duration::from_secs_f64(seconds);
    Some(proto::pb::google::protobuf::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_and_removed_labels_apply_to_the_named_metric_or_all() {
        let v = serde_json::json!({
            "disable_host_header_fallback": true,
            "metrics": [
                {"name": "request_bytes", "drop": true},
                {"tags_to_remove": ["source_principal"]},
                {"name": "requests_total", "dimensions": {"x": "request.host"}},
            ],
        });
        let mut warnings = Warnings::new();
        let c = compile(Fields::Json(v), &mut warnings).unwrap();
        assert!(c.disable_host_header_fallback);
        assert!(c.dropped[2] && !c.dropped[0]);
        assert_eq!(c.removed_tags[0], ["source_principal"]);
        assert_eq!(c.removed_tags[9], ["source_principal"]);
        assert_eq!(warnings.len(), 1);
        assert_eq!(c.tcp_reporting, Some(Duration::from_secs(5)));
    }

    #[test]
    fn tcp_reporting_duration_is_read_and_zero_turns_periodic_reports_off() {
        let compiled = |v| compile(Fields::Json(v), &mut Warnings::new());
        let c = compiled(serde_json::json!({"tcp_reporting_duration": "0.250s"})).unwrap();
        assert_eq!(c.tcp_reporting, Some(Duration::from_millis(250)));
        let c = compiled(serde_json::json!({"tcpReportingDuration": "0s"})).unwrap();
        assert_eq!(c.tcp_reporting, None);
        let e = compiled(serde_json::json!({"tcp_reporting_duration": 5})).unwrap_err();
        assert!(e.to_string().contains("tcp_reporting_duration"), "{e}");
    }
}
