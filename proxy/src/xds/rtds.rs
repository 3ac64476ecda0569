//! RTDS over ADS: each `envoy.service.runtime.v3.Runtime` resource is the layer of the
//! bootstrap's `rtds_layer` of that name, its `layer` Struct compiled as a static layer's
//! (`config::runtime::compile_layer`) and set in the live runtime; one that does not compile
//! is rejected (NACKed) and the layer keeps what it had. Start-up waits for every RTDS layer's
//! first answer, accepted or rejected, as Envoy's init targets do (see the handler's phases).
//! Every layer's subscription counts in the same `runtime.update_*` stats, as Envoy's (each
//! subscription's scope is `runtime.`).

use std::collections::BTreeSet;
use std::time::Instant;

use prost::Message;
use proto::pb::envoy::service::runtime::v3::Runtime;
use xds_client::{Applied, Rejected, Update};

use super::records::{Changes, Records, Status};
use super::stats::UpdateStats;
use crate::config::runtime::compile_layer;
use crate::runtime::LiveRuntime;

/// Type URL of `envoy.service.runtime.v3.Runtime` resources (RTDS).
pub const RUNTIME_TYPE_URL: &str = "type.googleapis.com/envoy.service.runtime.v3.Runtime";

/// The subscriptions' stats (`runtime.update_*`, `runtime.version`...) in `store`.
pub fn stats(store: &crate::stats::Store) -> UpdateStats {
    UpdateStats::new(store, "runtime")
}

/// Applies the RTDS update `u` (over Delta when `delta`) to `runtime`, recording it in
/// `records` and counting each resource's outcome in `stats`; each resource that answered
/// (accepted or not) leaves `pending`.
pub fn apply(
    runtime: &LiveRuntime,
    records: &mut Records,
    pending: &mut BTreeSet<String>,
    (stats, delta): (&UpdateStats, bool),
    u: Update,
) -> Applied {
    let names: Vec<String> = runtime
        .rtds_layers()
        .iter()
        .map(|l| l.name.clone())
        .collect();
    let mut rejected = Vec::new();
    let mut changes = Changes::default();
    for r in u.resources {
        let since = Instant::now();
        pending.remove(&r.name);
        if records.unchanged(&r.name, &r.value) {
            records.resent(&r.name);
            stats.accepted(&u.version_info, since);
            continue;
        }
        let compiled = Runtime::decode(r.value.clone())
            .map_err(|e| format!("runtime '{}': cannot decode: {e}", r.name))
            .and_then(|rt| {
                if !names.contains(&rt.name) {
                    return Err(format!(
                        "Unexpected RTDS runtime (expecting {}): {}",
                        names.join(", "),
                        rt.name
                    ));
                }
                compile_layer(&rt.layer.unwrap_or_default())
                    .map_err(|e| format!("runtime '{}': {}", rt.name, e.message))
            });
        match compiled {
            Ok(values) => {
                runtime.set_rtds(&r.name, Some(values));
                stats.accepted(&u.version_info, since);
                changes.note(records, &r.name);
                records.accept(&r.name, &r.version, r.value, Status::Acked);
            }
            Err(reason) => {
                tracing::warn!(resource = %r.name, version = %r.version, "rejected: {reason}");
                stats.rejected(delta);
                records.reject(&r.name, &r.version, r.value, &reason);
                rejected.push(Rejected {
                    name: r.name,
                    reason,
                });
            }
        }
    }
    for name in u.removed {
        stats.accepted(&u.version_info, Instant::now());
        pending.remove(&name);
        runtime.set_rtds(&name, None);
        records.remove(&name);
    }
    changes.answer(rejected)
}
