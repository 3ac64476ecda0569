//! A request's dynamic metadata (Envoy's `StreamInfo::dynamicMetadata()`): filters write
//! values under their namespace, and later filters, the router's consumers and the access log
//! read them.
//!
//! How a filter uses it: `FilterRequest::metadata` (decoding) and the `&mut DynamicMetadata`
//! an `Encoder` is handed (encoding) are the request's one store. Write with
//! [`DynamicMetadata::set`] (a whole `Struct` merged into a namespace, as Envoy's
//! `setDynamicMetadata`) or [`DynamicMetadata::insert`] (one key); read with
//! [`DynamicMetadata::namespace`] or [`DynamicMetadata::value`] (a path of keys). The store
//! is an empty map, which allocates nothing, for requests no filter writes to. When the
//! request has an access-log record, the store moves into it (`access_log::Record::metadata`)
//! once the router has its response and before the Encoders see it, so what response filters
//! write is there too for `%DYNAMIC_METADATA(NS:KEY...)%`.

pub mod json;
pub mod matcher;

use std::collections::BTreeMap;

use proto::pb::google::protobuf::{Struct, Value, value::Kind};

/// One request's dynamic metadata: namespace (a filter's name, usually) -> `Struct`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DynamicMetadata(BTreeMap<String, Struct>);

impl DynamicMetadata {
    /// Whether no namespace was ever set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Envoy's `setDynamicMetadata(namespace, fields)`: the namespace's top-level keys named in
    /// `fields` are replaced (not merged deeper); its other keys stay.
    pub fn set(&mut self, namespace: &str, fields: Struct) {
        match self.0.get_mut(namespace) {
            Some(existing) => existing.fields.extend(fields.fields),
            None => {
                self.0.insert(namespace.to_owned(), fields);
            }
        }
    }

    /// Sets one key of `namespace` (as [`DynamicMetadata::set`] with one field).
    pub fn insert(&mut self, namespace: &str, key: &str, value: Value) {
        self.0
            .entry(namespace.to_owned())
            .or_default()
            .fields
            .insert(key.to_owned(), value);
    }

    /// Every namespace and its `Struct`, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Struct)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The `Struct` of `namespace`, if some filter set it.
    pub fn namespace(&self, namespace: &str) -> Option<&Struct> {
        self.0.get(namespace)
    }

    /// The value at `path` (keys into nested structs) in `namespace`, as Envoy's
    /// `Metadata::metadataValue`: `None` when any step is missing or not a struct.
    pub fn value(&self, namespace: &str, path: &[impl AsRef<str>]) -> Option<&Value> {
        let (first, rest) = path.split_first()?;
        let mut value = self.namespace(namespace)?.fields.get(first.as_ref())?;
        for key in rest {
            match &value.kind {
                Some(Kind::StructValue(s)) => value = s.fields.get(key.as_ref())?,
                _ => return None,
            }
        }
        Some(value)
    }
}

/// A string `Value`.
pub fn string_value(s: impl Into<String>) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

/// A number `Value`.
pub fn number_value(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, Value)]) -> Struct {
        Struct {
            fields: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn set_replaces_top_level_keys_and_keeps_the_others() {
        let mut md = DynamicMetadata::default();
        assert!(md.is_empty());
        let inner = Value {
            kind: Some(Kind::StructValue(fields(&[("x", string_value("1"))]))),
        };
        md.set("ns", fields(&[("a", string_value("a1")), ("s", inner)]));
        md.set(
            "ns",
            fields(&[("a", number_value(2.0)), ("b", string_value("b"))]),
        );
        assert_eq!(md.value("ns", &["a"]), Some(&number_value(2.0)));
        assert_eq!(md.value("ns", &["b"]), Some(&string_value("b")));
        assert_eq!(md.value("ns", &["s", "x"]), Some(&string_value("1")));
        assert_eq!(md.value("ns", &["a", "x"]), None);
        assert_eq!(md.value("other", &["a"]), None);
        assert_eq!(md.value("ns", &[] as &[&str]), None);
        md.insert("other", "k", string_value("v"));
        assert_eq!(md.namespace("other").map(|s| s.fields.len()), Some(1));
    }
}
