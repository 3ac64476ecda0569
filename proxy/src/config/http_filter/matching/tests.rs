use http::{HeaderMap, HeaderValue, Method};

use super::*;
use crate::route::RouteRequest;
use crate::route::filter_matcher::{Connection, Data};

const FAULT: &str = "{name: envoy.filters.http.fault, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}}";
const SKIP: &str = "{action: {name: skip, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter}}}";

fn header_input(name: &str) -> String {
    format!(
        "{{name: h, typed_config: {{\"@type\": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput, header_name: \"{name}\"}}}}"
    )
}

fn query_input(name: &str) -> String {
    format!(
        "{{name: q, typed_config: {{\"@type\": type.googleapis.com/envoy.type.matcher.v3.HttpRequestQueryParamMatchInput, query_param: {name}}}}}"
    )
}

fn compile_matcher(xds_matcher: &str) -> Result<Matcher, ConfigError> {
    let yaml = format!("{{extension_config: {FAULT}, xds_matcher: {xds_matcher}}}");
    let codec = proto::Codec::new();
    let value = proto::Codec::parse_text(&yaml, proto::Format::Yaml).unwrap();
    let p: ExtensionWithMatcher = codec.decode(value, false).unwrap().message;
    let io = crate::config::FakeIo::new();
    compile(&Context::new(&io), &p).map(|(any, m)| {
        assert!(any.type_url.ends_with("fault.v3.HTTPFault"));
        m
    })
}

/// Whether `m` skips a GET of `path` with `headers`.
fn skips(m: &Matcher, path: &str, headers: &[(&'static str, &str)]) -> bool {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.append(*k, HeaderValue::from_str(v).unwrap());
    }
    m.skips(&Data {
        request: RouteRequest::new(&Method::GET, "h", path, &map),
        connection: Connection {
            remote: [192, 0, 2, 1].into(),
            direct_remote: [127, 0, 0, 1].into(),
            local: ([127, 0, 0, 2], 8080).into(),
        },
    })
}

#[test]
fn a_tree_skips_by_exact_and_longest_prefix() {
    let m = compile_matcher(&format!(
        "{{matcher_tree: {{input: {}, exact_match_map: {{map: {{yes: {SKIP}}}}}}}}}",
        header_input("x-skip")
    ))
    .unwrap();
    assert!(skips(&m, "/", &[("x-skip", "yes")]));
    assert!(!skips(&m, "/", &[("x-skip", "no")]));
    assert!(!skips(&m, "/", &[]));
    // Several values are joined with `,` before the lookup.
    assert!(!skips(&m, "/", &[("x-skip", "yes"), ("x-skip", "yes")]));

    // A longer prefix whose nested matcher does not match gives way to a shorter one.
    let nested = format!(
        "{{matcher: {{matcher_tree: {{input: {}, exact_match_map: {{map: {{\"1\": {SKIP}}}}}}}}}}}",
        query_input("v")
    );
    let m = compile_matcher(&format!(
        "{{matcher_tree: {{input: {}, prefix_match_map: {{map: {{/api: {SKIP}, /api/v: {nested}}}}}}}}}",
        header_input(":path")
    ))
    .unwrap();
    assert!(skips(&m, "/api/x", &[]));
    assert!(skips(&m, "/api/v?v=1", &[]));
    assert!(skips(&m, "/api/v?v=2", &[]));
    assert!(!skips(&m, "/other", &[]));
}

#[test]
fn a_list_takes_the_first_match_and_falls_back_to_on_no_match() {
    let single = |input: &str, value: &str| {
        format!("{{single_predicate: {{input: {input}, value_match: {value}}}}}")
    };
    let m = compile_matcher(&format!(
        "{{matcher_list: {{matchers: [{{predicate: {{and_matcher: {{predicate: [{}, {{not_matcher: {}}}]}}}}, on_match: {SKIP}}}]}}}}",
        single(&header_input("x-a"), "{prefix: 'on'}"),
        single(&query_input("keep"), "{exact: \"1\"}"),
    ))
    .unwrap();
    assert!(skips(&m, "/", &[("x-a", "on-1")]));
    assert!(skips(&m, "/?keep=2", &[("x-a", "on")]));
    assert!(!skips(&m, "/?keep=1", &[("x-a", "on")]));
    assert!(!skips(&m, "/", &[("x-a", "off")]));

    let m = compile_matcher(&format!(
        "{{matcher_list: {{matchers: [{{predicate: {}, on_match: {{matcher: {{matcher_list: {{matchers: [{{predicate: {}, on_match: {SKIP}}}]}}}}}}}}]}}, on_no_match: {SKIP}}}",
        single(&header_input("x-a"), "{exact: a}"),
        single(&header_input("x-b"), "{exact: b, ignore_case: true}"),
    ))
    .unwrap();
    assert!(skips(&m, "/", &[("x-a", "a"), ("x-b", "B")]));
    // The nested matcher does not match: on to `on_no_match`, which skips.
    assert!(skips(&m, "/", &[("x-a", "a")]));
    assert!(skips(&m, "/", &[]));
}

#[test]
fn connection_inputs_read_the_addresses() {
    let input = |name: &str| {
        format!(
            "{{name: i, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.{name}}}}}"
        )
    };
    for (name, value, expected) in [
        ("SourceIPInput", "192.0.2.1", true),
        ("SourceIPInput", "127.0.0.1", false),
        ("DirectSourceIPInput", "127.0.0.1", true),
        ("DestinationIPInput", "127.0.0.2", true),
        ("DestinationPortInput", "8080", true),
        ("DestinationPortInput", "80", false),
    ] {
        let m = compile_matcher(&format!(
            "{{matcher_tree: {{input: {}, exact_match_map: {{map: {{\"{value}\": {SKIP}}}}}}}}}",
            input(name)
        ))
        .unwrap();
        assert_eq!(skips(&m, "/", &[]), expected, "{name} {value}");
    }
}

#[test]
fn what_revoy_lacks_is_refused_by_name() {
    let tree = |input: &str, on: &str| {
        format!("{{matcher_tree: {{input: {input}, exact_match_map: {{map: {{k: {on}}}}}}}}}")
    };
    let cases = [
        (
            tree(
                "{name: ip, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.ServerNameInput}}",
                SKIP,
            ),
            "xds_matcher.matcher_tree.input.typed_config",
        ),
        (
            tree(
                &header_input("x"),
                "{action: {name: other, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.composite.v3.ExecuteFilterAction}}}",
            ),
            "xds_matcher.matcher_tree.exact_match_map.map[k].action",
        ),
        (
            tree(
                &header_input("x"),
                &SKIP.replace("{action", "{keep_matching: true, action"),
            ),
            "xds_matcher.matcher_tree.exact_match_map.map[k].keep_matching",
        ),
        (
            format!(
                "{{matcher_tree: {{input: {}, custom_match: {{name: c, typed_config: {{\"@type\": type.googleapis.com/xds.type.matcher.v3.IPMatcher}}}}}}}}",
                header_input("x")
            ),
            "xds_matcher.matcher_tree.custom_match",
        ),
        (
            "{matcher_list: {matchers: []}}".to_owned(),
            "xds_matcher.matcher_list.matchers",
        ),
        (
            tree(&header_input("bad name"), SKIP),
            "xds_matcher.matcher_tree.input.typed_config.header_name",
        ),
    ];
    for (matcher, path) in cases {
        let e = compile_matcher(&matcher).unwrap_err();
        assert_eq!(e.path, path, "{matcher}: {e}");
    }
    let codec = proto::Codec::new();
    let io = crate::config::FakeIo::new();
    for (yaml, path) in [
        (
            format!("{{extension_config: {FAULT}, matcher: {{on_no_match: {SKIP}}}}}"),
            "matcher",
        ),
        (
            "{extension_config: {name: x}, xds_matcher: {}}".to_owned(),
            "extension_config.typed_config",
        ),
        (format!("{{extension_config: {FAULT}}}"), "xds_matcher"),
    ] {
        let value = proto::Codec::parse_text(&yaml, proto::Format::Yaml).unwrap();
        let p: ExtensionWithMatcher = codec.decode(value, false).unwrap().message;
        let e = compile(&Context::new(&io), &p).unwrap_err();
        assert_eq!(e.path, path, "{yaml}: {e}");
    }
}
