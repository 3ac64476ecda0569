//! Proto3-JSON/YAML <-> Envoy messages, with `@type` Anys resolved at any depth.
//!
//! Envoy accepts Anys whose `@type` it knows, `TypedStruct` wrappers whose inner type it knows,
//! and (for extensions it does not implement) anything else as an opaque config. prost-reflect
//! rejects a whole document on one unknown `@type`, so before decoding, a schema-guided pass
//! unwraps TypedStructs of known types and wraps unknown `@type`s in an `xds.type.v3.TypedStruct`
//! (recording where), which keeps them as opaque values. The same pass takes the laxer forms
//! Envoy's parser (protobuf's JSON parser with case-insensitive enums) accepts: see
//! [`lenient`].

use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, Kind, MessageDescriptor, SerializeOptions,
};
use serde_json::{Map, Value};

use crate::any::type_name_of;
use crate::typed_struct::{UDPA_TYPED_STRUCT, XDS_TYPED_STRUCT};

/// Text format of a configuration document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// proto3 JSON.
    Json,
    /// YAML with proto3-JSON field names and values.
    Yaml,
}

impl Format {
    /// Picks the format from a file name the way Envoy does: `.json` is JSON, anything else YAML
    /// (YAML also accepts JSON).
    pub fn from_path(path: &str) -> Self {
        if path.ends_with(".json") {
            Format::Json
        } else {
            Format::Yaml
        }
    }
}

/// Why a document could not be decoded into a message.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The text is not valid JSON.
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The text is not valid YAML.
    #[error("invalid YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    /// A field has the wrong name, type or value; `path` names it (`a.b[0].c`).
    #[error("{path}: {message}")]
    Field {
        /// Where in the document.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The decoded message could not be converted into the generated Rust type.
    #[error("cannot convert to {type_name}: {message}")]
    Transcode {
        /// Target message name.
        type_name: String,
        /// The underlying error.
        message: String,
    },
}

/// A decoded message plus the `@type`s that were kept opaque, as `(field path, type URL)`.
#[derive(Debug)]
pub struct Decoded<T> {
    /// The message.
    pub message: T,
    /// Anys whose type this build does not know, kept as TypedStructs.
    pub unknown_types: Vec<(String, String)>,
}

/// Decodes and encodes Envoy messages in proto3 JSON. Owns a large descriptor pool: create one
/// where JSON is needed (start-up, validation, config dumps) and drop it afterwards.
pub struct Codec {
    pool: DescriptorPool,
}

impl Default for Codec {
    fn default() -> Self {
        Self::new()
    }
}

impl Codec {
    /// Builds a pool of every Envoy message (tens of milliseconds, tens of MB).
    pub fn new() -> Self {
        Codec {
            pool: crate::pool::build(),
        }
    }

    /// Builds a pool of only what decoding `value` as a `root` message can need: `root`'s
    /// files, the files of every `@type` / `type_url` named in the document, and their imports.
    /// Much smaller than [`Codec::new`]; decode the document with it, then drop it.
    pub fn for_document(root: &str, value: &Value) -> Self {
        Self::for_document_releasing(root, value, |_| {})
    }

    /// Like [`Codec::for_document`]; `release` gets the embedded descriptor set once the
    /// pool's files are copied out of it and before the pool is built (a process's resident
    /// peak when it decodes its bootstrap), to give its pages back to the OS.
    pub fn for_document_releasing(root: &str, value: &Value, release: fn(&'static [u8])) -> Self {
        let mut names = vec![root.to_owned()];
        collect_type_names(value, &mut names);
        Codec {
            pool: crate::pool::build_for(Some(&names), release),
        }
    }

    /// Parses JSON or YAML text into a JSON value (YAML's plain scalars read as Envoy's
    /// yaml-cpp loader reads them: `yes`, `n`, `Off` ... are booleans).
    pub fn parse_text(text: &str, format: Format) -> Result<Value, DecodeError> {
        Ok(match format {
            Format::Json => serde_json::from_str(text)?,
            Format::Yaml => crate::yaml::to_json(text)?,
        })
    }

    /// Whether the pool knows a message with this fully qualified name.
    pub fn knows(&self, full_name: &str) -> bool {
        self.pool.get_message_by_name(full_name).is_some()
    }

    /// Decodes `value` as a `T`. Unknown fields are errors unless `allow_unknown_fields`.
    pub fn decode<T: Message + Name + Default>(
        &self,
        value: Value,
        allow_unknown_fields: bool,
    ) -> Result<Decoded<T>, DecodeError> {
        self.decode_at(value, allow_unknown_fields, "")
    }

    /// Like [`Codec::decode`] for a part of a larger document found at path `at` (e.g.
    /// `static_resources.clusters[3]`): paths in errors and unknown types start with it.
    /// Decoding a large document part by part keeps one part's intermediate forms in memory
    /// at a time.
    pub fn decode_at<T: Message + Name + Default>(
        &self,
        mut value: Value,
        allow_unknown_fields: bool,
        at: &str,
    ) -> Result<Decoded<T>, DecodeError> {
        let desc = self.descriptor(&T::full_name());
        let mut unknown_types = Vec::new();
        let mut path = at.to_owned();
        self.rewrite_message(&mut value, &desc, &mut path, &mut unknown_types);
        let mut track = serde_path_to_error::Track::new();
        let de = serde_path_to_error::Deserializer::new(value, &mut track);
        let options = DeserializeOptions::new().deny_unknown_fields(!allow_unknown_fields);
        let dynamic =
            DynamicMessage::deserialize_with_options(desc, de, &options).map_err(|e| {
                DecodeError::Field {
                    path: display_path(at, &track.path().to_string()),
                    message: e.to_string(),
                }
            })?;
        let message = dynamic
            .transcode_to::<T>()
            .map_err(|e| DecodeError::Transcode {
                type_name: T::full_name(),
                message: e.to_string(),
            })?;
        Ok(Decoded {
            message,
            unknown_types,
        })
    }

    /// Decodes an Any's payload written as proto3 JSON (the TypedStruct `value` form).
    pub fn decode_struct_as_any(
        &self,
        type_url: &str,
        mut fields: Map<String, Value>,
    ) -> Result<Any, DecodeError> {
        fields.insert("@type".into(), Value::String(type_url.into()));
        Ok(self.decode::<Any>(Value::Object(fields), false)?.message)
    }

    /// Renders `msg` as proto3 JSON with proto field names (Envoy's config_dump style).
    pub fn to_json<T: Message + Name>(&self, msg: &T) -> Value {
        self.bytes_to_json(&T::full_name(), &msg.encode_to_vec())
    }

    /// Renders an Any as proto3 JSON with its `@type`; an Any of an unknown type is rendered
    /// as `{"@type": url}` alone.
    pub fn any_to_json(&self, any: &Any) -> Value {
        if self
            .pool
            .get_message_by_name(type_name_of(&any.type_url))
            .is_none()
        {
            return serde_json::json!({ "@type": any.type_url });
        }
        self.bytes_to_json("google.protobuf.Any", &any.encode_to_vec())
    }

    /// Redacts `value`, the JSON of a `full_name` message, as Envoy's admin dumps do: every
    /// field marked `udpa.annotations.sensitive` (private keys, passwords, generic secrets),
    /// and everything under one, loses its value.
    pub fn redact(&self, full_name: &str, value: &mut Value) {
        if let Some(desc) = self.pool.get_message_by_name(full_name) {
            crate::redact::Redactor::new(&self.pool).message(&desc, value, false);
        }
    }

    fn bytes_to_json(&self, full_name: &str, bytes: &[u8]) -> Value {
        let desc = self.descriptor(full_name);
        let options = SerializeOptions::new().use_proto_field_name(true);
        DynamicMessage::decode(desc, bytes)
            .ok()
            .and_then(|m| {
                m.serialize_with_options(serde_json::value::Serializer, &options)
                    .ok()
            })
            .unwrap_or_else(
                || serde_json::json!({ "@type": format!("type.googleapis.com/{full_name}") }),
            )
    }

    fn descriptor(&self, full_name: &str) -> MessageDescriptor {
        self.pool.get_message_by_name(full_name).unwrap_or_else(|| {
            panic!("{full_name} is an envoy-types message, so it is in the pool")
        })
    }

    fn rewrite_message(
        &self,
        value: &mut Value,
        desc: &MessageDescriptor,
        path: &mut String,
        unknown: &mut Vec<(String, String)>,
    ) {
        if desc.full_name() == "google.protobuf.Any" {
            return self.rewrite_any(value, path, unknown);
        }
        if desc.full_name() == "google.protobuf.Duration" {
            return duration_object_to_string(value);
        }
        if desc.full_name() == "google.protobuf.BoolValue" {
            return lenient::bool_from_string(value);
        }
        if desc.full_name().starts_with("google.protobuf.") {
            return;
        }
        let Value::Object(map) = value else { return };
        for (key, child) in map.iter_mut() {
            let Some(field) = desc
                .get_field_by_json_name(key)
                .or_else(|| desc.get_field_by_name(key))
            else {
                continue;
            };
            let base = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(key);
            if field.is_list() {
                lenient::lift_to_list(child);
            }
            match (field.kind(), &mut *child) {
                (Kind::Enum(e), Value::Array(items)) if field.is_list() => items
                    .iter_mut()
                    .for_each(|item| lenient::enum_value(item, &e)),
                (Kind::Enum(e), _) => lenient::enum_value(child, &e),
                (Kind::Bool, Value::Array(items)) if field.is_list() => {
                    items.iter_mut().for_each(lenient::bool_from_string)
                }
                (Kind::Bool, _) => lenient::bool_from_string(child),
                _ => {}
            }
            if field.is_map() {
                if let (Kind::Message(entry), Value::Object(entries)) = (field.kind(), child)
                    && let Kind::Message(v) = entry.map_entry_value_field().kind()
                {
                    for (k, item) in entries.iter_mut() {
                        let b = path.len();
                        path.push_str(&format!("[{k}]"));
                        self.rewrite_message(item, &v, path, unknown);
                        path.truncate(b);
                    }
                }
            } else if let Kind::Message(m) = field.kind() {
                match child {
                    Value::Array(items) if field.is_list() => {
                        for (i, item) in items.iter_mut().enumerate() {
                            let b = path.len();
                            path.push_str(&format!("[{i}]"));
                            self.rewrite_message(item, &m, path, unknown);
                            path.truncate(b);
                        }
                    }
                    _ => self.rewrite_message(child, &m, path, unknown),
                }
            }
            path.truncate(base);
        }
    }

    fn rewrite_any(
        &self,
        value: &mut Value,
        path: &mut String,
        unknown: &mut Vec<(String, String)>,
    ) {
        let Value::Object(map) = value else { return };
        // Envoy takes `{}` as an Any of no type (a route's `FilterConfig{config: {}}` enables
        // a filter); prost-reflect wants a type, so it becomes an empty `Empty`.
        if map.is_empty() {
            map.insert("@type".into(), Value::String(crate::EMPTY_ANY.into()));
            map.insert("value".into(), Value::Object(Map::new()));
            return;
        }
        let Some(url) = map.get("@type").and_then(Value::as_str).map(str::to_owned) else {
            return;
        };
        let name = type_name_of(&url).to_owned();
        if name == UDPA_TYPED_STRUCT || name == XDS_TYPED_STRUCT {
            let inner = map
                .get("type_url")
                .or_else(|| map.get("typeUrl"))
                .and_then(Value::as_str);
            let Some(inner) = inner.map(str::to_owned) else {
                return;
            };
            if self
                .pool
                .get_message_by_name(type_name_of(&inner))
                .is_none()
            {
                unknown.push((path.clone(), inner));
                return;
            }
            let mut fields = match map.remove("value") {
                Some(Value::Object(fields)) => fields,
                _ => Map::new(),
            };
            fields.insert("@type".into(), Value::String(inner));
            *value = Value::Object(fields);
            return self.rewrite_any(value, path, unknown);
        }
        match self.pool.get_message_by_name(&name) {
            Some(desc) if !name.starts_with("google.protobuf.") => {
                self.rewrite_message(value, &desc, path, unknown)
            }
            Some(_) => {}
            None => {
                unknown.push((path.clone(), url.clone()));
                map.remove("@type");
                let fields = std::mem::take(map);
                *value = serde_json::json!({
                    "@type": format!("type.googleapis.com/{XDS_TYPED_STRUCT}"),
                    "type_url": url,
                    "value": Value::Object(fields),
                });
            }
        }
    }
}

/// The forms Envoy's parser accepts beyond proto3 JSON (checked against Envoy 1.40's
/// `--mode validate` and `/config_dump`), rewritten into proto3 JSON before decoding.
mod lenient {
    use prost_reflect::EnumDescriptor;
    use serde_json::Value;

    /// A single value where a list is expected is a one-element list (`domains: "*"`,
    /// `filters:` as one object); lists nested in the list are flattened into it. `null`
    /// stays (an empty list).
    pub fn lift_to_list(value: &mut Value) {
        match value {
            Value::Null => {}
            Value::Array(items) if items.iter().any(Value::is_array) => {
                let mut flat = Vec::with_capacity(items.len());
                flatten_into(std::mem::take(items), &mut flat);
                *items = flat;
            }
            Value::Array(_) => {}
            single => *single = Value::Array(vec![single.take()]),
        }
    }

    fn flatten_into(items: Vec<Value>, out: &mut Vec<Value>) {
        for item in items {
            match item {
                Value::Array(inner) => flatten_into(inner, out),
                other => out.push(other),
            }
        }
    }

    /// An enum value by name in any case (`round_robin`, `Strict_Dns`: Envoy's parser tries
    /// the upper-cased name), or by number written as a string (`"1"`).
    pub fn enum_value(value: &mut Value, desc: &EnumDescriptor) {
        let Value::String(name) = value else { return };
        if desc.get_value_by_name(name).is_some() {
            return;
        }
        let upper = name.to_ascii_uppercase();
        if desc.get_value_by_name(&upper).is_some() {
            *name = upper;
        } else if let Ok(n) = name.trim().parse::<i32>() {
            *value = Value::from(n);
        }
    }

    /// A bool written as a string, in the words Envoy takes (case-insensitive): `true`, `t`,
    /// `yes`, `y`, `1`, `on` and `false`, `f`, `no`, `n`, `0`, `off`.
    pub fn bool_from_string(value: &mut Value) {
        let Value::String(text) = value else { return };
        match text.to_ascii_lowercase().as_str() {
            "true" | "t" | "yes" | "y" | "1" | "on" => *value = Value::Bool(true),
            "false" | "f" | "no" | "n" | "0" | "off" => *value = Value::Bool(false),
            _ => {}
        }
    }
}

/// Every message name a document mentions in `@type`, `type_url` or `typeUrl`.
fn collect_type_names(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if let (true, Value::String(url)) =
                    (matches!(k.as_str(), "@type" | "type_url" | "typeUrl"), v)
                {
                    out.push(type_name_of(url).to_owned());
                }
                collect_type_names(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_type_names(v, out)),
        _ => {}
    }
}

/// Envoy's YAML loader also takes a Duration written as `{seconds: 1, nanos: 5}`; proto3 JSON
/// only has the string form, so such objects become `"1.000000005s"`.
fn duration_object_to_string(value: &mut Value) {
    let Value::Object(map) = value else { return };
    let known = map.keys().all(|k| k == "seconds" || k == "nanos");
    let int = |k: &str| match map.get(k) {
        None => Some(0),
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => s.parse().ok(),
        Some(_) => None,
    };
    if let (true, Some(seconds), Some(nanos)) = (known, int("seconds"), int("nanos")) {
        *value = Value::String(format!("{seconds}.{:09}s", nanos.rem_euclid(1_000_000_000)));
    }
}

/// serde_path_to_error prints `a.b[0].c`; a leading `.` or `?` (root) is dropped.
/// A serde path (`.` or `?` at the root) below the document path `at`.
fn display_path(at: &str, p: &str) -> String {
    match (at, p) {
        ("", "." | "?") => "(root)".into(),
        (_, "." | "?") => at.to_owned(),
        ("", _) => p.to_owned(),
        _ => format!("{at}.{p}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::config::bootstrap::v3::Bootstrap;
    use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;

    const BOOTSTRAP: &str = r#"
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 9901}}}
static_resources:
  listeners:
  - name: l
    address: {socket_address: {address: 0.0.0.0, portValue: 10000}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config: {virtual_hosts: [{name: v, domains: ["*"], routes: [{match: {prefix: /}, direct_response: {status: 200}}]}]}
          http_filters:
          - name: istio.stats
            typed_config:
              "@type": type.googleapis.com/stats.PluginConfig
              disable_host_header_fallback: true
          - name: ts
            typed_config:
              "@type": type.googleapis.com/udpa.type.v1.TypedStruct
              type_url: type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
              value: {suppress_envoy_headers: true}
  clusters:
  - name: c
    connect_timeout: 0.25s
"#;

    fn decode(text: &str) -> Result<Decoded<Bootstrap>, DecodeError> {
        let value = Codec::parse_text(text, Format::Yaml).unwrap();
        let small = Codec::for_document("envoy.config.bootstrap.v3.Bootstrap", &value)
            .decode::<Bootstrap>(value.clone(), false);
        let full = Codec::new().decode::<Bootstrap>(value, false);
        assert_eq!(
            small
                .as_ref()
                .map(|d| (&d.message, &d.unknown_types))
                .map_err(|e| e.to_string()),
            full.as_ref()
                .map(|d| (&d.message, &d.unknown_types))
                .map_err(|e| e.to_string()),
            "a document-sized pool decodes exactly like the full pool"
        );
        small
    }

    #[test]
    fn decodes_nested_anys_durations_and_camel_case() {
        let d = decode(BOOTSTRAP).unwrap();
        let sr = d.message.static_resources.unwrap();
        assert_eq!(sr.clusters[0].connect_timeout.unwrap().nanos, 250_000_000);
        let l = &sr.listeners[0];
        let any = l.filter_chains[0].filters[0].config_type.clone().unwrap();
        let envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any) =
            any
        else {
            panic!("typed config")
        };
        let hcm: HttpConnectionManager = crate::unpack(&any).unwrap();
        assert_eq!(hcm.stat_prefix, "ingress");
        assert_eq!(hcm.http_filters.len(), 2);
        assert_eq!(
            d.unknown_types,
            vec![(
                "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config"
                    .to_owned(),
                "type.googleapis.com/stats.PluginConfig".to_owned()
            )]
        );
    }

    #[test]
    fn typed_struct_of_known_type_is_unwrapped() {
        let d = decode(BOOTSTRAP).unwrap();
        let sr = d.message.static_resources.unwrap();
        let envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any) =
            sr.listeners[0].filter_chains[0].filters[0]
                .config_type
                .clone()
                .unwrap()
        else {
            panic!()
        };
        let hcm: HttpConnectionManager = crate::unpack(&any).unwrap();
        let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(router)) = &hcm.http_filters[1].config_type else { panic!() };
        assert_eq!(
            router.type_url,
            "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        );
    }

    #[test]
    fn errors_name_the_field_path() {
        let bad = BOOTSTRAP.replace("0.25s", "soon");
        let err = decode(&bad).unwrap_err().to_string();
        assert!(
            err.starts_with("static_resources.clusters[0].connect_timeout:"),
            "{err}"
        );
        let typo = BOOTSTRAP.replace("admin: {address", "admin: {adress");
        let err = decode(&typo).unwrap_err().to_string();
        assert!(err.starts_with("admin"), "{err}");
        assert!(err.contains("adress"), "{err}");
    }

    #[test]
    fn durations_may_be_objects() {
        let with_object = BOOTSTRAP.replace(
            "connect_timeout: 0.25s",
            "connect_timeout: {seconds: 2, nanos: 500}",
        );
        let sr = decode(&with_object)
            .unwrap()
            .message
            .static_resources
            .unwrap();
        let d = sr.clusters[0].connect_timeout.unwrap();
        assert_eq!((d.seconds, d.nanos), (2, 500));
        let bad = BOOTSTRAP.replace("connect_timeout: 0.25s", "connect_timeout: {seconds: x}");
        assert!(
            decode(&bad)
                .unwrap_err()
                .to_string()
                .contains("connect_timeout")
        );
    }

    #[test]
    fn takes_envoys_lax_forms() {
        let lax = BOOTSTRAP
            .replace(
                "connect_timeout: 0.25s",
                "connect_timeout: 0.25s\n    type: strict_dns\n    lb_policy: Round_Robin\n    dns_lookup_family: \"1\"\n    ignore_health_on_host_removal: \"yes\"",
            )
            .replace("domains: [\"*\"]", "domains: \"*\"")
            .replace("stat_prefix: ingress", "stat_prefix: ingress\n          codec_type: auto\n          use_remote_address: \"true\"");
        let lax = lax.replacen(
            "    - filters:\n      - name: hcm",
            "    - filters:\n        name: hcm",
            1,
        );
        let d = decode(&lax).unwrap();
        let sr = d.message.static_resources.unwrap();
        let c = &sr.clusters[0];
        assert_eq!(
            (
                c.lb_policy,
                c.dns_lookup_family,
                c.ignore_health_on_host_removal
            ),
            (0, 1, true)
        );
        assert!(matches!(
            c.cluster_discovery_type,
            Some(
                envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(1)
            )
        ));
        let filters = &sr.listeners[0].filter_chains[0].filters;
        assert_eq!(filters.len(), 1);
        let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(
            any,
        )) = &filters[0].config_type
        else {
            panic!("typed config")
        };
        let hcm: HttpConnectionManager = crate::unpack(any).unwrap();
        assert_eq!(hcm.codec_type, 0);
        assert_eq!(hcm.use_remote_address.map(|b| b.value), Some(true));
        let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier::RouteConfig(rc)) = &hcm.route_specifier else { panic!() };
        assert_eq!(rc.virtual_hosts[0].domains, vec!["*"]);
        let nested = BOOTSTRAP.replace("domains: [\"*\"]", "domains: [[\"*\", a.test]]");
        let sr = decode(&nested).unwrap().message.static_resources.unwrap();
        let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(
            any,
        )) = &sr.listeners[0].filter_chains[0].filters[0].config_type
        else {
            panic!("typed config")
        };
        let hcm: HttpConnectionManager = crate::unpack(any).unwrap();
        let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier::RouteConfig(rc)) = &hcm.route_specifier else { panic!() };
        assert_eq!(rc.virtual_hosts[0].domains, vec!["*", "a.test"]);
    }

    #[test]
    fn still_refuses_what_envoy_refuses() {
        for (from, to) in [
            (
                "connect_timeout: 0.25s",
                "connect_timeout: 0.25s\n    lb_policy: roundRobin",
            ),
            ("connect_timeout: 0.25s", "connect_timeout: 5"),
            ("domains: [\"*\"]", "domains: 5"),
            (
                "stat_prefix: ingress",
                "stat_prefix: ingress\n          use_remote_address: 1",
            ),
        ] {
            let bad = BOOTSTRAP.replace(from, to);
            assert!(decode(&bad).is_err(), "{to}");
        }
    }

    #[test]
    fn unknown_fields_pass_when_allowed() {
        let typo = BOOTSTRAP.replace("admin: {address", "admin: {bogus: 1, address");
        let v = Codec::parse_text(&typo, Format::Yaml).unwrap();
        assert!(Codec::new().decode::<Bootstrap>(v, true).is_ok());
    }

    #[test]
    fn renders_back_to_json_with_types() {
        let codec = Codec::new();
        let d = decode(BOOTSTRAP).unwrap();
        let json = codec.to_json(&d.message);
        assert_eq!(
            json["static_resources"]["clusters"][0]["connect_timeout"],
            "0.250s"
        );
        let tc = &json["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        assert!(
            tc["@type"]
                .as_str()
                .unwrap()
                .ends_with("HttpConnectionManager")
        );
    }
}
