use super::*;
use crate::config::FakeIo;

fn decode<T: prost::Message + Default + prost::Name>(yaml: &str) -> T {
    let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
    proto::Codec::new()
        .decode::<T>(value, false)
        .unwrap()
        .message
}

fn rules(yaml: &str) -> (Result<Rules, ConfigError>, Warnings) {
    let mut w = Warnings::new();
    let r = compile_rules(&Context::new(&FakeIo::new()), &decode(yaml), false, &mut w);
    (r, w)
}

fn error(yaml: &str) -> ConfigError {
    rules(yaml).0.unwrap_err()
}

#[test]
fn what_revoy_cannot_evaluate_is_an_error_naming_the_field() {
    let cases = [
        (
            "policies: {p: {permissions: [{any: true}], principals: [{any: true}], condition: {const_expr: {bool_value: true}}}}",
            r#"policies["p"].condition"#,
        ),
        (
            "policies: {p: {permissions: [{and_rules: {rules: [{matcher: {name: m, typed_config: {'@type': type.googleapis.com/envoy.extensions.rbac.matchers.upstream_ip_port.v3.UpstreamIpPortMatcher}}}]}}], principals: [{any: true}]}}",
            r#"policies["p"].permissions[0].and_rules.rules[0].matcher"#,
        ),
        (
            "policies: {p: {permissions: [{any: true}], principals: [{not_id: {custom: {name: c, typed_config: {'@type': type.googleapis.com/envoy.extensions.rbac.principals.mtls_authenticated.v3.Config}}}}]}}",
            r#"policies["p"].principals[0].not_id.custom"#,
        ),
        (
            "policies: {p: {permissions: [{any: true}], principals: [{sourced_metadata: {metadata_matcher: {filter: f, path: [{key: k}], value: {present_match: true}}, metadata_source: ROUTE}}]}}",
            r#"policies["p"].principals[0].sourced_metadata.metadata_source"#,
        ),
        (
            "policies: {p: {permissions: [{metadata: {filter: envoy.filters.http.rbac, path: [{key: k}], value: {present_match: true}}}], principals: [{any: true}]}}",
            r#"policies["p"].permissions[0].metadata.filter"#,
        ),
        (
            "policies: {p: {permissions: [{any: true}], principals: []}}",
            r#"policies["p"].principals"#,
        ),
        (
            "policies: {p: {permissions: [{destination_port: 70000}], principals: [{any: true}]}}",
            r#"policies["p"].permissions[0].destination_port"#,
        ),
        (
            "policies: {p: {permissions: [{destination_port_range: {start: 90, end: 80}}], principals: [{any: true}]}}",
            r#"policies["p"].permissions[0].destination_port_range"#,
        ),
        (
            "policies: {p: {permissions: [{url_path: {path: {safe_regex: {regex: '('}}}}], principals: [{any: true}]}}",
            r#"policies["p"].permissions[0].url_path.path.safe_regex.regex"#,
        ),
        (
            "policies: {p: {permissions: [{}], principals: [{any: true}]}}",
            r#"policies["p"].permissions[0].rule"#,
        ),
    ];
    for (yaml, path) in cases {
        assert_eq!(error(yaml).path, path, "{yaml}");
    }
}

#[test]
fn filter_state_compiles_with_a_note_and_request_metadata_without() {
    let (r, w) = rules(
        "policies:
  p:
    permissions: [{any: true}]
    principals:
    - or_ids:
        ids:
        - metadata: {filter: istio_authn, path: [{key: source.principal}], value: {string_match: {exact: a}}}
        - filter_state: {key: io.istio.peer_principal, string_match: {exact: a}}
        - filter_state: {key: downstream_peer, string_match: {exact: a}}",
    );
    let r = r.unwrap();
    let paths: Vec<&str> = w.iter().map(|w| w.path.as_str()).collect();
    assert_eq!(
        paths,
        [r#"policies["p"].principals[0].or_ids.ids[2].filter_state"#],
        "only the key no filter of revoy's sets has a note"
    );
    let Principal::Or(ids) = &r.policies[0].1.principals[0] else {
        panic!("or_ids");
    };
    assert!(
        matches!(&ids[1], Principal::FilterState { key, .. } if &**key == "io.istio.peer_principal")
    );
    assert!(matches!(ids[2], Principal::AbsentFilterState));
}

#[test]
fn uri_templates_compile_to_whole_path_regexes() {
    let (r, _) = rules(
        "policies: {p: {permissions: [{uri_template: {name: t, typed_config: {'@type': type.googleapis.com/envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig, path_template: '/books/{id}/**'}}}], principals: [{any: true}]}}",
    );
    let r = r.unwrap();
    let Permission::UriTemplate(re) = &r.policies[0].1.permissions[0] else {
        panic!("a template");
    };
    assert!(re.is_match("/books/1/a/b"));
    assert!(!re.is_match("/books/1"));
}

#[test]
fn network_filter_needs_a_stat_prefix_and_no_matcher_tree() {
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    let compile = |yaml: &str| compile_network(&ctx, &decode(yaml), &mut Warnings::new());
    assert_eq!(compile("rules: {}").unwrap_err().path, "stat_prefix");
    assert_eq!(
        compile("stat_prefix: t.\nshadow_matcher: {matcher_list: {matchers: []}}")
            .unwrap_err()
            .path,
        "shadow_matcher"
    );
    let ok = compile("stat_prefix: t.\ndelay_deny: 0.5s\nshadow_rules: {action: DENY}").unwrap();
    assert!(ok.engines.enforced.is_none());
    assert!(ok.engines.shadow.is_some());
    assert_eq!(ok.delay_deny, Some(Duration::from_millis(500)));
}

#[test]
fn the_network_filter_refuses_header_rules_at_any_depth() {
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    let e = compile_network(
        &ctx,
        &decode(
            "stat_prefix: t.\nshadow_rules: {policies: {p: {permissions: [{any: true}], principals: [{not_id: {header: {name: x, present_match: true}}}]}}}",
        ),
        &mut Warnings::new(),
    )
    .unwrap_err();
    assert_eq!(
        e.path,
        r#"shadow_rules.policies["p"].principals[0].not_id.header"#
    );
    let (http, _) = rules(
        "policies: {p: {permissions: [{header: {name: x, present_match: true}}], principals: [{any: true}]}}",
    );
    assert!(http.is_ok());
}

/// An RBAC filter on `istio_authn` metadata (`action`) after a filter revoy skips.
fn behind_a_skipped_filter(action: &str) -> String {
    format!(
        "- {{name: envoy.filters.http.grpc_json_transcoder, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder}}}}
- {{name: envoy.filters.http.rbac, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC, rules: {{action: {action}, policies: {{p: {{permissions: [{{any: true}}], principals: [{{metadata: {{filter: istio_authn, path: [{{key: a}}], value: {{string_match: {{exact: b}}}}}}}}]}}}}}}}}}}
- {{name: envoy.filters.http.router, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}"
    )
}

#[test]
fn metadata_rules_behind_a_skipped_http_filter_fail_closed() {
    use crate::config::http_filter::{FilterKind, compile_chain};
    use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    let hcm: HttpConnectionManager = decode(&format!(
        "stat_prefix: h\nhttp_filters:\n{}",
        behind_a_skipped_filter("DENY")
    ));
    let mut w = Warnings::new();
    let chain = compile_chain(&ctx, &hcm.http_filters, &mut w).unwrap();
    let FilterKind::Rbac { after_skipped, .. } = &chain.filters[0].kind else {
        panic!("the rbac filter: {:?}", chain.filters);
    };
    assert_eq!(
        after_skipped.as_deref(),
        Some("envoy.filters.http.grpc_json_transcoder")
    );
    let closed: Vec<&str> = w
        .iter()
        .filter(|w| w.severity == crate::config::Severity::FailsClosed)
        .map(|w| w.path.as_str())
        .collect();
    assert_eq!(closed, ["http_filters[1]"]);
    let hcm: HttpConnectionManager = decode(&format!(
        "stat_prefix: h\nhttp_filters:\n{}",
        behind_a_skipped_filter("DENY").replace(
            "metadata: {filter: istio_authn, path: [{key: a}], value: {string_match: {exact: b}}}",
            "any: true"
        )
    ));
    let mut w = Warnings::new();
    compile_chain(&ctx, &hcm.http_filters, &mut w).unwrap();
    assert!(!w.any_fails_closed(), "rules without metadata: {w:?}");
}

#[test]
fn metadata_rules_behind_jwt_authn_setting_metadata_stay_open() {
    use crate::config::http_filter::{FilterKind, compile_chain};
    use proto::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    let jwt = |extra: &str| {
        format!(
            "- {{name: jwt, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication, providers: {{p: {{issuer: i, local_jwks: {{inline_string: '{{\"keys\": [{{\"kty\": \"oct\", \"k\": \"c2VjcmV0\"}}]}}'}}{extra}}}}}}}}}\n"
        )
    };
    let after = |extra: &str| {
        let filters = behind_a_skipped_filter("DENY").replacen(
            "- {name: envoy.filters.http.grpc_json_transcoder, typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder}}\n",
            &jwt(extra),
            1,
        );
        let hcm: HttpConnectionManager =
            decode(&format!("stat_prefix: h\nhttp_filters:\n{filters}"));
        let mut w = Warnings::new();
        let chain = compile_chain(&ctx, &hcm.http_filters, &mut w).unwrap();
        let FilterKind::Rbac { after_skipped, .. } = &chain.filters[1].kind else {
            panic!("the rbac filter: {:?}", chain.filters);
        };
        (after_skipped.clone(), w.any_fails_closed())
    };
    // revoy's jwt_authn writes the metadata: the rules read it, nothing fails closed.
    assert_eq!(after(", payload_in_metadata: i"), (None, false));
    assert_eq!(after(""), (None, false));
}

#[test]
fn metadata_rules_behind_a_skipped_network_or_listener_filter_fail_closed() {
    use proto::pb::envoy::config::listener::v3::Listener;
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    let rbac_on = |key: &str| {
        format!(
            "{{name: envoy.filters.network.rbac, typed_config: {{'@type': type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC, stat_prefix: t., rules: {{action: DENY, policies: {{p: {{permissions: [{{any: true}}], principals: [{{filter_state: {{key: {key}, string_match: {{exact: x}}}}}}]}}}}}}}}}}"
        )
    };
    let rbac = &rbac_on("downstream_peer");
    let tcp = "{name: tcp, typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t, cluster: c}}";
    let exchange = "{name: istio.metadata_exchange, typed_config: {'@type': type.googleapis.com/udpa.type.v1.TypedStruct, type_url: type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange, value: {protocol: istio-peer-exchange}}}";
    let listener = |filters: &str, listener_filters: &str| -> Listener {
        decode(&format!(
            "name: l\naddress: {{socket_address: {{address: 127.0.0.1, port_value: 1}}}}\nlistener_filters: [{listener_filters}]\nfilter_chains: [{{filters: [{filters}]}}]"
        ))
    };
    let refused = |l: &Listener| {
        crate::config::listener::compile_listener(&ctx, l, None, &mut Warnings::new())
            .unwrap()
            .chains[0]
            .refused
            .clone()
    };
    let why = refused(&listener(&format!("{exchange}, {rbac}, {tcp}"), "")).expect("refused");
    assert!(why.contains("istio.metadata_exchange"), "{why}");
    // The principals istio_authn sets are known: rules on them stay open after it.
    let principal = rbac_on("io.istio.peer_principal");
    assert_eq!(
        refused(&listener(&format!("{exchange}, {principal}, {tcp}"), "")),
        None
    );
    assert_eq!(
        refused(&listener(&format!("{rbac}, {exchange}, {tcp}"), "")),
        None
    );
    let proxy_protocol = "{name: envoy.filters.listener.proxy_protocol, typed_config: {'@type': type.googleapis.com/envoy.extensions.filters.listener.proxy_protocol.v3.ProxyProtocol}}";
    let why = refused(&listener(&format!("{rbac}, {tcp}"), proxy_protocol)).expect("refused");
    assert!(
        why.contains("envoy.filters.listener.proxy_protocol"),
        "{why}"
    );
}
