//! A workload's identity as Istio's proxy filters exchange it (istio/proxy
//! `extensions/common/metadata_object`): read from an Istio node's metadata (`NAME`,
//! `NAMESPACE`, `WORKLOAD_NAME`, `CLUSTER_ID`, `OWNER`, `LABELS`) or from a peer's, and written
//! back in the same shape as the `google.protobuf.Struct` the metadata exchange sends, encoded
//! deterministically (map keys in order) as Istio's proxy encodes it.

use proto::pb::google::protobuf::{Struct, value::Kind};

/// The labels carrying the canonical service, its revision, the app and its version.
const CANONICAL_NAME: &str = "service.istio.io/canonical-name";
const CANONICAL_REVISION: &str = "service.istio.io/canonical-revision";
const APP: &str = "app";
const VERSION: &str = "version";

/// This proxy as Istio's filters describe it: the node's id and workload, and the
/// `x-envoy-peer-metadata` value it sends (base64 of the exchanged Struct).
#[derive(Debug, Clone)]
pub struct LocalWorkload {
    /// `node.id` (`x-envoy-peer-metadata-id`).
    pub id: String,
    /// The id as the header value sent, when it can be one.
    pub id_header: Option<http::HeaderValue>,
    /// The workload of `node.metadata`.
    pub workload: Workload,
    /// `x-envoy-peer-metadata`.
    pub header: http::HeaderValue,
}

impl Default for LocalWorkload {
    fn default() -> Self {
        LocalWorkload {
            id: String::new(),
            id_header: None,
            workload: Workload::default(),
            header: http::HeaderValue::from_static(""),
        }
    }
}

impl LocalWorkload {
    /// The workload of an Istio node (its `metadata`).
    pub fn from_node(node: &proto::pb::envoy::config::core::v3::Node) -> LocalWorkload {
        use base64::Engine;
        let workload = node
            .metadata
            .as_ref()
            .map(Workload::from_struct)
            .unwrap_or_default();
        let header = base64::engine::general_purpose::STANDARD.encode(workload.to_struct_bytes());
        LocalWorkload {
            id: node.id.clone(),
            id_header: http::HeaderValue::from_str(&node.id).ok(),
            workload,
            header: http::HeaderValue::from_str(&header).expect("base64 is a header value"),
        }
    }
}

/// What Istio's telemetry knows of a workload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    /// `NAME`: the pod (instance) name.
    pub instance: String,
    /// `NAMESPACE`.
    pub namespace: String,
    /// `WORKLOAD_NAME`: the deployment (or other owner) name.
    pub workload: String,
    /// `CLUSTER_ID`.
    pub cluster: String,
    /// `OWNER`: the owning controller's URL (kept as sent).
    pub owner: String,
    /// Label `service.istio.io/canonical-name`.
    pub canonical_name: String,
    /// Label `service.istio.io/canonical-revision`.
    pub canonical_revision: String,
    /// Label `app`.
    pub app: String,
    /// Label `version`.
    pub version: String,
}

impl Workload {
    /// The workload a node metadata (or a peer's exchanged metadata) describes; fields
    /// missing or not strings are empty.
    pub fn from_struct(metadata: &Struct) -> Workload {
        let text = |s: &Struct, key: &str| match s.fields.get(key).and_then(|v| v.kind.as_ref()) {
            Some(Kind::StringValue(v)) => v.clone(),
            _ => String::new(),
        };
        let labels = match metadata.fields.get("LABELS").and_then(|v| v.kind.as_ref()) {
            Some(Kind::StructValue(s)) => s.clone(),
            _ => Struct::default(),
        };
        Workload {
            instance: text(metadata, "NAME"),
            namespace: text(metadata, "NAMESPACE"),
            workload: text(metadata, "WORKLOAD_NAME"),
            cluster: text(metadata, "CLUSTER_ID"),
            owner: text(metadata, "OWNER"),
            canonical_name: text(&labels, CANONICAL_NAME),
            canonical_revision: text(&labels, CANONICAL_REVISION),
            app: text(&labels, APP),
            version: text(&labels, VERSION),
        }
    }

    /// The workload in the proto encoding of the Struct the exchange sends: `NAME`,
    /// `NAMESPACE`, `WORKLOAD_NAME`, `CLUSTER_ID` when set, `LABELS` always (with the four
    /// labels that are set), `OWNER` when set; keys in order at every level.
    pub fn to_struct_bytes(&self) -> Vec<u8> {
        let mut labels: Vec<(&str, Field)> = [
            (APP, &self.app),
            (CANONICAL_NAME, &self.canonical_name),
            (CANONICAL_REVISION, &self.canonical_revision),
            (VERSION, &self.version),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k, Field::Text(v)))
        .collect();
        labels.sort_by_key(|(k, _)| *k);
        let mut fields: Vec<(&str, Field)> = [
            ("CLUSTER_ID", &self.cluster),
            ("NAME", &self.instance),
            ("NAMESPACE", &self.namespace),
            ("OWNER", &self.owner),
            ("WORKLOAD_NAME", &self.workload),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k, Field::Text(v)))
        .collect();
        fields.push(("LABELS", Field::Struct(labels)));
        fields.sort_by_key(|(k, _)| *k);
        encode_struct(&fields)
    }

    /// The workload a peer sent as a proto-encoded Struct; `None` when the bytes are not one.
    pub fn from_struct_bytes(bytes: &[u8]) -> Option<Workload> {
        let s: Struct = prost::Message::decode(bytes).ok()?;
        Some(Workload::from_struct(&s))
    }

    /// The workload an `x-envoy-peer-metadata` value carries (base64, padded or not).
    pub fn from_header(value: &[u8]) -> Option<Workload> {
        use base64::Engine;
        let trimmed = value
            .strip_suffix(b"==")
            .or_else(|| value.strip_suffix(b"="))
            .unwrap_or(value);
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(trimmed)
            .ok()?;
        Workload::from_struct_bytes(&bytes)
    }
}

/// The magic number that starts a TCP metadata exchange frame (network byte order).
pub const EXCHANGE_MAGIC: u32 = 0x3D23_0467;

/// The frame Istio's TCP metadata exchange (`istio.metadata_exchange` network filter, after
/// ALPN `istio-peer-exchange`) sends first on a connection: the magic, the payload's length
/// (both 32-bit big-endian), and the payload, an `Any` of a `google.protobuf.Struct` holding
/// `x-envoy-peer-metadata` (the workload's Struct) and `x-envoy-peer-metadata-id` (the node
/// id, when there is one).
pub fn exchange_frame(local: &LocalWorkload) -> Vec<u8> {
    let metadata = length_delimited(5, &local.workload.to_struct_bytes());
    let mut data = Vec::new();
    let mut entry = length_delimited(1, b"x-envoy-peer-metadata");
    entry.extend(length_delimited(2, &metadata));
    data.extend(length_delimited(1, &entry));
    if !local.id.is_empty() {
        let mut entry = length_delimited(1, b"x-envoy-peer-metadata-id");
        entry.extend(length_delimited(
            2,
            &length_delimited(3, local.id.as_bytes()),
        ));
        data.extend(length_delimited(1, &entry));
    }
    let mut any = length_delimited(1, b"type.googleapis.com/google.protobuf.Struct");
    any.extend(length_delimited(2, &data));
    let mut frame = Vec::with_capacity(8 + any.len());
    frame.extend_from_slice(&EXCHANGE_MAGIC.to_be_bytes());
    frame.extend_from_slice(&(any.len() as u32).to_be_bytes());
    frame.extend(any);
    frame
}

/// What an exchange frame's payload (the `Any` after the 8-byte header) holds: `None` when
/// it is no `Any` (the frame is then not taken off, as in Istio's filter), else the peer's
/// workload when the Struct names one.
pub fn exchanged_workload(payload: &[u8]) -> Option<Option<Workload>> {
    use proto::pb::google::protobuf::Any;
    let any: Any = prost::Message::decode(payload).ok()?;
    let data: Option<Struct> = prost::Message::decode(any.value.as_slice()).ok();
    Some(data.and_then(
        |d| match d.fields.get("x-envoy-peer-metadata")?.kind.as_ref()? {
            Kind::StructValue(s) => Some(Workload::from_struct(s)),
            _ => None,
        },
    ))
}

/// A Struct field's value as the exchange writes them.
enum Field<'a> {
    Text(&'a str),
    Struct(Vec<(&'a str, Field<'a>)>),
}

/// A Struct (`fields`, field 1: map entries of key 1, Value 2) in proto encoding, entries in
/// the given order.
fn encode_struct(fields: &[(&str, Field<'_>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in fields {
        let value = match value {
            // Value.string_value is field 3, Value.struct_value field 5.
            Field::Text(t) => length_delimited(3, t.as_bytes()),
            Field::Struct(inner) => length_delimited(5, &encode_struct(inner)),
        };
        let mut entry = length_delimited(1, key.as_bytes());
        entry.extend(length_delimited(2, &value));
        out.extend(length_delimited(1, &entry));
    }
    out
}

/// A length-delimited field: its tag, its length as a varint, its bytes.
fn length_delimited(field: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 6);
    prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Struct {
        let v = serde_json::json!({
            "NAME": "productpage-v1-84975bc778-pxz2w",
            "NAMESPACE": "default",
            "WORKLOAD_NAME": "productpage-v1",
            "CLUSTER_ID": "client-cluster",
            "OWNER": "kubernetes://apis/apps/v1/namespaces/default/deployments/productpage-v1",
            "ISTIO_VERSION": "1.5-dev",
            "LABELS": {"app": "productpage", "version": "v1", "pod-template-hash": "84975bc778",
                       "service.istio.io/canonical-name": "productpage-v1",
                       "service.istio.io/canonical-revision": "version-1"},
        });
        json_struct(&v)
    }

    /// A JSON object of strings and objects as a Struct.
    fn json_struct(v: &serde_json::Value) -> Struct {
        use proto::pb::google::protobuf::Value;
        let fields = v
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let kind = match v {
                    serde_json::Value::String(s) => Kind::StringValue(s.clone()),
                    other => Kind::StructValue(json_struct(other)),
                };
                (k.clone(), Value { kind: Some(kind) })
            })
            .collect();
        Struct { fields }
    }

    #[test]
    fn node_metadata_gives_the_workload() {
        let w = Workload::from_struct(&node());
        assert_eq!(w.workload, "productpage-v1");
        assert_eq!(w.namespace, "default");
        assert_eq!(w.cluster, "client-cluster");
        assert_eq!(w.app, "productpage");
        assert_eq!(w.version, "v1");
        assert_eq!(w.canonical_revision, "version-1");
    }

    #[test]
    fn the_exchanged_struct_round_trips_and_keeps_only_istios_fields() {
        let w = Workload::from_struct(&node());
        let bytes = w.to_struct_bytes();
        assert_eq!(Workload::from_struct_bytes(&bytes), Some(w));
        let s: Struct = prost::Message::decode(bytes.as_slice()).unwrap();
        let mut keys: Vec<&String> = s.fields.keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "CLUSTER_ID",
                "LABELS",
                "NAME",
                "NAMESPACE",
                "OWNER",
                "WORKLOAD_NAME"
            ]
        );
    }

    #[test]
    fn an_exchange_frame_carries_the_workload_after_its_header() {
        let local = LocalWorkload {
            id: "sidecar~10.0.0.1~a.b~b.svc.cluster.local".into(),
            id_header: None,
            workload: Workload::from_struct(&node()),
            header: http::HeaderValue::from_static(""),
        };
        let frame = exchange_frame(&local);
        assert_eq!(frame[..4], 0x3D23_0467u32.to_be_bytes());
        let len = u32::from_be_bytes(frame[4..8].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 8);
        assert_eq!(exchanged_workload(&frame[8..]), Some(Some(local.workload)));
    }

    #[test]
    fn an_empty_workload_still_sends_its_labels() {
        let s: Struct =
            prost::Message::decode(Workload::default().to_struct_bytes().as_slice()).unwrap();
        assert_eq!(s.fields.keys().collect::<Vec<_>>(), ["LABELS"]);
    }
}
