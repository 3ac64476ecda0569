//! What the server serves: a version plus, per type URL, resources by name.

use std::collections::BTreeMap;
use std::sync::Arc;

use proto::pb::google::protobuf::Any;

use crate::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL};

/// One resource of a snapshot: the packed message and its own version (a hash of its bytes,
/// which Delta compares with the version a client holds).
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotResource {
    /// The resource, packed.
    pub any: Arc<Any>,
    /// A hash of the type URL and bytes, in hex.
    pub version: String,
}

impl SnapshotResource {
    /// Wraps `any`, computing its version.
    pub fn new(any: Any) -> Self {
        let mut h = Fnv::new();
        h.write(any.type_url.as_bytes());
        h.write(&[0]);
        h.write(&any.value);
        SnapshotResource {
            version: h.hex(),
            any: Arc::new(any),
        }
    }
}

/// An immutable set of resources the server hands to every client.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    version: String,
    types: BTreeMap<String, BTreeMap<String, SnapshotResource>>,
}

impl Snapshot {
    /// An empty snapshot with this version (sent as `version_info` / `system_version_info`).
    pub fn new(version: impl Into<String>) -> Self {
        Snapshot {
            version: version.into(),
            types: BTreeMap::new(),
        }
    }

    /// Adds (or replaces) resource `name` of `type_url`. The Any's own type URL is kept as
    /// is, so a test can serve a resource of the wrong type on purpose.
    pub fn with(mut self, type_url: &str, name: impl Into<String>, any: Any) -> Self {
        self.insert(type_url, name.into(), any);
        self
    }

    /// Adds a typed message under its own type URL.
    pub fn with_message<T: prost::Message + prost::Name>(
        self,
        name: impl Into<String>,
        msg: &T,
    ) -> Self {
        let any = proto::pack(msg);
        let type_url = any.type_url.clone();
        self.with(&type_url, name, any)
    }

    /// Adds (or replaces) resource `name` of `type_url`; answers the one it replaced.
    pub fn insert(&mut self, type_url: &str, name: String, any: Any) -> Option<SnapshotResource> {
        self.insert_resource(type_url, name, SnapshotResource::new(any))
    }

    /// Adds (or replaces) resource `name` of `type_url` with its version given, for a
    /// resource whose encoding is not canonical (a `Struct` or another map encodes its entries
    /// in no fixed order): the version of its source then keeps equal content at one version.
    pub fn insert_versioned(
        &mut self,
        type_url: &str,
        name: String,
        any: Any,
        version: String,
    ) -> Option<SnapshotResource> {
        let resource = SnapshotResource {
            any: Arc::new(any),
            version,
        };
        self.insert_resource(type_url, name, resource)
    }

    fn insert_resource(
        &mut self,
        type_url: &str,
        name: String,
        resource: SnapshotResource,
    ) -> Option<SnapshotResource> {
        self.types
            .entry(type_url.to_owned())
            .or_default()
            .insert(name, resource)
    }

    /// Sets the version (e.g. to a hash of the content once every resource is in).
    pub fn set_version(&mut self, version: impl Into<String>) {
        self.version = version.into();
    }

    /// The snapshot's version.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The resources of one type, by name (empty if the type has none).
    pub fn resources(&self, type_url: &str) -> &BTreeMap<String, SnapshotResource> {
        static EMPTY: BTreeMap<String, SnapshotResource> = BTreeMap::new();
        self.types.get(type_url).unwrap_or(&EMPTY)
    }

    /// The type URLs that have resources, with their counts.
    pub fn counts(&self) -> Vec<(&str, usize)> {
        self.types
            .iter()
            .filter(|(_, r)| !r.is_empty())
            .map(|(t, r)| (t.as_str(), r.len()))
            .collect()
    }

    /// A hash of every type, name and resource version, in hex: equal content, equal hash.
    pub fn content_hash(&self) -> String {
        let mut h = Fnv::new();
        for (type_url, resources) in &self.types {
            for (name, r) in resources {
                for part in [type_url, name, &r.version] {
                    h.write(part.as_bytes());
                    h.write(&[0]);
                }
            }
        }
        h.hex()
    }
}

/// The order in which a snapshot change is pushed to a client: CDS, EDS, LDS, RDS (clusters
/// warm before the listeners that use them, as istiod and go-control-plane do), then any other
/// type in `types`' order.
pub fn push_order<'a>(types: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    const FIRST: [&str; 4] = [
        CLUSTER_TYPE_URL,
        ENDPOINT_TYPE_URL,
        LISTENER_TYPE_URL,
        ROUTE_TYPE_URL,
    ];
    let mut types: Vec<&str> = types.into_iter().collect();
    types.sort_by_key(|t| FIRST.iter().position(|f| f == t).unwrap_or(FIRST.len()));
    types
}

/// 64-bit FNV-1a: a hash that stays the same across builds and runs (versions a client keeps
/// and sends back in `initial_resource_versions` must still match after a server restart).
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub(crate) fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_order_puts_clusters_first_and_keeps_the_rest_in_order() {
        let order = push_order([
            "b",
            ROUTE_TYPE_URL,
            LISTENER_TYPE_URL,
            "a",
            ENDPOINT_TYPE_URL,
            CLUSTER_TYPE_URL,
        ]);
        assert_eq!(
            order,
            [
                CLUSTER_TYPE_URL,
                ENDPOINT_TYPE_URL,
                LISTENER_TYPE_URL,
                ROUTE_TYPE_URL,
                "b",
                "a"
            ]
        );
    }

    #[test]
    fn resource_versions_follow_the_bytes() {
        let any = |v: &[u8]| Any {
            type_url: "t".into(),
            value: v.to_vec(),
        };
        let a = SnapshotResource::new(any(b"x"));
        assert_eq!(a.version, SnapshotResource::new(any(b"x")).version);
        assert_ne!(a.version, SnapshotResource::new(any(b"y")).version);
        let s1 = Snapshot::new("1").with("t", "a", any(b"x"));
        let s2 = Snapshot::new("2").with("t", "a", any(b"x"));
        assert_eq!(s1.content_hash(), s2.content_hash());
        assert_ne!(
            s1.content_hash(),
            s2.with("t", "b", any(b"x")).content_hash()
        );
    }
}
