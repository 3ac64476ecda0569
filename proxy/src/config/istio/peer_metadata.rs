//! `istio.metadata_exchange` as an HTTP filter (io.istio.http.peer_metadata.Config, what
//! istiod emits today, wrapped in a TypedStruct): how the downstream and upstream peers'
//! workload metadata is discovered and how this proxy's own is propagated. revoy implements
//! the `istio_headers` method (`x-envoy-peer-metadata`, `x-envoy-peer-metadata-id`); the
//! workload-metadata xDS and the deprecated baggage method discover nothing here, with a note.

use serde_json::Value;

use super::{Fields, field};
use crate::config::{ConfigError, Warnings};

/// The message's fully qualified name.
pub const CONFIG: &str = "io.istio.http.peer_metadata.Config";

/// The proto form (istio/proxy `source/extensions/filters/http/peer_metadata/config.proto`).
#[derive(Clone, PartialEq, prost::Message)]
struct ConfigProto {
    #[prost(message, repeated, tag = "1")]
    downstream_discovery: Vec<DiscoveryProto>,
    #[prost(message, repeated, tag = "2")]
    upstream_discovery: Vec<DiscoveryProto>,
    #[prost(message, repeated, tag = "3")]
    downstream_propagation: Vec<PropagationProto>,
    #[prost(message, repeated, tag = "4")]
    upstream_propagation: Vec<PropagationProto>,
    #[prost(bool, tag = "5")]
    shared_with_upstream: bool,
    #[prost(string, repeated, tag = "6")]
    additional_labels: Vec<String>,
}

/// `DiscoveryMethod`: a oneof of empty messages, bar `istio_headers`.
#[derive(Clone, PartialEq, prost::Message)]
struct DiscoveryProto {
    #[prost(message, optional, tag = "1")]
    baggage: Option<Empty>,
    #[prost(message, optional, tag = "2")]
    workload_discovery: Option<Empty>,
    #[prost(message, optional, tag = "3")]
    istio_headers: Option<IstioHeadersProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PropagationProto {
    #[prost(message, optional, tag = "1")]
    istio_headers: Option<IstioHeadersProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct IstioHeadersProto {
    #[prost(bool, tag = "1")]
    skip_external_clusters: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Empty {}

/// A way of discovering a peer's metadata, in precedence order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// The `x-envoy-peer-metadata` headers (request headers for the downstream peer,
    /// response headers for the upstream one).
    IstioHeaders,
    /// The workload metadata xDS, which revoy lacks: finds nothing.
    WorkloadDiscovery,
    /// The deprecated baggage method: finds nothing.
    Baggage,
}

/// Sending this proxy's metadata in `x-envoy-peer-metadata` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Propagation {
    /// Not to upstream clusters marked external (`istio.external`), nor `PassthroughCluster`.
    pub skip_external_clusters: bool,
}

/// The compiled filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerMetadataConfig {
    /// How the downstream peer is found (from the request).
    pub downstream_discovery: Vec<Discovery>,
    /// How the upstream peer is found (from the response).
    pub upstream_discovery: Vec<Discovery>,
    /// This proxy's metadata on responses (only to a downstream that sent its own).
    pub downstream_propagation: Option<Propagation>,
    /// This proxy's metadata on requests going upstream.
    pub upstream_propagation: Option<Propagation>,
    /// The Wasm plugin's form (see [`super::wasm`]), which propagates by the listener's
    /// direction: not upstream from an inbound listener, not downstream on an outbound one.
    /// The listener's compile drops the propagation its direction rules out.
    pub by_listener_direction: bool,
}

/// Compiles the filter's config.
pub fn compile(
    fields: Fields<'_>,
    warnings: &mut Warnings,
) -> Result<PeerMetadataConfig, ConfigError> {
    let proto = match fields {
        Fields::Proto(bytes) => {
            prost::Message::decode(bytes).map_err(|e| super::decode_error(CONFIG, e))?
        }
        Fields::Json(value) => from_json(&value)?,
    };
    let discovery = |list: &[DiscoveryProto], at: &str, warnings: &mut Warnings| {
        list.iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let method = if m.istio_headers.is_some() {
                    Discovery::IstioHeaders
                } else if m.workload_discovery.is_some() {
                    Discovery::WorkloadDiscovery
                } else if m.baggage.is_some() {
                    Discovery::Baggage
                } else {
                    return None;
                };
                if method != Discovery::IstioHeaders {
                    warnings.note(
                        format!("{at}[{i}]"),
                        "this peer discovery method is not implemented by revoy and finds no peer (telemetry labels read `unknown`)",
                    );
                }
                Some(method)
            })
            .collect()
    };
    let propagation = |list: &[PropagationProto]| {
        list.iter()
            .find_map(|m| m.istio_headers.as_ref())
            .map(|h| Propagation {
                skip_external_clusters: h.skip_external_clusters,
            })
    };
    if !proto.additional_labels.is_empty() {
        warnings.note(
            "additional_labels",
            "additional peer labels are not kept by revoy (only CEL-defined metrics read them)",
        );
    }
    Ok(PeerMetadataConfig {
        downstream_discovery: discovery(
            &proto.downstream_discovery,
            "downstream_discovery",
            warnings,
        ),
        upstream_discovery: discovery(&proto.upstream_discovery, "upstream_discovery", warnings),
        downstream_propagation: propagation(&proto.downstream_propagation),
        upstream_propagation: propagation(&proto.upstream_propagation),
        by_listener_direction: false,
    })
}

/// The proto form of the JSON fields.
fn from_json(value: &Value) -> Result<ConfigProto, ConfigError> {
    let list = |name: &str| -> Result<&[Value], ConfigError> {
        match field(value, name) {
            None => Ok(&[]),
            Some(Value::Array(a)) => Ok(a),
            Some(_) => Err(ConfigError::new(name, "expected a list")),
        }
    };
    let headers = |m: &Value| {
        field(m, "istio_headers").map(|h| IstioHeadersProto {
            skip_external_clusters: field(h, "skip_external_clusters")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    };
    let discovery = |name: &str| -> Result<Vec<DiscoveryProto>, ConfigError> {
        Ok(list(name)?
            .iter()
            .map(|m| DiscoveryProto {
                baggage: field(m, "baggage").map(|_| Empty {}),
                workload_discovery: field(m, "workload_discovery").map(|_| Empty {}),
                istio_headers: headers(m),
            })
            .collect())
    };
    let propagation = |name: &str| -> Result<Vec<PropagationProto>, ConfigError> {
        Ok(list(name)?
            .iter()
            .map(|m| PropagationProto {
                istio_headers: headers(m),
            })
            .collect())
    };
    Ok(ConfigProto {
        downstream_discovery: discovery("downstream_discovery")?,
        upstream_discovery: discovery("upstream_discovery")?,
        downstream_propagation: propagation("downstream_propagation")?,
        upstream_propagation: propagation("upstream_propagation")?,
        shared_with_upstream: false,
        additional_labels: match field(value, "additional_labels") {
            None => Vec::new(),
            Some(v) => super::strings(v, "additional_labels")?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istiods_outbound_config_discovers_upstream_and_propagates_upstream() {
        // testdata/filters/mx_native_outbound.yaml.tmpl in istio/proxy.
        let v = serde_json::json!({
            "upstream_discovery": [{"istio_headers": {}}, {"workload_discovery": {}}],
            "upstream_propagation": [{"istio_headers": {}}],
        });
        let mut warnings = Warnings::new();
        let c = compile(Fields::Json(v), &mut warnings).unwrap();
        assert_eq!(
            c.upstream_discovery,
            [Discovery::IstioHeaders, Discovery::WorkloadDiscovery]
        );
        assert!(c.downstream_discovery.is_empty());
        assert_eq!(
            c.upstream_propagation,
            Some(Propagation {
                skip_external_clusters: false
            })
        );
        assert_eq!(c.downstream_propagation, None);
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn the_proto_form_reads_the_same() {
        use prost::Message;
        let proto = ConfigProto {
            downstream_discovery: vec![DiscoveryProto {
                istio_headers: Some(IstioHeadersProto::default()),
                ..Default::default()
            }],
            downstream_propagation: vec![PropagationProto {
                istio_headers: Some(IstioHeadersProto {
                    skip_external_clusters: true,
                }),
            }],
            ..Default::default()
        };
        let c = compile(Fields::Proto(&proto.encode_to_vec()), &mut Warnings::new()).unwrap();
        assert_eq!(c.downstream_discovery, [Discovery::IstioHeaders]);
        assert_eq!(
            c.downstream_propagation,
            Some(Propagation {
                skip_external_clusters: true
            })
        );
    }
}
