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

/// The fully qualified message name in a type URL (`type.googleapis.com/a.b.C` -> `a.b.C`).
pub fn type_name_of(type_url: &str) -> &str {
    type_url.rsplit('/').next().unwrap_or(type_url)
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
