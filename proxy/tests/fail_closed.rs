//! Fail closed: a feature revoy does not implement never makes it less safe than its config.
//! An HTTP filter that controls access denies every request (403), a network one closes every
//! connection, a cluster whose transport socket revoy lacks (ALTS) is never connected to in
//! plaintext (503, `UF`), and each of them is counted, logged, listed in `/config_dump` and
//! makes `--mode validate` exit 1. A bootstrap that wants listeners or clusters from xDS never
//! reports LIVE. Each check failed before revoy failed closed: the filters were skipped, the
//! cluster got plaintext, validate said OK and the server reported LIVE.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/ports.rs"]
mod ports;
use child::Proxy;
use ports::free_port;

const UPSTREAM_ALTS: &str = r#"
      name: envoy.transport_sockets.alts
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.alts.v3.Alts
        handshaker_service: 127.0.0.1:1"#;

/// A plaintext upstream that answers every request with 200 and counts its connections, and
/// keeps every byte it was sent (so a test can see whether a secret reached it in clear text).
struct Upstream {
    port: u16,
    connections: Arc<AtomicUsize>,
    received: Arc<Mutex<Vec<u8>>>,
}

impl Upstream {
    fn start() -> Upstream {
        let port = free_port();
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("upstream binds");
        let connections = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (n, seen) = (connections.clone(), received.clone());
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                n.fetch_add(1, Ordering::SeqCst);
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    s.set_read_timeout(Some(Duration::from_secs(2))).ok();
                    while let Ok(len) = s.read(&mut buf) {
                        if len == 0 {
                            break;
                        }
                        seen.lock().unwrap().extend_from_slice(&buf[..len]);
                        if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                            let _ = s.write_all(
                                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-upstream: plain\r\n\r\nok",
                            );
                        }
                    }
                });
            }
        });
        Upstream {
            port,
            connections,
            received,
        }
    }
}

fn hcm_listener(name: &str, port: u16, filters: &str, route: &str) -> String {
    bootstrap::http_listener(
        name,
        port,
        "",
        filters,
        &format!("[{{match: {{prefix: /}}, {route}}}]"),
    )
}

fn cluster(name: &str, endpoints: &str, transport: &str) -> String {
    format!(
        r#"
  - name: {name}
    connect_timeout: 1s
    load_assignment:
      cluster_name: {name}
      endpoints: [{{lb_endpoints: [{endpoints}]}}]{transport}"#
    )
}

fn endpoint(port: u16, metadata: &str) -> String {
    format!(
        "{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}{metadata}}}"
    )
}

/// Ports of the fail-closed bootstrap's listeners.
struct Ports {
    admin: u16,
    authz: u16,
    transcoder: u16,
    tls: u16,
    istio: u16,
    tcp: u16,
}

fn bootstrap(p: &Ports, up: u16) -> String {
    let authz = "{name: envoy.filters.http.api_key_auth, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.api_key_auth.v3.ApiKeyAuth}}, ";
    let transcoder = "{name: envoy.filters.http.grpc_json_transcoder, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder}}, ";
    let mut listeners = String::new();
    listeners += &hcm_listener("authz", p.authz, authz, "route: {cluster: plain}");
    listeners += &hcm_listener(
        "transcoder",
        p.transcoder,
        transcoder,
        "route: {cluster: plain}",
    );
    listeners += &hcm_listener("tls", p.tls, "", "route: {cluster: secure}");
    listeners += &hcm_listener("istio", p.istio, "", "route: {cluster: istio}");
    listeners += &format!(
        r#"
  - name: tcp
    address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.ext_authz
        typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.ext_authz.v3.ExtAuthz, stat_prefix: t, failure_mode_allow: true, grpc_service: {{envoy_grpc: {{cluster_name: plain}}}}}}
      - name: envoy.filters.network.tcp_proxy
        typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: t, cluster: plain}}"#,
        p.tcp
    );
    // Istio's outbound cluster shape, with a socket revoy lacks for endpoints labelled
    // tlsMode=istio and plaintext for the others.
    let istio_matches = r#"
    transport_socket_matches:
    - name: tlsMode-istio
      match: {tlsMode: istio}
      transport_socket:
        name: envoy.transport_sockets.alts
        typed_config: {"@type": type.googleapis.com/envoy.extensions.transport_sockets.alts.v3.Alts, handshaker_service: "127.0.0.1:1"}
    - name: tlsMode-disabled
      match: {}
      transport_socket:
        name: envoy.transport_sockets.raw_buffer
        typed_config: {"@type": type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer}"#;
    let mut clusters = String::new();
    clusters += &cluster("plain", &endpoint(up, ""), "");
    clusters += &cluster(
        "secure",
        &endpoint(up, ""),
        &format!("\n    transport_socket:{UPSTREAM_ALTS}"),
    );
    clusters += &cluster(
        "istio",
        &endpoint(
            up,
            ", metadata: {filter_metadata: {envoy.transport_socket_match: {tlsMode: istio}}}",
        ),
        istio_matches,
    );
    format!(
        "admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}}}\nstatic_resources:\n  listeners:{listeners}\n  clusters:{clusters}\n",
        p.admin
    )
}

/// One HTTP/1.1 request carrying a credential; returns (status, body).
fn get(port: u16) -> (u16, String) {
    let credential = "Authorization: Bearer secret-token\r\n";
    http1::get_with(None, ([127, 0, 0, 1], port).into(), "/", credential)
        .unwrap_or((0, String::new()))
}

fn admin(port: u16, path: &str) -> (u16, String) {
    http1::get(None, ([127, 0, 0, 1], port).into(), path).unwrap_or((0, String::new()))
}

fn stat(admin_port: u16, name: &str) -> Option<u64> {
    let (_, body) = admin(admin_port, "/stats");
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn unimplemented_security_features_refuse_traffic() {
    let up = Upstream::start();
    let p = Ports {
        admin: free_port(),
        authz: free_port(),
        transcoder: free_port(),
        tls: free_port(),
        istio: free_port(),
        tcp: free_port(),
    };
    let yaml = bootstrap(&p, up.port);
    let _revoy = Proxy::start(&yaml, || admin(p.admin, "/ready").0 == 200);

    // A filter without security effect is skipped: the request reaches the upstream.
    assert_eq!(get(p.transcoder), (200, "ok".to_owned()));
    let served = up.connections.load(Ordering::SeqCst);
    assert_eq!(served, 1);

    // API key authentication (here one with no credentials) is not implemented: every
    // request is denied.
    let (status, body) = get(p.authz);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("envoy.filters.http.api_key_auth"), "{body}");
    assert_eq!(
        stat(p.admin, "http.authz.downstream_rq_fail_closed"),
        Some(1)
    );

    // ALTS is not implemented: no connection at all, a 503 that names the reason.
    let (status, body) = get(p.tls);
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("upstream connect error or disconnect/reset before headers.")
            && body.contains("envoy.transport_sockets.alts"),
        "{body}"
    );
    assert_eq!(
        stat(p.admin, "cluster.secure.upstream_cx_fail_closed"),
        Some(1)
    );
    assert_eq!(
        stat(p.admin, "cluster.secure.upstream_cx_connect_fail"),
        Some(1)
    );

    // The endpoint whose match picks the socket revoy lacks is refused too.
    let (status, body) = get(p.istio);
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        stat(p.admin, "cluster.istio.upstream_cx_fail_closed"),
        Some(1)
    );

    // A network external authorization filter: the connection is closed before anything is
    // proxied.
    let mut s = TcpStream::connect(("127.0.0.1", p.tcp)).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(b"GET / HTTP/1.1\r\nAuthorization: Bearer secret-token\r\n\r\n");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(buf.is_empty(), "{:?}", String::from_utf8_lossy(&buf));
    let refused = format!("listener.127.0.0.1_{}.downstream_cx_fail_closed", p.tcp);
    assert_eq!(stat(p.admin, &refused), Some(1));

    // Nothing but the one allowed request ever reached the upstream.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(up.connections.load(Ordering::SeqCst), served);
    let seen = String::from_utf8_lossy(&up.received.lock().unwrap()).into_owned();
    assert_eq!(seen.matches("secret-token").count(), 1, "{seen}");

    // /config_dump says why, per field path, in an entry of its own.
    let (status, dump) = admin(p.admin, "/config_dump");
    assert_eq!(status, 200);
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("JSON");
    let findings = dump["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["@type"] == "type.googleapis.com/google.protobuf.Struct")
        .expect("an entry listing what is not implemented")["value"]["revoy_unimplemented"]
        .as_array()
        .unwrap()
        .clone();
    let effect = |path: &str| {
        findings
            .iter()
            .find(|f| f["path"] == path)
            .map(|f| f["effect"].as_str().unwrap().to_owned())
    };
    assert_eq!(
        effect("static_resources.clusters[1].transport_socket").as_deref(),
        Some("FAILS_CLOSED")
    );
    assert_eq!(
        effect("static_resources.clusters[2].transport_socket_matches[0].transport_socket")
            .as_deref(),
        Some("FAILS_CLOSED")
    );
    assert_eq!(
        effect(
            "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0]"
        )
        .as_deref(),
        Some("FAILS_CLOSED")
    );
    assert_eq!(
        effect(
            "static_resources.listeners[1].filter_chains[0].filters[0].typed_config.http_filters[0]"
        )
        .as_deref(),
        Some("SKIPPED")
    );
    assert_eq!(
        effect("static_resources.listeners[4].filter_chains[0].filters[0]").as_deref(),
        Some("FAILS_CLOSED")
    );
}

fn validate(yaml: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_revoy"))
        .args(["--mode", "validate", "--config-yaml", yaml, "-l", "off"])
        .output()
        .expect("revoy runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn validate_lists_unimplemented_features_and_fails_on_fail_closed_ones() {
    let p = Ports {
        admin: 1,
        authz: 2,
        transcoder: 3,
        tls: 4,
        istio: 5,
        tcp: 6,
    };
    let (code, out) = validate(&bootstrap(&p, 7));
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        out.matches("not implemented (fails closed)").count(),
        4,
        "{out}"
    );
    assert_eq!(out.matches("not implemented (skipped)").count(), 1, "{out}");
    assert!(!out.contains(" OK"), "{out}");

    // Only skipped features: listed, and the config is valid.
    let transcoder = "{name: envoy.filters.http.grpc_json_transcoder, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder}}, ";
    let yaml = format!(
        "static_resources:\n  listeners:{}\n  clusters:{}\n",
        hcm_listener("transcoder", 3, transcoder, "route: {cluster: plain}"),
        cluster("plain", &endpoint(7, ""), "")
    );
    let yaml = yaml.replace(
        "stat_prefix: transcoder",
        "stat_prefix: transcoder\n          access_log: [{name: envoy.access_loggers.stdout, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog}}]\n          forward_client_cert_matcher: {}",
    );
    let (code, out) = validate(&yaml);
    assert_eq!(code, 0, "{out}");
    for field in ["http_filters[0]", "forward_client_cert_matcher"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with("not implemented (skipped)") && l.contains(field)),
            "{field}: {out}"
        );
    }
    // The stdout access log is implemented: accepted without a finding.
    assert!(!out.contains("access_log"), "{out}");
    assert!(out.contains("OK"), "{out}");
}

#[test]
fn bootstrap_waiting_for_xds_is_not_live_while_its_control_plane_is_unreachable() {
    let admin_port = free_port();
    let listener = free_port();
    let yaml = format!(
        r#"
admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}}}
dynamic_resources:
  lds_config: {{ads: {{}}}}
  cds_config: {{ads: {{}}}}
  ads_config: {{api_type: GRPC, grpc_services: [{{envoy_grpc: {{cluster_name: xds}}}}]}}
static_resources:
  listeners:{}
  clusters:{}
"#,
        hcm_listener(
            "health",
            listener,
            "",
            "direct_response: {status: 200, body: {inline_string: ok}}"
        ),
        cluster("xds", &endpoint(9, ""), "")
    );
    // Started once the admin answers; with no control plane (nothing listens on the xds
    // cluster's port) the server is not LIVE before `initial_fetch_timeout` (15 s), and, as
    // in Envoy, its static listener refuses connections until then.
    let _revoy = Proxy::start(&yaml, || admin(admin_port, "/ready").0 != 0);
    assert!(TcpStream::connect(("127.0.0.1", listener)).is_err());
    let (status, body) = admin(admin_port, "/ready");
    assert_eq!((status, body.trim()), (503, "PRE_INITIALIZING"));
    assert_eq!(stat(admin_port, "server.state"), Some(2));
    assert_eq!(stat(admin_port, "server.live"), Some(0));
}

#[test]
fn filters_are_judged_by_what_they_are_not_what_they_are_called() {
    let with_filter = |filter: &str| {
        format!(
            "static_resources:\n  listeners:{}\n  clusters:{}\n",
            hcm_listener("l", 3, filter, "route: {cluster: plain}"),
            cluster("plain", &endpoint(7, ""), "")
        )
    };
    let cases = [
        // Envoy picks a filter by its type: this one is OAuth2, whatever its name.
        "{name: envoy.filters.http.router, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.oauth2.v3.OAuth2}}, ",
        // A type this build does not know, kept as a TypedStruct: its own name decides.
        "{name: vendor_filter, typed_config: {\"@type\": type.googleapis.com/acme.authz.v1.Config, mode: strict}}, ",
        // A config from ECDS cannot be known at all.
        "{name: vendor_filter, config_discovery: {config_source: {ads: {}}, type_urls: [type.googleapis.com/acme.authz.v1.Config]}}, ",
    ];
    for filter in cases {
        let (code, out) = validate(&with_filter(filter));
        assert_eq!(code, 1, "{filter}: {out}");
        assert!(
            out.contains("not implemented (fails closed)"),
            "{filter}: {out}"
        );
    }
    // A listener filter revoy cannot know (from ECDS) closes every connection of the listener.
    let yaml = with_filter("").replace(
        "    filter_chains:",
        "    listener_filters: [{name: vendor_listener_filter, config_discovery: {config_source: {ads: {}}, type_urls: [type.googleapis.com/acme.authz.v1.Config]}}]\n    filter_chains:",
    );
    let (code, out) = validate(&yaml);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("listener_filters[0]"), "{out}");
}
