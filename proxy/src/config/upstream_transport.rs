//! A cluster's `transport_socket` and `transport_socket_matches`, as far as revoy honours them:
//! which hosts are connected to in plaintext, and why the others are refused. Upstream TLS is
//! not implemented yet, so a host whose transport socket asks for it (or for any socket revoy
//! lacks) is never connected to at all: its requests fail with 503 (`UF`), naming the reason.

use std::sync::Arc;

use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::{Metadata, TransportSocket, transport_socket};
use proto::pb::google::protobuf::Struct;

/// The metadata namespace `transport_socket_matches` compare against.
const MATCH_NAMESPACE: &str = "envoy.transport_socket_match";

/// Why connections to a host are refused (shown in its 503 body and in the logs).
pub type Refusal = Arc<str>;

/// The compiled transport sockets of one cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamTransport {
    /// `transport_socket_matches` in order: the labels an endpoint's metadata must carry, and
    /// the refusal of its socket (`None`: plaintext).
    matches: Vec<(Struct, Option<Refusal>)>,
    /// The cluster's `transport_socket` (`None`: plaintext).
    default: Option<Refusal>,
}

impl UpstreamTransport {
    /// Compiles the cluster's transport sockets.
    pub fn compile(c: &Cluster) -> UpstreamTransport {
        let default = if c.transport_socket_matcher.is_some() {
            Some(Refusal::from(
                "transport_socket_matcher is not implemented by revoy",
            ))
        } else {
            c.transport_socket.as_ref().and_then(refusal)
        };
        UpstreamTransport {
            matches: c
                .transport_socket_matches
                .iter()
                .map(|m| {
                    (
                        m.r#match.clone().unwrap_or_default(),
                        m.transport_socket.as_ref().and_then(refusal),
                    )
                })
                .collect(),
            default,
        }
    }

    /// Why a host with this endpoint (and locality) metadata is refused, if it is: the first
    /// of `transport_socket_matches` whose labels the endpoint's metadata carries, else the
    /// first whose labels the locality's carries, else the cluster's `transport_socket`, as
    /// Envoy picks it.
    pub fn refusal_for(
        &self,
        endpoint: Option<&Metadata>,
        locality: Option<&Metadata>,
    ) -> Option<Refusal> {
        let first = |md| self.matches.iter().find(|(labels, _)| carries(md, labels));
        first(endpoint)
            .or_else(|| first(locality))
            .map_or(&self.default, |(_, r)| r)
            .clone()
    }

    /// Each configured socket revoy refuses, by field (`transport_socket`,
    /// `transport_socket_matches[1].transport_socket`), for the start-up report.
    pub fn refusals(&self) -> impl Iterator<Item = (String, &Refusal)> {
        let matches = self.matches.iter().enumerate().filter_map(|(i, (_, r))| {
            r.as_ref()
                .map(|r| (format!("transport_socket_matches[{i}].transport_socket"), r))
        });
        self.default
            .as_ref()
            .map(|r| ("transport_socket".to_owned(), r))
            .into_iter()
            .chain(matches)
    }
}

/// Whether `md`'s `envoy.transport_socket_match` entry has every label of `labels` (an empty
/// set matches any endpoint).
fn carries(md: Option<&Metadata>, labels: &Struct) -> bool {
    if labels.fields.is_empty() {
        return true;
    }
    let Some(have) = md.and_then(|m| m.filter_metadata.get(MATCH_NAMESPACE)) else {
        return false;
    };
    labels
        .fields
        .iter()
        .all(|(k, v)| have.fields.get(k) == Some(v))
}

/// Why revoy refuses connections over `ts`; `None` for plaintext (`raw_buffer`).
fn refusal(ts: &TransportSocket) -> Option<Refusal> {
    let type_url = match &ts.config_type {
        Some(transport_socket::ConfigType::TypedConfig(any)) => any.type_url.as_str(),
        None => "",
    };
    let type_name = proto::type_name_of(type_url);
    if type_name.ends_with("raw_buffer.v3.RawBuffer")
        || (type_url.is_empty() && ts.name == "envoy.transport_sockets.raw_buffer")
    {
        return None;
    }
    Some(Refusal::from(
        if type_name.ends_with("tls.v3.UpstreamTlsContext") {
            format!(
                "upstream TLS (transport socket '{}', UpstreamTlsContext) is not implemented by revoy; not connecting in plaintext instead",
                ts.name
            )
        } else {
            format!(
                "transport socket '{}' ({}) is not implemented by revoy; not connecting in plaintext instead",
                ts.name,
                if type_url.is_empty() {
                    "no typed_config"
                } else {
                    type_url
                }
            )
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(yaml: &str) -> Cluster {
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        proto::Codec::new()
            .decode::<Cluster>(value, false)
            .unwrap()
            .message
    }

    fn metadata(yaml: &str) -> Metadata {
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        proto::Codec::new()
            .decode::<Metadata>(value, false)
            .unwrap()
            .message
    }

    #[test]
    fn upstream_tls_is_refused_and_raw_buffer_is_not() {
        let tls = UpstreamTransport::compile(&cluster(
            r#"
name: secure
transport_socket:
  name: envoy.transport_sockets.tls
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
    sni: example.com
"#,
        ));
        let why = tls.refusal_for(None, None).expect("refused");
        assert!(why.contains("UpstreamTlsContext"), "{why}");
        assert_eq!(tls.refusals().next().unwrap().0, "transport_socket");
        let plain = UpstreamTransport::compile(&cluster(
            r#"
name: plain
transport_socket:
  name: envoy.transport_sockets.raw_buffer
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer
"#,
        ));
        assert_eq!(plain.refusal_for(None, None), None);
        assert_eq!(
            UpstreamTransport::compile(&cluster("name: none")).refusal_for(None, None),
            None
        );
    }

    #[test]
    fn matches_pick_the_socket_by_endpoint_then_locality_metadata() {
        // Istio's outbound cluster shape: mTLS for endpoints labelled tlsMode=istio,
        // plaintext for the rest.
        let t = UpstreamTransport::compile(&cluster(
            r#"
name: outbound|80||svc
transport_socket_matches:
- name: tlsMode-istio
  match: {tlsMode: istio}
  transport_socket:
    name: envoy.transport_sockets.tls
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
- name: tlsMode-disabled
  match: {}
  transport_socket:
    name: envoy.transport_sockets.raw_buffer
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer
"#,
        ));
        let istio = metadata("filter_metadata: {envoy.transport_socket_match: {tlsMode: istio}}");
        let other = metadata("filter_metadata: {envoy.transport_socket_match: {tlsMode: other}}");
        assert!(t.refusal_for(Some(&istio), None).is_some());
        // The empty match fits any endpoint, so the locality is never asked.
        assert_eq!(t.refusal_for(None, Some(&istio)), None);
        assert_eq!(t.refusal_for(Some(&other), None), None);
        assert_eq!(t.refusal_for(None, None), None);
        let fields: Vec<String> = t.refusals().map(|(f, _)| f).collect();
        assert_eq!(fields, ["transport_socket_matches[0].transport_socket"]);
    }

    #[test]
    fn every_match_is_tried_on_the_endpoint_before_the_locality() {
        let t = UpstreamTransport::compile(&cluster(
            r#"
name: c
transport_socket_matches:
- name: plain
  match: {a: "1"}
  transport_socket: {name: envoy.transport_sockets.raw_buffer}
- name: tls
  match: {b: "2"}
  transport_socket:
    name: envoy.transport_sockets.tls
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
"#,
        ));
        let endpoint = metadata(r#"filter_metadata: {envoy.transport_socket_match: {b: "2"}}"#);
        let locality = metadata(r#"filter_metadata: {envoy.transport_socket_match: {a: "1"}}"#);
        assert!(t.refusal_for(Some(&endpoint), Some(&locality)).is_some());
        assert_eq!(t.refusal_for(None, Some(&locality)), None);
    }
}
