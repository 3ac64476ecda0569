//! Istio's own proxy extensions (from istio/proxy), which istiod configures and stock Envoy
//! lacks. Their configs arrive two ways: as an `Any` of the Istio message in proto form (what
//! istiod sends over xDS), or as a `TypedStruct` of its JSON fields (what istiod wraps some in,
//! and what revoy's codec keeps a type in when it has no schema for it, as for every Istio
//! type in a YAML or JSON file). [`Fields`] reads either.

pub mod alpn;
pub mod authn;
pub mod metadata_exchange;
pub mod peer_metadata;
pub mod stats;
pub mod wasm;
pub mod workload;

use proto::pb::google::protobuf::Any;
use serde_json::Value;

use super::ConfigError;

/// What istiod writes in a cluster's `istio` filter metadata that Istio's filters read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IstioCluster {
    /// `services[0].host`: the FQDN of the service the cluster stands for.
    pub service_host: String,
    /// `services[0].name`: its short name.
    pub service_name: String,
    /// `external`: the cluster leaves the mesh.
    pub external: bool,
    /// `disable_mx`: no metadata exchange headers to it.
    pub disable_mx: bool,
}

impl IstioCluster {
    /// Reads a cluster's `istio` filter metadata.
    pub fn from_metadata(istio: &proto::pb::google::protobuf::Struct) -> IstioCluster {
        use proto::pb::google::protobuf::{Struct, value::Kind};
        let text = |s: &Struct, key: &str| match s.fields.get(key).and_then(|v| v.kind.as_ref()) {
            Some(Kind::StringValue(v)) => v.clone(),
            _ => String::new(),
        };
        let flag = |key: &str| {
            matches!(
                istio.fields.get(key).and_then(|v| v.kind.as_ref()),
                Some(Kind::BoolValue(true))
            )
        };
        let first = match istio.fields.get("services").and_then(|v| v.kind.as_ref()) {
            Some(Kind::ListValue(l)) => match l.values.first().and_then(|v| v.kind.as_ref()) {
                Some(Kind::StructValue(s)) => Some(s),
                _ => None,
            },
            _ => None,
        };
        IstioCluster {
            service_host: first.map(|s| text(s, "host")).unwrap_or_default(),
            service_name: first.map(|s| text(s, "name")).unwrap_or_default(),
            external: flag("external"),
            disable_mx: flag("disable_mx"),
        }
    }
}

/// An Istio extension's config, in the form it arrived in.
#[derive(Debug)]
pub enum Fields<'a> {
    /// The message's proto encoding.
    Proto(&'a [u8]),
    /// Its proto3-JSON fields.
    Json(Value),
}

impl<'a> Fields<'a> {
    /// The config `any` carries when it stands for `type_name` (itself or in a TypedStruct);
    /// `None` when it is another type.
    pub fn of(any: &'a Any, type_name: &str) -> Option<Fields<'a>> {
        if proto::type_name_of(&any.type_url) == type_name {
            return Some(Fields::Proto(&any.value));
        }
        if proto::extension_type(any) != type_name {
            return None;
        }
        let ts: proto::TypedStruct = prost::Message::decode(any.value.as_slice()).ok()?;
        Some(Fields::Json(ts.value.as_ref().map_or(
            Value::Object(Default::default()),
            super::route::struct_to_json,
        )))
    }
}

/// The field `name` of a JSON object, by its proto name or its JSON (lowerCamelCase) name,
/// as protobuf's JSON parser accepts both.
pub fn field<'v>(object: &'v Value, name: &str) -> Option<&'v Value> {
    object
        .get(name)
        .or_else(|| object.get(camel(name).as_str()))
}

/// `snake_case` -> `snakeCase`.
fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.push(c.to_ascii_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// A list of strings at `at`, or a ConfigError naming it.
pub fn strings(value: &Value, at: &str) -> Result<Vec<String>, ConfigError> {
    let list = value
        .as_array()
        .ok_or_else(|| ConfigError::new(at, "expected a list of strings"))?;
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| ConfigError::new(format!("{at}[{i}]"), "expected a string"))
        })
        .collect()
}

/// A proto decoding error of `type_name` as a ConfigError.
pub fn decode_error(type_name: &str, e: prost::DecodeError) -> ConfigError {
    ConfigError::new("", format!("invalid {type_name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_json_names_of_a_field_are_read() {
        let v = serde_json::json!({"alpnOverride": 1, "upstream_protocol": 2});
        assert_eq!(field(&v, "alpn_override"), Some(&serde_json::json!(1)));
        assert_eq!(field(&v, "upstream_protocol"), Some(&serde_json::json!(2)));
        assert_eq!(field(&v, "missing_field"), None);
    }
}
