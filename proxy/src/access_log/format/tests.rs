use std::time::{Duration, UNIX_EPOCH};

use super::*;
use crate::access_log::ResponseFlag;
use crate::access_log::record::{Downstream, RequestHead};
use crate::config::Context;
use crate::config::context::FakeIo;

/// An access log's format (which has the connection's filter state).
fn parse(format: &str) -> Result<Template, String> {
    let io = FakeIo::new().with_env("ZONE", "eu-1").with_hostname("box");
    let log = Formatters {
        filter_state: true,
        ..Formatters::default()
    };
    Template::parse_with(format, &Context::new(&io), log)
}

fn text(format: &str, rec: &Record) -> String {
    let mut out = String::new();
    parse(format).unwrap().render_text(rec, false, &mut out);
    out
}

fn json(members: Vec<(&str, &str)>, rec: &Record, omit_empty: bool) -> String {
    let members = members
        .into_iter()
        .map(|(k, v)| (k.to_owned(), JsonValue::Template(parse(v).unwrap())))
        .collect();
    LogFormat::Json {
        members,
        omit_empty,
    }
    .render(rec)
}

/// A request that was answered 200 by 127.0.0.12:8080 after 12 ms.
fn record() -> Record {
    let mut rec = Record::new(Downstream {
        remote: Some("192.0.2.7:5555".parse().unwrap()),
        direct_remote: None,
        local: Some("127.0.0.11:80".parse().unwrap()),
        server_name: None,
        filter_state: None,
    });
    rec.start_time = UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
    rec.end = Some(rec.start + Duration::from_millis(12));
    rec.last_downstream_rx = Some(rec.start);
    rec.protocol = Some("HTTP/1.1");
    let mut headers = http::HeaderMap::new();
    headers.insert("user-agent", http::HeaderValue::from_static("curl/8.0"));
    rec.request = Some(RequestHead {
        method: "GET".into(),
        path: "/a?b=c".into(),
        authority: "example.com".into(),
        scheme: "http",
        headers,
    });
    rec.response_code = Some(200);
    rec.bytes_sent = 42;
    rec.upstream_host = Some("127.0.0.12:8080".parse().unwrap());
    rec.upstream_cluster = Some("backend".into());
    rec.attempts = 1;
    rec
}

#[test]
fn missing_values_render_a_dash_in_text() {
    let rec = record();
    assert_eq!(
        text(
            "%REQ(X-MISSING)% %RESP(X-MISSING)% %ROUTE_NAME% %RESPONSE_FLAGS% %UPSTREAM_TRANSPORT_FAILURE_REASON%",
            &rec
        ),
        "- - - - -"
    );
    let mut out = String::new();
    parse("[%ROUTE_NAME%]")
        .unwrap()
        .render_text(&rec, true, &mut out);
    assert_eq!(out, "[]", "omit_empty_values drops the dash");
}

#[test]
fn the_default_format_renders_like_envoys() {
    let rec = record();
    let line = LogFormat::default_text(&Context::new(&FakeIo::new())).render(&rec);
    assert_eq!(
        line,
        "[2023-11-14T22:13:20.123Z] \"GET /a?b=c HTTP/1.1\" 200 - 0 42 12 - \"-\" \"curl/8.0\" \"-\" \"example.com\" \"127.0.0.12:8080\"\n"
    );
}

#[test]
fn headers_take_their_alternative_and_truncate() {
    let rec = record();
    assert_eq!(text("%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%", &rec), "/a?b=c");
    assert_eq!(text("%REQ(USER-AGENT):4%", &rec), "curl");
    assert_eq!(
        text("%REQ(:METHOD)% %REQ(:AUTHORITY)%", &rec),
        "GET example.com"
    );
    assert_eq!(text("%RESP(:STATUS)%", &rec), "200");
}

#[test]
fn start_time_formats() {
    let rec = record();
    assert_eq!(text("%START_TIME(%s)%", &rec), "1700000000");
    assert_eq!(text("%START_TIME(%s.%3f)%", &rec), "1700000000.123");
    assert_eq!(text("%START_TIME(%f)%", &rec), "123456789");
    assert_eq!(text("%START_TIME(%Y/%m/%d)%", &rec), "2023/11/14");
}

#[test]
fn addresses_and_their_parts() {
    let rec = record();
    assert_eq!(
        text(
            "%DOWNSTREAM_REMOTE_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT% %DOWNSTREAM_REMOTE_PORT%",
            &rec
        ),
        "192.0.2.7:5555 192.0.2.7 5555"
    );
    assert_eq!(
        text("%DOWNSTREAM_DIRECT_REMOTE_ADDRESS%", &rec),
        "192.0.2.7:5555",
        "the direct address falls back to the remote one"
    );
    assert_eq!(
        text(
            "%DOWNSTREAM_LOCAL_ADDRESS% %UPSTREAM_HOST% %UPSTREAM_CLUSTER_RAW%",
            &rec
        ),
        "127.0.0.11:80 127.0.0.12:8080 backend"
    );
}

#[test]
fn durations_and_counts() {
    let mut rec = record();
    assert_eq!(
        text(
            "%DURATION% %REQUEST_DURATION% %RESPONSE_DURATION% %BYTES_RECEIVED% %BYTES_SENT% %UPSTREAM_REQUEST_ATTEMPT_COUNT%",
            &rec
        ),
        "12 0 - 0 42 1"
    );
    rec.first_upstream_rx = Some(rec.start + Duration::from_millis(5));
    assert_eq!(
        text("%RESPONSE_DURATION% %RESPONSE_TX_DURATION%", &rec),
        "5 7"
    );
}

#[test]
fn upstream_wire_bytes_settle_from_the_attempts_meter_or_render_a_dash() {
    let ops = "%UPSTREAM_WIRE_BYTES_SENT% %UPSTREAM_WIRE_BYTES_RECEIVED% %UPSTREAM_HEADER_BYTES_SENT% %UPSTREAM_HEADER_BYTES_RECEIVED%";
    let mut rec = record();
    assert_eq!(text(ops, &rec), "0 0 0 0", "no upstream connection");
    let target = std::sync::Arc::new(crate::access_log::AttemptTarget::default());
    target.wire().wrote_head(40, 20);
    target.wire().wrote(5);
    target.wire().read(30);
    target.wire().read_head(12);
    rec.attempt_target = Some(target.clone());
    rec.settle();
    assert_eq!(text(ops, &rec), "45 30 20 12");
    rec.attempt_target = None;
    rec.upstream_wire = None;
    assert_eq!(text(ops, &rec), "- - - -", "a connection nothing counted");
    assert_eq!(
        json(vec![("sent", "%UPSTREAM_WIRE_BYTES_SENT%")], &rec, false),
        "{\"sent\":null}\n"
    );
}

#[test]
fn flags_details_and_transport_failures() {
    let mut rec = record();
    rec.flags.set(ResponseFlag::UpstreamRetryLimitExceeded);
    rec.flags.set(ResponseFlag::UpstreamConnectionFailure);
    rec.upstream_transport_failure = Some("delayed connect error: Connection refused".into());
    rec.details = Some("via_upstream".into());
    assert_eq!(
        text(
            "%RESPONSE_FLAGS% %RESPONSE_FLAGS_LONG% %UPSTREAM_TRANSPORT_FAILURE_REASON% %RESPONSE_CODE_DETAILS%",
            &rec
        ),
        "URX,UF UpstreamRetryLimitExceeded,UpstreamConnectionFailure delayed_connect_error:_Connection_refused via_upstream"
    );
}

#[test]
fn environment_and_hostname_are_read_at_parse_time() {
    let rec = record();
    assert_eq!(
        text("%ENVIRONMENT(ZONE)% %ENVIRONMENT(NOPE)% %HOSTNAME%", &rec),
        "eu-1 - box"
    );
}

#[test]
fn json_keeps_types_and_nulls() {
    let rec = record();
    let line = json(
        vec![
            ("code", "%RESPONSE_CODE%"),
            ("route", "%ROUTE_NAME%"),
            ("mix", "x %RESPONSE_CODE% %ROUTE_NAME%"),
            ("ua", "%REQ(USER-AGENT)%"),
        ],
        &rec,
        false,
    );
    assert_eq!(
        line,
        "{\"code\":200,\"route\":null,\"mix\":\"x 200 -\",\"ua\":\"curl/8.0\"}\n"
    );
    let line = json(
        vec![("code", "%RESPONSE_CODE%"), ("route", "%ROUTE_NAME%")],
        &rec,
        true,
    );
    assert_eq!(
        line, "{\"code\":200}\n",
        "omit_empty_values leaves nulls out"
    );
}

#[test]
fn json_strings_are_escaped() {
    let mut rec = record();
    rec.details = Some("a\"b\\c\u{1}".into());
    let line = json(vec![("d", "%RESPONSE_CODE_DETAILS%")], &rec, false);
    assert_eq!(line, "{\"d\":\"a\\\"b\\\\c\\u0001\"}\n");
}

#[test]
fn operator_errors_name_the_operator() {
    assert_eq!(
        parse("%NOT_A_THING%").unwrap_err(),
        "Not supported field in StreamInfo: NOT_A_THING (revoy does not implement the %NOT_A_THING% access log operator)"
    );
    assert!(
        parse("%FILTER_STATE(a)%")
            .unwrap_err()
            .contains("%FILTER_STATE(a)% is not supported by revoy")
    );
    assert_eq!(
        parse("%DYNAMIC_METADATA()%").unwrap_err(),
        "DYNAMIC_METADATA requires parameters"
    );
    assert_eq!(parse("%REQ%").unwrap_err(), "REQ requires parameters");
    assert_eq!(
        parse("%PROTOCOL(x)%").unwrap_err(),
        "PROTOCOL does not take any parameters or length"
    );
    assert!(
        parse("100%")
            .unwrap_err()
            .starts_with("Incorrect configuration: 100%.")
    );
    assert_eq!(text("100%%", &record()), "100%");
}

#[test]
fn dynamic_metadata_renders_strings_as_text_and_the_rest_as_json() {
    use crate::route::metadata::{number_value, string_value};
    let mut rec = record();
    rec.metadata.insert("ns", "s", string_value("hello"));
    rec.metadata.insert("ns", "n", number_value(42.0));
    assert_eq!(
        text(
            "%DYNAMIC_METADATA(ns)% %DYNAMIC_METADATA(ns:s):3% %DYNAMIC_METADATA(ns:n)% %DYNAMIC_METADATA(ns:x)% %DYNAMIC_METADATA(other)%",
            &rec
        ),
        r#"{"n":42,"s":"hello"} hel 42 - -"#
    );
    let line = json(
        vec![
            ("a", "%DYNAMIC_METADATA(ns)%"),
            ("n", "%DYNAMIC_METADATA(ns:n)%"),
            ("s", "%DYNAMIC_METADATA(ns:s):2%"),
            ("m", "%DYNAMIC_METADATA(ns:x)%"),
        ],
        &rec,
        false,
    );
    assert_eq!(
        line,
        "{\"a\":{\"n\":42,\"s\":\"hello\"},\"n\":42,\"s\":\"he\",\"m\":null}\n"
    );
}

#[test]
fn formatter_operators_need_their_extension_and_metadata_other_than_dynamic_is_refused() {
    let io = FakeIo::new();
    let ctx = Context::new(&io);
    let all = Formatters {
        req_without_query: true,
        metadata: true,
        filter_state: true,
    };
    for op in ["%REQ_WITHOUT_QUERY(:PATH)%", "%METADATA(DYNAMIC:a:k)%"] {
        let e = Template::parse(op, &ctx).unwrap_err();
        assert!(
            e.starts_with("Not supported field in StreamInfo"),
            "{op}: {e}"
        );
        assert!(Template::parse_with(op, &ctx, all).is_ok(), "{op}");
    }
    let e = Template::parse_with("%METADATA(ROUTE:a:k)%", &ctx, all).unwrap_err();
    assert!(e.contains("ROUTE"), "{e}");
    let e = Template::parse_with("%METADATA(DYNAMIC)%", &ctx, all).unwrap_err();
    assert!(e.contains("Invalid METADATA"), "{e}");
}

/// Envoy 1.40 renders a string filter state (`envoy.string`, as `istio_authn` sets its
/// principals) quoted as JSON by default and with `:TYPED`, bare with `:PLAIN`, truncating
/// what it renders, and as a JSON string alone in a JSON member (probed with Envoy's
/// `set_filter_state` filter).
#[test]
fn filter_state_renders_istio_authn_principals_as_envoy_renders_a_string() {
    let spiffe = "spiffe://cluster.local/ns/a/sa/b";
    let mut rec = record();
    let tls = crate::tls::peer::test_peer(&[spiffe], &[], "b").with_istio_authn(true);
    rec.downstream.filter_state = Some(std::sync::Arc::new(tls));
    let ops = "%FILTER_STATE(io.istio.peer_principal)% %FILTER_STATE(io.istio.peer_principal:PLAIN)% %FILTER_STATE(io.istio.peer_principal:TYPED)% %FILTER_STATE(io.istio.peer_principal:PLAIN):10% %FILTER_STATE(io.istio.peer_principal):10%";
    assert_eq!(
        text(ops, &rec),
        format!("\"{spiffe}\" {spiffe} \"{spiffe}\" spiffe://c \"spiffe://")
    );
    let members = vec![
        ("d", "%FILTER_STATE(io.istio.peer_principal)%"),
        ("mixed", "x=%FILTER_STATE(io.istio.peer_principal)%"),
        ("p", "%FILTER_STATE(io.istio.peer_principal:PLAIN)%"),
    ];
    assert_eq!(
        json(members, &rec, false),
        format!("{{\"d\":\"{spiffe}\",\"mixed\":\"x=\\\"{spiffe}\\\"\",\"p\":\"{spiffe}\"}}\n")
    );
    rec.downstream.filter_state = None;
    assert_eq!(text("%FILTER_STATE(io.istio.local_principal)%", &rec), "-");
    for bad in [
        "%FILTER_STATE(envoy.string.key)%",
        "%FILTER_STATE(io.istio.peer_principal:FIELD:x)%",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    // A format rendered without the connection's filter state (a network rate limit's
    // descriptor) refuses the operator rather than render it empty.
    let io = FakeIo::new();
    let e = Template::parse(
        "%FILTER_STATE(io.istio.peer_principal)%",
        &Context::new(&io),
    )
    .unwrap_err();
    assert!(
        e.contains("only for access log and local reply formats"),
        "{e}"
    );
}
