//! Distributed tracing against Envoy 1.40: the same bootstrap (an OpenTelemetry or Zipkin
//! provider pointing at a fake collector in this test) and the same requests through Envoy
//! and through revoy; the spans the collectors receive and the trace headers the upstream
//! sees are compared with ids and times masked (their relations kept: which span is whose
//! parent, which trace an incoming header joined).

#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

mod tracing {
    pub mod fakes;
    pub mod observe;
}

use std::net::SocketAddr;
use std::time::Duration;

use tracing::fakes;

/// The bootstrap: one listener whose connection manager traces with `tracing` (its
/// `provider` included), routes `/ok` to the upstream, `/empty` to a cluster with no
/// endpoints (503), and nothing else (404); the collector's cluster is `collector`.
fn bootstrap(
    admin: u16,
    listener: u16,
    upstream: SocketAddr,
    collector: SocketAddr,
    collector_h2: bool,
    tracing: &str,
    hcm_extra: &str,
) -> String {
    let h2 = if collector_h2 {
        "\n    typed_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {http2_protocol_options: {}}}}"
    } else {
        ""
    };
    format!(
        r#"node: {{id: node-a, cluster: cluster-a, locality: {{zone: zone-a}}}}
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
layered_runtime:
  layers:
  - name: static
    static_layer: {{tracing.opentelemetry.min_flush_spans: 1, tracing.zipkin.min_flush_spans: 1}}
static_resources:
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listener}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          {hcm_extra}
          tracing: {tracing}
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - {{match: {{path: /ok}}, route: {{cluster: backend}}}}
              - {{match: {{path: /decorated}}, route: {{cluster: backend}}, decorator: {{operation: my-op}}}}
              - {{match: {{path: /empty}}, route: {{cluster: empty}}}}
  clusters:
  - name: backend
    connect_timeout: 1s
    load_assignment: {{cluster_name: backend, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up_port}}}}}}}}}]}}]}}
  - name: empty
    connect_timeout: 1s
    load_assignment: {{cluster_name: empty, endpoints: []}}
  - name: collector
    connect_timeout: 1s{h2}
    load_assignment: {{cluster_name: collector, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {col_port}}}}}}}}}]}}]}}
"#,
        up_port = upstream.port(),
        col_port = collector.port(),
    )
}

fn otel_tracing(extra: &str) -> String {
    format!(
        "{{random_sampling: {{value: 100}}, {extra} provider: {{name: envoy.tracers.opentelemetry, typed_config: {{\"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig, service_name: svc-a, grpc_service: {{envoy_grpc: {{cluster_name: collector}}, timeout: 1s}}}}}}}}"
    )
}

async fn get(addr: SocketAddr, path: &str, headers: &str) -> (u16, String) {
    let (path, headers) = (path.to_owned(), headers.to_owned());
    tokio::task::spawn_blocking(move || http1::get_with(None, addr, &path, &headers).unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_envoy_otel() {
    let Some(envoy) = oracle::envoy_or_skip("dump") else {
        return;
    };
    let (up, up_log) = fakes::http_server(200).await;
    let (col, col_log) = fakes::otlp_collector().await;
    let (admin, listener) = (ports::free_port(), ports::free_port());
    let yaml = bootstrap(
        admin,
        listener,
        up,
        col,
        true,
        &otel_tracing("spawn_upstream_span: true,"),
        "",
    );
    let _p = child::Proxy::envoy(&envoy, &yaml, 71, || {
        std::net::TcpStream::connect(("127.0.0.1", listener)).is_ok()
    });
    let addr: SocketAddr = ([127, 0, 0, 1], listener).into();
    println!("{:?}", get(addr, "/ok", "user-agent: ua\r\n").await);
    println!(
        "{:?}",
        get(
            addr,
            "/decorated",
            "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n"
        )
        .await
    );
    println!("{:?}", get(addr, "/nothing", "").await);
    println!("{:?}", get(addr, "/empty", "").await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut labels = tracing::observe::Labels::default();
    labels.keep = vec![
        "0af7651916cd43dd8448eb211c80319c".into(),
        "b7ad6b7169203331".into(),
    ];
    for s in up_log.lock().unwrap().iter() {
        let tp = s
            .headers
            .get("traceparent")
            .map(|v| tracing::observe::traceparent(v.to_str().unwrap(), &mut labels));
        println!(
            "UP {} tp={tp:?} ts={:?} rid={:?} headers={:?}",
            s.path,
            s.headers.get("tracestate"),
            s.headers
                .get("x-request-id")
                .map(|v| tracing::observe::request_id(v.to_str().unwrap())),
            s.headers.keys().collect::<Vec<_>>()
        );
    }
    for l in tracing::observe::otel_lines(&col_log.lock().unwrap(), &mut labels) {
        println!("{l}");
    }
    let stats = get(([127, 0, 0, 1], admin).into(), "/stats?filter=tracing", "").await;
    println!("{}", stats.1);
}
