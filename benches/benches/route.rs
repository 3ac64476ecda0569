//! Route engine benches: lookup cost vs table size (Istio-shaped virtual hosts), compile time
//! of a large table, and router-check throughput.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http::{HeaderMap, Method};
use proto::pb::envoy::config::route::v3 as pb;
use revoy::config::route::compile_route_config;
use revoy::config::{Context, SystemIo, Warnings};
use revoy::route::{RouteRequest, RouteTable};

/// Istio's sidecar outbound domains for one service.
fn istio_domains(i: usize) -> Vec<String> {
    let (svc, ns) = (format!("svc{i}"), format!("ns{}", i % 50));
    let ip = format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256);
    let mut d = Vec::new();
    for host in [
        format!("{svc}.{ns}.svc.cluster.local"),
        format!("{svc}.{ns}.svc"),
        format!("{svc}.{ns}"),
        svc.clone(),
        ip,
    ] {
        d.push(format!("{host}:80"));
        d.push(host);
    }
    d
}

fn table_config(vhosts: usize, routes: usize) -> pb::RouteConfiguration {
    let virtual_hosts = (0..vhosts)
        .map(|i| pb::VirtualHost {
            name: format!("svc{i}.ns{}.svc.cluster.local:80", i % 50),
            domains: istio_domains(i),
            routes: (0..routes)
                .map(|j| {
                    let last = j + 1 == routes;
                    pb::Route {
                        name: format!("r{j}"),
                        r#match: Some(pb::RouteMatch {
                            path_specifier: Some(pb::route_match::PathSpecifier::Prefix(if last {
                                "/".to_owned()
                            } else {
                                format!("/api/v{j}/")
                            })),
                            ..Default::default()
                        }),
                        action: Some(pb::route::Action::Route(pb::RouteAction {
                            cluster_specifier: Some(pb::route_action::ClusterSpecifier::Cluster(
                                format!("outbound|80||svc{i}.ns{}.svc.cluster.local", i % 50),
                            )),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    pb::RouteConfiguration {
        name: "80".to_owned(),
        virtual_hosts,
        ..Default::default()
    }
}

/// The route table compiled from `config` (without cluster checks).
fn compile_table(config: &pb::RouteConfiguration) -> RouteTable {
    compile_route_config(&Context::new(&SystemIo), config, None, &mut Warnings::new()).unwrap()
}

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("route_lookup");
    for routes in [10usize, 100] {
        for vhosts in [10usize, 1_000, 10_000] {
            let table = compile_table(&table_config(vhosts, routes));
            let host = format!("svc{}.ns{}:80", vhosts / 2, (vhosts / 2) % 50);
            let headers = HeaderMap::new();
            let method = Method::GET;
            for (which, path) in [("last", "/index.html"), ("first", "/api/v0/x")] {
                g.bench_with_input(
                    BenchmarkId::new(format!("{routes}_routes_{which}"), vhosts),
                    &vhosts,
                    |b, _| {
                        b.iter(|| {
                            let req = RouteRequest::new(
                                &method,
                                black_box(&host),
                                black_box(path),
                                &headers,
                            );
                            black_box(table.select(&req).map(|s| s.route_index))
                        })
                    },
                );
            }
        }
    }
    g.finish();
}

fn compile(c: &mut Criterion) {
    let config = table_config(10_000, 10);
    let mut g = c.benchmark_group("route_compile");
    g.sample_size(10);
    // Compiling alone (the new table's drop is excluded), then compiling and dropping: a config
    // update also drops the table it replaces.
    g.bench_function("10000_vhosts_x_10_routes", |b| {
        b.iter_with_large_drop(|| compile_table(black_box(&config)))
    });
    g.bench_function("10000_vhosts_x_10_routes_and_drop", |b| {
        b.iter(|| compile_table(black_box(&config)))
    });
    g.finish();
}

fn router_check(c: &mut Criterion) {
    let table = compile_table(&table_config(100, 10));
    let case = serde_json::json!({
        "test_name": "t",
        "input": {"authority": "svc50.ns0:80", "path": "/api/v3/x", "method": "GET"},
        "validate": {"cluster_name": "outbound|80||svc50.ns0.svc.cluster.local", "virtual_host_name": "svc50.ns0.svc.cluster.local:80", "path_rewrite": "/api/v3/x"}
    });
    let no_matchers =
        |_: &serde_json::Value| -> Result<revoy::route::matcher::HeaderMatcher, String> {
            Err("unused".into())
        };
    c.bench_function("router_check_case", |b| {
        b.iter(|| {
            let r = revoy::router_check::run_case(&table, black_box(&case), &no_matchers);
            assert!(r.failures.is_empty());
            black_box(r)
        })
    });
}

criterion_group!(benches, lookup, compile, router_check);
criterion_main!(benches);
