//! Istio's Wasm null-VM plugins: how istiod up to about 1.17-1.21 configured the metadata exchange
//! and `istio.stats`, as an `envoy.extensions.filters.{http,network}.wasm.v3.Wasm` filter whose
//! VM runtime is `envoy.wasm.runtime.null` and whose code is the plugin's name
//! (`envoy.wasm.metadata_exchange`, `envoy.wasm.stats`), compiled into Istio's proxy. revoy
//! runs these as its native filters, with the plugin's configuration mapped. Any other Wasm
//! filter (another runtime, other code, remote code) is not one of these, and fails closed.

use proto::pb::envoy::config::core::v3::{async_data_source, data_source};
use proto::pb::envoy::extensions::wasm::v3::{PluginConfig, plugin_config};
use proto::pb::google::protobuf::Any;
use serde_json::{Map, Value};

use super::peer_metadata::{Discovery, PeerMetadataConfig, Propagation};
use super::stats::IstioStatsConfig;
use super::{Fields, field};
use crate::config::{ConfigError, Warnings};

/// The HTTP filter's config type.
pub const HTTP_WASM: &str = "envoy.extensions.filters.http.wasm.v3.Wasm";
/// The network filter's config type.
pub const NETWORK_WASM: &str = "envoy.extensions.filters.network.wasm.v3.Wasm";
/// The runtime of plugins compiled into the proxy.
const NULL_RUNTIME: &str = "envoy.wasm.runtime.null";
/// The metadata exchange plugin's code name.
const METADATA_EXCHANGE: &str = "envoy.wasm.metadata_exchange";
/// The stats plugin's code name.
const STATS: &str = "envoy.wasm.stats";

/// The stats plugin's fields revoy's `istio.stats` reads.
const STATS_FIELDS: [&str; 5] = [
    "disable_host_header_fallback",
    "tcp_reporting_duration",
    "metrics",
    "definitions",
    "reporter",
];

/// The stats plugin's fields that only its Wasm form had: how its own stats store was named,
/// separated, rotated and cached. revoy's metrics keep Istio's names.
const STATS_WASM_ONLY: [&str; 7] = [
    "debug",
    "stat_prefix",
    "field_separator",
    "value_separator",
    "max_peer_cache_size",
    "rotation_interval",
    "graceful_deletion_interval",
];

/// One of Istio's null-VM plugins, compiled to revoy's native filter.
#[derive(Debug)]
pub enum NullPlugin {
    /// `envoy.wasm.metadata_exchange` (HTTP only).
    MetadataExchange(PeerMetadataConfig),
    /// `envoy.wasm.stats`.
    Stats(Box<IstioStatsConfig>),
}

/// A Wasm filter's config as far as telling the plugin apart needs.
struct Plugin {
    runtime: String,
    /// `vm_config.code.local.inline_string`, when the code is given so.
    code: Option<String>,
    configuration: Configuration,
}

/// The plugin's `configuration`.
enum Configuration {
    Absent,
    /// A `google.protobuf.StringValue` (or `BytesValue`, or a `Struct` in JSON): the text
    /// the plugin parses as JSON.
    Text(String),
    /// Another message type, by its fully qualified name.
    Typed(String),
}

/// Compiles `any`, the config of a Wasm filter (`wasm_type`: [`HTTP_WASM`] or
/// [`NETWORK_WASM`]), in proto form or in a TypedStruct. `None` when it is not one of Istio's
/// null-VM plugins revoy implements for that kind of filter, which the caller fails closed.
pub fn compile(
    any: &Any,
    wasm_type: &str,
    warnings: &mut Warnings,
) -> Result<Option<NullPlugin>, ConfigError> {
    let plugin = match Fields::of(any, wasm_type) {
        None => return Ok(None),
        Some(Fields::Proto(bytes)) => {
            let wasm: proto::pb::envoy::extensions::filters::http::wasm::v3::Wasm =
                prost::Message::decode(bytes).map_err(|e| super::decode_error(wasm_type, e))?;
            from_proto(wasm.config.unwrap_or_default())?
        }
        Some(Fields::Json(value)) => from_json(&value)?,
    };
    if plugin.runtime != NULL_RUNTIME {
        return Ok(None);
    }
    match plugin.code.as_deref() {
        Some(METADATA_EXCHANGE) if wasm_type == HTTP_WASM => {
            exchange(plugin.configuration, warnings).map(Some)
        }
        Some(STATS) => stats(plugin.configuration, warnings).map(Some),
        _ => Ok(None),
    }
}

/// The metadata exchange: both peers discovered from `x-envoy-peer-metadata` headers, and
/// this proxy's metadata sent upstream (but from an inbound listener) and answered to a
/// downstream that sent its own (but on an outbound listener); see
/// [`PeerMetadataConfig::by_listener_direction`].
fn exchange(
    configuration: Configuration,
    warnings: &mut Warnings,
) -> Result<NullPlugin, ConfigError> {
    match configuration {
        Configuration::Absent => {}
        // What istiod sends: the TCP filter's message, which the plugin does not read.
        Configuration::Typed(t) if t == super::metadata_exchange::CONFIG => {}
        Configuration::Text(text) => {
            let json = parse_object(&text)?;
            for key in json.keys() {
                let what = if key == "max_peer_cache_size" {
                    "the plugin's cache of decoded peers; revoy decodes each peer's header"
                } else {
                    "not a field of the plugin's configuration"
                };
                warnings.note(
                    format!("config.configuration.value.{key}"),
                    format!("{what}; ignored"),
                );
            }
        }
        Configuration::Typed(t) => {
            return Err(ConfigError::new(
                "config.configuration",
                format!("the metadata exchange plugin takes a JSON string, not a {t}"),
            ));
        }
    }
    let headers = Some(Propagation {
        skip_external_clusters: false,
    });
    Ok(NullPlugin::MetadataExchange(PeerMetadataConfig {
        downstream_discovery: vec![Discovery::IstioHeaders],
        upstream_discovery: vec![Discovery::IstioHeaders],
        downstream_propagation: headers,
        upstream_propagation: headers,
        by_listener_direction: true,
    }))
}

/// The stats plugin: its JSON configuration's fields that `istio.stats` has, compiled as that
/// filter's; the Wasm form's own fields are noted and ignored.
fn stats(configuration: Configuration, warnings: &mut Warnings) -> Result<NullPlugin, ConfigError> {
    const AT: &str = "config.configuration.value";
    let json = match configuration {
        Configuration::Absent => Map::new(),
        Configuration::Text(text) => parse_object(&text)?,
        Configuration::Typed(t) => {
            return Err(ConfigError::new(
                "config.configuration",
                format!("the stats plugin takes a JSON string, not a {t}"),
            ));
        }
    };
    let mut kept = Map::new();
    for (key, value) in json {
        let snake = snake(&key);
        if STATS_FIELDS.contains(&snake.as_str()) {
            kept.insert(key, value);
        } else if STATS_WASM_ONLY.contains(&snake.as_str()) {
            let what = match (snake.as_str(), &value) {
                ("stat_prefix", Value::String(p)) if p == "istio" => {
                    "the plugin's default metric prefix, which revoy's names carry".to_owned()
                }
                ("stat_prefix", _) => format!(
                    "a metric prefix ({value}) revoy does not apply: its metrics are named istio_*"
                ),
                _ => "a setting of the Wasm plugin's own stats store; revoy's has none".to_owned(),
            };
            warnings.note(format!("{AT}.{key}"), format!("{what}; ignored"));
        } else {
            warnings.note(
                format!("{AT}.{key}"),
                "not a field of the stats plugin's configuration; ignored",
            );
        }
    }
    let before = warnings.len();
    let compiled = super::stats::compile(Fields::Json(Value::Object(kept)), warnings);
    warnings.prefix_since(before, AT);
    Ok(NullPlugin::Stats(Box::new(
        compiled.map_err(|e| e.within(AT))?,
    )))
}

/// The JSON object a plugin's configuration text holds.
fn parse_object(text: &str) -> Result<Map<String, Value>, ConfigError> {
    match serde_json::from_str(text) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(other) => Err(ConfigError::new(
            "config.configuration.value",
            format!("expected a JSON object, got {other}"),
        )),
        Err(e) => Err(ConfigError::new(
            "config.configuration.value",
            format!("invalid JSON: {e}"),
        )),
    }
}

/// `camelCase` -> `camel_case` (the plugins parsed proto3 JSON, which takes both).
fn snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The proto form.
fn from_proto(config: PluginConfig) -> Result<Plugin, ConfigError> {
    let Some(plugin_config::Vm::VmConfig(vm)) = config.vm else {
        return Ok(Plugin {
            runtime: String::new(),
            code: None,
            configuration: Configuration::Absent,
        });
    };
    let code = match vm.code.and_then(|c| c.specifier) {
        Some(async_data_source::Specifier::Local(local)) => match local.specifier {
            Some(data_source::Specifier::InlineString(s)) => Some(s),
            _ => None,
        },
        _ => None,
    };
    let configuration = match config.configuration {
        None => Configuration::Absent,
        Some(any) if proto::is_empty_any(&any) => Configuration::Absent,
        Some(any) => configuration_of(&any)?,
    };
    Ok(Plugin {
        runtime: vm.runtime,
        code,
        configuration,
    })
}

/// A proto `configuration`.
fn configuration_of(any: &Any) -> Result<Configuration, ConfigError> {
    use proto::pb::google::protobuf::{BytesValue, StringValue, Struct};
    let at = |e: proto::UnpackError| ConfigError::new("config.configuration", e.to_string());
    Ok(match proto::type_name_of(&any.type_url) {
        "google.protobuf.StringValue" => {
            Configuration::Text(proto::unpack::<StringValue>(any).map_err(at)?.value)
        }
        "google.protobuf.BytesValue" => {
            let bytes = proto::unpack::<BytesValue>(any).map_err(at)?.value;
            Configuration::Text(
                String::from_utf8(bytes).map_err(|_| {
                    ConfigError::new("config.configuration.value", "not UTF-8 text")
                })?,
            )
        }
        "google.protobuf.Struct" => Configuration::Text(
            crate::config::route::struct_to_json(&proto::unpack::<Struct>(any).map_err(at)?)
                .to_string(),
        ),
        _ => Configuration::Typed(proto::extension_type(any)),
    })
}

/// The JSON form (a TypedStruct's fields, what a config dump may hold).
fn from_json(value: &Value) -> Result<Plugin, ConfigError> {
    let path = |mut v: &Value, names: &[&str]| -> Option<Value> {
        for n in names {
            v = field(v, n)?;
        }
        Some(v.clone())
    };
    let text = |names: &[&str]| path(value, names).and_then(|v| v.as_str().map(str::to_owned));
    let configuration = match path(value, &["config", "configuration"]) {
        None => Configuration::Absent,
        Some(Value::Object(c)) => {
            let type_url = c.get("@type").and_then(Value::as_str).unwrap_or("");
            match (proto::type_name_of(type_url), c.get("value")) {
                ("", _) if c.is_empty() => Configuration::Absent,
                ("google.protobuf.StringValue", Some(Value::String(s))) => {
                    Configuration::Text(s.clone())
                }
                ("google.protobuf.StringValue", None) => Configuration::Text(String::new()),
                ("google.protobuf.Struct", _) => {
                    let mut fields = c.clone();
                    fields.remove("@type");
                    Configuration::Text(Value::Object(fields).to_string())
                }
                ("", _) => {
                    return Err(ConfigError::new(
                        "config.configuration",
                        "an Any without an @type",
                    ));
                }
                (t, _) => Configuration::Typed(t.to_owned()),
            }
        }
        Some(other) => {
            return Err(ConfigError::new(
                "config.configuration",
                format!("expected an Any, got {other}"),
            ));
        }
    };
    Ok(Plugin {
        runtime: text(&["config", "vm_config", "runtime"]).unwrap_or_default(),
        code: text(&["config", "vm_config", "code", "local", "inline_string"]),
        configuration,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::core::v3::{AsyncDataSource, DataSource};
    use proto::pb::envoy::extensions::wasm::v3::VmConfig;

    /// A proto HTTP Wasm filter running `code` on `runtime`.
    fn wasm(runtime: &str, code: &str, configuration: Option<Any>) -> Any {
        let config = PluginConfig {
            root_id: "stats_outbound".into(),
            configuration,
            vm: Some(plugin_config::Vm::VmConfig(VmConfig {
                runtime: runtime.into(),
                code: Some(AsyncDataSource {
                    specifier: Some(async_data_source::Specifier::Local(DataSource {
                        specifier: Some(data_source::Specifier::InlineString(code.into())),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        proto::pack(
            &proto::pb::envoy::extensions::filters::http::wasm::v3::Wasm {
                config: Some(config),
            },
        )
    }

    fn string_value(s: &str) -> Any {
        proto::pack(&proto::pb::google::protobuf::StringValue { value: s.into() })
    }

    #[test]
    fn the_stats_plugins_json_is_istio_stats_config() {
        let json = r#"{"debug": "false", "stat_prefix": "istio", "disable_host_header_fallback": true,
            "tcp_reporting_duration": "1s",
            "metrics": [{"name": "request_bytes", "drop": true}, {"tags_to_remove": ["source_principal"]}]}"#;
        let any = wasm(NULL_RUNTIME, STATS, Some(string_value(json)));
        let mut warnings = Warnings::new();
        let Some(NullPlugin::Stats(c)) = compile(&any, HTTP_WASM, &mut warnings).unwrap() else {
            panic!("not the stats filter");
        };
        assert!(c.disable_host_header_fallback);
        assert!(c.dropped[2]);
        assert_eq!(c.removed_tags[0], ["source_principal"]);
        assert_eq!(c.tcp_reporting, Some(std::time::Duration::from_secs(1)));
        // debug and stat_prefix: noted, by their path.
        assert_eq!(warnings.len(), 2);
    }

    #[test]
    fn the_metadata_exchange_plugin_exchanges_headers_both_ways() {
        let mx = proto::pack(&proto::pb::google::protobuf::Empty {});
        let mx = Any {
            type_url: format!(
                "type.googleapis.com/{}",
                super::super::metadata_exchange::CONFIG
            ),
            ..mx
        };
        let any = wasm(NULL_RUNTIME, METADATA_EXCHANGE, Some(mx));
        let Some(NullPlugin::MetadataExchange(c)) =
            compile(&any, HTTP_WASM, &mut Warnings::new()).unwrap()
        else {
            panic!("not the exchange");
        };
        assert_eq!(c.downstream_discovery, [Discovery::IstioHeaders]);
        assert_eq!(c.upstream_discovery, [Discovery::IstioHeaders]);
        assert!(c.by_listener_direction);
    }

    #[test]
    fn other_wasm_code_or_runtimes_are_not_istios_plugins() {
        let mut w = Warnings::new();
        for any in [
            wasm("envoy.wasm.runtime.v8", STATS, None),
            wasm(NULL_RUNTIME, "envoy.wasm.attributegen", None),
            wasm(
                NULL_RUNTIME,
                "/etc/istio/extensions/stats-filter.wasm",
                None,
            ),
        ] {
            assert!(compile(&any, HTTP_WASM, &mut w).unwrap().is_none());
        }
        // The exchange plugin has no network form.
        let mut any = wasm(NULL_RUNTIME, METADATA_EXCHANGE, None);
        any.type_url = format!("type.googleapis.com/{NETWORK_WASM}");
        assert!(compile(&any, NETWORK_WASM, &mut w).unwrap().is_none());
    }

    #[test]
    fn the_json_form_reads_the_same_and_errors_name_the_field() {
        let v = serde_json::json!({"config": {
            "root_id": "stats_inbound",
            "vm_config": {"runtime": NULL_RUNTIME, "code": {"local": {"inline_string": STATS}}},
            "configuration": {
                "@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": "{\"disableHostHeaderFallback\": true}",
            },
        }});
        let p = from_json(&v).unwrap();
        assert_eq!(p.runtime, NULL_RUNTIME);
        assert_eq!(p.code.as_deref(), Some(STATS));
        let NullPlugin::Stats(c) = stats(p.configuration, &mut Warnings::new()).unwrap() else {
            panic!("not the stats filter");
        };
        assert!(c.disable_host_header_fallback);
        let e = stats(
            Configuration::Text(r#"{"metrics": 3}"#.into()),
            &mut Warnings::new(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("config.configuration.value.metrics"),
            "{e}"
        );
        let e = stats(Configuration::Text("{".into()), &mut Warnings::new()).unwrap_err();
        assert!(e.to_string().contains("config.configuration.value"), "{e}");
    }
}
