use std::time::{Duration, UNIX_EPOCH};

use http::HeaderValue;

use super::*;
use crate::config::{Context, FakeIo};

/// Parses with a machine named `host-a` whose environment has `ZONE=eu-west-1`.
fn parse(template: &str) -> Result<Template, String> {
    let io = FakeIo::new()
        .with_env("ZONE", "eu-west-1")
        .with_hostname("host-a");
    Template::parse(template, &Context::new(&io))
}

fn render(template: &str, own: &HeaderMap, ctx: &FormatContext<'_>, dir: Direction) -> String {
    parse(template).unwrap().render(own, ctx, dir)
}

fn err(template: &str) -> String {
    parse(template).unwrap_err()
}

#[test]
fn grammar_errors_carry_envoys_messages() {
    assert_eq!(err("%NOPE%"), "Not supported field in StreamInfo: NOPE");
    assert_eq!(
        err("%REQ(x-a"),
        "Incorrect configuration: %REQ(x-a. Couldn't find valid command at position 0"
    );
    assert_eq!(
        err("100%"),
        "Incorrect configuration: 100%. Couldn't find valid command at position 3"
    );
    assert_eq!(
        err("%REQ(x-a):abc%"),
        "Incorrect configuration: %REQ(x-a):abc%. Couldn't find valid command at position 0"
    );
    assert_eq!(
        err("%START_TIME(%s%"),
        "Incorrect configuration: %START_TIME(%s%. Couldn't find valid command at position 0"
    );
    assert_eq!(err("%REQ()%"), "REQ requires parameters");
    assert_eq!(err("%ENVIRONMENT()%"), "ENVIRONMENT requires parameters");
    assert_eq!(
        err("%DYNAMIC_METADATA()%"),
        "DYNAMIC_METADATA requires parameters"
    );
    assert_eq!(
        err("%UPSTREAM_METADATA()%"),
        "UPSTREAM_METADATA requires parameters"
    );
    assert_eq!(
        err("%REQ(a?b?c)%"),
        "More than 1 alternative header specified in token: a?b?c"
    );
    assert_eq!(
        err("%RESPONSE_CODE(x)%"),
        "RESPONSE_CODE does not take any parameters or length"
    );
    assert_eq!(
        err("%HOSTNAME:3%"),
        "HOSTNAME does not take any parameters or length"
    );
    assert_eq!(
        err("%DOWNSTREAM_PEER_URI_SAN:3%"),
        "DOWNSTREAM_PEER_URI_SAN does not take any parameters or length"
    );
    assert_eq!(
        err("%START_TIME:3%"),
        "START_TIME does not allow length to be specified."
    );
    assert_eq!(
        err("%REQUESTED_SERVER_NAME:3%"),
        "REQUESTED_SERVER_NAME does not allow length to be specified."
    );
    assert_eq!(
        err("%UPSTREAM_METADATA(a:b):3%"),
        "UPSTREAM_METADATA does not allow length to be specified."
    );
    assert_eq!(
        err("%REQUESTED_SERVER_NAME(x)%"),
        "Invalid REQUESTED_SERVER_NAME option: 'x', only 'SNI_ONLY'/'SNI_FIRST'/'HOST_FIRST' are allowed"
    );
    assert_eq!(
        err("%DOWNSTREAM_LOCAL_ISSUER%"),
        "Not supported field in StreamInfo: DOWNSTREAM_LOCAL_ISSUER"
    );
}

#[test]
fn request_headers_with_fallback_length_and_pseudo_headers() {
    let mut own = HeaderMap::new();
    own.append("x-a", HeaderValue::from_static("aval"));
    own.append("x-a", HeaderValue::from_static("second"));
    own.insert("x-b", HeaderValue::from_static("bval"));
    let ctx = FormatContext {
        request_method: Some("GET"),
        request_scheme: Some("http"),
        request_authority: Some("example.com:8080"),
        request_path: Some("/p?q=1"),
        ..Default::default()
    };
    let r = |t: &str| render(t, &own, &ctx, Direction::Request);
    assert_eq!(r("%REQ(x-a)%"), "aval");
    assert_eq!(r("%REQ(X-A)%"), "aval");
    assert_eq!(r("%REQ(x-none?x-b)%"), "bval");
    assert_eq!(r("%REQ(x-a?x-b)%"), "aval");
    assert_eq!(r("%REQ(x-a):2%"), "av");
    assert_eq!(r("%REQ(x-a):0%"), "");
    assert_eq!(r("%REQ(x-none)%"), "");
    assert_eq!(
        r("%REQ(:path)% %REQ(:method)% %REQ(:scheme)%"),
        "/p?q=1 GET http"
    );
    assert_eq!(
        r("%REQ(:authority)%|%REQ(host)%"),
        "example.com:8080|example.com:8080"
    );
    assert_eq!(r("%RESP(x-a)%"), "");
    assert_eq!(r("%REQ(x-a)%%%"), "aval%");
}

#[test]
fn response_status_pseudo_header_and_response_code_differ() {
    let mut own = HeaderMap::new();
    own.insert("content-type", HeaderValue::from_static("text/plain"));
    let ctx = FormatContext {
        response_status: Some(201),
        ..Default::default()
    };
    let r = |t: &str| render(t, &own, &ctx, Direction::Response);
    assert_eq!(
        r("%RESP(:status)% %RESPONSE_CODE% %RESPONSE_FLAGS%"),
        "201 0 -"
    );
    assert_eq!(r("%RESP(content-type):4%"), "text");
    let ctx = FormatContext {
        response_code: Some(503),
        response_flags: Some("UF,URX"),
        ..Default::default()
    };
    assert_eq!(
        render(
            "%RESPONSE_CODE% %RESPONSE_FLAGS%",
            &own,
            &ctx,
            Direction::Response
        ),
        "503 UF,URX"
    );
}

#[test]
fn addresses_protocol_and_upstream_facts() {
    let own = HeaderMap::new();
    let ctx = FormatContext {
        downstream_remote: Some("10.0.0.1:5555".parse().unwrap()),
        downstream_local: Some("127.0.0.1:19900".parse().unwrap()),
        upstream_host: Some("127.0.0.1:8080".parse().unwrap()),
        upstream_remote: Some("[::1]:8080".parse().unwrap()),
        upstream_local: Some("127.0.0.6:4000".parse().unwrap()),
        upstream_cluster: Some("a"),
        upstream_transport_failure_reason: Some("TLS_error"),
        protocol: Some("HTTP/2"),
        ..Default::default()
    };
    let r = |t: &str| render(t, &own, &ctx, Direction::Request);
    assert_eq!(
        r(
            "%DOWNSTREAM_REMOTE_ADDRESS%|%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%|%DOWNSTREAM_REMOTE_PORT%"
        ),
        "10.0.0.1:5555|10.0.0.1|5555"
    );
    assert_eq!(
        r("%DOWNSTREAM_DIRECT_REMOTE_ADDRESS%"),
        "10.0.0.1:5555",
        "falls back to the remote address"
    );
    assert_eq!(
        r(
            "%DOWNSTREAM_LOCAL_ADDRESS%|%DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT%|%DOWNSTREAM_LOCAL_PORT%"
        ),
        "127.0.0.1:19900|127.0.0.1|19900"
    );
    assert_eq!(
        r(
            "%UPSTREAM_HOST%|%UPSTREAM_REMOTE_ADDRESS%|%UPSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%|%UPSTREAM_REMOTE_PORT%"
        ),
        "127.0.0.1:8080|[::1]:8080|::1|8080",
        "the host, and the address its connection reached"
    );
    assert_eq!(
        r("%UPSTREAM_LOCAL_ADDRESS%|%UPSTREAM_LOCAL_ADDRESS_WITHOUT_PORT%|%UPSTREAM_LOCAL_PORT%"),
        "127.0.0.6:4000|127.0.0.6|4000"
    );
    assert_eq!(
        r("%UPSTREAM_CLUSTER% %UPSTREAM_TRANSPORT_FAILURE_REASON% %PROTOCOL%"),
        "a TLS_error HTTP/2"
    );
    let empty = FormatContext::default();
    assert_eq!(
        render(
            "%UPSTREAM_HOST%%PROTOCOL%%DOWNSTREAM_PEER_URI_SAN%%UPSTREAM_METADATA([\"a\",\"b\"])%%DYNAMIC_METADATA(a:b):2%",
            &own,
            &empty,
            Direction::Request
        ),
        ""
    );
}

#[test]
fn start_time_sni_hostname_and_environment() {
    let own = HeaderMap::new();
    let ctx = FormatContext {
        start_time: Some(UNIX_EPOCH + Duration::new(1_796_042_457, 715_437_000)),
        request_authority: Some("host.test"),
        ..Default::default()
    };
    let r = |t: &str| render(t, &own, &ctx, Direction::Response);
    assert_eq!(r("%START_TIME%"), "2026-11-30T12:40:57.715Z");
    assert_eq!(r("%START_TIME()%"), "2026-11-30T12:40:57.715Z");
    assert_eq!(r("%START_TIME(%s)%"), "1796042457");
    assert_eq!(
        r("%START_TIME(%Y/%m/%d %H:%M:%S.%3f)%"),
        "2026/11/30 12:40:57.715"
    );
    assert_eq!(r("%REQUESTED_SERVER_NAME%"), "");
    assert_eq!(r("%REQUESTED_SERVER_NAME(HOST_FIRST)%"), "host.test");
    let tls = FormatContext {
        requested_server_name: Some("sni.test"),
        ..ctx.clone()
    };
    assert_eq!(
        render(
            "%REQUESTED_SERVER_NAME(SNI_FIRST)% %REQUESTED_SERVER_NAME(HOST_FIRST)%",
            &own,
            &tls,
            Direction::Response
        ),
        "sni.test host.test"
    );
    assert_eq!(r("%HOSTNAME%"), "host-a", "the compiling machine's name");
    let named = FormatContext {
        hostname: Some("pod-1"),
        ..Default::default()
    };
    assert_eq!(
        render("%HOSTNAME%", &own, &named, Direction::Request),
        "pod-1"
    );
    let t = parse("zone=%ENVIRONMENT(ZONE):2%").unwrap();
    assert_eq!(
        t.literal(),
        Some("zone=eu"),
        "resolved at configuration time"
    );
    assert_eq!(
        parse("%ENVIRONMENT(PATH)%").unwrap().literal(),
        Some("-"),
        "only the injected environment is read"
    );
}

#[test]
fn tls_facts_join_lists_and_render_empty_on_plaintext() {
    let own = HeaderMap::new();
    let facts = TlsFacts {
        version: "TLSv1.3".into(),
        peer: CertFacts {
            uri_san: vec!["spiffe://a".into(), "spiffe://b".into()],
            subject: "CN=client".into(),
            not_before: Some(UNIX_EPOCH + Duration::from_secs(86_400)),
            ..Default::default()
        },
        local: CertFacts {
            dns_san: vec!["server.test".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    let ctx = FormatContext {
        downstream_tls: Some(&facts),
        ..Default::default()
    };
    assert_eq!(
        render(
            "%DOWNSTREAM_TLS_VERSION%|%DOWNSTREAM_PEER_URI_SAN%|%DOWNSTREAM_PEER_SUBJECT%|%DOWNSTREAM_LOCAL_DNS_SAN%|%DOWNSTREAM_PEER_CERT_V_START(%F)%",
            &own,
            &ctx,
            Direction::Request
        ),
        "TLSv1.3|spiffe://a,spiffe://b|CN=client|server.test|1970-01-02"
    );
}
