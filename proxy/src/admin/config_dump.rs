//! `/config_dump`: a valid `envoy.admin.v3.ConfigDump` built from protos and rendered with the
//! proto3-JSON codec, so every nested Any carries its `@type`.

use proto::pb::envoy::admin::v3::{
    BootstrapConfigDump, ClustersConfigDump, ConfigDump, ListenersConfigDump, RoutesConfigDump,
    clusters_config_dump::StaticCluster, listeners_config_dump::StaticListener,
    routes_config_dump::StaticRouteConfig,
};
use proto::pb::envoy::config::listener::v3::filter::ConfigType;
use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use proto::pb::google::protobuf::Timestamp;
use proto::{Codec, pack};

use super::AdminRequest;
use crate::config::Severity;
use crate::process::Process;
use crate::xds::Xds;

fn started(process: &Process) -> Timestamp {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(process.started.elapsed());
    // Envoy's timestamps have millisecond precision.
    Timestamp {
        seconds: since.as_secs() as i64,
        nanos: (since.subsec_millis() * 1_000_000) as i32,
    }
}

/// Renders the dump (`xds`: xDS's state, once started); `?resource=` selects one repeated field like Envoy.
pub fn render(process: &Process, xds: Option<&Xds>, req: &AdminRequest) -> serde_json::Value {
    let ts = Some(started(process));
    let b = process.bootstrap.proto.decode();
    let sr = b.static_resources.clone().unwrap_or_default();
    let bootstrap = BootstrapConfigDump {
        bootstrap: Some(b),
        last_updated: ts,
    };
    let clusters = ClustersConfigDump {
        static_clusters: sr
            .clusters
            .iter()
            .map(|c| StaticCluster {
                cluster: Some(pack(c)),
                last_updated: ts,
            })
            .collect(),
        ..Default::default()
    };
    let listeners = ListenersConfigDump {
        static_listeners: sr
            .listeners
            .iter()
            .map(|l| StaticListener {
                listener: Some(pack(l)),
                last_updated: ts,
            })
            .collect(),
        ..Default::default()
    };
    let mut routes = RoutesConfigDump::default();
    for l in &sr.listeners {
        for chain in l.filter_chains.iter().chain(l.default_filter_chain.iter()) {
            for f in &chain.filters {
                let Some(ConfigType::TypedConfig(any)) = &f.config_type else {
                    continue;
                };
                let Ok(hcm) = proto::unpack::<HttpConnectionManager>(any) else {
                    continue;
                };
                if let Some(RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier {
                    routes.static_route_configs.push(StaticRouteConfig {
                        route_config: Some(pack(&rc)),
                        last_updated: ts,
                    });
                }
            }
        }
    }
    let (mut clusters, mut listeners) = (clusters, listeners);
    super::xds::fill_dump(xds, &mut listeners, &mut clusters, &mut routes);
    let eds = req
        .has("include_eds")
        .then(|| super::xds::endpoints_dump(process, xds));
    // Envoy's order: bootstrap, clusters, endpoints, listeners, routes, secrets.
    let mut configs = vec![pack(&bootstrap), pack(&clusters)];
    if let Some(eds) = eds {
        configs.push(pack(&eds));
    }
    configs.extend([
        pack(&listeners),
        pack(&routes),
        pack(&super::secrets::dump(process)),
    ]);
    let dump = ConfigDump { configs };
    let codec = Codec::new();
    let mut value = codec.to_json(&dump);
    // Private keys, passwords and other sensitive fields never leave, wherever they are.
    codec.redact("envoy.admin.v3.ConfigDump", &mut value);
    let mut configs: Vec<serde_json::Value> = match value {
        serde_json::Value::Object(mut o) => match o.remove("configs") {
            Some(serde_json::Value::Array(a)) => a,
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    if let Some(findings) = unimplemented(process) {
        configs.push(findings);
    }
    if let Some(pattern) = req.param("name_regex").filter(|r| !r.is_empty()) {
        let Ok(re) = regex::Regex::new(&format!("^(?:{pattern})$")) else {
            return serde_json::json!({ "error": format!("invalid name_regex '{pattern}'") });
        };
        for c in &mut configs {
            keep_named(c, &re);
        }
    }
    if let Some(resource) = req.param("resource").filter(|r| !r.is_empty()) {
        configs = configs
            .into_iter()
            .filter_map(|c| resource_items(c, resource))
            .flatten()
            .collect();
    }
    if let Some(mask) = req.param("mask").filter(|m| !m.is_empty()) {
        let paths: Vec<Vec<&str>> = mask
            .split(',')
            .map(|p| p.trim().split('.').collect())
            .collect();
        configs = configs
            .into_iter()
            .filter_map(|c| masked(c, &paths))
            .collect();
    }
    if configs.is_empty() {
        // An empty ConfigDump, rendered as Envoy does.
        return serde_json::json!({});
    }
    serde_json::json!({ "configs": configs })
}

/// Keeps, in every list of `config`, the resources whose name `re` matches (`?name_regex=`):
/// the item's `name`, or that of the resource it wraps (`listener`, `cluster`, `route_config`,
/// `endpoint_config`'s `cluster_name`).
fn keep_named(config: &mut serde_json::Value, re: &regex::Regex) {
    let Some(fields) = config.as_object_mut() else {
        return;
    };
    for value in fields.values_mut() {
        if let Some(items) = value.as_array_mut() {
            items.retain(|item| item_name(item).is_none_or(|n| re.is_match(n)));
        }
    }
}

fn item_name(item: &serde_json::Value) -> Option<&str> {
    own_name(item).or_else(|| {
        item.as_object()?
            .values()
            .filter(|v| v.is_object())
            .find_map(own_name)
    })
}

fn own_name(v: &serde_json::Value) -> Option<&str> {
    v.get("name")
        .or_else(|| v.get("cluster_name"))
        .and_then(|n| n.as_str())
}

/// What the config uses that revoy does not implement, as one more entry of the dump (a
/// `google.protobuf.Struct`, so the dump stays a valid `ConfigDump`): each finding's field
/// path, whether it fails closed or is skipped, and what revoy does instead. `None` when
/// there is nothing to say.
fn unimplemented(process: &Process) -> Option<serde_json::Value> {
    let findings = &process.bootstrap.unimplemented;
    if findings.is_empty() {
        return None;
    }
    let items: Vec<serde_json::Value> = findings
        .iter()
        .map(|w| {
            serde_json::json!({
                "path": w.path,
                "effect": match w.severity {
                    Severity::FailsClosed => "FAILS_CLOSED",
                    _ => "SKIPPED",
                },
                "message": w.message,
            })
        })
        .collect();
    Some(serde_json::json!({
        "@type": "type.googleapis.com/google.protobuf.Struct",
        "value": { "revoy_unimplemented": items },
    }))
}

/// The items of the repeated field `resource` of one config, each tagged with its message type
/// (`<config type>.<item type>`, e.g. `...ListenersConfigDump.StaticListener`) like Envoy.
fn resource_items(config: serde_json::Value, resource: &str) -> Option<Vec<serde_json::Value>> {
    let type_url = config.get("@type")?.as_str()?.to_owned();
    let items = config.get(resource)?.as_array()?.clone();
    let item_type = format!("{type_url}.{}", item_message(resource)?);
    Some(
        items
            .into_iter()
            .map(|mut item| {
                if let serde_json::Value::Object(o) = &mut item {
                    o.insert("@type".into(), serde_json::Value::String(item_type.clone()));
                }
                item
            })
            .collect(),
    )
}

/// The message type of the items of a config dump's repeated field.
fn item_message(resource: &str) -> Option<&'static str> {
    Some(match resource {
        "static_clusters" => "StaticCluster",
        "dynamic_active_clusters" | "dynamic_warming_clusters" => "DynamicCluster",
        "static_listeners" => "StaticListener",
        "dynamic_listeners" => "DynamicListener",
        "static_route_configs" => "StaticRouteConfig",
        "dynamic_route_configs" => "DynamicRouteConfig",
        "static_secrets" => "StaticSecret",
        "dynamic_active_secrets" | "dynamic_warming_secrets" => "DynamicSecret",
        _ => return None,
    })
}

/// `config` with only the fields under `paths` (dotted field paths, like a protobuf
/// `FieldMask`), keeping the `@type` of every object on the way (an `Any` stays typed);
/// `None` when none of the paths is present.
fn masked(config: serde_json::Value, paths: &[Vec<&str>]) -> Option<serde_json::Value> {
    let mut out = serde_json::Map::new();
    for path in paths {
        if path
            .iter()
            .try_fold(&config, |v, field| v.get(field))
            .is_some()
        {
            copy_path(&config, &mut out, path);
        }
    }
    if out.is_empty() {
        return None;
    }
    if let Some(t) = config.get("@type") {
        out.insert("@type".into(), t.clone());
    }
    Some(serde_json::Value::Object(out))
}

/// Copies the value at the dotted `path` of `src` into `out`, creating the objects on the way
/// with the `@type` of their source objects.
fn copy_path(
    src: &serde_json::Value,
    out: &mut serde_json::Map<String, serde_json::Value>,
    path: &[&str],
) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let Some(value) = src.get(first) else {
        return;
    };
    if rest.is_empty() {
        out.insert((*first).to_owned(), value.clone());
        return;
    }
    let next = out
        .entry(*first)
        .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
    let Some(obj) = next.as_object_mut() else {
        return;
    };
    if let Some(t) = value.get("@type") {
        obj.insert("@type".into(), t.clone());
    }
    copy_path(value, obj, rest);
}
