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
use crate::server::Shared;

fn started(shared: &Shared) -> Timestamp {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(shared.started.elapsed());
    Timestamp {
        seconds: since.as_secs() as i64,
        nanos: since.subsec_nanos() as i32,
    }
}

/// Renders the dump; `?resource=` selects one repeated field like Envoy.
pub fn render(shared: &Shared, req: &AdminRequest) -> serde_json::Value {
    let ts = Some(started(shared));
    let b = shared.bootstrap.proto.decode();
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
    let dump = ConfigDump {
        configs: vec![
            pack(&bootstrap),
            pack(&clusters),
            pack(&listeners),
            pack(&routes),
        ],
    };
    let codec = Codec::new();
    let mut value = codec.to_json(&dump);
    if let Some(resource) = req.param("resource").filter(|r| !r.is_empty()) {
        let items: Vec<serde_json::Value> = value["configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.get(resource).and_then(|v| v.as_array()).cloned())
            .flatten()
            .collect();
        value = serde_json::json!({ "configs": items });
    }
    value
}
