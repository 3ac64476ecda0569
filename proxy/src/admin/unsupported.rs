//! Envoy's POST-only admin endpoints for things revoy does not have (profilers, runtime
//! overrides, stat-name lookup recording), answered as Envoy 1.40 answers them where that
//! answer is true of revoy too (probed: a build without gperftools refuses to start the CPU
//! profiler and has no heap profiler), and with a 501 naming what is missing otherwise.

use super::{AdminRequest, AdminResponse, text};
use crate::process::Process;

const ENABLE_USAGE: &str = "?enable=<y|n>\n";

/// `enable=y` or `enable=n` as the only parameter, as Envoy's profiler handlers require.
fn enable(req: &AdminRequest) -> Option<bool> {
    match req.params.as_slice() {
        [(name, value)] if name == "enable" && value == "y" => Some(true),
        [(name, value)] if name == "enable" && value == "n" => Some(false),
        _ => None,
    }
}

/// `/cpuprofiler?enable=<y|n>`: there is no CPU profiler to start; stopping one that never ran
/// is fine.
pub fn cpu_profiler(req: &AdminRequest) -> AdminResponse {
    match enable(req) {
        None => text(400, ENABLE_USAGE),
        Some(true) => text(500, "failure to start the profiler"),
        Some(false) => text(200, "OK\n"),
    }
}

/// `/heapprofiler`: not in this build.
pub fn heap_profiler() -> AdminResponse {
    text(501, "The current build does not support heap profiler")
}

/// `/allocprofiler?enable=<y|n>`: no allocation profiler, so none was ever started.
pub fn alloc_profiler(req: &AdminRequest) -> AdminResponse {
    match enable(req) {
        None => text(400, ENABLE_USAGE),
        Some(true) => text(501, "revoy has no allocation profiler"),
        Some(false) => text(400, "Allocation profiler is not started"),
    }
}

/// `/runtime_modify?key=value...`: Envoy's usage without parameters, and its refusal when the
/// bootstrap has no admin runtime layer; revoy applies no runtime overrides at all, so with
/// such a layer it says so.
pub fn runtime_modify(req: &AdminRequest, process: &Process) -> AdminResponse {
    use proto::pb::envoy::config::bootstrap::v3::runtime_layer::LayerSpecifier;
    if req.params.is_empty() {
        return text(
            400,
            "usage: /runtime_modify?key1=value1&key2=value2&keyN=valueN\n       \
             or send the parameters as form values\n\
             use an empty value to remove a previously added override",
        );
    }
    let admin_layer = process
        .bootstrap
        .proto
        .decode()
        .layered_runtime
        .is_some_and(|r| {
            r.layers
                .iter()
                .any(|l| matches!(l.layer_specifier, Some(LayerSpecifier::AdminLayer(_))))
        });
    if admin_layer {
        text(501, "revoy does not apply runtime overrides")
    } else {
        text(503, "No admin layer specified")
    }
}

/// `/stats/recentlookups/clear` and `/disable`: revoy records no lookups, so there is nothing
/// to clear and recording is off; `/enable` cannot turn it on.
pub fn recent_lookups(path: &str) -> AdminResponse {
    if path.ends_with("/enable") {
        text(501, "revoy does not record stat-name lookups")
    } else {
        text(200, "OK\n")
    }
}
