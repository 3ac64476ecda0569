//! A LDS resource from a control plane (protobuf bytes), decoded and compiled as the xDS
//! handler does: refused with a reason, never a panic in the xDS thread.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = revoy::fuzzing::lds_resource(data);
});
