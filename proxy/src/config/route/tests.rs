use super::*;
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
    compile_route_config(&decode(yaml), Some(&|c: &str| c != "missing"))
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
        &decode(
            "virtual_hosts:\n- name: v\n  domains: ['*']\n  routes:\n  - match: {prefix: /}\n    route: {cluster: missing}\n",
        ),
        None,
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

#[test]
fn regex_cache_lives_for_one_scope() {
    use super::matchers::{RegexCacheScope, compile_regex};
    let cached = || super::matchers::cached_regex_count();
    assert_eq!(cached(), None);
    {
        let _scope = RegexCacheScope::enter();
        let a = compile_regex("ab+c", true).unwrap();
        let b = compile_regex("ab+c", true).unwrap();
        compile_regex("ab+c", false).unwrap();
        {
            let _nested = RegexCacheScope::enter();
            compile_regex("x", true).unwrap();
        }
        assert_eq!(cached(), Some(3));
        assert!(a.is_match("abbc") && b.is_match("abbc") && !b.is_match("xabbc"));
        assert!(compile_regex("(", true).is_err());
    }
    assert_eq!(cached(), None);
}
