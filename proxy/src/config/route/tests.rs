use super::*;
use crate::config::FakeIo;
use crate::route::{Action, RouteRequest};

pub(crate) fn decode(yaml: &str) -> pb::RouteConfiguration {
    let codec = proto::Codec::new();
    let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
    codec
        .decode::<pb::RouteConfiguration>(value, false)
        .unwrap()
        .message
}

fn compile(yaml: &str) -> Result<RouteTable, ConfigError> {
    compile_route_config(
        &Context::new(&FakeIo::new()),
        &decode(yaml),
        Some(&|c: &str| c != "missing"),
        &mut Warnings::new(),
    )
}

#[test]
fn unknown_cluster_is_an_error() {
    let e = compile(
        "name: rc\nvirtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {prefix: /}\n    route: {cluster: missing}\n",
    )
    .unwrap_err();
    assert_eq!(e.path, "virtual_hosts[0].routes[0].route.cluster");
    assert_eq!(e.message, "route: unknown cluster 'missing'");
    let ok = compile_route_config(
        &Context::new(&FakeIo::new()),
        &decode(
            "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {prefix: /}\n    route: {cluster: missing}\n",
        ),
        None,
        &mut Warnings::new(),
    );
    assert!(ok.is_ok());
}

#[test]
fn duplicate_domains_and_bad_regex() {
    let e = compile(
        "name: rc\nvirtual_hosts:\n- {name: a, domains: [x.com]}\n- {name: b, domains: [X.com]}\n",
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "Only unique values for domains are permitted. Duplicate entry of domain x.com in route rc"
    );
    let e = compile(
        "name: rc\nvirtual_hosts:\n- {name: a, domains: ['*']}\n- {name: b, domains: ['*']}\n",
    )
    .unwrap_err();
    assert_eq!(
        e.message,
        "Only a single wildcard domain is permitted in route rc"
    );
    let e = compile(
        "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {safe_regex: {regex: '(('}}\n    route: {cluster: c}\n",
    )
    .unwrap_err();
    assert_eq!(e.path, "virtual_hosts[0].routes[0].match.safe_regex.regex");
    assert!(e.message.starts_with("Invalid regex '(('"), "{e}");
}

#[test]
fn timeouts_and_inherited_retry() {
    let t = compile(
        "virtual_hosts:\n- name: v\n  domains: ['*']\n  retry_policy: {retry_on: '5xx, reset', num_retries: 3}\n  routes:\n  - match: {prefix: /a}\n    route: {cluster: c, timeout: 0s}\n  - match: {prefix: /b}\n    route: {cluster: c, timeout: 2.5s, retry_policy: {retry_on: connect-failure}}\n  - match: {prefix: /}\n    route: {cluster: c}\n",
    )
    .unwrap();
    let routes = &t.virtual_hosts()[0].routes;
    let f = |i: usize| routes[i].forward().unwrap();
    assert_eq!(f(0).timeout, None);
    assert_eq!(f(1).timeout, Some(Duration::from_millis(2500)));
    assert_eq!(f(2).timeout, Some(Duration::from_secs(15)));
    assert_eq!(
        f(0).retry_policy.as_ref().unwrap().retry_on,
        ["5xx", "reset"]
    );
    assert_eq!(f(0).retry_policy.as_ref().unwrap().num_retries, 3);
    assert_eq!(
        f(1).retry_policy.as_ref().unwrap().retry_on,
        ["connect-failure"]
    );
    assert_eq!(f(1).retry_policy.as_ref().unwrap().num_retries, 1);
}

#[test]
fn direct_response_body_limit() {
    let big = "x".repeat(5000);
    let e = compile(&format!(
        "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {{prefix: /}}\n    direct_response: {{status: 200, body: {{inline_string: {big}}}}}\n"
    ))
    .unwrap_err();
    assert_eq!(
        e.message,
        "response body size is 5000 bytes; maximum is 4096"
    );
    let t = compile(
        "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {prefix: /}\n    direct_response: {status: 418, body: {inline_string: tea}}\n",
    )
    .unwrap();
    let headers = http::HeaderMap::new();
    let req = RouteRequest::new(&http::Method::GET, "x", "/", &headers);
    let sel = t.select(&req).unwrap();
    let Action::DirectResponse(d) = &sel.route.action else {
        panic!()
    };
    assert_eq!(d.status, 418);
    assert_eq!(&d.body[..], b"tea");
    assert_eq!(d.content_type(), Some("text/plain"));
}

/// The machine the tests' route tables are compiled for.
fn fake_io() -> FakeIo {
    FakeIo::new()
        .with_file("/etc/revoy/teapot.txt", "short and stout")
        .with_env("GREETING", "hello")
        .with_env("ZONE", "eu-west-1")
        .with_hostname("pod-7")
}

fn compile_with(io: &FakeIo, yaml: &str) -> Result<RouteTable, ConfigError> {
    compile_route_config(&Context::new(io), &decode(yaml), None, &mut Warnings::new())
}

/// The body of the only route's direct response.
fn direct_body(t: &RouteTable) -> &[u8] {
    let Action::DirectResponse(d) = &t.virtual_hosts[0].routes[0].action else {
        panic!("not a direct response")
    };
    &d.body
}

#[test]
fn direct_response_bodies_come_through_the_context() {
    let io = fake_io();
    let route = |body: &str| {
        format!(
            "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {{prefix: /}}\n    direct_response: {{status: 200, body: {body}}}\n"
        )
    };
    let t = compile_with(&io, &route("{filename: /etc/revoy/teapot.txt}")).unwrap();
    assert_eq!(direct_body(&t), b"short and stout");
    let t = compile_with(&io, &route("{environment_variable: GREETING}")).unwrap();
    assert_eq!(direct_body(&t), b"hello");
    let e = compile_with(&io, &route("{filename: /etc/revoy/missing.txt}")).unwrap_err();
    assert_eq!(
        e.path,
        "virtual_hosts[0].routes[0].direct_response.body.filename"
    );
    assert!(
        e.message
            .starts_with("cannot read /etc/revoy/missing.txt: "),
        "{e}"
    );
    let e = compile_with(&io, &route("{environment_variable: PATH}")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "virtual_hosts[0].routes[0].direct_response.body.environment_variable: Environment variable doesn't exist: PATH"
    );
}

#[test]
fn environment_and_hostname_formatters_are_fixed_from_the_context() {
    let t = compile_with(
        &fake_io(),
        "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {prefix: /}\n    route: {cluster: c}\n    request_headers_to_add:\n    - header: {key: x-zone, value: '%ENVIRONMENT(ZONE)%/%ENVIRONMENT(UNSET):4%'}\n    - header: {key: x-host, value: 'on %HOSTNAME%'}\n",
    )
    .unwrap();
    let rules = t.virtual_hosts[0].routes[0].headers.as_ref().unwrap();
    let values: Vec<String> = rules
        .request
        .add
        .iter()
        .map(|a| {
            a.value.render(
                &http::HeaderMap::new(),
                &Default::default(),
                crate::route::format::Direction::Request,
            )
        })
        .collect();
    assert_eq!(values, ["eu-west-1/-", "on pod-7"]);
    assert_eq!(rules.request.add[0].value.literal(), Some("eu-west-1/-"));
}

#[test]
fn identical_regexes_are_compiled_once_per_context() {
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    let yaml = "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {safe_regex: {regex: '/a+'}, headers: [{name: x, string_match: {safe_regex: {regex: 'b+'}}}]}\n    route: {cluster: c}\n  - match: {safe_regex: {regex: '/a+'}, headers: [{name: x, string_match: {safe_regex: {regex: 'b+'}}}]}\n    route: {cluster: c, regex_rewrite: {pattern: {regex: 'b+'}, substitution: x}}\n";
    compile_route_config(&ctx, &decode(yaml), None, &mut Warnings::new()).unwrap();
    assert_eq!(
        ctx.cached_regexes(),
        3,
        "two anchored patterns, one unanchored"
    );
    compile_route_config(&ctx, &decode(yaml), None, &mut Warnings::new()).unwrap();
    assert_eq!(
        ctx.cached_regexes(),
        3,
        "shared across tables of one compile"
    );
}

/// A route config with one route: `path_match_policy` template `m` and `route` settings.
fn template_route(m: &str, route: &str) -> String {
    format!(
        "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match:\n      path_match_policy:\n        name: envoy.path.match.uri_template.uri_template_matcher\n        typed_config: {{'@type': type.googleapis.com/envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig, path_template: '{m}'}}\n    route: {route}\n"
    )
}

/// A `path_rewrite_policy` with rewrite template `r`, plus `extra` route fields.
fn template_rewrite(r: &str, extra: &str) -> String {
    format!(
        "{{cluster: c, {extra} path_rewrite_policy: {{name: envoy.path.rewrite.uri_template.uri_template_rewriter, typed_config: {{'@type': type.googleapis.com/envoy.extensions.path.rewrite.uri_template.v3.UriTemplateRewriteConfig, path_template_rewrite: '{r}'}}}}}}"
    )
}

#[test]
fn path_template_rewrite_substitutes_variables_and_keeps_the_query() {
    let t = compile(&template_route(
        "/a/{x}/{y=**}",
        &template_rewrite("/r/{y}/{x}", ""),
    ))
    .unwrap();
    let h = http::HeaderMap::new();
    for (path, rewritten) in [
        ("/a/1/2/3?q=1&r=2", "/r/2/3/1?q=1&r=2"),
        ("/a/1/", "/r//1"),
        ("/a/x=y/z?", "/r/z/x=y?"),
    ] {
        let req = RouteRequest::new(&http::Method::GET, "h", path, &h);
        let s = t.select(&req).unwrap();
        assert_eq!(s.rewritten_path(&req).as_deref(), Some(rewritten), "{path}");
    }
    let req = RouteRequest::new(&http::Method::GET, "h", "/a/1/2", &h);
    let explained = serde_json::to_value(crate::route::explain::explain(&t, &req, |_| {
        crate::route::explain::ClusterState::Ready
    }))
    .unwrap();
    assert_eq!(explained["rewritten_path"], "/r/2/1", "{explained}");
    let listed = crate::route::explain::tables_json(&[&t]);
    let action = &listed[0]["virtual_hosts"][0]["routes"][0]["action"];
    assert_eq!(action["path_template_rewrite"], "/r/{y}/{x}", "{listed}");
}

#[test]
fn path_template_rewrite_config_errors_match_envoy() {
    let err = |m: &str, r: &str| compile(&template_route(m, r)).unwrap_err().message;
    assert_eq!(
        err("/foo/{a}", &template_rewrite("/{c}", "")),
        "mismatch between variables in path_match_policy /foo/{a} and path_rewrite_policy /{c}"
    );
    for extra in [
        "prefix_rewrite: /x,",
        "regex_rewrite: {pattern: {regex: x}, substitution: z},",
    ] {
        assert_eq!(
            err("/foo/{a}", &template_rewrite("/{a}", extra)),
            "Specify only one of prefix_rewrite, regex_rewrite or path_rewrite_policy"
        );
    }
    for bad in ["foo", "/r//x", "/r/{x=*}", "/r/{x", "/r/a}b", "/r/?q"] {
        assert_eq!(
            err("/r/{x}", &template_rewrite(bad, "")),
            format!("path_rewrite_policy.path_template_rewrite {bad} is invalid")
        );
    }
    assert_eq!(
        err("/foo/{a", "{cluster: c}"),
        "path_match_policy.path_template /foo/{a is invalid: Unmatched variable bracket in mixed pattern: \"{a\""
    );
    let yaml = format!(
        "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {{prefix: /}}\n    route: {}\n",
        template_rewrite("/{c}", "")
    );
    assert_eq!(
        compile(&yaml).unwrap_err().message,
        "unable to use envoy.path.rewrite.uri_template.uri_template_rewriter extension without envoy.path.match.uri_template.uri_template_matcher extension"
    );
    for ok in [
        "/r/*",
        "/r/{x}.json",
        "/{x}x{x}",
        "/r/a=b",
        "/r/{x}/",
        "/r/%20",
    ] {
        assert!(
            compile(&template_route("/r/{x}", &template_rewrite(ok, ""))).is_ok(),
            "{ok}"
        );
    }
}

#[test]
fn equal_retry_policies_are_compiled_once() {
    let t = compile(
        r"
virtual_hosts:
- name: a
  domains: [a]
  retry_policy: {retry_on: 5xx, num_retries: 2}
  routes:
  - match: {prefix: /x}
    route: {cluster: c, retry_policy: {retry_on: 5xx, num_retries: 2}}
  - match: {prefix: /y}
    route: {cluster: c, retry_policy: {retry_on: 5xx, num_retries: 3}}
  - match: {prefix: /}
    route: {cluster: c}
- name: b
  domains: [b]
  routes:
  - match: {prefix: /}
    route: {cluster: c, retry_policy: {retry_on: 5xx, num_retries: 3}}
",
    )
    .unwrap();
    let policy = |vh: usize, r: usize| match &t.virtual_hosts()[vh].routes[r].action {
        Action::Forward(f) => f.retry_policy.clone().unwrap(),
        other => panic!("not a forward: {other:?}"),
    };
    assert!(
        Arc::ptr_eq(&policy(0, 0), &policy(0, 2)),
        "route and virtual host share"
    );
    assert!(
        Arc::ptr_eq(&policy(0, 1), &policy(1, 0)),
        "across virtual hosts"
    );
    assert!(!Arc::ptr_eq(&policy(0, 0), &policy(0, 1)));
    assert_eq!((policy(0, 0).num_retries, policy(0, 1).num_retries), (2, 3));
}
