//! Packing and unpacking `google.protobuf.Any` (envoy-types' own copy of the WKTs).

use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};

/// Why an `Any` could not be unpacked into the requested message type.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The Any holds another type than the one asked for.
    #[error("expected {expected}, got {actual}")]
    WrongType {
        /// Fully qualified name asked for.
        expected: String,
        /// The Any's type URL.
        actual: String,
    },
    /// The bytes are not a valid encoding of the type.
    #[error("invalid {type_name}: {source}")]
    Decode {
        /// Fully qualified name of the type.
        type_name: String,
        /// The protobuf decoding error.
        source: prost::DecodeError,
    },
}

/// The type URL an empty JSON Any (`{}`) decodes to: Envoy takes it as an Any of no type.
pub const EMPTY_ANY: &str = "type.googleapis.com/google.protobuf.Empty";

/// Whether `any` is empty: no type, or the [`EMPTY_ANY`] an empty JSON object decodes to.
pub fn is_empty_any(any: &Any) -> bool {
    any.type_url.is_empty() || (any.type_url == EMPTY_ANY && any.value.is_empty())
}

/// The fully qualified message name in a type URL (`type.googleapis.com/a.b.C` -> `a.b.C`).
pub fn type_name_of(type_url: &str) -> &str {
    type_url.rsplit('/').next().unwrap_or(type_url)
}

/// The fully qualified name of the extension config `any` stands for: its own type, or, for a
/// TypedStruct (how the codec keeps a type this build does not know), the type it carries.
pub fn extension_type(any: &Any) -> String {
    let name = type_name_of(&any.type_url);
    if (name == crate::UDPA_TYPED_STRUCT || name == crate::XDS_TYPED_STRUCT)
        && let Ok(ts) = crate::TypedStruct::decode(any.value.as_slice())
    {
        return type_name_of(&ts.type_url).to_owned();
    }
    name.to_owned()
}

/// Decodes `any` as a `T`, checking the type URL first.
pub fn unpack<T: Message + Name + Default>(any: &Any) -> Result<T, UnpackError> {
    if type_name_of(&any.type_url) != T::full_name() {
        return Err(UnpackError::WrongType {
            expected: T::full_name(),
            actual: any.type_url.clone(),
        });
    }
    T::decode(any.value.as_slice()).map_err(|source| UnpackError::Decode {
        type_name: T::full_name(),
        source,
    })
}

/// Wraps `msg` in an Any with its `type.googleapis.com/...` URL.
pub fn pack<T: Message + Name>(msg: &T) -> Any {
    Any {
        type_url: T::type_url(),
        value: msg.encode_to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_struct_stands_for_the_type_it_carries() {
        let ts = crate::TypedStruct {
            type_url: "type.googleapis.com/acme.authz.v1.Config".into(),
            value: None,
        };
        let any = Any {
            type_url: format!("type.googleapis.com/{}", crate::XDS_TYPED_STRUCT),
            value: ts.encode_to_vec(),
        };
        assert_eq!(extension_type(&any), "acme.authz.v1.Config");
        let plain = Any {
            type_url: "type.googleapis.com/a.b.C".into(),
            value: Vec::new(),
        };
        assert_eq!(extension_type(&plain), "a.b.C");
    }
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::listener::v3::Listener;

    #[test]
    fn pack_then_unpack_round_trips_and_checks_type() {
        let c = Cluster {
            name: "web".into(),
            ..Default::default()
        };
        let any = pack(&c);
        assert_eq!(
            any.type_url,
            "type.googleapis.com/envoy.config.cluster.v3.Cluster"
        );
        assert_eq!(unpack::<Cluster>(&any).unwrap().name, "web");
        let err = unpack::<Listener>(&any).unwrap_err();
        assert!(
            err.to_string()
                .contains("expected envoy.config.listener.v3.Listener")
        );
    }
}
