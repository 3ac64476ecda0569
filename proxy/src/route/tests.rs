use http::{HeaderMap, HeaderValue, Method};

use super::*;

fn table(yaml: &str) -> RouteTable {
    let rc = crate::config::route::tests::decode(yaml);
    crate::config::route::compile_route_config(
        &crate::config::Context::new(&crate::config::FakeIo::new()),
        &rc,
        None,
        &mut crate::config::Warnings::new(),
    )
    .unwrap()
}

fn route_name<'t>(
    t: &'t RouteTable,
    authority: &str,
    path: &str,
    headers: &HeaderMap,
) -> Option<&'t str> {
    let req = RouteRequest::new(&Method::GET, authority, path, headers);
    t.select(&req).map(|s| s.route.name.as_str())
}

const ROUTES: &str = r#"
name: rc
virtual_hosts:
- name: api
  domains: [api.example.com, "api.example.com:8080"]
  routes:
  - name: exact
    match: {path: /exact}
    route: {cluster: a}
  - name: ci
    match: {prefix: /CI, case_sensitive: false}
    route: {cluster: a, prefix_rewrite: /lower}
  - name: sep
    match: {path_separated_prefix: /sep}
    route: {cluster: a}
  - name: re
    match: {safe_regex: {regex: "/users/[0-9]+"}}
    route: {cluster: a, regex_rewrite: {pattern: {regex: "^/users/([0-9]+)$"}, substitution: "/u/\\1"}}
  - name: hdr
    match:
      prefix: /h
      headers:
      - {name: x-v, string_match: {prefix: v1}}
      - {name: x-absent, present_match: true, invert_match: true}
    route: {cluster: a}
  - name: range
    match:
      prefix: /h
      headers: [{name: x-n, range_match: {start: 1, end: 10}}]
    route: {cluster: a}
  - name: query
    match:
      prefix: /q
      query_parameters: [{name: debug, string_match: {exact: "1"}}]
    route: {cluster: a}
  - name: grpc
    match: {prefix: /, grpc: {}}
    route: {cluster: g}
  - name: weighted
    match: {prefix: /w}
    route:
      weighted_clusters:
        clusters:
        - {name: w1, weight: 30}
        - {name: w2, weight: 70, host_rewrite_literal: w2.internal}
  - name: default
    match: {prefix: /}
    route: {cluster: d, host_rewrite_literal: rewritten}
- name: wild
  domains: ["*.example.com", "foo.*"]
  routes:
  - name: wild
    match: {prefix: /}
    redirect: {https_redirect: true, strip_query: true}
"#;

#[test]
fn path_and_header_matching() {
    let t = table(ROUTES);
    let h = HeaderMap::new();
    let a = "api.example.com";
    assert_eq!(route_name(&t, a, "/exact", &h), Some("exact"));
    assert_eq!(route_name(&t, a, "/exact?x=1", &h), Some("exact"));
    assert_eq!(route_name(&t, a, "/exact/more", &h), Some("default"));
    assert_eq!(route_name(&t, a, "/ci/x", &h), Some("ci"));
    assert_eq!(route_name(&t, a, "/sep", &h), Some("sep"));
    assert_eq!(route_name(&t, a, "/sep/x", &h), Some("sep"));
    assert_eq!(route_name(&t, a, "/sepx", &h), Some("default"));
    assert_eq!(route_name(&t, a, "/users/12", &h), Some("re"));
    assert_eq!(route_name(&t, a, "/users/12x", &h), Some("default"));
    assert_eq!(route_name(&t, a, "/q?debug=1", &h), Some("query"));
    assert_eq!(route_name(&t, a, "/q?debug=2", &h), Some("default"));
    let mut h = HeaderMap::new();
    h.insert("x-v", HeaderValue::from_static("v1.2"));
    assert_eq!(route_name(&t, a, "/h", &h), Some("hdr"));
    h.insert("x-absent", HeaderValue::from_static("here"));
    assert_eq!(route_name(&t, a, "/h", &h), Some("default"));
    let mut h = HeaderMap::new();
    h.insert("x-n", HeaderValue::from_static("9"));
    assert_eq!(route_name(&t, a, "/h", &h), Some("range"));
    h.insert("x-n", HeaderValue::from_static("10"));
    assert_eq!(route_name(&t, a, "/h", &h), Some("default"));
    let mut h = HeaderMap::new();
    h.insert(
        "content-type",
        HeaderValue::from_static("application/grpc+proto"),
    );
    assert_eq!(route_name(&t, a, "/svc/M", &h), Some("grpc"));
}

#[test]
fn domains_and_ports() {
    let t = table(ROUTES);
    let h = HeaderMap::new();
    assert_eq!(route_name(&t, "API.example.com", "/x", &h), Some("default"));
    assert_eq!(
        route_name(&t, "api.example.com:8080", "/x", &h),
        Some("default")
    );
    assert_eq!(route_name(&t, "api.example.com:9090", "/x", &h), None);
    assert_eq!(route_name(&t, "b.example.com", "/x", &h), Some("wild"));
    assert_eq!(route_name(&t, "foo.bar", "/x", &h), Some("wild"));
    assert_eq!(route_name(&t, "other", "/x", &h), None);
    let t = table(
        "ignore_port_in_host_matching: true\nvirtual_hosts:\n- name: v\n  domains: [a.com]\n  routes:\n  - name: r\n    match: {prefix: /}\n    route: {cluster: c}\n",
    );
    assert_eq!(route_name(&t, "a.com:1234", "/", &h), Some("r"));
}

#[test]
fn rewrites_weights_and_redirects() {
    let t = table(ROUTES);
    let h = HeaderMap::new();
    let mut req = RouteRequest::new(&Method::GET, "api.example.com", "/CI/x?y=1", &h);
    let s = t.select(&req).unwrap();
    assert_eq!(s.rewritten_path(&req).as_deref(), Some("/lower/x?y=1"));
    req.path = "/users/42?z";
    let s = t.select(&req).unwrap();
    assert_eq!(s.rewritten_path(&req).as_deref(), Some("/u/42?z"));
    req.path = "/other";
    let s = t.select(&req).unwrap();
    assert_eq!(s.rewritten_path(&req), None);
    assert_eq!(s.rewritten_host(&req, None).as_deref(), Some("rewritten"));
    req.path = "/w";
    for (random, cluster, host) in [
        (29, "w1", None),
        (30, "w2", Some("w2.internal")),
        (199, "w2", Some("w2.internal")),
    ] {
        req.random_value = random;
        let s = t.select(&req).unwrap();
        let picked = s.route.forward().unwrap().pick_cluster(&req).unwrap();
        assert_eq!(picked.name, cluster, "random {random}");
        assert_eq!(s.rewritten_host(&req, picked.weighted).as_deref(), host);
    }
    let req = RouteRequest::new(&Method::GET, "b.example.com", "/p?q=1", &h);
    let s = t.select(&req).unwrap();
    assert_eq!(
        s.redirect_location(&req).as_deref(),
        Some("https://b.example.com/p")
    );
}

#[test]
fn header_mutation_order() {
    let yaml = |wins: bool| {
        format!(
            "most_specific_header_mutations_wins: {wins}\nrequest_headers_to_add: [{{header: {{key: x-l, value: global}}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}}]\nvirtual_hosts:\n- name: v\n  domains: ['*']\n  request_headers_to_add: [{{header: {{key: x-l, value: vhost}}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}}]\n  routes:\n  - match: {{prefix: /}}\n    route: {{cluster: c}}\n    request_headers_to_add: [{{header: {{key: x-l, value: route}}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}}]\n    request_headers_to_remove: [x-gone]\n"
        )
    };
    for (wins, expected) in [(false, "global"), (true, "route")] {
        let t = table(&yaml(wins));
        let h = HeaderMap::new();
        let req = RouteRequest::new(&Method::GET, "x", "/", &h);
        let s = t.select(&req).unwrap();
        let mut out = HeaderMap::new();
        out.insert("x-gone", HeaderValue::from_static("1"));
        s.apply_request_headers(None, &mut out, &FormatContext::default());
        assert_eq!(out["x-l"], expected);
        assert!(!out.contains_key("x-gone"));
    }
}

#[test]
fn require_tls_redirects() {
    let t = table(
        "virtual_hosts:\n- name: v\n  domains: ['*']\n  require_tls: EXTERNAL_ONLY\n  routes:\n  - name: r\n    match: {prefix: /}\n    route: {cluster: c}\n",
    );
    let h = HeaderMap::new();
    let mut req = RouteRequest::new(&Method::GET, "a.com:80", "/x", &h);
    let s = t.select(&req).unwrap();
    assert_eq!(s.route_index, None);
    assert_eq!(
        s.redirect_location(&req).as_deref(),
        Some("https://a.com/x")
    );
    req.https = true;
    assert_eq!(t.select(&req).unwrap().route_index, Some(0));
    let mut internal = HeaderMap::new();
    internal.insert("x-envoy-internal", HeaderValue::from_static("true"));
    let req = RouteRequest::new(&Method::GET, "a.com", "/x", &internal);
    assert_eq!(t.select(&req).unwrap().route_index, Some(0));
}

#[test]
fn picked_clusters_outlive_the_request() {
    let t = table(
        r#"
name: rc
virtual_hosts:
- name: all
  domains: ["*"]
  routes:
  - match: {prefix: /w}
    route:
      weighted_clusters:
        clusters:
        - {name: w1, weight: 1}
        - {cluster_header: x-cluster, weight: 1}
  - match: {prefix: /h}
    route: {cluster_header: x-cluster}
"#,
    );
    let pick = |path: &str, random: u64| {
        let mut headers = HeaderMap::new();
        headers.insert("x-cluster", HeaderValue::from_static("from-header"));
        let mut req = RouteRequest::new(&Method::GET, "any", path, &headers);
        req.random_value = random;
        let selected = t.select(&req).unwrap();
        let picked = selected.route.forward().unwrap().pick_cluster(&req);
        drop(headers);
        picked.map(|p| (p.name.into_owned(), p.weighted.map(|w| w.weight)))
    };
    assert_eq!(pick("/w", 0), Some(("w1".to_owned(), Some(1))));
    assert_eq!(pick("/w", 1), Some(("from-header".to_owned(), Some(1))));
    assert_eq!(pick("/h", 0), Some(("from-header".to_owned(), None)));
}
