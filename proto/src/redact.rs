//! Envoy's `MessageUtil::redact` on a message's proto3 JSON: every field marked
//! `[(udpa.annotations.sensitive) = true]`, and everything under one, loses its value before
//! an admin dump shows it. Strings and bytes become `"[redacted]"` (bytes: its base64), other
//! scalars are cleared (so proto3 JSON leaves them out), map keys stay; `Any`s and
//! `TypedStruct`s are redacted as the message they hold.

use std::collections::HashMap;

use prost_reflect::{
    DescriptorPool, ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor,
};
use serde_json::Value;

use crate::any::type_name_of;
use crate::typed_struct::{UDPA_TYPED_STRUCT, XDS_TYPED_STRUCT};

/// What a redacted string becomes.
const REDACTED: &str = "[redacted]";

/// What a redacted bytes field becomes: `[redacted]` in base64, as proto3 JSON writes bytes.
const REDACTED_BYTES: &str = "W3JlZGFjdGVkXQ==";

/// One redaction pass: the pool the JSON was written with and which fields are sensitive.
pub(crate) struct Redactor<'p> {
    pool: &'p DescriptorPool,
    sensitive: Option<ExtensionDescriptor>,
    /// Field options decoded once per field (by full name): sensitive or not.
    known: HashMap<String, bool>,
}

impl<'p> Redactor<'p> {
    /// A pass over JSON written with `pool` (without `udpa.annotations.sensitive` in the pool,
    /// nothing is sensitive).
    pub(crate) fn new(pool: &'p DescriptorPool) -> Self {
        Redactor {
            pool,
            sensitive: pool.get_extension_by_name("udpa.annotations.sensitive"),
            known: HashMap::new(),
        }
    }

    /// Redacts `value`, the JSON of a `desc` message.
    pub(crate) fn message(&mut self, desc: &MessageDescriptor, value: &mut Value, sensitive: bool) {
        match desc.full_name() {
            "google.protobuf.Any" => return self.any(value, sensitive),
            XDS_TYPED_STRUCT | UDPA_TYPED_STRUCT => return self.typed_struct(value, sensitive),
            name if name.starts_with("google.protobuf.") => {
                if sensitive {
                    well_known(name, value);
                }
                return;
            }
            _ => {}
        }
        let Value::Object(fields) = value else { return };
        let mut cleared = Vec::new();
        for (key, child) in fields.iter_mut() {
            let Some(field) = desc
                .get_field_by_name(key)
                .or_else(|| desc.get_field_by_json_name(key))
            else {
                continue;
            };
            let sensitive = sensitive || self.is_sensitive(&field);
            if let Kind::Message(m) = field.kind() {
                if field.is_map() {
                    let value_field = m.map_entry_value_field();
                    let Value::Object(entries) = child else {
                        continue;
                    };
                    for entry in entries.values_mut() {
                        match value_field.kind() {
                            Kind::Message(vm) => self.message(&vm, entry, sensitive),
                            // A cleared map value is its default, which proto3 JSON writes.
                            kind if sensitive => {
                                *entry = redacted(&kind).unwrap_or_else(|| default_of(&kind))
                            }
                            _ => {}
                        }
                    }
                } else if let Value::Array(items) = child {
                    items
                        .iter_mut()
                        .for_each(|item| self.message(&m, item, sensitive));
                } else {
                    self.message(&m, child, sensitive);
                }
            } else if sensitive {
                match (redacted(&field.kind()), child) {
                    (Some(r), Value::Array(items)) => items.fill(r),
                    (Some(r), child) => *child = r,
                    (None, _) => cleared.push(key.clone()),
                }
            }
        }
        for key in cleared {
            fields.remove(&key);
        }
    }

    /// An `Any`: `{"@type": url, ...fields}` (or `{"@type", "value"}` for a well-known type).
    fn any(&mut self, value: &mut Value, sensitive: bool) {
        let Some(name) = value
            .get("@type")
            .and_then(Value::as_str)
            .map(|url| type_name_of(url).to_owned())
        else {
            return;
        };
        let Some(inner) = self.pool.get_message_by_name(&name) else {
            return;
        };
        if name.starts_with("google.protobuf.") && name != "google.protobuf.Any" {
            if let Some(v) = value.get_mut("value")
                && sensitive
            {
                well_known(&name, v);
            }
            return;
        }
        self.message(&inner, value, sensitive);
    }

    /// A `TypedStruct`: its `value` is the JSON of the message `type_url` names.
    fn typed_struct(&mut self, value: &mut Value, sensitive: bool) {
        let Some(name) = value
            .get("type_url")
            .and_then(Value::as_str)
            .map(|url| type_name_of(url).to_owned())
        else {
            return;
        };
        let (Some(inner), Some(fields)) =
            (self.pool.get_message_by_name(&name), value.get_mut("value"))
        else {
            return;
        };
        self.message(&inner, fields, sensitive);
    }

    fn is_sensitive(&mut self, field: &FieldDescriptor) -> bool {
        let Some(ext) = &self.sensitive else {
            return false;
        };
        if let Some(known) = self.known.get(field.full_name()) {
            return *known;
        }
        *self
            .known
            .entry(field.full_name().to_owned())
            .or_insert_with(|| {
                let options = field.options();
                options.has_extension(ext) && options.get_extension(ext).as_bool() == Some(true)
            })
    }
}

/// What a redacted scalar of `kind` becomes: strings and bytes `[redacted]`; `None` for any
/// other kind, which is cleared instead.
fn redacted(kind: &Kind) -> Option<Value> {
    match kind {
        Kind::String => Some(Value::from(REDACTED)),
        Kind::Bytes => Some(Value::from(REDACTED_BYTES)),
        _ => None,
    }
}

/// The proto3 JSON of a cleared scalar of `kind` (a map value stays, with its default).
fn default_of(kind: &Kind) -> Value {
    match kind {
        Kind::Bool => Value::Bool(false),
        Kind::String => Value::from(""),
        Kind::Bytes => Value::from(""),
        Kind::Enum(e) => e.default_value().name().to_owned().into(),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64 | Kind::Fixed64 => {
            Value::from("0")
        }
        _ => Value::from(0),
    }
}

/// A well-known type under a sensitive field, in its special JSON form: the string and bytes
/// wrappers and every string in a `Struct`, `Value` or `ListValue` become `[redacted]`; the
/// other wrappers, durations and timestamps keep their (cleared) default.
fn well_known(name: &str, value: &mut Value) {
    match name {
        "google.protobuf.StringValue" => *value = Value::from(REDACTED),
        "google.protobuf.BytesValue" => *value = Value::from(REDACTED_BYTES),
        "google.protobuf.BoolValue" => *value = Value::Bool(false),
        "google.protobuf.Int64Value" | "google.protobuf.UInt64Value" => *value = Value::from("0"),
        "google.protobuf.Int32Value"
        | "google.protobuf.UInt32Value"
        | "google.protobuf.FloatValue"
        | "google.protobuf.DoubleValue" => *value = Value::from(0),
        "google.protobuf.Duration" => *value = Value::from("0s"),
        "google.protobuf.Timestamp" => *value = Value::from("1970-01-01T00:00:00Z"),
        "google.protobuf.Struct" | "google.protobuf.Value" | "google.protobuf.ListValue" => {
            strings(value)
        }
        _ => {}
    }
}

/// Every string in a `Struct`/`Value`/`ListValue` JSON becomes `[redacted]` (keys stay).
fn strings(value: &mut Value) {
    match value {
        Value::String(s) => *s = REDACTED.to_owned(),
        Value::Array(items) => items.iter_mut().for_each(strings),
        Value::Object(fields) => fields.values_mut().for_each(strings),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::Codec;

    const SECRET: &str = "envoy.extensions.transport_sockets.tls.v3.Secret";

    fn redacted(root: &str, mut value: Value) -> Value {
        Codec::for_document(root, &value).redact(root, &mut value);
        value
    }

    /// Envoy 1.40's `/config_dump` shows a `tls_certificate` secret with a private key in a
    /// file, an inline key and an inline password as below (its `static_secrets` and
    /// `dynamic_active_secrets`): the certificate stays, the key's file name and inline
    /// values become `[redacted]` (bytes: its base64).
    #[test]
    fn private_keys_and_passwords_are_redacted_as_envoy_does() {
        let value = redacted(
            SECRET,
            json!({"name": "s", "tls_certificate": {
                "certificate_chain": {"filename": "/c.pem"},
                "private_key": {"filename": "/k.pem"},
                "password": {"inline_bytes": "cGFzcw=="}}}),
        );
        assert_eq!(
            value,
            json!({"name": "s", "tls_certificate": {
                "certificate_chain": {"filename": "/c.pem"},
                "private_key": {"filename": "[redacted]"},
                "password": {"inline_bytes": "W3JlZGFjdGVkXQ=="}}})
        );
        let value = redacted(
            SECRET,
            json!({"name": "s", "tls_certificate": {"private_key": {"inline_string": "KEY"}}}),
        );
        assert_eq!(
            value["tls_certificate"]["private_key"],
            json!({"inline_string": "[redacted]"})
        );
    }

    /// The same inside `Any`s at any depth (a listener's transport socket), and in a
    /// generic secret's map: its values are redacted, its keys stay.
    #[test]
    fn anys_and_map_values_are_redacted() {
        let listener = json!({"name": "l", "filter_chains": [{"transport_socket": {
            "name": "tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "common_tls_context": {"tls_certificates": [{
                    "certificate_chain": {"inline_string": "CERT"},
                    "private_key": {"environment_variable": "KEY_VAR"}}]}}}}]});
        let value = redacted("envoy.config.listener.v3.Listener", listener);
        let cert = &value["filter_chains"][0]["transport_socket"]["typed_config"]["common_tls_context"]
            ["tls_certificates"][0];
        assert_eq!(cert["certificate_chain"], json!({"inline_string": "CERT"}));
        assert_eq!(
            cert["private_key"],
            json!({"environment_variable": "[redacted]"})
        );
        let value = redacted(
            SECRET,
            json!({"name": "g", "generic_secret": {"secrets": {"token": {"inline_string": "T"}}}}),
        );
        assert_eq!(
            value["generic_secret"]["secrets"],
            json!({"token": {"inline_string": "[redacted]"}})
        );
    }
}
