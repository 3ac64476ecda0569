//! The admin API against a running revoy: Envoy's endpoints, pilot-agent's raw-regex stats
//! queries, POST-only endpoints, config_dump validity, /routes explain, quit.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use proto::Codec;
use proto::pb::envoy::admin::v3::ConfigDump;

#[path = "support/child.rs"]
mod child;
#[path = "support/chunked.rs"]
mod chunked;
#[path = "support/ports.rs"]
mod ports;
use child::Proxy;
use ports::free_port;

/// A running revoy and its ports.
struct Started {
    child: Proxy,
    admin: u16,
    listener: u16,
}

fn start() -> Started {
    let (admin, listener) = (free_port(), free_port());
    let yaml = format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: inbound
    traffic_direction: INBOUND
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listener}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: inbound
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]
          route_config:
            name: local
            validate_clusters: false
            virtual_hosts:
            - name: web
              domains: ["web.example", "web.example:*"]
              routes:
              - name: api
                match: {{prefix: /api}}
                route: {{cluster: backend, prefix_rewrite: /v2}}
              - name: gone
                match: {{prefix: /gone}}
                route: {{cluster: missing}}
              - name: hostless
                match: {{prefix: /hostless}}
                route: {{cluster: empty}}
              - name: hello
                match: {{prefix: /}}
                direct_response: {{status: 200, body: {{inline_string: hi}}}}
  clusters:
  - name: backend
    connect_timeout: 1s
    load_assignment: {{cluster_name: backend, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 9}}}}}}}}]}}]}}
  - {{name: empty, connect_timeout: 1s, load_assignment: {{cluster_name: empty}}}}
"#
    );
    let child = Proxy::start(&yaml, || raw(admin, "GET", "/ready").0 == 200);
    Started {
        child,
        admin,
        listener,
    }
}

/// Sends a raw request (target verbatim, like pilot-agent) and returns (status, body).
fn raw(port: u16, method: &str, target: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "{method} {target} HTTP/1.1\r\nHost: web.example\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, chunked::body(&out))
}

fn get(r: &Started, target: &str) -> (u16, String) {
    raw(r.admin, "GET", target)
}

#[test]
fn help_lists_endpoints_and_post_only_ones_refuse_get() {
    let r = start();
    let (status, help) = get(&r, "/help");
    assert_eq!(status, 200);
    assert!(help.starts_with("admin commands are:\n"));
    for ep in [
        "/clusters",
        "/config_dump",
        "/listeners",
        "/ready",
        "/routes",
        "/server_info",
        "/stats",
        "/stats/prometheus",
    ] {
        assert!(
            help.contains(&format!("  {ep}: ")),
            "{ep} missing from /help"
        );
    }
    for ep in [
        "/quitquitquit",
        "/healthcheck/fail",
        "/healthcheck/ok",
        "/reset_counters",
        "/drain_listeners",
        "/logging",
    ] {
        assert!(
            help.contains(&format!("  {ep} (POST): ")),
            "{ep} not marked POST"
        );
        let (status, body) = get(&r, ep);
        assert_eq!(
            (status, body.as_str()),
            (405, "Method GET not allowed, POST required.")
        );
    }
    assert!(help.contains("      usedonly: "));
    assert_eq!(get(&r, "/nope").0, 404);
}

#[test]
fn stats_answer_pilot_agents_raw_queries() {
    let r = start();
    let (status, body) = get(
        &r,
        r"/stats?usedonly&filter=^(server\.state|listener_manager\.workers_started)",
    );
    assert_eq!(status, 200);
    assert_eq!(
        body,
        "listener_manager.workers_started: 1\nserver.state: 0\n"
    );
    assert_eq!(raw(r.listener, "GET", "/").0, 200);
    let (_, body) = get(
        &r,
        r"/stats?filter=^http\.inbound\.downstream_rq_(total|2xx)$",
    );
    assert_eq!(
        body,
        "http.inbound.downstream_rq_2xx: 1\nhttp.inbound.downstream_rq_total: 1\n"
    );
    // `inbound`: the admin's own `http.admin.downstream_rq_total` would come first.
    let (_, json) = get(&r, "/stats?format=json&filter=inbound.downstream_rq_total");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["stats"][0]["name"], "http.inbound.downstream_rq_total");
    assert_eq!(v["stats"][0]["value"], 1);
    let (_, prom) = get(&r, "/stats/prometheus");
    // Envoy's tag extraction: the connection manager's stat prefix becomes a label.
    // The admin's own series (`admin`) comes first in the family.
    assert!(prom.contains(
        "# TYPE envoy_http_downstream_rq_total counter\n\
         envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"admin\"} "
    ));
    assert!(prom.contains(
        "\nenvoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"inbound\"} 1\n"
    ));
    assert_eq!(get(&r, "/stats?filter=(unclosed").0, 400);
    assert_eq!(raw(r.admin, "POST", "/reset_counters").0, 200);
    let (_, body) = get(&r, r"/stats?filter=^http\.inbound\.downstream_rq_total$");
    assert_eq!(body, "http.inbound.downstream_rq_total: 0\n");
}

#[test]
fn config_dump_is_a_valid_config_dump() {
    let r = start();
    let (status, body) = get(&r, "/config_dump");
    assert_eq!(status, 200);
    let value: serde_json::Value = serde_json::from_str(&body).unwrap();
    let dump: ConfigDump = Codec::new()
        .decode(value.clone(), false)
        .expect("valid envoy.admin.v3.ConfigDump")
        .message;
    let types: Vec<&str> = dump.configs.iter().map(|a| a.type_url.as_str()).collect();
    assert_eq!(
        types,
        [
            "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump",
            "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
            "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
            "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
            // Envoy 1.40 shows it even without secrets.
            "type.googleapis.com/envoy.admin.v3.SecretsConfigDump",
        ]
    );
    assert_eq!(
        value["configs"][3]["static_route_configs"][0]["route_config"]["name"],
        "local"
    );
    let (_, listeners) = get(&r, "/listeners");
    assert_eq!(listeners, format!("inbound::127.0.0.1:{}\n", r.listener));
    let (_, clusters) = get(&r, "/clusters");
    assert!(
        clusters.contains("backend::127.0.0.1:9::health_flags::healthy\n"),
        "{clusters}"
    );
    let (_, info) = get(&r, "/server_info");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["state"], "LIVE");
}

#[test]
fn routes_explain_a_decision() {
    let r = start();
    let (status, body) = get(&r, "/routes?host=web.example:8080&path=/api/users");
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let d = &v["decisions"][0];
    assert_eq!(d["route_config"], "local");
    assert_eq!(d["virtual_host"], "web");
    assert_eq!(d["domain"], "web.example:*");
    assert_eq!(d["route_name"], "api");
    assert_eq!(d["cluster"], "backend");
    assert_eq!(d["rewritten_path"], "/v2/users");
    let (_, body) = get(&r, "/routes?host=web.example&path=/other");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["decisions"][0]["route_name"], "hello");
    assert_eq!(v["decisions"][0]["skipped"][0]["name"], "api");
    let (_, body) = get(&r, "/routes?host=nobody&path=/");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["decisions"][0]["virtual_host"].is_null());
    let (_, tables) = get(&r, "/routes");
    assert!(tables.contains("\"web.example:*\""));
    assert_eq!(get(&r, "/routes?route_config=missing").0, 404);
}

/// Where the decision answers without an upstream, the explanation carries the status, flag
/// and details of the access-log line (those `tests/access_log.rs` and
/// `tests/access_log/flags.rs` compare with Envoy's): no route, a missing cluster, a cluster
/// without hosts, a direct response.
#[test]
fn routes_explanations_carry_the_access_log_outcome() {
    let r = start();
    let outcome = |path: &str| {
        let (_, body) = get(&r, &format!("/routes?host=web.example&path={path}"));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["decisions"][0]["access_log"].clone()
    };
    let expect = |code: u16, flags: Option<&str>, long: Option<&str>, details: &str| serde_json::json!({"response_code": code, "response_flags": flags, "response_flags_long": long, "response_code_details": details});
    assert_eq!(outcome("/api/x"), serde_json::Value::Null);
    assert_eq!(
        outcome("/gone"),
        expect(503, Some("NC"), Some("NoClusterFound"), "cluster_not_found")
    );
    assert_eq!(
        outcome("/hostless"),
        expect(
            503,
            Some("UH"),
            Some("NoHealthyUpstream"),
            "no_healthy_upstream"
        )
    );
    assert_eq!(outcome("/"), expect(200, None, None, "direct_response"));
    let (_, body) = get(&r, "/routes?host=nobody&path=/");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["decisions"][0]["access_log"],
        expect(404, Some("NR"), Some("NoRouteFound"), "route_not_found")
    );
    let (_, text) = get(&r, "/routes?host=web.example&path=/hostless&format=text");
    assert!(
        text.contains("access log: 503 UH no_healthy_upstream\n"),
        "{text}"
    );
}

/// `/server_info` says DRAINING while health checks fail, as Envoy 1.40's does (its body is not
/// comparable whole: uptime, paths and ports differ). The rest of `/healthcheck/fail` is
/// compared with Envoy in `differential.rs` (`healthcheck_fail`).
#[test]
fn server_info_state_follows_health_checks() {
    let r = start();
    let state = || {
        let (_, info) = get(&r, "/server_info");
        serde_json::from_str::<serde_json::Value>(&info).unwrap()["state"].clone()
    };
    assert_eq!(raw(r.admin, "POST", "/healthcheck/fail").0, 200);
    assert_eq!(state(), "DRAINING");
    assert_eq!(raw(r.admin, "POST", "/healthcheck/ok").0, 200);
    assert_eq!(state(), "LIVE");
}

/// `/quitquitquit` ends the process with status 0. What `/drain_listeners` and
/// `/healthcheck/fail` do is compared with Envoy in `differential.rs` (`drain_listeners*`,
/// `healthcheck_fail`).
#[test]
fn quit_exits_cleanly() {
    let mut r = start();
    assert_eq!(raw(r.listener, "GET", "/").0, 200);
    assert_eq!(raw(r.admin, "POST", "/quitquitquit").0, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = r.child.0.try_wait().unwrap() {
            assert!(status.success());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "revoy did not exit after /quitquitquit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
