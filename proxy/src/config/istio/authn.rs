//! `istio_authn`, the network filter istiod releases of the 1.2x series put first on inbound
//! filter chains (io.istio.network.authn.Config): once a TLS handshake in which the peer presented a
//! certificate completes, the first `spiffe://` URI SAN of the peer's certificate and of this
//! side's become the connection's filter state `io.istio.peer_principal` and
//! `io.istio.local_principal`, which istiod's RBAC rules for AuthorizationPolicy `principals`
//! and `namespaces` match (`crate::filter_state` names them; `crate::tls::PeerTls` holds them).

use serde_json::Value;

use super::Fields;
use crate::config::ConfigError;

/// The message's fully qualified name.
pub const CONFIG: &str = "io.istio.network.authn.Config";

/// Whether `key` is one the filter sets (the only filter state revoy has).
pub fn sets(key: &str) -> bool {
    crate::filter_state::KEYS.contains(&key)
}

#[derive(Clone, PartialEq, prost::Message)]
struct ConfigProto {
    /// `shared`: the principals are also shared with the upstream connection (an Envoy
    /// pooling hint; revoy's upstream connections never read them).
    #[prost(bool, tag = "1")]
    shared: bool,
}

/// Checks the filter's config (it has no field revoy acts on): a field it does not have is
/// an error naming it.
pub fn compile(fields: Fields<'_>) -> Result<(), ConfigError> {
    match fields {
        Fields::Proto(bytes) => {
            let _: ConfigProto =
                prost::Message::decode(bytes).map_err(|e| super::decode_error(CONFIG, e))?;
        }
        Fields::Json(Value::Object(object)) => {
            if let Some(unknown) = object.keys().find(|k| k.as_str() != "shared") {
                return Err(ConfigError::new(
                    unknown.as_str(),
                    format!("{CONFIG} has no field '{unknown}'"),
                ));
            }
        }
        Fields::Json(other) => {
            return Err(ConfigError::new(
                "",
                format!("{CONFIG}: expected an object, got {other}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istiods_empty_config_and_shared_are_accepted() {
        assert!(compile(Fields::Json(serde_json::json!({}))).is_ok());
        assert!(compile(Fields::Json(serde_json::json!({"shared": true}))).is_ok());
        assert!(compile(Fields::Proto(&[0x08, 0x01])).is_ok());
    }

    #[test]
    fn an_unknown_field_is_named() {
        let e = compile(Fields::Json(serde_json::json!({"peers": []}))).unwrap_err();
        assert!(e.to_string().contains("peers"), "{e}");
    }
}
