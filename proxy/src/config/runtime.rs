//! The bootstrap's `layered_runtime`: each layer's name and kind, and the static layers'
//! values typed as Envoy types them (text, boolean, number, non-negative integer, fractional
//! percent), which the live runtime (`crate::runtime`) merges with the admin layer's
//! overrides; disk layers' directories, which the live runtime reads at each load (see
//! [`DiskLayer`]), and how a file there becomes a key and a value; RTDS layers by the resource
//! they subscribe to over ADS, whose `layer` Struct compiles as a static layer's does
//! ([`compile_layer`]).

use std::collections::HashMap;

use proto::pb::envoy::config::bootstrap::v3::LayeredRuntime;
use proto::pb::envoy::config::bootstrap::v3::runtime_layer::{self, LayerSpecifier};
use proto::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use proto::pb::google::protobuf::Value;
use proto::pb::google::protobuf::value::Kind;

use super::ConfigError;
use super::context::Context;
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

    /// A disk layer file's value (its text as [`disk_text`] leaves it), typed as Envoy types
    /// it: read as YAML, a number is a number (and, whole, a boolean), a boolean a boolean, a
    /// mapping of `numerator` and `denominator` a fractional percent, anything else only text.
    /// Text that is not YAML is an error, which makes Envoy drop the whole layer.
    pub fn from_disk(text: String) -> Result<RuntimeValue, String> {
        let yaml = proto::Codec::parse_text(&text, proto::Format::Yaml)
            .map_err(|e| format!("Unable to parse YAML runtime value: {e}"))?;
        let mut value = RuntimeValue {
            raw: String::new(),
            boolean: None,
            double: None,
            uint: None,
            fraction: None,
        };
        match yaml {
            serde_json::Value::Number(n) => value.set_number(n.as_f64().unwrap_or(0.0)),
            serde_json::Value::Bool(b) => value.boolean = Some(b),
            serde_json::Value::Object(fields) => value.fraction = yaml_fraction(&fields),
            serde_json::Value::String(_) => {
                if let Ok(d) = text.trim().parse::<f64>() {
                    value.set_number(d);
                }
            }
            serde_json::Value::Null | serde_json::Value::Array(_) => {}
        }
        value.raw = text;
        Ok(value)
    }

    /// Envoy's `setNumberValue`: the number, its truncation when non-negative, and a boolean
    /// (non-zero) when whole and below 2^31.
    fn set_number(&mut self, d: f64) {
        self.double = Some(d);
        if d < f64::from(i32::MAX) && d == f64::from(d as i32) {
            self.boolean = Some(d != 0.0);
        }
        if d >= 0.0 && d <= u64::MAX as f64 {
            self.uint = Some(d as u64);
        }
    }
}

/// Envoy's `parseFractionValue`: `numerator` (a number) and `denominator` (`HUNDRED`,
/// `TEN_THOUSAND`, `MILLION`; default `HUNDRED`), nothing else.
fn yaml_fraction(fields: &serde_json::Map<String, serde_json::Value>) -> Option<FractionalPercent> {
    let mut f = FractionalPercent {
        numerator: 0,
        denominator: 100,
    };
    for (name, value) in fields {
        match (name.as_str(), value) {
            ("numerator", serde_json::Value::Number(n)) => {
                f.numerator = n.as_f64().unwrap_or(0.0) as u32;
            }
            ("numerator", _) => {}
            ("denominator", serde_json::Value::String(d)) => {
                f.denominator = match d.as_str() {
                    "HUNDRED" => 100,
                    "TEN_THOUSAND" => 10_000,
                    "MILLION" => 1_000_000,
                    _ => return None,
                };
            }
            _ => return None,
        }
    }
    Some(f)
}

/// A disk layer file's text as Envoy keeps it: its non-empty lines, without those starting
/// with `#`, joined by newlines, the last line (and any line equal to it) with trailing
/// whitespace removed; leading whitespace stays.
pub fn disk_text(text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').filter(|l| !l.is_empty()).collect();
    let Some(last) = lines.last() else {
        return String::new();
    };
    let mut value = String::new();
    for line in &lines {
        if line.starts_with('#') {
            continue;
        }
        if line == last {
            value.push_str(line.trim_end_matches([' ', '\t', '\x0c', '\x0b', '\n', '\r']));
        } else {
            value.push_str(line);
            value.push('\n');
        }
    }
    value
}

/// The key of the file at `relative` (its path's components under the layer's directory):
/// the components joined by `.`, hidden ones included, as Envoy names them.
pub fn disk_key<'a>(relative: impl IntoIterator<Item = &'a str>) -> String {
    relative.into_iter().collect::<Vec<_>>().join(".")
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
    /// `disk_layer`: the files under a directory, read at each load.
    Disk(DiskLayer),
    /// `rtds_layer`: a `Runtime` resource served over ADS (empty until it arrives).
    Rtds(RtdsLayer),
}

/// An `rtds_layer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RtdsLayer {
    /// The resource's name (`rtds_layer.name`).
    pub name: String,
    /// How long start-up waits for it (`rtds_config.initial_fetch_timeout`; `None`: forever).
    pub initial_fetch_timeout: Option<std::time::Duration>,
}

/// A `disk_layer`: where its files are, and the symlink whose swap makes them be read again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskLayer {
    /// `symlink_root`, watched for a rename onto it (Envoy's `MovedTo`).
    pub symlink_root: String,
    /// `<symlink_root>/<subdirectory>`, before the service cluster is appended.
    pub directory: String,
    /// `append_service_cluster`: the node's cluster is a subdirectory of `directory`.
    pub append_service_cluster: bool,
}

impl DiskLayer {
    /// The directory read for a node of cluster `service_cluster`.
    pub fn path(&self, service_cluster: &str) -> String {
        if self.append_service_cluster {
            format!("{}/{service_cluster}", self.directory)
        } else {
            self.directory.clone()
        }
    }
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
    /// lists and nulls refused, a disk layer's `symlink_root` in a directory that exists (Envoy
    /// cannot watch it otherwise), an RTDS layer's config source `ads` (the only one revoy
    /// subscribes through).
    pub fn compile(
        ctx: &Context<'_>,
        runtime: Option<&LayeredRuntime>,
    ) -> Result<StaticRuntime, ConfigError> {
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
                    LayerKind::Static(compile_layer(s).map_err(|e| e.within(&path))?)
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
                Some(LayerSpecifier::DiskLayer(d)) => {
                    LayerKind::Disk(disk_layer(ctx, d).map_err(|e| e.within(&path))?)
                }
                Some(LayerSpecifier::RtdsLayer(r)) => {
                    match r
                        .rtds_config
                        .as_ref()
                        .map(|c| (c, c.config_source_specifier.as_ref()))
                    {
                        Some((c, Some(ConfigSourceSpecifier::Ads(_)))) => {
                            LayerKind::Rtds(RtdsLayer {
                                name: r.name.clone(),
                                initial_fetch_timeout: super::dynamic::initial_fetch_timeout(c),
                            })
                        }
                        _ => {
                            return Err(ConfigError::new(
                                format!("{path}.rtds_layer.rtds_config"),
                                "revoy serves RTDS layers only over ADS (ads: {} with dynamic_resources.ads_config)",
                            ));
                        }
                    }
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

/// A static layer's (or an RTDS resource's) values: its objects flattened into `a.b` keys
/// unless they are fractional percents, lists and nulls refused, as Envoy's `ProtoLayer`.
pub fn compile_layer(
    s: &proto::pb::google::protobuf::Struct,
) -> Result<HashMap<String, RuntimeValue>, ConfigError> {
    let mut values = HashMap::new();
    for (key, value) in &s.fields {
        walk(&mut values, key, value)?;
    }
    Ok(values)
}

impl StaticRuntime {
    /// The RTDS layers, in order.
    pub fn rtds_layers(&self) -> Vec<&RtdsLayer> {
        self.layers
            .iter()
            .filter_map(|l| match &l.kind {
                LayerKind::Rtds(r) => Some(r),
                _ => None,
            })
            .collect()
    }
}

/// A `disk_layer`, its symlink's directory checked as Envoy's watch checks it.
fn disk_layer(ctx: &Context<'_>, d: &runtime_layer::DiskLayer) -> Result<DiskLayer, ConfigError> {
    let parent = match d.symlink_root.rfind('/') {
        Some(0) => "/",
        Some(i) => &d.symlink_root[..i],
        None => ".",
    };
    if !ctx.is_dir(parent) {
        return Err(ConfigError::new(
            "disk_layer.symlink_root",
            format!(
                "unable to add filesystem watch for file {}: No such file or directory",
                d.symlink_root
            ),
        ));
    }
    Ok(DiskLayer {
        symlink_root: d.symlink_root.clone(),
        directory: format!("{}/{}", d.symlink_root, d.subdirectory),
        append_service_cluster: d.append_service_cluster,
    })
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

/// Compiles the `layered_runtime` of a bootstrap written in YAML (for tests), with only the
/// directory `/srv` on disk.
#[cfg(test)]
pub(crate) fn from_bootstrap_yaml(yaml: &str) -> Result<StaticRuntime, ConfigError> {
    let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).expect("YAML");
    let b: proto::pb::envoy::config::bootstrap::v3::Bootstrap = proto::Codec::new()
        .decode(value, false)
        .expect("a bootstrap")
        .message;
    let io = super::context::FakeIo::new().with_dir("/srv");
    StaticRuntime::compile(&Context::new(&io), b.layered_runtime.as_ref())
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
            StaticRuntime::compile(&Context::new(&super::super::context::FakeIo::new()), None)
                .unwrap(),
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

    #[test]
    fn disk_files_name_keys_and_keep_text_as_envoy_does() {
        assert_eq!(disk_key(["routing", "shift", "a"]), "routing.shift.a");
        assert_eq!(disk_key([".hidden", "k"]), ".hidden.k");
        assert_eq!(disk_text("# a comment\n  42  \n\n"), "  42");
        assert_eq!(disk_text("x\n# c\ny \n"), "x\ny");
        assert_eq!(disk_text("5\n# trailing comment"), "5\n");
        // A line equal to the last one is trimmed, and loses its newline, wherever it is.
        assert_eq!(disk_text("a \nb\na \n"), "ab\na");
        assert_eq!(disk_text(""), "");
    }

    #[test]
    fn disk_values_are_typed_as_yaml() {
        let v = |s: &str| RuntimeValue::from_disk(s.to_owned()).unwrap();
        assert_eq!((v("  42").uint, v("  42").raw.as_str()), (Some(42), "  42"));
        assert_eq!((v("3.5").uint, v("3.5").boolean), (Some(3), None));
        assert_eq!(
            (v("0").boolean, v("yes").boolean),
            (Some(false), Some(true))
        );
        assert_eq!(
            v("numerator: 5\ndenominator: TEN_THOUSAND").fraction,
            Some(FractionalPercent {
                numerator: 5,
                denominator: 10_000
            })
        );
        assert_eq!(v("numerator: 5\nother: 1").fraction, None);
        assert_eq!((v("hello").double, v("").raw.as_str()), (None, ""));
        assert!(RuntimeValue::from_disk("a: b: c".to_owned()).is_err());
    }

    #[test]
    fn disk_layers_need_their_symlinks_directory_and_rtds_layers_ads() {
        let r = runtime(
            "layered_runtime: {layers: [{name: d, disk_layer: {symlink_root: /srv/current, subdirectory: envoy, append_service_cluster: true}}]}",
        );
        let LayerKind::Disk(d) = &r.layers[0].kind else {
            panic!("a disk layer")
        };
        assert_eq!(d.path("svc"), "/srv/current/envoy/svc");
        let fails = |yaml: &str| from_bootstrap_yaml(yaml).unwrap_err().to_string();
        assert!(fails("layered_runtime: {layers: [{name: d, disk_layer: {symlink_root: /nowhere/current}}]}")
            .contains("unable to add filesystem watch for file /nowhere/current"));
        assert!(fails("layered_runtime: {layers: [{name: r, rtds_layer: {name: r, rtds_config: {path: /x}}}]}")
            .contains("layered_runtime.layers[0].rtds_layer.rtds_config"));
        let r = runtime(
            "layered_runtime: {layers: [{name: r, rtds_layer: {name: res, rtds_config: {ads: {}}}}]}",
        );
        assert_eq!(r.rtds_layers()[0].name, "res");
    }
}
