//! Istio's peer metadata from another workload: an `x-envoy-peer-metadata` header value (base64
//! Struct, first byte 0) or the payload of the TCP metadata exchange frame (first byte 1).
#![no_main]

use libfuzzer_sys::fuzz_target;
use revoy::config::istio::workload::{Workload, exchanged_workload};

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((0, value)) => drop(Workload::from_header(value)),
        Some((_, payload)) => drop(exchanged_workload(payload)),
        None => {}
    }
});
