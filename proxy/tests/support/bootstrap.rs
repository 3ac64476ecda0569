//! Bootstrap pieces that many tests write alike, as YAML text: the admin block, an HTTP
//! listener whose connection manager ends in the router, a static cluster, and a bootstrap
//! taking its listeners and clusters over ADS.
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "{name: r, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// `admin:` on 127.0.0.1:`port`, a top-level line.
pub fn admin(port: u16) -> String {
    format!("admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}\n")
}

/// A whole bootstrap: admin on `admin`, then `listeners` and `clusters` (entries as
/// [`http_listener`] and [`cluster`] write them; empty `clusters`: none).
pub fn with_admin(admin: u16, listeners: &str, clusters: &str) -> String {
    let clusters = if clusters.is_empty() {
        String::new()
    } else {
        format!("  clusters:{clusters}\n")
    };
    format!(
        "{}static_resources:\n  listeners:{listeners}\n{clusters}",
        self::admin(admin)
    )
}

/// One entry of `static_resources.listeners`: listener `name` on 127.0.0.1:`port` whose
/// connection manager (stat prefix `name`, `settings` added as lines of its own, e.g.
/// `"codec_type: HTTP1"`) runs the HTTP filters `filters` (flow-style entries, each followed
/// by `, `) and then the router, with one virtual host for every domain serving `routes` (a
/// flow-style list).
pub fn http_listener(name: &str, port: u16, settings: &str, filters: &str, routes: &str) -> String {
    let settings: String = settings
        .lines()
        .map(|l| format!("\n          {l}"))
        .collect();
    format!(
        r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: {name}{settings}
          http_filters: [{filters}{ROUTER}]
          route_config:
            virtual_hosts: [{{name: all, domains: ["*"], routes: {routes}}}]"#
    )
}

/// One entry of `static_resources.clusters`: a static cluster `name` of one endpoint,
/// 127.0.0.1:`port`, with `extra` (lines of its own at the cluster's indentation) added.
pub fn cluster(name: &str, port: u16, extra: &str) -> String {
    let extra: String = extra.lines().map(|l| format!("\n    {l}")).collect();
    format!(
        r#"
  - name: {name}
    connect_timeout: 1s
    load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}{extra}"#
    )
}

/// A whole bootstrap for node `node`: admin on `admin`, listeners and clusters over ADS
/// (`api_type`: GRPC or DELTA_GRPC) from the server at `xds_address` (a flow-style Envoy
/// `Address`), through the HTTP/2 cluster `xds_cluster`.
pub fn over_ads(node: &str, admin: u16, xds_address: &str, api_type: &str) -> String {
    format!(
        r#"node: {{id: {node}, cluster: test}}
{}dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    grpc_services: [{{envoy_grpc: {{cluster_name: xds_cluster}}}}]
  lds_config: {{ads: {{}}, resource_api_version: V3}}
  cds_config: {{ads: {{}}, resource_api_version: V3}}
static_resources:
  clusters:
  - name: xds_cluster
    connect_timeout: 1s
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: xds_cluster
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {xds_address}}}
"#,
        self::admin(admin)
    )
}
