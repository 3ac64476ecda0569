//! The bootstrap's `layered_runtime`: each layer's name and kind, and the static layers'
//! values typed as Envoy types them (text, boolean, number, non-negative integer, fractional
//! percent), which the live runtime (`crate::runtime`) merges with the admin layer's
//! overrides. Disk and RTDS layers are listed by name and not read.

use std::collections::HashMap;

use proto::pb::envoy::config::bootstrap::v3::LayeredRuntime;
use proto::pb::envoy::config::bootstrap::v3::runtime_layer::LayerSpecifier;
use proto::pb::google::protobuf::Value;
use proto::pb::google::protobuf::value::Kind;

use super::ConfigError;
use crate::route::matcher::FractionalPercent;

/// One runtime value: its text (as `/runtime` shows it) and what it reads as, as Envoy's
/// snapshot types it.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeValue {
    /// The text.
    pub raw: String,
    /// `true`/`false` (any case), or an integer (non-zero: true).
    pub boolean: Option<bool>,
    /// A number.
    pub double: Option<f64>,
    /// A non-negative number, truncated.
    pub uint: Option<u64>,
    /// A `FractionalPercent` (a static layer's object with `numerator` or `denominator`).
    pub fraction: Option<FractionalPercent>,
}

impl RuntimeValue {
    /// A value given as text (a static layer's string, an admin override).
    pub fn parse(raw: String) -> RuntimeValue {
        let stripped = raw.trim();
        let integer = stripped.parse::<u64>().ok();
        let word = if stripped.eq_ignore_ascii_case("true") {
            Some(true)
        } else if stripped.eq_ignore_ascii_case("false") {
            Some(false)
        } else {
            None
        };
        let double = word.is_none().then(|| raw.parse::<f64>().ok()).flatten();
        RuntimeValue {
            boolean: word.or(integer.map(|i| i != 0)),
            uint: double
                .filter(|d| *d >= 0.0 && *d <= u64::MAX as f64)
                .map(|d| d as u64),
            double,
            fraction: None,
            raw,
        }
    }
}

/// A `RuntimeFeatureFlag`: on or off by the runtime's boolean at `key`, else `default`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeFlag {
    /// The runtime key (empty: the flag was not set, and `default` holds).
    pub key: String,
    /// `default_value`.
    pub default: bool,
}

impl RuntimeFlag {
    /// An unset flag: always on, as Envoy takes it.
    pub fn on() -> RuntimeFlag {
        RuntimeFlag {
            key: String::new(),
            default: true,
        }
    }
}

/// What a layer is.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerKind {
    /// `static_layer`: its values, flattened to `a.b.c` keys.
    Static(HashMap<String, RuntimeValue>),
    /// `admin_layer`: what `/runtime_modify` sets.
    Admin,
    /// `disk_layer` or `rtds_layer`: not read by revoy (no values).
    NotRead,
}

/// One layer of `layered_runtime`, in order (a later layer's value wins).
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeLayer {
    /// Its name.
    pub name: String,
    /// What it is.
    pub kind: LayerKind,
}

/// The compiled `layered_runtime`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StaticRuntime {
    /// The layers, in order.
    pub layers: Vec<RuntimeLayer>,
}

impl StaticRuntime {
    /// Compiles `runtime` as Envoy loads it: layer names unique, at most one admin layer, a
    /// static layer's objects flattened into `a.b` keys unless they are fractional percents,
    /// lists and nulls refused.
    pub fn compile(runtime: Option<&LayeredRuntime>) -> Result<StaticRuntime, ConfigError> {
        let mut out = StaticRuntime::default();
        let mut admin = false;
        for (i, layer) in runtime
            .map(|r| r.layers.as_slice())
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let path = format!("layered_runtime.layers[{i}]");
            if out.layers.iter().any(|l| l.name == layer.name) {
                return Err(ConfigError::new(
                    &path,
                    format!("Duplicate layer name: {}", layer.name),
                ));
            }
            let kind = match &layer.layer_specifier {
                Some(LayerSpecifier::StaticLayer(s)) => {
                    let mut values = HashMap::new();
                    for (key, value) in &s.fields {
                        walk(&mut values, key, value).map_err(|e| e.within(&path))?;
                    }
                    LayerKind::Static(values)
                }
                Some(LayerSpecifier::AdminLayer(_)) if admin => {
                    return Err(ConfigError::new(
                        &path,
                        "Too many admin layers specified in LayeredRuntime, at most one may be specified",
                    ));
                }
                Some(LayerSpecifier::AdminLayer(_)) => {
                    admin = true;
                    LayerKind::Admin
                }
                Some(LayerSpecifier::DiskLayer(_) | LayerSpecifier::RtdsLayer(_)) => {
                    LayerKind::NotRead
                }
                None => return Err(ConfigError::new(&path, "layer specifier not set")),
            };
            out.layers.push(RuntimeLayer {
                name: layer.name.clone(),
                kind,
            });
        }
        Ok(out)
    }
}

/// Adds `value` at `key` (and the values nested in it under `key.`) to `values`.
fn walk(
    values: &mut HashMap<String, RuntimeValue>,
    key: &str,
    value: &Value,
) -> Result<(), ConfigError> {
    let typed = match &value.kind {
        Some(Kind::StringValue(s)) => RuntimeValue::parse(s.clone()),
        Some(Kind::NumberValue(n)) => RuntimeValue::parse(n.to_string()),
        Some(Kind::BoolValue(b)) => RuntimeValue::parse(b.to_string()),
        Some(Kind::StructValue(s))
            if s.fields.is_empty()
                || s.fields.contains_key("numerator")
                || s.fields.contains_key("denominator") =>
        {
            fraction(s)
        }
        Some(Kind::StructValue(s)) => {
            for (k, v) in &s.fields {
                walk(values, &format!("{key}.{k}"), v)?;
            }
            return Ok(());
        }
        Some(Kind::ListValue(_) | Kind::NullValue(_)) | None => {
            return Err(ConfigError::new(
                "static_layer",
                format!("Invalid runtime entry value for {key}"),
            ));
        }
    };
    values.insert(key.to_owned(), typed);
    Ok(())
}

/// A static layer's fractional-percent object (`numerator`, `denominator` by enum name).
fn fraction(s: &proto::pb::google::protobuf::Struct) -> RuntimeValue {
    let number = |name: &str| match s.fields.get(name).and_then(|v| v.kind.as_ref()) {
        Some(Kind::NumberValue(n)) => Some(*n as u32),
        Some(Kind::StringValue(t)) => t.parse().ok(),
        _ => None,
    };
    let denominator = match s.fields.get("denominator").and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(t)) if t == "TEN_THOUSAND" => 10_000,
        Some(Kind::StringValue(t)) if t == "MILLION" => 1_000_000,
        Some(Kind::NumberValue(n)) if *n == 1.0 => 10_000,
        Some(Kind::NumberValue(n)) if *n == 2.0 => 1_000_000,
        _ => 100,
    };
    let numerator = number("numerator").unwrap_or(0);
    let mut fields: Vec<String> = s
        .fields
        .iter()
        .map(|(k, v)| match &v.kind {
            Some(Kind::StringValue(t)) => format!("{k}: {t}"),
            Some(Kind::NumberValue(n)) => format!("{k}: {n}"),
            _ => format!("{k}: ?"),
        })
        .collect();
    fields.sort();
    RuntimeValue {
        raw: fields.join("\n"),
        boolean: None,
        double: None,
        uint: None,
        fraction: Some(FractionalPercent {
            numerator,
            denominator,
        }),
    }
}

/// Compiles the `layered_runtime` of a bootstrap written in YAML (for tests).
#[cfg(test)]
pub(crate) fn from_bootstrap_yaml(yaml: &str) -> Result<StaticRuntime, ConfigError> {
    let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).expect("YAML");
    let b: proto::pb::envoy::config::bootstrap::v3::Bootstrap = proto::Codec::new()
        .decode(value, false)
        .expect("a bootstrap")
        .message;
    StaticRuntime::compile(b.layered_runtime.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(yaml: &str) -> StaticRuntime {
        from_bootstrap_yaml(yaml).unwrap()
    }

    #[test]
    fn keys_flat_nested_and_layered() {
        let r = runtime(
            "layered_runtime: {layers: [\
             {name: a, static_layer: {fault.http.abort.abort_percent: 10, x: {y: {z: '7'}}, s: nope}}, \
             {name: b, admin_layer: {}}, \
             {name: c, static_layer: {fault: {http: {abort: {abort_percent: 100}}}}}]}",
        );
        let value = |layer: usize, key: &str| match &r.layers[layer].kind {
            LayerKind::Static(values) => values.get(key).and_then(|v| v.uint),
            _ => None,
        };
        assert_eq!(value(0, "fault.http.abort.abort_percent"), Some(10));
        assert_eq!(value(2, "fault.http.abort.abort_percent"), Some(100));
        assert_eq!(value(0, "x.y.z"), Some(7));
        assert_eq!(value(0, "s"), None);
        assert_eq!(r.layers[1].kind, LayerKind::Admin);
        assert_eq!(
            StaticRuntime::compile(None).unwrap(),
            StaticRuntime::default()
        );
    }

    #[test]
    fn values_are_typed_as_envoy_types_them() {
        let v = |s: &str| RuntimeValue::parse(s.to_owned());
        assert_eq!((v("7").uint, v("7").boolean), (Some(7), Some(true)));
        assert_eq!((v("3.7").uint, v("3.7").double), (Some(3), Some(3.7)));
        assert_eq!((v("-1").uint, v("-1").double), (None, Some(-1.0)));
        assert_eq!((v("TRUE").boolean, v("TRUE").double), (Some(true), None));
        assert_eq!((v("hello").boolean, v("hello").uint), (None, None));
        let r = runtime(
            "layered_runtime: {layers: [{name: a, static_layer: {f: {numerator: 3, denominator: TEN_THOUSAND}, on: true}}]}",
        );
        let LayerKind::Static(values) = &r.layers[0].kind else {
            panic!("a static layer")
        };
        assert_eq!(
            values["f"].fraction,
            Some(FractionalPercent {
                numerator: 3,
                denominator: 10_000
            })
        );
        assert_eq!(values["on"].raw, "true");
    }

    #[test]
    fn refuses_what_envoy_refuses() {
        let fails = |yaml: &str| from_bootstrap_yaml(yaml).unwrap_err().to_string();
        assert!(fails("layered_runtime: {layers: [{name: a, admin_layer: {}}, {name: a, admin_layer: {}}]}").contains("Duplicate layer name: a"));
        assert!(fails("layered_runtime: {layers: [{name: a, admin_layer: {}}, {name: b, admin_layer: {}}]}").contains("Too many admin layers"));
        assert!(
            fails("layered_runtime: {layers: [{name: a, static_layer: {k: [1]}}]}")
                .contains("Invalid runtime entry value for k")
        );
    }
}
