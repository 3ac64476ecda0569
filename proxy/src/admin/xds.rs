//! What xDS delivered, for admin: the dynamic sections of `/config_dump` (every resource with
//! its version, update time, client status and — for every type, not only listeners as in
//! Envoy — its last rejection; a listener's old version while it drains), `/init_dump`, and
//! revoy's own `/xds` (each stream's state and the last pushes with their ACK or NACK).

use std::collections::BTreeMap;
use std::time::SystemTime;

use proto::pack;
use proto::pb::envoy::admin::v3::{
    ClientResourceStatus, ClustersConfigDump, EndpointsConfigDump, ListenersConfigDump,
    RoutesConfigDump, UpdateFailureState,
    clusters_config_dump::DynamicCluster,
    endpoints_config_dump::{DynamicEndpointConfig, StaticEndpointConfig},
    listeners_config_dump::{DynamicListener, DynamicListenerState},
    routes_config_dump::DynamicRouteConfig,
};
use proto::pb::google::protobuf::Timestamp;
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL};

use crate::process::Process;
use crate::xds::Xds;
use crate::xds::handler::{Phase, any};
use crate::xds::records::{Record, Serving, Status};

/// A protobuf timestamp (millisecond precision, as Envoy's).
pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: (d.subsec_millis() * 1_000_000) as i32,
    }
}

fn client_status(r: &Record) -> i32 {
    (match r.status {
        Status::Acked => ClientResourceStatus::Acked,
        Status::Nacked => ClientResourceStatus::Nacked,
        Status::Warming => ClientResourceStatus::Requested,
        Status::DoesNotExist => ClientResourceStatus::DoesNotExist,
    }) as i32
}

fn error_state(type_url: &str, r: &Record) -> Option<UpdateFailureState> {
    r.error.as_ref().map(|e| UpdateFailureState {
        failed_configuration: Some(any(type_url, &e.value)),
        last_update_attempt: Some(timestamp(e.at)),
        details: e.reason.clone(),
        version_info: e.version.clone(),
    })
}

/// Adds the dynamic listeners, clusters and route configurations to the dump's sections.
pub fn fill_dump(
    xds: Option<&Xds>,
    listeners: &mut ListenersConfigDump,
    clusters: &mut ClustersConfigDump,
    routes: &mut RoutesConfigDump,
) {
    let Some(xds) = xds else {
        return;
    };
    xds.handler.with_state(|st| {
        listeners.version_info = st.lds_version.clone();
        clusters.version_info = st.cds_version.clone();
        let dump_state = |s: &Serving| DynamicListenerState {
            version_info: s.version.to_string(),
            listener: Some(any(LISTENER_TYPE_URL, &s.value)),
            last_updated: Some(timestamp(s.at)),
        };
        let mut dynamic: BTreeMap<&str, DynamicListener> = BTreeMap::new();
        for (name, r) in st.listeners.iter() {
            // An update warming while the previous version serves: both are shown (and a
            // rejection since, as its error state).
            let warming = st
                .listener_warms(name)
                .then(|| {
                    r.value.as_ref().map(|v| DynamicListenerState {
                        version_info: r.version.to_string(),
                        listener: Some(any(LISTENER_TYPE_URL, v)),
                        last_updated: Some(timestamp(r.last_updated)),
                    })
                })
                .flatten();
            dynamic.insert(
                name,
                DynamicListener {
                    name: name.clone(),
                    active_state: r.active().as_ref().map(dump_state),
                    warming_state: warming,
                    draining_state: None,
                    error_state: error_state(LISTENER_TYPE_URL, r),
                    client_status: client_status(r),
                },
            );
        }
        // A removed listener still draining has an entry of its own, with no client status
        // (as in Envoy).
        for (name, s) in st.draining_listeners.shown() {
            let entry = dynamic.entry(name).or_insert_with(|| DynamicListener {
                name: name.clone(),
                ..Default::default()
            });
            entry.draining_state = Some(dump_state(s));
        }
        listeners.dynamic_listeners.extend(dynamic.into_values());
        for (_, r) in st.clusters.iter() {
            let dynamic = DynamicCluster {
                version_info: r.version.to_string(),
                cluster: r.value.as_ref().map(|v| any(CLUSTER_TYPE_URL, v)),
                last_updated: Some(timestamp(r.last_updated)),
                error_state: error_state(CLUSTER_TYPE_URL, r),
                client_status: client_status(r),
            };
            if r.warming {
                clusters.dynamic_warming_clusters.push(dynamic);
            } else {
                clusters.dynamic_active_clusters.push(dynamic);
            }
        }
        for (_, r) in st.routes.iter() {
            routes.dynamic_route_configs.push(DynamicRouteConfig {
                version_info: r.version.to_string(),
                route_config: r.value.as_ref().map(|v| any(ROUTE_TYPE_URL, v)),
                last_updated: Some(timestamp(r.last_updated)),
                error_state: error_state(ROUTE_TYPE_URL, r),
                client_status: client_status(r),
            });
        }
    });
}

/// `/config_dump?include_eds`: as Envoy, every cluster's hosts as an assignment (the
/// bootstrap's clusters static, those from CDS dynamic); an EDS cluster's entry carries its
/// assignment's last rejection and client status (revoy's own, as for the other types).
pub fn endpoints_dump(process: &Process, xds: Option<&Xds>) -> EndpointsConfigDump {
    let mut dump = EndpointsConfigDump::default();
    for (dynamic, cla) in process.shared.clusters.assignments() {
        if !dynamic {
            dump.static_endpoint_configs.push(StaticEndpointConfig {
                endpoint_config: Some(pack(&cla)),
                last_updated: None,
            });
            continue;
        }
        let (error_state, client_status) = xds
            .and_then(|x| {
                x.handler.with_state(|st| {
                    st.endpoints
                        .get(&cla.cluster_name)
                        .map(|r| (error_state(ENDPOINT_TYPE_URL, r), client_status(r)))
                })
            })
            .unwrap_or_default();
        dump.dynamic_endpoint_configs.push(DynamicEndpointConfig {
            endpoint_config: Some(pack(&cla)),
            error_state,
            client_status,
            ..Default::default()
        });
    }
    dump
}

/// `/init_dump`: what start-up still waits for (Envoy lists its unready init targets).
pub fn init_dump(xds: Option<&Xds>) -> serde_json::Value {
    let Some(xds) = xds else {
        return serde_json::json!({});
    };
    xds.handler.with_state(|st| {
        let mut targets = Vec::new();
        match st.phase() {
            Some(Phase::Runtime) => {
                for name in st.pending_rtds_names() {
                    targets.push(serde_json::json!({"name": format!("RTDS {name}"), "state": "waiting for the initial RTDS response"}));
                }
            }
            Some(Phase::Clusters) => {
                targets.push(serde_json::json!({"name": "CDS", "state": "waiting for the initial CDS response and its endpoints"}));
                for c in st.warming_cluster_names() {
                    targets.push(serde_json::json!({"name": format!("EDS {c}"), "state": "warming"}));
                }
            }
            Some(Phase::Listeners) => {
                targets.push(serde_json::json!({"name": "LDS", "state": "waiting for the initial LDS response and its route configurations"}));
                for l in st.warming_listener_names() {
                    targets.push(serde_json::json!({"name": format!("Listener {l}"), "state": "warming"}));
                }
            }
            Some(Phase::Done) | None => {}
        }
        if targets.is_empty() {
            serde_json::json!({})
        } else {
            serde_json::json!({"unready_targets_dumps": [{"name": "Server", "target_names": targets}]})
        }
    })
}

/// `/xds`: the stream's state, each type's subscription, and the last pushes, newest first,
/// each with the resources it added, changed, left unchanged, removed and rejected (with the
/// reason).
pub fn render(xds: Option<&Xds>) -> serde_json::Value {
    let Some(xds) = xds else {
        return serde_json::json!({"error": "no dynamic_resources in the bootstrap"});
    };
    let counts = xds.handler.with_state(|st| {
        serde_json::json!({
            "listeners": {"accepted": st.listeners.accepted_names().count(), "warming": st.warming_listener_names().count()},
            "clusters": {"accepted": st.clusters.accepted_names().count(), "warming": st.warming_cluster_names().count()},
            "route_configs": st.routes.accepted_names().count(),
            "endpoint_assignments": st.endpoints.accepted_names().count(),
            "initialized": st.phase() == Some(Phase::Done),
        })
    });
    let Some(client) = &xds.client else {
        return serde_json::json!({"resources": counts, "stream": null});
    };
    let status = client.status();
    let types: Vec<_> = status
        .types
        .iter()
        .map(|t| {
            serde_json::json!({
                "type_url": t.type_url,
                "wildcard": t.wildcard,
                "names": t.names,
                "name_count": t.name_count,
                "acked_version": t.acked_version,
                "nonce": t.nonce,
                "pending": t.pending,
            })
        })
        .collect();
    let pushes: Vec<_> = status
        .pushes
        .iter()
        .map(|p| {
            let (verdict, reason) = match &p.verdict {
                xds_client::Verdict::Ack => ("ACK", None),
                xds_client::Verdict::Nack(r) => ("NACK", Some(r.clone())),
            };
            let rejected: Vec<_> = p
                .rejected
                .iter()
                .map(|r| serde_json::json!({"name": r.name, "reason": r.reason}))
                .collect();
            serde_json::json!({
                "at": httpdate::fmt_http_date(p.at),
                "type_url": p.type_url,
                "version": p.version,
                "nonce": p.nonce,
                "resources": p.resources.first,
                "resource_count": p.resources.count,
                "added": p.added.first,
                "added_count": p.added.count,
                "changed": p.changed.first,
                "changed_count": p.changed.count,
                "unchanged_count": p.unchanged,
                "removed": p.removed.first,
                "removed_count": p.removed.count,
                "rejected": rejected,
                "rejected_count": p.rejected_count,
                "verdict": verdict,
                "reason": reason,
                "apply_ms": p.apply_time.as_secs_f64() * 1000.0,
            })
        })
        .collect();
    serde_json::json!({
        "stream": {"connected": status.connected, "streams": status.streams},
        "resources": counts,
        "subscriptions": types,
        "pushes": pushes,
    })
}
