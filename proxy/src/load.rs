//! Reading the bootstrap named on the command line: the `-c` file, `--config-yaml` merged over
//! it (Envoy's proto merge: messages merge, repeated fields append, scalars replace), decoding,
//! and the `--service-*` node overrides.

use proto::pb::envoy::config::bootstrap::v3::Bootstrap;
use proto::{Codec, DecodeError, Format};
use serde_json::Value;

use crate::cli::Options;

/// Why the bootstrap could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Neither `-c` nor `--config-yaml` was given.
    #[error(
        "At least one of --config-path or --config-yaml or Options::configProto() should be non-empty"
    )]
    NoConfig,
    /// The file could not be read.
    #[error("unable to read file: {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text did not decode into a Bootstrap.
    #[error("{origin}: {source}")]
    Decode {
        /// `-c <file>` or `--config-yaml`.
        origin: String,
        /// The decoding problem (names the field path).
        source: DecodeError,
    },
}

/// A decoded bootstrap plus the `@type`s kept opaque.
pub struct Loaded {
    /// The bootstrap.
    pub bootstrap: Bootstrap,
    /// `(field path, type URL)` of Anys this build does not know.
    pub unknown_types: Vec<(String, String)>,
}

/// Merges `over` into `base` like protobuf's MergeFrom on the JSON form.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (Value::Array(b), Value::Array(o)) => b.extend(o),
        (slot, v) => *slot = v,
    }
}

/// Decodes a bootstrap document with its static clusters and listeners taken out and decoded
/// one by one: a thousand clusters decoded as one message would hold the whole document in
/// several forms at once (JSON tree, dynamic message, encoded bytes).
fn decode_in_parts(
    codec: &Codec,
    mut doc: Value,
    allow_unknown_fields: bool,
) -> Result<proto::Decoded<Bootstrap>, DecodeError> {
    let (clusters, listeners) = take_static_lists(&mut doc);
    let mut decoded = codec.decode::<Bootstrap>(doc, allow_unknown_fields)?;
    let unknown = &mut decoded.unknown_types;
    let resources = decoded.message.static_resources.get_or_insert_default();
    if let Some((at, items)) = clusters {
        resources.clusters = decode_each(codec, &at, items, allow_unknown_fields, unknown)?;
    }
    if let Some((at, items)) = listeners {
        resources.listeners = decode_each(codec, &at, items, allow_unknown_fields, unknown)?;
    }
    Ok(decoded)
}

/// A list taken out of the document: its path and items.
type Part = Option<(String, Vec<Value>)>;

/// Removes `static_resources.clusters` and `.listeners` from `doc` when they are arrays, or a
/// single object (a one-item list to Envoy's parser, as everywhere in the document); any other
/// shape stays, for the bootstrap's decoding to report.
fn take_static_lists(doc: &mut Value) -> (Part, Part) {
    let Some(d) = doc.as_object_mut() else {
        return (None, None);
    };
    let Some(key) = ["static_resources", "staticResources"]
        .into_iter()
        .find(|k| d.get(*k).is_some_and(Value::is_object))
    else {
        return (None, None);
    };
    let Some(resources) = d.get_mut(key).and_then(Value::as_object_mut) else {
        return (None, None);
    };
    let mut take = |list: &str| match resources.remove(list) {
        Some(Value::Array(items)) => Some((format!("{key}.{list}"), items)),
        Some(one @ Value::Object(_)) => Some((format!("{key}.{list}"), vec![one])),
        Some(other) => {
            resources.insert(list.to_owned(), other);
            None
        }
        None => None,
    };
    (take("clusters"), take("listeners"))
}

fn decode_each<T: prost::Message + prost::Name + Default>(
    codec: &Codec,
    at: &str,
    items: Vec<Value>,
    allow_unknown_fields: bool,
    unknown_types: &mut Vec<(String, String)>,
) -> Result<Vec<T>, DecodeError> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let part = codec.decode_at(item, allow_unknown_fields, &format!("{at}[{i}]"))?;
            unknown_types.extend(part.unknown_types);
            Ok(part.message)
        })
        .collect()
}

/// Loads the bootstrap the options name.
pub fn load(opts: &Options) -> Result<Loaded, LoadError> {
    if opts.config_path.is_empty() && opts.config_yaml.is_empty() {
        return Err(LoadError::NoConfig);
    }
    let mut doc = Value::Object(Default::default());
    if !opts.config_path.is_empty() {
        let text =
            std::fs::read_to_string(&opts.config_path).map_err(|source| LoadError::Read {
                path: opts.config_path.clone(),
                source,
            })?;
        doc = Codec::parse_text(&text, Format::from_path(&opts.config_path)).map_err(|source| {
            LoadError::Decode {
                origin: opts.config_path.clone(),
                source,
            }
        })?;
    }
    if !opts.config_yaml.is_empty() {
        let over = Codec::parse_text(&opts.config_yaml, Format::Yaml).map_err(|source| {
            LoadError::Decode {
                origin: "--config-yaml".into(),
                source,
            }
        })?;
        merge(&mut doc, over);
    }
    let origin = if opts.config_path.is_empty() {
        "--config-yaml".to_owned()
    } else {
        opts.config_path.clone()
    };
    // The process's resident peak is building the descriptor pool below: before it, give
    // back the pages that reading and parsing the text touched (code, freed heap).
    crate::memory::release_idle_pages();
    let codec = Codec::for_document_releasing(
        &<Bootstrap as prost::Name>::full_name(),
        &doc,
        crate::memory::drop_pages,
    );
    let decoded = decode_in_parts(&codec, doc, opts.allow_unknown_static())
        .map_err(|source| LoadError::Decode { origin, source })?;
    Ok(Loaded {
        bootstrap: decoded.message,
        unknown_types: decoded.unknown_types,
    })
}

/// The node this proxy presents (`/server_info`, and to a control plane): the bootstrap's,
/// with `--service-cluster`, `--service-node` and `--service-zone` over its cluster, id and
/// zone, as Envoy's local info has it. The bootstrap itself (and `/config_dump`) keeps the node
/// as written.
pub fn effective_node(
    bootstrap: Option<&proto::pb::envoy::config::core::v3::Node>,
    opts: &Options,
) -> proto::pb::envoy::config::core::v3::Node {
    let mut node = bootstrap.cloned().unwrap_or_default();
    if let Some(c) = &opts.service_cluster {
        node.cluster = c.clone();
    }
    if let Some(n) = &opts.service_node {
        node.id = n.clone();
    }
    if let Some(z) = &opts.service_zone {
        node.locality.get_or_insert_with(Default::default).zone = z.clone();
    }
    node
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_is_proto_merge() {
        let mut base = json!({"a": {"x": 1, "list": [1]}, "s": "old"});
        merge(&mut base, json!({"a": {"y": 2, "list": [2]}, "s": "new"}));
        assert_eq!(
            base,
            json!({"a": {"x": 1, "y": 2, "list": [1, 2]}, "s": "new"})
        );
    }

    #[test]
    fn config_yaml_alone_and_node_overrides() {
        let mut opts = <Options as clap::Parser>::parse_from([
            "revoy",
            "--config-yaml",
            "node: {id: a, cluster: b}",
            "--service-cluster",
            "c",
        ]);
        let loaded = load(&opts).unwrap();
        let written = loaded.bootstrap.node.as_ref().unwrap();
        assert_eq!((written.id.as_str(), written.cluster.as_str()), ("a", "b"));
        let node = effective_node(Some(written), &opts);
        assert_eq!((node.id.as_str(), node.cluster.as_str()), ("a", "c"));
        opts.config_yaml = "node: {idd: a}".into();
        let err = load(&opts).err().unwrap().to_string();
        assert!(
            err.contains("--config-yaml") && err.contains("idd"),
            "{err}"
        );
    }

    #[test]
    fn clusters_and_listeners_decode_one_by_one_with_their_paths() {
        let mut opts = <Options as clap::Parser>::parse_from(["revoy", "--config-yaml", ""]);
        opts.config_yaml = "staticResources: {clusters: [{name: a}, {name: b}], \
                            listeners: [{name: l}]}"
            .into();
        let loaded = load(&opts).unwrap();
        let resources = loaded.bootstrap.static_resources.unwrap();
        let names: Vec<_> = resources.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(resources.listeners[0].name, "l");
        opts.config_yaml = "static_resources: {clusters: [{name: a}, {name: b, bogus: 1}]}".into();
        let err = load(&opts).err().unwrap().to_string();
        assert!(err.contains("static_resources.clusters[1]"), "{err}");
        assert!(err.contains("bogus"), "{err}");
        opts.config_yaml = "static_resources: {clusters: {name: a}}".into();
        let resources = load(&opts).unwrap().bootstrap.static_resources.unwrap();
        assert_eq!(
            resources.clusters[0].name, "a",
            "one object is a one-item list"
        );
        opts.config_yaml = "static_resources: {clusters: {name: a, bogus: 1}}".into();
        let err = load(&opts).err().unwrap().to_string();
        assert!(err.contains("static_resources.clusters[0]"), "{err}");
        opts.config_yaml = "static_resources: {clusters: 5}".into();
        let err = load(&opts).err().unwrap().to_string();
        assert!(err.contains("static_resources.clusters"), "{err}");
    }
}
