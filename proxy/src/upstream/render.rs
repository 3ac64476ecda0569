//! The admin `/clusters` output: Envoy's text lines and its `ClusterStatuses` JSON.

use std::fmt::Write;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::cluster::Cluster;
use super::host::Host;

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
