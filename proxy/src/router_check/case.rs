//! Runs one router-check test case against a compiled [`RouteTable`] through the proxy's own
//! `RouteTable::select`, and compares each requested field like Envoy's router_check_tool.

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use serde_json::Value;

use crate::route::FormatContext;
use crate::route::matcher::HeaderMatcher;
use crate::route::{Action, FractionalPercent, RouteRequest, RouteTable, Runtime, Selected};

/// The runtime the tool mocks: a `runtime_fraction` is enabled only when the test's `runtime`
/// input names its key.
struct ToolRuntime<'a>(&'a str);

impl Runtime for ToolRuntime<'_> {
    fn feature_enabled(&self, key: &str, _default: FractionalPercent, _random: u64) -> bool {
        !self.0.is_empty() && self.0 == key
    }
}

/// A header-matcher compiler (the test file's `*_header_matches` are Envoy HeaderMatchers).
pub type MatcherCompiler<'a> = &'a dyn Fn(&Value) -> Result<HeaderMatcher, String>;

/// The outcome of one test case.
#[derive(Debug, Default)]
pub struct CaseResult {
    /// Failure lines (`expected: [..], actual: [..], test type: ..`).
    pub failures: Vec<String>,
    /// `(virtual host index, route index)` of the matched route, when a check on it passed.
    pub covered: Option<(usize, usize)>,
}

fn s<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

fn compare(out: &mut CaseResult, passed: &mut bool, actual: &str, expected: &str, test_type: &str) {
    if actual == expected {
        *passed = true;
    } else {
        out.failures.push(format!(
            "expected: [{expected}], actual: [{actual}], test type: {test_type}"
        ));
    }
}

/// Formats a duration like proto3 JSON (`15s`, `0.500s`).
pub fn format_duration(d: Option<std::time::Duration>) -> String {
    let d = d.unwrap_or_default();
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        let frac = format!("{:09}", d.subsec_nanos());
        format!("{}.{}s", d.as_secs(), frac.trim_end_matches('0'))
    }
}

/// Parses a proto3 JSON duration (`1.5s`).
fn parse_duration(v: &Value) -> Option<std::time::Duration> {
    let s = v.as_str()?.strip_suffix('s')?;
    let secs: f64 = s.parse().ok()?;
    Some(std::time::Duration::from_secs_f64(secs))
}

/// Runs one test case (`{"test_name", "input", "validate"}`).
pub fn run_case(
    table: &RouteTable,
    case: &Value,
    compile_matcher: MatcherCompiler<'_>,
) -> CaseResult {
    let mut out = CaseResult::default();
    let empty = Value::Null;
    let input = case.get("input").unwrap_or(&empty);
    let validate = case.get("validate").unwrap_or(&empty);
    let authority = s(input, "authority").unwrap_or("");
    let path = s(input, "path").unwrap_or("");
    let method = s(input, "method")
        .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
        .unwrap_or(Method::GET);
    let ssl = input.get("ssl").and_then(Value::as_bool).unwrap_or(false);
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-forwarded-proto",
        HeaderValue::from_static(if ssl { "https" } else { "http" }),
    );
    if input
        .get("internal")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        headers.insert("x-envoy-internal", HeaderValue::from_static("true"));
    }
    let extra = input
        .get("additional_request_headers")
        .or_else(|| input.get("additional_headers"))
        .and_then(Value::as_array);
    for h in extra.into_iter().flatten() {
        let name = s(h, "key").or_else(|| s(h, "field")).unwrap_or("");
        let value = s(h, "value").unwrap_or("");
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(n, v);
        }
    }
    let runtime = ToolRuntime(s(input, "runtime").unwrap_or(""));
    let random_value = input
        .get("random_value")
        .and_then(|v| {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
        .unwrap_or(0);
    let mut req = RouteRequest::new(&method, authority, path, &headers);
    req.https = ssl;
    req.random_value = random_value;
    req.runtime = Some(&runtime);

    let selected = table.select(&req);
    let entry = selected.filter(|sel| matches!(sel.route.action, Action::Forward(_)));
    let picked = entry.and_then(|sel| sel.route.forward().and_then(|f| f.pick_cluster(&req)));
    let mut passed = false;

    if let Some(expected) = s(validate, "cluster_name") {
        let actual = picked.as_ref().map_or("", |p| p.name.as_ref());
        compare(&mut out, &mut passed, actual, expected, "cluster_name");
    }
    if let Some(expected) = s(validate, "virtual_cluster_name") {
        let actual = entry
            .and_then(|sel| sel.virtual_cluster(&req))
            .unwrap_or("");
        compare(
            &mut out,
            &mut passed,
            actual,
            expected,
            "virtual_cluster_name",
        );
    }
    if let Some(expected) = s(validate, "virtual_host_name") {
        let actual = entry.map_or("", |sel| sel.virtual_host.name.as_str());
        compare(&mut out, &mut passed, actual, expected, "virtual_host_name");
    }
    let weighted = picked.as_ref().and_then(|p| p.weighted);
    let new_path = entry.map(|sel| sel.rewritten_path(&req).unwrap_or_else(|| path.to_owned()));
    let new_host = entry.map(|sel| {
        sel.rewritten_host(&req, weighted)
            .map_or_else(|| authority.to_owned(), |h| h.into_owned())
    });
    if let Some(expected) = s(validate, "path_rewrite") {
        compare(
            &mut out,
            &mut passed,
            new_path.as_deref().unwrap_or(""),
            expected,
            "path_rewrite",
        );
    }
    if let Some(expected) = s(validate, "host_rewrite") {
        compare(
            &mut out,
            &mut passed,
            new_host.as_deref().unwrap_or(""),
            expected,
            "host_rewrite",
        );
    }
    if let Some(expected) = s(validate, "path_redirect") {
        let actual = selected.map_or_else(String::new, |sel| redirect_url(&sel, &req));
        compare(&mut out, &mut passed, &actual, expected, "path_redirect");
    }
    if let Some(expected) = validate.get("code_redirect").and_then(Value::as_u64) {
        let actual = selected.map_or(0, |sel| match &sel.route.action {
            Action::Redirect(r) => r.status.as_u16(),
            Action::DirectResponse(d) => d.status.as_u16(),
            _ => 0,
        });
        compare(
            &mut out,
            &mut passed,
            &actual.to_string(),
            &expected.to_string(),
            "code_redirect",
        );
    }
    if let Some(expected) = validate.get("timeout").and_then(parse_duration) {
        let actual = entry
            .and_then(|sel| sel.route.forward())
            .and_then(|f| f.timeout);
        let actual = if entry.is_some() {
            format_duration(actual)
        } else {
            String::new()
        };
        compare(
            &mut out,
            &mut passed,
            &actual,
            &format_duration(Some(expected)),
            "timeout",
        );
    }
    if let Some(matchers) = validate
        .get("request_header_matches")
        .and_then(Value::as_array)
    {
        let mut finalized = headers.clone();
        if let Some(sel) = entry {
            sel.apply_request_headers(weighted, &mut finalized, &FormatContext::default());
        }
        let mut view = req;
        view.headers = &finalized;
        view.path = new_path.as_deref().unwrap_or(path);
        view.authority = new_host.as_deref().unwrap_or(authority);
        check_headers(
            &mut out,
            &mut passed,
            matchers,
            &view,
            compile_matcher,
            "request_header_matches",
        );
    }
    if let Some(matchers) = validate
        .get("response_header_matches")
        .and_then(Value::as_array)
    {
        let mut response = HeaderMap::new();
        if let Some(sel) = selected {
            if let Action::DirectResponse(d) = &sel.route.action
                && !d.body.is_empty()
            {
                response.insert(
                    http::header::CONTENT_LENGTH,
                    HeaderValue::from(d.body.len()),
                );
                if let Some(ct) = d.content_type() {
                    response.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
                }
            }
            sel.apply_response_headers(weighted, &mut response, &FormatContext::default());
        }
        let view = RouteRequest::new(&method, "", "", &response);
        check_headers(
            &mut out,
            &mut passed,
            matchers,
            &view,
            compile_matcher,
            "response_header_matches",
        );
    }
    if let Some(expected) = validate.get("route_metadata").and_then(Value::as_array) {
        for m in expected {
            let (ns, key, value) = (
                s(m, "namespace").unwrap_or(""),
                s(m, "key").unwrap_or(""),
                s(m, "value").unwrap_or(""),
            );
            let actual = selected
                .and_then(|sel| sel.route.metadata.as_deref()?.get(ns))
                .and_then(|v| v.get(key))
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .unwrap_or_default();
            compare(
                &mut out,
                &mut passed,
                &actual,
                value,
                &format!("route_metadata[{ns}.{key}]"),
            );
        }
    }
    if passed {
        out.covered = selected.and_then(|sel| {
            let vh = table
                .virtual_hosts()
                .iter()
                .position(|v| std::ptr::eq(v, sel.virtual_host))?;
            Some((vh, sel.route_index?))
        });
    }
    out
}

fn redirect_url(sel: &Selected<'_>, req: &RouteRequest<'_>) -> String {
    match &sel.route.action {
        Action::Redirect(_) => sel.redirect_location(req).unwrap_or_default(),
        Action::DirectResponse(_) => Selected::request_url(req),
        _ => String::new(),
    }
}

fn check_headers(
    out: &mut CaseResult,
    passed: &mut bool,
    matchers: &[Value],
    view: &RouteRequest<'_>,
    compile: MatcherCompiler<'_>,
    test_type: &str,
) {
    for m in matchers {
        match compile(m) {
            Ok(hm) if hm.matches(view) => *passed = true,
            Ok(hm) => {
                let actual =
                    crate::route::matcher::header_value(view, &hm.name).unwrap_or_default();
                out.failures.push(format!(
                    "actual: [{actual}], expected: [{}], test type: {test_type}",
                    hm.describe()
                ));
            }
            Err(e) => out.failures.push(format!(
                "invalid header matcher: {e}, test type: {test_type}"
            )),
        }
    }
}
