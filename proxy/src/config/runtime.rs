//! The bootstrap's static runtime layers (`layered_runtime` `static_layer`s) as the numbers
//! compiles read: Envoy's runtime keys that override a configured value (the fault filter's).
//! Disk, admin and RTDS layers are not read: a key only they set keeps its configured value.

use std::collections::HashMap;

use proto::pb::envoy::config::bootstrap::v3::LayeredRuntime;
use proto::pb::envoy::config::bootstrap::v3::runtime_layer::LayerSpecifier;
use proto::pb::google::protobuf::Value;
use proto::pb::google::protobuf::value::Kind;

/// The numeric values of the static layers, by key (a later layer's value wins, as in Envoy).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StaticRuntime {
    numbers: HashMap<String, f64>,
}

impl StaticRuntime {
    /// The static layers of `runtime`: nested objects name their keys joined by `.`, as Envoy
    /// flattens them; numbers, and strings that read as numbers, are kept.
    pub fn from_layers(runtime: Option<&LayeredRuntime>) -> StaticRuntime {
        let mut out = StaticRuntime::default();
        for layer in runtime.map(|r| r.layers.as_slice()).unwrap_or_default() {
            if let Some(LayerSpecifier::StaticLayer(s)) = &layer.layer_specifier {
                for (key, value) in &s.fields {
                    out.walk(key, value);
                }
            }
        }
        out
    }

    /// Records `value` at `key` (and the values nested in it under `key.`).
    fn walk(&mut self, key: &str, value: &Value) {
        match &value.kind {
            Some(Kind::NumberValue(n)) => {
                self.numbers.insert(key.to_owned(), *n);
            }
            Some(Kind::StringValue(s)) => {
                if let Ok(n) = s.trim().parse::<f64>() {
                    self.numbers.insert(key.to_owned(), n);
                }
            }
            Some(Kind::StructValue(s)) => {
                for (k, v) in &s.fields {
                    self.walk(&format!("{key}.{k}"), v);
                }
            }
            _ => {}
        }
    }

    /// The number at `key`, if a static layer sets one.
    pub fn number(&self, key: &str) -> Option<f64> {
        self.numbers.get(key).copied()
    }

    /// The non-negative integer at `key` (a fraction truncated, as Envoy reads integers).
    pub fn integer(&self, key: &str) -> Option<u64> {
        self.number(key).filter(|n| *n >= 0.0).map(|n| n as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(yaml: &str) -> StaticRuntime {
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        let b: proto::pb::envoy::config::bootstrap::v3::Bootstrap =
            proto::Codec::new().decode(value, false).unwrap().message;
        StaticRuntime::from_layers(b.layered_runtime.as_ref())
    }

    #[test]
    fn keys_flat_nested_and_layered() {
        let r = runtime(
            "layered_runtime: {layers: [\
             {name: a, static_layer: {fault.http.abort.abort_percent: 10, x: {y: {z: '7'}}, s: nope}}, \
             {name: b, admin_layer: {}}, \
             {name: c, static_layer: {fault: {http: {abort: {abort_percent: 100}}}}}]}",
        );
        assert_eq!(r.integer("fault.http.abort.abort_percent"), Some(100));
        assert_eq!(r.integer("x.y.z"), Some(7));
        assert_eq!(r.number("s"), None);
        assert_eq!(r.number("absent"), None);
        assert_eq!(StaticRuntime::from_layers(None), StaticRuntime::default());
    }
}
