//! A message kept in its binary wire form.

use std::fmt;
use std::marker::PhantomData;

/// A protobuf message stored encoded, for readers that are rare next to its size in memory
/// (`/config_dump`, change detection). A decoded Envoy `Cluster` is about 3.4 KB of mostly empty
/// fields; encoded it is the size of what was configured. Decoded again on demand.
pub struct Encoded<T> {
    bytes: Box<[u8]>,
    message: PhantomData<fn() -> T>,
}

impl<T: prost::Message + Default> Encoded<T> {
    /// Encodes `message`.
    pub fn new(message: &T) -> Self {
        Encoded {
            bytes: message.encode_to_vec().into_boxed_slice(),
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

/// Equal encodings mean equal messages. (Two encodings of one message with a map field may
/// differ in entry order, which makes them compare unequal: callers use this only to skip
/// unchanged work, where a false "changed" costs a rebuild, never a wrong result.)
impl<T> PartialEq for Encoded<T> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl<T> Eq for Encoded<T> {}

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
}
