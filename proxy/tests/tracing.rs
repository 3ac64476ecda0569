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
#[path = "tracing/zipkin.rs"]
mod zipkin;

use std::net::SocketAddr;
use std::time::Duration;

use tracing::{fakes, observe};

/// The bootstrap: one listener whose connection manager traces with `tracing` (its
/// `provider` included), routes `/ok` to the upstream, `/empty` to a cluster with no
/// endpoints (503), `/retry` to `flaky` with one retry on 5xx, and nothing else (404); the
/// collector's cluster is `collector`.
#[allow(clippy::too_many_arguments)]
fn bootstrap(
    admin: u16,
    listener: u16,
    upstream: SocketAddr,
    flaky: SocketAddr,
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
              - {{match: {{path: /retry}}, route: {{cluster: flaky, retry_policy: {{retry_on: 5xx, num_retries: 1}}}}}}
              - {{match: {{path: /sampled}}, route: {{cluster: backend}}, tracing: {{random_sampling: {{numerator: 100}}}}}}
  clusters:
  - name: backend
    connect_timeout: 1s
    load_assignment: {{cluster_name: backend, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up_port}}}}}}}}}]}}]}}
  - name: empty
    connect_timeout: 1s
    load_assignment: {{cluster_name: empty, endpoints: []}}
  - name: flaky
    connect_timeout: 1s
    load_assignment: {{cluster_name: flaky, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {flaky_port}}}}}}}}}]}}]}}
  - name: collector
    connect_timeout: 1s{h2}
    load_assignment: {{cluster_name: collector, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {col_port}}}}}}}}}]}}]}}
"#,
        up_port = upstream.port(),
        flaky_port = flaky.port(),
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

/// Which proxy a run drives.
#[derive(Clone, Copy, Debug)]
enum Which {
    Envoy,
    Revoy,
}

/// A change to the bootstrap a run makes.
type Edit<'a> = dyn Fn(String) -> String + 'a;

/// Runs the requests of the OpenTelemetry scenario through `which` with HCM `tracing` on the
/// bootstrap as `edit` leaves it, and returns what the upstream and the collector saw, as
/// comparable lines.
async fn otel_run(
    which: Which,
    tracing: &str,
    edit: &Edit<'_>,
    requests: &[(&str, &str)],
) -> Vec<String> {
    let (up, up_log) = fakes::http_server(200).await;
    let (flaky, _) = fakes::http_server(503).await;
    let (col, col_log) = fakes::otlp_collector().await;
    let (admin, listener) = (ports::free_port(), ports::free_port());
    let yaml = edit(bootstrap(
        admin, listener, up, flaky, col, true, tracing, "",
    ));
    let ready = || std::net::TcpStream::connect(("127.0.0.1", listener)).is_ok();
    let _p = match which {
        Which::Envoy => child::Proxy::envoy(&oracle::envoy_path().unwrap(), &yaml, 72, ready),
        Which::Revoy => child::Proxy::start(&yaml, ready),
    };
    let addr: SocketAddr = ([127, 0, 0, 1], listener).into();
    let mut out = Vec::new();
    let mut labels = observe::Labels::default();
    labels.keep = vec![JOIN_TRACE.into(), JOIN_SPAN.into()];
    for (path, headers) in requests {
        let before = col_log.lock().unwrap().len();
        let ups = up_log.lock().unwrap().len();
        let (status, body) = get(addr, path, headers).await;
        out.push(format!("request {path} {headers:?} -> {status} {body:?}"));
        // Each request's spans arrive one export per span (min_flush_spans 1).
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let n = col_log.lock().unwrap().len();
            if std::time::Instant::now() > deadline
                || (n > before && n == col_log.lock().unwrap().len() && {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    n == col_log.lock().unwrap().len()
                })
            {
                break;
            }
        }
        for s in up_log.lock().unwrap()[ups..].iter() {
            let h = |n: &str| s.headers.get(n).map(|v| v.to_str().unwrap().to_owned());
            out.push(format!(
                "upstream {} traceparent={:?} tracestate={:?} x-request-id={:?} decorator={:?}",
                s.path,
                h("traceparent").map(|v| observe::traceparent(&v, &mut labels)),
                h("tracestate"),
                h("x-request-id").map(|v| observe::request_id(&v)),
                h("x-envoy-decorator-operation"),
            ));
        }
        // Which of a request's spans finishes first is a race in both proxies: exports are
        // compared in span-name order.
        let mut exports = col_log.lock().unwrap()[before..].to_vec();
        exports.sort_by_key(|e| {
            e.resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .flat_map(|s| &s.spans)
                .map(|s| s.name.clone())
                .collect::<Vec<_>>()
        });
        out.extend(observe::otel_lines(&exports, &mut labels));
    }
    let admin: SocketAddr = ([127, 0, 0, 1], admin).into();
    let stats = tokio::task::spawn_blocking(move || {
        http1::get(None, admin, "/stats?filter=tracing").unwrap().1
    })
    .await
    .unwrap();
    out.extend(
        stats
            .lines()
            .filter(|l| !l.contains("timer_flushed"))
            .map(str::to_owned),
    );
    out
}

const JOIN_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const JOIN_SPAN: &str = "b7ad6b7169203331";

fn compare(name: &str, envoy: &[String], revoy: &[String]) {
    if envoy != revoy {
        let mut report = format!("{name}: revoy differs from Envoy\n");
        for i in 0..envoy.len().max(revoy.len()) {
            let (e, r) = (envoy.get(i), revoy.get(i));
            let mark = if e == r { " " } else { "!" };
            report.push_str(&format!(
                "{mark} envoy: {}\n{mark} revoy: {}\n",
                e.map_or("<none>", |s| s),
                r.map_or("<none>", |s| s)
            ));
        }
        panic!("{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opentelemetry_spans_match_envoy() {
    if oracle::envoy_or_skip("opentelemetry_spans_match_envoy").is_none() {
        return;
    }
    let join = format!("traceparent: 00-{JOIN_TRACE}-{JOIN_SPAN}-01\r\ntracestate: k=v\r\n");
    let requests = [
        ("/ok", "user-agent: ua\r\n"),
        ("/decorated", join.as_str()),
        ("/nothing", ""),
        ("/empty", ""),
        ("/ok", "x-client-trace-id: abc\r\n"),
        ("/ok", "x-envoy-force-trace: true\r\n"),
        ("/ok%2Fx", ""),
        ("/retry", ""),
    ];
    let egress = |y: String| {
        y.replace(
            "  - name: ingress\n",
            "  - name: ingress\n    traffic_direction: OUTBOUND\n",
        )
        .replace(
            "stat_prefix: ingress",
            "stat_prefix: ingress\n          path_with_escaped_slashes_action: REJECT_REQUEST",
        )
    };
    let configs: [(&str, String, &Edit<'_>); 7] = [
        (
            "spawn_upstream_span",
            otel_tracing(
                "spawn_upstream_span: true, custom_tags: [{tag: lit, literal: {value: one}}, {tag: hdr, request_header: {name: user-agent, default_value: none}}],",
            ),
            &|y| y,
        ),
        ("one span per request", otel_tracing(""), &|y| y),
        (
            "random sampling 0",
            otel_tracing("random_sampling: {value: 0},")
                .replace("{random_sampling: {value: 100}, ", "{"),
            &|y| y,
        ),
        (
            "client sampling 0, random sampling 0",
            otel_tracing("client_sampling: {value: 0}, random_sampling: {value: 0},")
                .replace("{random_sampling: {value: 100}, ", "{"),
            &|y| y,
        ),
        (
            "overall sampling 0",
            otel_tracing("overall_sampling: {value: 0},"),
            &|y| y,
        ),
        (
            "egress, escaped slashes rejected before routing",
            otel_tracing("spawn_upstream_span: true,"),
            &egress,
        ),
        ("egress without upstream spans", otel_tracing(""), &egress),
    ];
    let mut runs = Vec::new();
    for (name, tracing, edit) in configs {
        let envoy = otel_run(Which::Envoy, &tracing, edit, &requests).await;
        let revoy = otel_run(Which::Revoy, &tracing, edit, &requests).await;
        if std::env::var_os("REVOY_TRACE_VERBOSE").is_some() {
            for l in &envoy {
                println!("E {name}: {l}");
            }
        }
        runs.push((name, envoy, revoy));
    }
    // The sampling settings decide something here: `x-client-trace-id` is sampled under the
    // default client_sampling and not under 0; overall_sampling 0 unsamples what random
    // sampling 100 picked.
    let envoy_of = |n: &str| &runs.iter().find(|(name, ..)| *name == n).expect(n).1;
    assert_ne!(
        envoy_of("random sampling 0"),
        envoy_of("client sampling 0, random sampling 0")
    );
    assert_ne!(
        envoy_of("one span per request"),
        envoy_of("overall sampling 0")
    );
    for (name, envoy, revoy) in runs {
        compare(name, &envoy, &revoy);
    }
}

/// Runs 40 requests through `which` with an OpenTelemetry collector that is not there, and
/// returns its `tracing` and collector cluster stats once every span went to a failed export:
/// every request must still succeed.
/// A collector that is not there, for `tracing` (its cluster `collector`, over h2 when
/// `collector_h2`): 40 requests, each answered 200, then the tracer's and the collector
/// cluster's stats once `spans_sent` says every span went to an export and `exported` counts
/// one attempt.
async fn dead_collector_stats(
    which: Which,
    tracing: &str,
    collector_h2: bool,
    spans_sent: &str,
    exported: &[&str],
) -> String {
    let (up, _) = fakes::http_server(200).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (admin, listener) = (ports::free_port(), ports::free_port());
    let yaml = bootstrap(admin, listener, up, up, dead, collector_h2, tracing, "");
    let ready = || std::net::TcpStream::connect(("127.0.0.1", listener)).is_ok();
    let _p = match which {
        Which::Envoy => child::Proxy::envoy(&oracle::envoy_path().unwrap(), &yaml, 74, ready),
        Which::Revoy => child::Proxy::start(&yaml, ready),
    };
    let addr: SocketAddr = ([127, 0, 0, 1], listener).into();
    for _ in 0..40 {
        assert_eq!(get(addr, "/ok", "").await.0, 200, "{which:?}");
    }
    let admin: SocketAddr = ([127, 0, 0, 1], admin).into();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats = tokio::task::spawn_blocking(move || {
            http1::get(None, admin, "/stats?filter=tracing|collector")
                .unwrap()
                .1
        })
        .await
        .unwrap();
        let attempts: u64 = exported.iter().map(|n| stat(&stats, n).unwrap_or(0)).sum();
        if attempts > 0 && stat(&stats, spans_sent) == Some(40) {
            return stats;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{which:?}: no failed export counted: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Failed OTLP exports, counted as any internal request to the cluster `collector` that got
/// no answer (Envoy 1.40 counts no gRPC call stats for them).
const FAILED_EXPORTS: &str = "cluster.collector.internal.upstream_rq_503";

/// The value of counter `name` in `/stats` text.
fn stat(stats: &str, name: &str) -> Option<u64> {
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.parse().ok())
}

/// A collector that is not there costs counters, not requests: every request still succeeds
/// and the failed exports are counted as Envoy 1.40 counts them (compared when Envoy is at
/// hand): as requests of the collector cluster that failed to connect, with no gRPC call
/// stats and no tracing counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_does_not_fail_or_stall_requests() {
    let counted = |stats: &str| {
        let mut seen: Vec<String> = [
            "cluster.collector.upstream_cx_connect_fail",
            "cluster.collector.upstream_rq_pending_failure_eject",
            "cluster.collector.upstream_rq_503",
            FAILED_EXPORTS,
            "tracing.opentelemetry.spans_dropped",
        ]
        .iter()
        .map(|n| format!("{n} counted: {}", stat(stats, n).unwrap_or(0) > 0))
        .collect();
        seen.extend(
            stats
                .lines()
                .filter(|l| l.contains(".grpc."))
                .map(str::to_owned),
        );
        seen
    };
    let tracing = otel_tracing("");
    let otel = |which| {
        dead_collector_stats(
            which,
            &tracing,
            true,
            "tracing.opentelemetry.spans_sent",
            &[FAILED_EXPORTS],
        )
    };
    let revoy = otel(Which::Revoy).await;
    if oracle::envoy_or_skip("a_dead_collector_does_not_fail_or_stall_requests").is_none() {
        assert!(
            counted(&revoy)
                .iter()
                .filter(|l| l.ends_with("true"))
                .count()
                == 4,
            "{revoy}"
        );
        return;
    }
    let envoy = otel(Which::Envoy).await;
    compare("dead collector", &counted(&envoy), &counted(&revoy));
}
