//! A message kept in its binary wire form.

use std::fmt;
use std::marker::PhantomData;

/// A protobuf message stored encoded, for readers that are rare next to its size in memory
/// (`/config_dump`, change detection). A decoded Envoy `Cluster` is about 3.4 KB of mostly empty
/// fields; encoded it is the size of what was configured. Decoded again on demand.
pub struct Encoded<T> {
    bytes: bytes::Bytes,
    message: PhantomData<fn() -> T>,
}

impl<T: prost::Message + Default> Encoded<T> {
    /// Encodes `message`.
    pub fn new(message: &T) -> Self {
        Encoded {
            bytes: message.encode_to_vec().into(),
            message: PhantomData,
        }
    }

    /// Keeps `bytes`, which decode as a `T` (an xDS resource as received: the record of it
    /// and the compiled config then share one buffer).
    pub fn from_encoded(bytes: bytes::Bytes) -> Self {
        Encoded {
            bytes,
            message: PhantomData,
        }
    }

    /// The message, decoded.
    pub fn decode(&self) -> T {
        T::decode(&*self.bytes).expect("bytes encoded from a valid message decode")
    }
}

impl<T> Clone for Encoded<T> {
    fn clone(&self) -> Self {
        Encoded {
            bytes: self.bytes.clone(),
            message: PhantomData,
        }
    }
}

/// Equal when the messages are equal. Equal bytes settle it at once; otherwise both sides are
/// decoded and compared, because two encodings of one message may differ (map fields are
/// written in hash order).
impl<T: prost::Message + Default + PartialEq> PartialEq for Encoded<T> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes || self.decode() == other.decode()
    }
}

impl<T> fmt::Debug for Encoded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Encoded({} bytes)", self.bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::config::cluster::v3::Cluster;

    #[test]
    fn round_trips_and_compares_by_content() {
        let a = Cluster {
            name: "a".into(),
            ..Default::default()
        };
        let enc = Encoded::new(&a);
        assert_eq!(enc.decode(), a);
        assert_eq!(enc, Encoded::new(&a.clone()));
        let b = Cluster {
            name: "b".into(),
            ..Default::default()
        };
        assert_ne!(enc, Encoded::new(&b));
    }

    #[test]
    fn equal_messages_with_maps_compare_equal() {
        use crate::pb::envoy::config::core::v3::Metadata;
        use crate::pb::google::protobuf::Struct;
        let with = |keys: &[&str]| Cluster {
            metadata: Some(Metadata {
                filter_metadata: keys
                    .iter()
                    .map(|k| (k.to_string(), Struct::default()))
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let keys: Vec<String> = (0..32).map(|i| format!("k{i}")).collect();
        let forward: Vec<&str> = keys.iter().map(String::as_str).collect();
        let backward: Vec<&str> = forward.iter().rev().copied().collect();
        assert_eq!(
            Encoded::new(&with(&forward)),
            Encoded::new(&with(&backward))
        );
        assert_ne!(
            Encoded::new(&with(&forward)),
            Encoded::new(&with(&forward[1..]))
        );
    }
}
