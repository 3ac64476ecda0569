use std::net::SocketAddr;

use http::{HeaderMap, Method};

use super::*;
use crate::config::{Context, FakeIo, Warnings};

fn rules(yaml: &str) -> Rules {
    let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
    let proto: proto::pb::envoy::config::rbac::v3::Rbac =
        proto::Codec::new().decode(value, false).unwrap().message;
    crate::config::rbac::compile_rules(
        &Context::new(&FakeIo::new()),
        &proto,
        false,
        &mut Warnings::new(),
    )
    .unwrap()
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().unwrap()
}

/// A connection from 127.0.0.2:5000 to 127.0.0.1:8080, plaintext, no server name.
fn connection() -> Facts<'static> {
    Facts {
        request: None,
        local: addr("127.0.0.1:8080"),
        source: ip("127.0.0.2"),
        direct_remote: ip("127.0.0.2"),
        remote: ip("127.0.0.2"),
        tls: None,
        server_name: "",
        metadata: None,
    }
}

fn allowed(r: &Rules, facts: &Facts<'_>) -> bool {
    r.decide(facts).allowed
}

#[test]
fn allow_needs_a_matching_policy_and_deny_refuses_one() {
    let policy =
        "policies: {p: {permissions: [{destination_port: 8080}], principals: [{any: true}]}}";
    let allow = rules(&format!("action: ALLOW\n{policy}"));
    let deny = rules(&format!("action: DENY\n{policy}"));
    let log = rules(&format!("action: LOG\n{policy}"));
    let here = connection();
    let mut elsewhere = connection();
    elsewhere.local = addr("127.0.0.1:9090");
    assert!(allowed(&allow, &here) && !allowed(&allow, &elsewhere));
    assert!(!allowed(&deny, &here) && allowed(&deny, &elsewhere));
    assert!(allowed(&log, &here) && allowed(&log, &elsewhere));
    assert_eq!(log.decide(&here).policy.as_deref(), Some("p"));
    assert_eq!(log.decide(&elsewhere).policy, None);
    assert!(
        !allowed(&rules("action: ALLOW"), &here),
        "no policy allows nothing"
    );
}

#[test]
fn the_effective_policy_is_the_first_matching_by_name() {
    let r = rules(
        "action: DENY
policies:
  zeta: {permissions: [{any: true}], principals: [{any: true}]}
  alpha: {permissions: [{destination_port: 8080}], principals: [{any: true}]}
  beta: {permissions: [{any: true}], principals: [{any: true}]}",
    );
    assert_eq!(r.decide(&connection()).policy.as_deref(), Some("alpha"));
    let mut other = connection();
    other.local = addr("127.0.0.1:1");
    assert_eq!(r.decide(&other).policy.as_deref(), Some("beta"));
}

#[test]
fn and_or_not_and_address_rules() {
    let r = rules(
        "policies:
  p:
    permissions:
    - and_rules:
        rules:
        - destination_port_range: {start: 8000, end: 8081}
        - not_rule: {destination_ip: {address_prefix: 127.0.0.9, prefix_len: 32}}
    principals:
    - or_ids:
        ids:
        - direct_remote_ip: {address_prefix: 127.128.0.0, prefix_len: 9}
        - source_ip: {address_prefix: 127.0.0.2, prefix_len: 32}",
    );
    assert!(allowed(&r, &connection()));
    let mut c = connection();
    c.local = addr("127.0.0.1:8081");
    assert!(!allowed(&r, &c), "range end is exclusive");
    let mut c = connection();
    c.local = addr("127.0.0.9:8080");
    assert!(!allowed(&r, &c));
    let mut c = connection();
    c.source = ip("127.0.0.3");
    c.direct_remote = ip("127.0.0.3");
    assert!(!allowed(&r, &c));
    c.direct_remote = ip("127.200.1.2");
    assert!(allowed(&r, &c));
}

#[test]
fn a_connection_has_no_headers_and_no_path() {
    let absent = rules(
        "policies: {p: {permissions: [{header: {name: x-a, present_match: true, invert_match: true}}], principals: [{any: true}]}}",
    );
    let path = rules(
        "policies: {p: {permissions: [{not_rule: {url_path: {path: {prefix: /}}}}], principals: [{any: true}]}}",
    );
    assert!(allowed(&absent, &connection()));
    assert!(
        allowed(&path, &connection()),
        "url_path never matches without a request"
    );
}

#[test]
fn request_rules_see_headers_method_and_the_path_without_query() {
    let r = rules(
        "policies:
  p:
    permissions:
    - and_rules:
        rules:
        - header: {name: ':method', string_match: {exact: GET}}
        - url_path: {path: {exact: /Info, ignore_case: true}}
        - header: {name: x-team, string_match: {prefix: blue}}
    principals: [{remote_ip: {address_prefix: 192.0.2.0, prefix_len: 24}}]",
    );
    let mut headers = HeaderMap::new();
    headers.append("x-team", "blue-1".parse().unwrap());
    let get = Method::GET;
    let req = crate::route::RouteRequest::new(&get, "h", "/info?x=1", &headers);
    let mut facts = connection();
    facts.request = Some(&req);
    facts.remote = ip("192.0.2.7");
    assert!(allowed(&r, &facts));
    facts.remote = ip("127.0.0.2");
    assert!(!allowed(&r, &facts), "remote_ip is the address after XFF");
    facts.remote = ip("192.0.2.7");
    let post = Method::POST;
    let req = crate::route::RouteRequest::new(&post, "h", "/info", &headers);
    facts.request = Some(&req);
    assert!(!allowed(&r, &facts));
}

#[test]
fn metadata_and_filter_state_are_absent() {
    let r = rules(
        "policies:
  p:
    permissions: [{any: true}]
    principals:
    - and_ids:
        ids:
        - metadata: {filter: istio_authn, path: [{key: source.principal}], value: {string_match: {exact: a}}, invert: true}
        - not_id: {filter_state: {key: io.istio.peer_principal, string_match: {exact: a}}}",
    );
    assert!(allowed(&r, &connection()));
}

/// A self-signed certificate with these SANs and common name, as a TLS connection's peer.
fn peer(uris: &[&str], dns: &[&str], cn: &str) -> crate::tls::PeerTls {
    crate::tls::peer::test_peer(uris, dns, cn)
}

#[test]
fn authenticated_principal_is_a_uri_san_else_a_dns_san_else_the_subject() {
    let by = |m: &str| {
        rules(&format!(
            "policies: {{p: {{permissions: [{{any: true}}], principals: [{{authenticated: {{principal_name: {m}}}}}]}}}}"
        ))
    };
    let spiffe = by("{exact: 'spiffe://cluster.local/ns/default/sa/sleep'}");
    let dns = by("{exact: sleep.default.svc}");
    let subject = by("{exact: CN=sleep}");
    let anything = by("{safe_regex: {regex: '.*'}}");
    let any_tls =
        rules("policies: {p: {permissions: [{any: true}], principals: [{authenticated: {}}]}}");
    let tls = peer(
        &["spiffe://cluster.local/ns/default/sa/sleep"],
        &["sleep.default.svc"],
        "sleep",
    );
    let mut facts = connection();
    for r in [&spiffe, &dns, &subject, &anything, &any_tls] {
        assert!(!allowed(r, &facts), "plaintext is never authenticated");
    }
    facts.tls = Some(&tls);
    for r in [&spiffe, &dns, &subject, &anything, &any_tls] {
        assert!(allowed(r, &facts));
    }
    let anonymous = crate::tls::PeerTls::new(None, None);
    facts.tls = Some(&anonymous);
    assert!(
        allowed(&any_tls, &facts),
        "TLS without a client certificate"
    );
    assert!(allowed(&anything, &facts), "the empty subject matches '.*'");
    assert!(!allowed(&spiffe, &facts));
}

/// istiod's shapes of AuthorizationPolicy `principals` and `namespaces`: filter state
/// `io.istio.peer_principal`, which only a chain with `istio_authn` has, and only once the
/// peer presented a certificate (its first `spiffe://` URI SAN).
#[test]
fn istio_peer_principal_is_filter_state_of_istio_authn_chains() {
    let by = |m: &str| {
        rules(&format!(
            "policies: {{p: {{permissions: [{{any: true}}], principals: [{{filter_state: {{key: io.istio.peer_principal, string_match: {m}}}}}]}}}}"
        ))
    };
    let sleep = by("{exact: 'spiffe://cluster.local/ns/default/sa/sleep'}");
    let namespace = by("{safe_regex: {regex: '.*/ns/default/.*'}}");
    let other = by("{exact: 'spiffe://cluster.local/ns/default/sa/other'}");
    let uris = [
        "https://not-spiffe.example",
        "spiffe://cluster.local/ns/default/sa/sleep",
    ];
    let mut facts = connection();
    let without_authn = peer(&uris, &[], "sleep");
    facts.tls = Some(&without_authn);
    assert!(!allowed(&sleep, &facts), "no istio_authn: no filter state");
    let with_authn = peer(&uris, &[], "sleep").with_istio_authn(true);
    facts.tls = Some(&with_authn);
    assert!(allowed(&sleep, &facts));
    assert!(allowed(&namespace, &facts));
    assert!(!allowed(&other, &facts));
    let anonymous = crate::tls::PeerTls::new(None, None).with_istio_authn(true);
    facts.tls = Some(&anonymous);
    assert!(!allowed(&namespace, &facts), "no certificate: no principal");
}

#[test]
fn requested_server_name() {
    let r = rules(
        "policies: {p: {permissions: [{requested_server_name: {suffix: .example.com}}], principals: [{any: true}]}}",
    );
    let mut facts = connection();
    assert!(!allowed(&r, &facts));
    facts.server_name = "a.example.com";
    assert!(allowed(&r, &facts));
}

#[test]
fn stats_count_shadow_and_enforced_decisions_under_their_prefixes() {
    let store = crate::stats::Store::new();
    let stats = Stats::new(&store, "tcp.rbac.", "", "dry_");
    let engines = Engines {
        enforced: Some(rules("action: DENY")),
        shadow: Some(rules("action: ALLOW")),
    };
    let v = engines.decide(&connection());
    assert!(v.allowed());
    stats.record(&v);
    assert_eq!(store.counter("tcp.rbac.allowed").value(), 1);
    assert_eq!(store.counter("tcp.rbac.dry_.shadow_denied").value(), 1);
    assert_eq!(store.counter("tcp.rbac.denied").value(), 0);
    let none = Engines::default().decide(&connection());
    assert!(none.allowed());
    stats.record(&none);
    assert_eq!(store.counter("tcp.rbac.allowed").value(), 1);
}

#[test]
fn stat_prefixes_join_as_envoy_joins_them() {
    assert_eq!(
        stat_prefix_join("http.in.rbac.", "allowed"),
        "http.in.rbac.allowed"
    );
    assert_eq!(stat_prefix_join("http.in.rbac.", ""), "http.in.rbac.");
    assert_eq!(stat_prefix_join("a", "b"), "a.b");
    assert_eq!(stat_prefix_join("", "b"), "b");
}
