//! The admin `/clusters` output: Envoy's text lines and its `ClusterStatuses` JSON; and each
//! cluster's hosts as `/config_dump?include_eds` shows them.

use std::fmt::Write;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use proto::pb::envoy::config::core::v3::{HealthStatus as CoreHealth, Locality as LocalityProto};
use proto::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
    cluster_load_assignment::Policy, endpoint::AdditionalAddress, lb_endpoint,
};

use proto::pb::google::protobuf::UInt32Value;

use super::cluster::Cluster;
use super::host::Host;
use crate::config::cluster::{Discovery, HealthStatus};
use crate::config::listener::address_proto;

fn cluster_hosts(c: &Cluster) -> Vec<Arc<Host>> {
    let mut hosts = c.host_set().hosts().to_vec();
    hosts.extend(c.original_dst_hosts());
    hosts
}

/// Appends the text lines of one cluster (`name::host:port::stat::value`).
pub(crate) fn text(out: &mut String, c: &Cluster) {
    let name = c.name();
    let cfg = c.config();
    let _ = writeln!(
        out,
        "{name}::observability_name::{}",
        cfg.observability_name
    );
    for (label, t) in ["default_priority", "high_priority"]
        .iter()
        .zip(&cfg.circuit_breakers)
    {
        let _ = writeln!(
            out,
            "{name}::{label}::max_connections::{}",
            t.max_connections
        );
        let _ = writeln!(
            out,
            "{name}::{label}::max_pending_requests::{}",
            t.max_pending_requests
        );
        let _ = writeln!(out, "{name}::{label}::max_requests::{}", t.max_requests);
        let _ = writeln!(out, "{name}::{label}::max_retries::{}", t.max_retries);
    }
    let _ = writeln!(out, "{name}::added_via_api::{}", cfg.added_via_api);
    for h in cluster_hosts(c) {
        let p = format!("{name}::{}", h.addr);
        let mut stats: Vec<(&str, u64)> = h.stats.counters().into_iter().collect();
        stats.extend(h.stats.gauges());
        stats.sort_by_key(|(n, _)| *n);
        for (n, v) in stats {
            let _ = writeln!(out, "{p}::{n}::{v}");
        }
        let _ = writeln!(out, "{p}::hostname::{}", h.hostname);
        let _ = writeln!(out, "{p}::health_flags::{}", h.health_flags());
        let _ = writeln!(out, "{p}::weight::{}", h.weight);
        let _ = writeln!(out, "{p}::region::{}", h.locality.region);
        let _ = writeln!(out, "{p}::zone::{}", h.locality.zone);
        let _ = writeln!(out, "{p}::sub_zone::{}", h.locality.sub_zone);
        let _ = writeln!(out, "{p}::canary::false");
        let _ = writeln!(out, "{p}::priority::{}", h.priority);
        let _ = writeln!(out, "{p}::success_rate::-1");
        let _ = writeln!(out, "{p}::local_origin_success_rate::-1");
    }
}

/// One `ClusterStatus` object.
pub(crate) fn json(c: &Cluster) -> Value {
    let cfg = c.config();
    let mut status = Map::new();
    status.insert("name".into(), json!(c.name()));
    if cfg.added_via_api {
        status.insert("added_via_api".into(), json!(true));
    }
    let hosts: Vec<Value> = cluster_hosts(c).iter().map(|h| host_json(h)).collect();
    if !hosts.is_empty() {
        status.insert("host_statuses".into(), Value::Array(hosts));
    }
    let thresholds: Vec<Value> = cfg
        .circuit_breakers
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut m = Map::new();
            if i == 1 {
                m.insert("priority".into(), json!("HIGH"));
            }
            m.insert("max_connections".into(), json!(t.max_connections));
            m.insert("max_pending_requests".into(), json!(t.max_pending_requests));
            m.insert("max_requests".into(), json!(t.max_requests));
            m.insert("max_retries".into(), json!(t.max_retries));
            Value::Object(m)
        })
        .collect();
    status.insert(
        "circuit_breakers".into(),
        json!({ "thresholds": thresholds }),
    );
    status.insert("observability_name".into(), json!(cfg.observability_name));
    Value::Object(status)
}

fn host_json(h: &Host) -> Value {
    let stat = |name: &str, value: u64, gauge: bool| {
        let mut m = Map::new();
        if value != 0 {
            m.insert("value".into(), json!(value.to_string()));
        }
        if gauge {
            m.insert("type".into(), json!("GAUGE"));
        }
        m.insert("name".into(), json!(name));
        Value::Object(m)
    };
    let mut stats: Vec<Value> = h
        .stats
        .counters()
        .iter()
        .map(|(n, v)| stat(n, *v, false))
        .collect();
    stats.extend(h.stats.gauges().iter().map(|(n, v)| stat(n, *v, true)));
    let mut m = Map::new();
    m.insert(
        "address".into(),
        json!({ "socket_address": { "address": h.addr.ip().to_string(), "port_value": h.addr.port() } }),
    );
    m.insert("stats".into(), Value::Array(stats));
    m.insert(
        "health_status".into(),
        json!({ "eds_health_status": h.health.eds_name() }),
    );
    m.insert("weight".into(), json!(h.weight));
    if !h.hostname.is_empty() {
        m.insert("hostname".into(), json!(h.hostname));
    }
    if h.priority != 0 {
        m.insert("priority".into(), json!(h.priority));
    }
    let mut locality = Map::new();
    for (k, v) in [
        ("region", &h.locality.region),
        ("zone", &h.locality.zone),
        ("sub_zone", &h.locality.sub_zone),
    ] {
        if !v.is_empty() {
            locality.insert(k.into(), json!(v));
        }
    }
    m.insert("locality".into(), Value::Object(locality));
    Value::Object(m)
}

/// The cluster's hosts as Envoy's `/config_dump?include_eds` shows them: a
/// ClusterLoadAssignment named by its EDS service (else the cluster), one LocalityLbEndpoints
/// per priority and locality in the order their hosts come, each host with its weight and
/// coarse health, the default overprovisioning factor.
pub(crate) fn assignment(c: &Cluster) -> ClusterLoadAssignment {
    let cluster_name = match &c.config().discovery {
        Discovery::Eds { service_name } => service_name.clone(),
        _ => c.name().to_owned(),
    };
    let mut hosts = cluster_hosts(c);
    hosts.sort_by_key(|h| h.priority);
    let mut endpoints: Vec<LocalityLbEndpoints> = Vec::new();
    let mut groups: Vec<(u32, Arc<crate::config::cluster::Locality>)> = Vec::new();
    for h in &hosts {
        let i = match groups
            .iter()
            .position(|(p, l)| *p == h.priority && **l == *h.locality)
        {
            Some(i) => i,
            None => {
                groups.push((h.priority, h.locality.clone()));
                endpoints.push(LocalityLbEndpoints {
                    locality: Some(LocalityProto {
                        region: h.locality.region.clone(),
                        zone: h.locality.zone.clone(),
                        sub_zone: h.locality.sub_zone.clone(),
                    }),
                    priority: h.priority,
                    load_balancing_weight: Some(UInt32Value { value: 0 }),
                    ..Default::default()
                });
                endpoints.len() - 1
            }
        };
        endpoints[i].lb_endpoints.push(lb_endpoint(h));
    }
    ClusterLoadAssignment {
        cluster_name,
        endpoints,
        policy: Some(Policy {
            overprovisioning_factor: Some(UInt32Value { value: 140 }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn lb_endpoint(h: &Host) -> LbEndpoint {
    let health = match h.health {
        HealthStatus::Healthy => CoreHealth::Healthy,
        HealthStatus::Degraded => CoreHealth::Degraded,
        HealthStatus::Unhealthy | HealthStatus::Draining => CoreHealth::Unhealthy,
    };
    let additional_addresses = h
        .addresses
        .iter()
        .filter(|a| **a != h.addr)
        .map(|a| AdditionalAddress {
            address: Some(address_proto(*a)),
        })
        .collect();
    LbEndpoint {
        health_status: health as i32,
        load_balancing_weight: Some(UInt32Value { value: h.weight }),
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: Some(address_proto(h.addr)),
            additional_addresses,
            hostname: h.hostname.clone(),
            health_check_config: Some(Default::default()),
            ..Default::default()
        })),
        ..Default::default()
    }
}
