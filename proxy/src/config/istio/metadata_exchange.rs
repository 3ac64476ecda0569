//! `istio.metadata_exchange` as a network filter (envoy.tcp.metadataexchange.config.
//! MetadataExchange): on a downstream chain (inbound) or in a cluster's `filters`
//! (`envoy.filters.network.upstream.metadata_exchange`, outbound), a TLS connection that
//! negotiated the configured ALPN (`istio-peer-exchange`) starts with each side's exchange
//! frame (see [`super::workload::exchange_frame`]) before the application's bytes.

use serde_json::Value;

use super::{Fields, field};
use crate::config::ConfigError;

/// The message's fully qualified name.
pub const CONFIG: &str = "envoy.tcp.metadataexchange.config.MetadataExchange";

#[derive(Clone, PartialEq, prost::Message)]
struct ConfigProto {
    #[prost(string, tag = "1")]
    protocol: String,
}

/// The compiled filter: the ALPN protocol that turns the exchange on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpExchange {
    /// `protocol` (istiod sets `istio-peer-exchange`).
    pub protocol: Vec<u8>,
}

/// Compiles the filter's config.
pub fn compile(fields: Fields<'_>) -> Result<TcpExchange, ConfigError> {
    let protocol = match fields {
        Fields::Proto(bytes) => {
            let p: ConfigProto =
                prost::Message::decode(bytes).map_err(|e| super::decode_error(CONFIG, e))?;
            p.protocol
        }
        Fields::Json(value) => field(&value, "protocol")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    };
    Ok(TcpExchange {
        protocol: protocol.into_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istiods_config_names_the_alpn() {
        let v = serde_json::json!({"protocol": "istio-peer-exchange"});
        assert_eq!(
            compile(Fields::Json(v)).unwrap().protocol,
            b"istio-peer-exchange"
        );
    }
}
