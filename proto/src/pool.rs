//! The descriptor pool behind proto3-JSON decoding: envoy-types' FileDescriptorSet plus the
//! TypedStruct files it lacks.

use prost_reflect::DescriptorPool;

static ENVOY_FDS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_types.bin"));

/// Builds a fresh pool. It is large (tens of MB), so callers keep it only while decoding.
pub(crate) fn build() -> DescriptorPool {
    let mut pool =
        DescriptorPool::decode(ENVOY_FDS).expect("envoy-types ships a valid descriptor set");
    for file in crate::typed_struct::descriptor_files() {
        let name = file.package().to_owned() + ".TypedStruct";
        if pool.get_message_by_name(&name).is_none() {
            pool.add_file_descriptor_proto(file)
                .expect("TypedStruct descriptor is valid");
        }
    }
    pool
}
