//! Peers' workloads by the `x-envoy-peer-metadata` value that carried them. A sidecar sends
//! the same value on every request and response, so each is decoded (base64, then a
//! protobuf `Struct`) once rather than per request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::config::istio::workload::Workload;

/// How many values are kept; when a new one would exceed it, the cache starts over (a
/// sidecar talks to few peers, and a downstream that sends a new value every time must not
/// grow it without bound).
const CAPACITY: usize = 256;

/// Decoded peer metadata by header value, shared by a metadata exchange's requests.
#[derive(Debug, Default)]
pub struct PeerCache(Mutex<HashMap<Box<[u8]>, Arc<Workload>>>);

impl PeerCache {
    /// The workload `value` describes, `None` when it is not valid peer metadata.
    pub fn workload(&self, value: &[u8]) -> Option<Arc<Workload>> {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(workload) = known.get(value) {
            return Some(workload.clone());
        }
        let workload = Arc::new(Workload::from_header(value)?);
        if known.len() >= CAPACITY {
            known.clear();
        }
        known.insert(value.into(), workload.clone());
        Some(workload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(workload: &str) -> String {
        use base64::Engine;
        let w = Workload {
            workload: workload.into(),
            namespace: "default".into(),
            ..Default::default()
        };
        base64::engine::general_purpose::STANDARD.encode(w.to_struct_bytes())
    }

    #[test]
    fn a_value_seen_again_is_the_same_workload_and_a_new_one_is_decoded() {
        let cache = PeerCache::default();
        let a = cache.workload(header("a").as_bytes()).unwrap();
        assert_eq!(a.workload, "a");
        assert!(Arc::ptr_eq(
            &a,
            &cache.workload(header("a").as_bytes()).unwrap()
        ));
        assert_eq!(
            cache.workload(header("b").as_bytes()).unwrap().workload,
            "b"
        );
        assert!(cache.workload(b"not base64!").is_none());
    }

    #[test]
    fn it_starts_over_when_full() {
        let cache = PeerCache::default();
        let first = cache.workload(header("w0").as_bytes()).unwrap();
        for i in 1..=CAPACITY {
            cache.workload(header(&format!("w{i}")).as_bytes()).unwrap();
        }
        let again = cache.workload(header("w0").as_bytes()).unwrap();
        assert!(
            !Arc::ptr_eq(&first, &again),
            "w0 was dropped and decoded anew"
        );
        assert_eq!(again.workload, "w0");
        assert!(cache.0.lock().unwrap().len() <= CAPACITY);
    }
}
