//! A cluster's `transport_socket` and `transport_socket_matches`: which hosts are connected
//! to in plaintext, which over TLS (`UpstreamTlsContext`, compiled by `config::tls`), and
//! which are refused (a transport socket revoy lacks: never replaced by plaintext; their
//! requests fail with 503 `UF`, naming the reason).

use std::sync::Arc;

use proto::pb::envoy::config::cluster::v3::Cluster;
use proto::pb::envoy::config::core::v3::{Metadata, TransportSocket, transport_socket};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use proto::pb::google::protobuf::Struct;

use super::tls::upstream::{self, ClientTls};
use super::{ConfigError, Context};

/// The metadata namespace `transport_socket_matches` compare against.
const MATCH_NAMESPACE: &str = "envoy.transport_socket_match";

/// Why connections to a host are refused (shown in its 503 body and in the logs).
pub type Refusal = Arc<str>;

/// One compiled transport socket.
#[derive(Debug, Clone)]
pub enum Socket {
    /// `raw_buffer`, or none configured.
    Plain,
    /// `envoy.transport_sockets.tls`.
    Tls(Arc<ClientTls>),
    /// One revoy does not implement: no connection at all.
    Refused(Refusal),
}

/// The compiled transport sockets of one cluster.
#[derive(Debug, Clone)]
pub struct UpstreamTransport {
    /// Index 0: the cluster's `transport_socket`; then each of `transport_socket_matches`.
    sockets: Vec<Socket>,
    /// `transport_socket_matches` in order: the labels an endpoint's metadata must carry.
    matches: Vec<Struct>,
}

impl Default for UpstreamTransport {
    fn default() -> Self {
        UpstreamTransport {
            sockets: vec![Socket::Plain],
            matches: Vec::new(),
        }
    }
}

impl UpstreamTransport {
    /// Compiles the cluster's transport sockets; a bad TLS context is an error naming its
    /// field.
    pub fn compile(ctx: &Context<'_>, c: &Cluster) -> Result<UpstreamTransport, ConfigError> {
        let default = if c.transport_socket_matcher.is_some() {
            Socket::Refused(Refusal::from(
                "transport_socket_matcher is not implemented by revoy",
            ))
        } else {
            match &c.transport_socket {
                None => Socket::Plain,
                Some(ts) => socket(ctx, ts).map_err(|e| e.within("transport_socket"))?,
            }
        };
        let mut sockets = vec![default];
        let mut matches = Vec::new();
        for (i, m) in c.transport_socket_matches.iter().enumerate() {
            sockets.push(match &m.transport_socket {
                None => Socket::Plain,
                Some(ts) => socket(ctx, ts).map_err(|e| {
                    e.within(&format!("transport_socket_matches[{i}].transport_socket"))
                })?,
            });
            matches.push(m.r#match.clone().unwrap_or_default());
        }
        Ok(UpstreamTransport { sockets, matches })
    }

    /// The socket of a host with this endpoint (and locality) metadata, by index: the first
    /// of `transport_socket_matches` whose labels the endpoint's metadata carries, else the
    /// first whose labels the locality's carries, else the cluster's `transport_socket`, as
    /// Envoy picks it.
    pub fn socket_for(&self, endpoint: Option<&Metadata>, locality: Option<&Metadata>) -> usize {
        let first = |md| self.matches.iter().position(|labels| carries(md, labels));
        first(endpoint)
            .or_else(|| first(locality))
            .map_or(0, |i| i + 1)
    }

    /// Every socket, by index.
    pub fn sockets(&self) -> &[Socket] {
        &self.sockets
    }

    /// Each configured socket revoy refuses, by field (`transport_socket`,
    /// `transport_socket_matches[1].transport_socket`), for the start-up report.
    pub fn refusals(&self) -> impl Iterator<Item = (String, &Refusal)> {
        self.sockets
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Socket::Refused(r) if i == 0 => Some(("transport_socket".to_owned(), r)),
                Socket::Refused(r) => Some((
                    format!("transport_socket_matches[{}].transport_socket", i - 1),
                    r,
                )),
                _ => None,
            })
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

/// Compiles one transport socket.
fn socket(ctx: &Context<'_>, ts: &TransportSocket) -> Result<Socket, ConfigError> {
    let any = ts
        .config_type
        .as_ref()
        .map(|transport_socket::ConfigType::TypedConfig(any)| any);
    let type_url = any.map_or("", |a| a.type_url.as_str());
    let type_name = proto::type_name_of(type_url);
    if type_name.ends_with("raw_buffer.v3.RawBuffer")
        || (type_url.is_empty() && ts.name == "envoy.transport_sockets.raw_buffer")
    {
        return Ok(Socket::Plain);
    }
    if let Some(any) = any.filter(|_| type_name.ends_with("tls.v3.UpstreamTlsContext")) {
        let tls = proto::unpack::<UpstreamTlsContext>(any)
            .map_err(|e| ConfigError::new("typed_config", e.to_string()))?;
        let compiled = upstream::compile(ctx, &tls).map_err(|e| e.within("typed_config"))?;
        if compiled.common.params.versions.is_empty() {
            return Ok(Socket::Refused(Refusal::from(
                "tls_params allow no TLS version revoy implements (1.2, 1.3)",
            )));
        }
        return Ok(Socket::Tls(Arc::new(compiled)));
    }
    Ok(Socket::Refused(Refusal::from(format!(
        "transport socket '{}' ({}) is not implemented by revoy; not connecting in plaintext instead",
        ts.name,
        if type_url.is_empty() {
            "no typed_config"
        } else {
            type_url
        }
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FakeIo;

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

    fn compile(yaml: &str) -> Result<UpstreamTransport, ConfigError> {
        UpstreamTransport::compile(&Context::new(&FakeIo::new()), &cluster(yaml))
    }

    #[test]
    fn tls_is_compiled_raw_buffer_is_plain_and_unknown_sockets_are_refused() {
        let tls = compile(
            r#"
name: secure
transport_socket:
  name: envoy.transport_sockets.tls
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
    sni: example.com
"#,
        )
        .unwrap();
        match &tls.sockets()[tls.socket_for(None, None)] {
            Socket::Tls(t) => assert_eq!(t.sni.as_deref(), Some("example.com")),
            other => panic!("{other:?}"),
        }
        let plain = compile(
            r#"
name: plain
transport_socket:
  name: envoy.transport_sockets.raw_buffer
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer
"#,
        )
        .unwrap();
        assert!(matches!(plain.sockets()[0], Socket::Plain));
        let alts = compile(
            r#"
name: alts
transport_socket:
  name: envoy.transport_sockets.alts
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.transport_sockets.alts.v3.Alts
"#,
        )
        .unwrap();
        assert_eq!(alts.refusals().next().unwrap().0, "transport_socket");
    }

    #[test]
    fn a_bad_tls_context_is_an_error_at_its_field() {
        let e = compile(
            r#"
name: secure
transport_socket_matches:
- name: m
  match: {}
  transport_socket:
    name: envoy.transport_sockets.tls
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
      common_tls_context:
        validation_context: {trusted_ca: {filename: /missing.pem}}
"#,
        )
        .unwrap_err();
        assert_eq!(
            e.path,
            "transport_socket_matches[0].transport_socket.typed_config.common_tls_context.validation_context.trusted_ca"
        );
    }

    #[test]
    fn matches_pick_the_socket_by_endpoint_then_locality_metadata() {
        // Istio's outbound cluster shape: mTLS for endpoints labelled tlsMode=istio,
        // plaintext for the rest.
        let t = compile(
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
        )
        .unwrap();
        let istio = metadata("filter_metadata: {envoy.transport_socket_match: {tlsMode: istio}}");
        let other = metadata("filter_metadata: {envoy.transport_socket_match: {tlsMode: other}}");
        assert_eq!(t.socket_for(Some(&istio), None), 1);
        // The empty match fits any endpoint, so the locality is never asked.
        assert_eq!(t.socket_for(None, Some(&istio)), 2);
        assert_eq!(t.socket_for(Some(&other), None), 2);
        assert!(matches!(t.sockets()[1], Socket::Tls(_)));
        assert!(matches!(t.sockets()[2], Socket::Plain));
    }

    #[test]
    fn every_match_is_tried_on_the_endpoint_before_the_locality() {
        let t = compile(
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
        )
        .unwrap();
        let endpoint = metadata(r#"filter_metadata: {envoy.transport_socket_match: {b: "2"}}"#);
        let locality = metadata(r#"filter_metadata: {envoy.transport_socket_match: {a: "1"}}"#);
        assert_eq!(t.socket_for(Some(&endpoint), Some(&locality)), 2);
        assert_eq!(t.socket_for(None, Some(&locality)), 1);
        assert_eq!(t.socket_for(None, None), 0);
    }
}
