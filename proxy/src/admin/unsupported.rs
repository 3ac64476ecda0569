//! Envoy's POST-only admin endpoints for things revoy does not have (profilers, runtime
//! overrides, stat-name lookup recording), answered as Envoy 1.40 answers them where that
//! answer is true of revoy too (probed: a build without gperftools refuses to start the CPU
//! profiler and has no heap profiler), and with a 501 naming what is missing otherwise.

use super::{AdminRequest, AdminResponse, text};

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

/// `/stats/recentlookups/clear` and `/disable`: revoy records no lookups, so there is nothing
/// to clear and recording is off; `/enable` cannot turn it on.
pub fn recent_lookups(path: &str) -> AdminResponse {
    if path.ends_with("/enable") {
        text(501, "revoy does not record stat-name lookups")
    } else {
        text(200, "OK\n")
    }
}
