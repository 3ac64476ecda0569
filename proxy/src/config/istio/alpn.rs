//! `istio.alpn` (istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig): the ALPN list an
//! upstream TLS connection offers, chosen by the HTTP protocol the request goes upstream in
//! (istiod sets `istio-http/1.0`, `istio-http/1.1`, `istio-h2`, so the peer sidecar's inbound
//! chains can tell mesh traffic by ALPN). The override replaces the cluster's own ALPN list,
//! as Envoy's `ApplicationProtocols` filter state does, and connections made with it are
//! pooled apart from the others.

use std::sync::Arc;

use serde_json::Value;

use super::{Fields, field, strings};
use crate::config::ConfigError;

/// The message's fully qualified name.
pub const FILTER_CONFIG: &str = "istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig";

/// The proto form (istio/api `envoy/config/filter/http/alpn/v2alpha1/config.proto`).
#[derive(Clone, PartialEq, prost::Message)]
struct FilterConfigProto {
    #[prost(message, repeated, tag = "1")]
    alpn_override: Vec<AlpnOverrideProto>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct AlpnOverrideProto {
    /// HTTP10 = 0, HTTP11 = 1, HTTP2 = 2.
    #[prost(int32, tag = "1")]
    upstream_protocol: i32,
    #[prost(string, repeated, tag = "2")]
    alpn_override: Vec<String>,
}

/// An ALPN list, as rustls takes it.
pub type AlpnList = Arc<[Vec<u8>]>;

/// The HTTP protocols an upstream request may go in, as the filter keys its overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.0.
    Http10,
    /// HTTP/1.1.
    Http11,
    /// HTTP/2.
    Http2,
}

/// The compiled filter: an ALPN list per upstream protocol (none: the cluster's own).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlpnOverrides {
    by_protocol: [Option<AlpnList>; 3],
}

impl AlpnOverrides {
    /// The list a request going upstream in `protocol` offers instead of the cluster's.
    pub fn get(&self, protocol: UpstreamProtocol) -> Option<&AlpnList> {
        self.by_protocol[protocol as usize].as_ref()
    }
}

/// Compiles the filter's config.
pub fn compile(fields: Fields<'_>) -> Result<AlpnOverrides, ConfigError> {
    let pairs: Vec<(i32, Vec<String>)> = match fields {
        Fields::Proto(bytes) => {
            let proto: FilterConfigProto =
                prost::Message::decode(bytes).map_err(|e| super::decode_error(FILTER_CONFIG, e))?;
            proto
                .alpn_override
                .into_iter()
                .map(|o| (o.upstream_protocol, o.alpn_override))
                .collect()
        }
        Fields::Json(value) => from_json(&value)?,
    };
    let mut out = AlpnOverrides::default();
    for (i, (protocol, list)) in pairs.into_iter().enumerate() {
        let slot = usize::try_from(protocol)
            .ok()
            .filter(|p| *p < 3)
            .ok_or_else(|| {
                ConfigError::new(
                    format!("alpn_override[{i}].upstream_protocol"),
                    format!("unknown upstream protocol {protocol}"),
                )
            })?;
        // Envoy keeps the first entry for a protocol; an empty list overrides nothing.
        if out.by_protocol[slot].is_none() && !list.is_empty() {
            out.by_protocol[slot] = Some(list.into_iter().map(String::into_bytes).collect());
        }
    }
    Ok(out)
}

/// The (protocol, list) pairs of the JSON form.
fn from_json(value: &Value) -> Result<Vec<(i32, Vec<String>)>, ConfigError> {
    let Some(list) = field(value, "alpn_override") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| ConfigError::new("alpn_override", "expected a list"))?;
    list.iter()
        .enumerate()
        .map(|(i, entry)| {
            let at = format!("alpn_override[{i}]");
            let protocol = match field(entry, "upstream_protocol") {
                None => 0,
                Some(Value::String(s)) => match s.as_str() {
                    "HTTP10" => 0,
                    "HTTP11" => 1,
                    "HTTP2" => 2,
                    other => {
                        return Err(ConfigError::new(
                            format!("{at}.upstream_protocol"),
                            format!("unknown upstream protocol {other}"),
                        ));
                    }
                },
                Some(Value::Number(n)) => n.as_i64().map_or(-1, |n| n as i32),
                Some(_) => -1,
            };
            let alpn = match field(entry, "alpn_override") {
                None => Vec::new(),
                Some(v) => strings(v, &format!("{at}.alpn_override"))?,
            };
            Ok((protocol, alpn))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn list(p: &[&str]) -> Option<AlpnList> {
        Some(p.iter().map(|s| s.as_bytes().to_vec()).collect())
    }

    #[test]
    fn istiods_proto_config_maps_each_protocol_to_its_list() {
        let proto = FilterConfigProto {
            alpn_override: vec![
                AlpnOverrideProto {
                    upstream_protocol: 0,
                    alpn_override: vec!["istio-http/1.0".into(), "istio".into()],
                },
                AlpnOverrideProto {
                    upstream_protocol: 2,
                    alpn_override: vec!["istio-h2".into()],
                },
                AlpnOverrideProto {
                    upstream_protocol: 2,
                    alpn_override: vec!["second".into()],
                },
            ],
        };
        let c = compile(Fields::Proto(&proto.encode_to_vec())).unwrap();
        assert_eq!(
            c.get(UpstreamProtocol::Http10),
            list(&["istio-http/1.0", "istio"]).as_ref()
        );
        assert_eq!(c.get(UpstreamProtocol::Http11), None);
        assert_eq!(c.get(UpstreamProtocol::Http2), list(&["istio-h2"]).as_ref());
    }

    #[test]
    fn the_json_form_reads_enum_names_and_both_field_spellings() {
        let v = serde_json::json!({"alpnOverride": [
            {"alpnOverride": ["istio-http/1.0"]},
            {"upstream_protocol": "HTTP11", "alpn_override": ["istio-http/1.1"]},
            {"upstreamProtocol": 2, "alpnOverride": []},
        ]});
        let c = compile(Fields::Json(v)).unwrap();
        assert_eq!(
            c.get(UpstreamProtocol::Http10),
            list(&["istio-http/1.0"]).as_ref()
        );
        assert_eq!(
            c.get(UpstreamProtocol::Http11),
            list(&["istio-http/1.1"]).as_ref()
        );
        assert_eq!(c.get(UpstreamProtocol::Http2), None);
    }

    #[test]
    fn an_unknown_protocol_is_an_error_naming_the_entry() {
        let v = serde_json::json!({"alpn_override": [{}, {"upstream_protocol": "HTTP3"}]});
        let e = compile(Fields::Json(v)).unwrap_err();
        assert_eq!(e.path, "alpn_override[1].upstream_protocol");
    }
}
