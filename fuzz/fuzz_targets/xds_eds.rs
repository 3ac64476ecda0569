//! An EDS resource (ClusterLoadAssignment protobuf bytes) from a control plane, decoded and
//! compiled for a plaintext EDS cluster as the xDS handler does.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use revoy::config::cluster::ClusterConfig;

/// An EDS cluster's `Cluster` in protobuf: name `c` (field 1), type EDS (field 2 = 3), and
/// `eds_cluster_config` (field 3) whose `eds_config` (field 1) is `ads` (field 3).
const EDS_CLUSTER: &[u8] = b"\x0a\x01c\x10\x03\x1a\x04\x0a\x02\x1a\x00";

static CLUSTER: LazyLock<ClusterConfig> =
    LazyLock::new(|| revoy::fuzzing::cds_resource(EDS_CLUSTER).expect("the EDS cluster compiles"));

fuzz_target!(|data: &[u8]| {
    let _ = revoy::fuzzing::eds_resource(data, &CLUSTER);
});
