//! Istio's own proxy filters (istio/proxy), which stock Envoy lacks, so these tests check
//! revoy against Istio's documented behaviour and wire formats rather than against Envoy.
//!
//! `istio.metadata_exchange` and `istio.stats`, as in Istio proxy's own end-to-end test (its
//! `testdata/`, copied into `tests/data/istio/`): a client revoy (outbound listener) sends
//! through a server revoy (inbound listener) to a static reply; each node has the metadata of
//! Istio's test nodes; each must export `istio_requests_total` with exactly the labels,
//! values and order of Istio's goldens. What the client sends upstream is decoded by a decoder
//! written here from Istio's format description (base64 of a `google.protobuf.Struct`).
//!
//! `response_flags`: Istio's stats filter labels a request with Envoy's short response flags
//! (`%RESPONSE_FLAGS%`); Envoy 1.40 on the same routes, with an access log in place of the
//! stats filter, says which flags a request gets, and revoy's `istio_requests_total` must
//! carry those; likewise a TCP connection's in `istio_tcp_connections_*_total`.
//!
//! A gRPC call's messages (`istio_request_messages_total` / `istio_response_messages_total`,
//! from grpc_stats' `emit_filter_state`): reported every `tcp_reporting_duration` while the
//! call is open, as Istio's proxy reports them (its `TestStatsGrpcStream`), then the rest
//! when it ends.
//!
//! `istio.alpn`: a TLS upstream records the ALPN list each ClientHello offers (read before
//! the handshake, so whatever the server then picks), and answers with it: a request's
//! upstream connection offers the override for the protocol it goes upstream in, in place of
//! the cluster's own list, and connections with and without an override are not shared.

#[path = "support/admin.rs"]
mod admin;
#[path = "support/bootstrap.rs"]
mod bootstrap;
#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/gotemplate.rs"]
mod gotemplate;
#[path = "support/h2_server.rs"]
mod h2_server;
#[path = "support/http1.rs"]
mod http1;
#[path = "support/log_lines.rs"]
mod log_lines;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/skip.rs"]
mod skip;
#[path = "istio_filters/upgrade.rs"]
mod upgrade;
#[path = "istio_filters/wire.rs"]
mod wire;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use certs::{Ca, CertDir, Issued};
use child::Proxy;
use ports::free_port;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

/// The ALPN lists offered to an upstream, one per connection, comma-joined.
type Offers = Arc<Mutex<Vec<String>>>;

/// A TLS upstream presenting `server` and negotiating no ALPN, which records what each
/// connection offered and answers every HTTP/1 request with it.
fn recording_upstream(server: &Issued) -> (u16, Offers) {
    let chain = CertificateDer::pem_slice_iter(server.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap(),
    );
    let offers = Offers::default();
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let seen = offers.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (config, seen) = (config.clone(), seen.clone());
            std::thread::spawn(move || answer_offer(config, tcp, &seen));
        }
    });
    (port, offers)
}

/// One connection: its ClientHello's ALPN list recorded, then each request answered with it.
fn answer_offer(config: Arc<rustls::ServerConfig>, mut tcp: TcpStream, seen: &Mutex<Vec<String>>) {
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut acceptor = rustls::server::Acceptor::default();
    let accepted = loop {
        if acceptor.read_tls(&mut tcp).is_err() {
            return;
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => break accepted,
            Ok(None) => {}
            Err(_) => return,
        }
    };
    let offered = accepted
        .client_hello()
        .alpn()
        .map(|list| {
            list.map(|p| String::from_utf8_lossy(p).into_owned())
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_else(|| "none".into());
    seen.lock().unwrap().push(offered.clone());
    let Ok(mut conn) = accepted.into_connection(config) else {
        return;
    };
    let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
    http1::answer_heads(&mut stream, |_| http1::ok(&offered));
}

/// istiod's `istio.alpn` config for outbound listeners (as in its LDS output).
const ISTIO_ALPN: &str = r#"{name: istio.alpn, typed_config: {"@type": type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig, alpn_override: [{alpn_override: [istio-http/1.0, istio, http/1.0]}, {upstream_protocol: HTTP11, alpn_override: [istio-http/1.1, istio, http/1.1]}, {upstream_protocol: HTTP2, alpn_override: [istio-h2, istio, h2]}]}}"#;

/// Two listeners routing `/h1`, `/h2` and `/down` to clusters of those upstream protocols
/// (HTTP/1.1, HTTP/2, the downstream's), all TLS to `upstream` with Istio's mTLS ALPN list;
/// `istio.alpn` runs on the first only.
fn alpn_bootstrap(
    admin: u16,
    with: u16,
    without: u16,
    upstream: u16,
    ca: &std::path::Path,
) -> String {
    let routes = "[{match: {prefix: /h1}, route: {cluster: h1}}, {match: {prefix: /h2}, route: {cluster: h2}}, {match: {prefix: /down}, route: {cluster: down}}]";
    let listener = |name: &str, port: u16, filters: &str| {
        bootstrap::http_listener(
            name,
            port,
            "http_protocol_options: {accept_http_10: true}",
            filters,
            routes,
        )
    };
    let cluster = |name: &str, protocol: &str| {
        let extra = format!(
            r#"typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    {protocol}
transport_socket:
  name: envoy.transport_sockets.tls
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
    sni: backend.test
    common_tls_context:
      alpn_protocols: [istio-peer-exchange, istio]
      validation_context: {{trusted_ca: {{filename: {}}}}}"#,
            ca.display()
        );
        bootstrap::cluster(name, upstream, &extra)
    };
    format!(
        "{}static_resources:\n  listeners:{}{}\n  clusters:{}{}{}\n",
        bootstrap::admin(admin),
        listener("with", with, &format!("{ISTIO_ALPN}, ")),
        listener("without", without, ""),
        cluster("h1", "explicit_http_config: {http_protocol_options: {}}"),
        cluster("h2", "explicit_http_config: {http2_protocol_options: {}}"),
        cluster(
            "down",
            "use_downstream_protocol_config: {http_protocol_options: {}, http2_protocol_options: {}}"
        ),
    )
}

/// A request in HTTP/1.0 (no keep-alive): the status and body.
fn get_http10(port: u16, path: &str) -> (u16, String) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\nhost: backend.test\r\n\r\n").unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

#[test]
fn istio_alpn_offers_the_override_for_the_upstream_protocol() {
    let dir = CertDir::new();
    let mesh = Ca::new("cluster.local");
    let ca = mesh.write_root_to(dir.path(), "ca");
    let (upstream, offers) = recording_upstream(&mesh.server(&["backend.test"]).issue());
    let (admin, with, without) = (free_port(), free_port(), free_port());
    let _revoy = listening(
        &alpn_bootstrap(admin, with, without, upstream, &ca),
        &[with, without],
    );
    let get = |port: u16, path: &str| {
        http1::get(None, ([127, 0, 0, 1], port).into(), path).unwrap_or_default()
    };

    // HTTP/1.1 upstream: istiod's HTTP11 list, not the cluster's.
    assert_eq!(
        get(with, "/h1"),
        (200, "istio-http/1.1,istio,http/1.1".to_owned())
    );
    // Without the filter the cluster's own list, on a connection of its own.
    assert_eq!(
        get(without, "/h1"),
        (200, "istio-peer-exchange,istio".to_owned())
    );
    // The downstream's protocol, HTTP/1.0 here: the HTTP10 list.
    assert_eq!(
        get_http10(with, "/down"),
        (200, "istio-http/1.0,istio,http/1.0".to_owned())
    );
    assert_eq!(
        get(with, "/down"),
        (200, "istio-http/1.1,istio,http/1.1".to_owned())
    );
    // HTTP/2 upstream: the HTTP2 list is offered (this upstream speaks only HTTP/1, so the
    // request itself fails, with the 502 of an HTTP/2 protocol error as in Envoy 1.40,
    // `tests/access_log/h2_upstream.rs`; what matters is the ClientHello).
    let before = offers.lock().unwrap().len();
    let (status, _) = get(with, "/h2");
    assert_eq!(status, 502);
    let offered = offers.lock().unwrap()[before..].to_vec();
    assert_eq!(
        offered.first().map(String::as_str),
        Some("istio-h2,istio,h2")
    );
    // Each cluster and list had its own connection: the request without the filter reused
    // none of the first's.
    let all = offers.lock().unwrap().clone();
    assert_eq!(
        all[..4],
        [
            "istio-http/1.1,istio,http/1.1",
            "istio-peer-exchange,istio",
            "istio-http/1.0,istio,http/1.0",
            "istio-http/1.1,istio,http/1.1",
        ]
    );
}

/// revoy on `yaml`, ready once each of its listeners on `ports` accepts a connection (its
/// admin answers before they do).
fn listening(yaml: &str, ports: &[u16]) -> Proxy {
    Proxy::start(yaml, || {
        ports
            .iter()
            .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
    })
}

/// One of Istio proxy's test templates (`tests/data/istio/`) rendered with the variables its
/// tests leave empty (`vars` besides).
fn render(file: &str, vars: &[(&str, &str)]) -> String {
    let path = format!("{}/tests/data/istio/{file}", env!("CARGO_MANIFEST_DIR"));
    let mut data = serde_json::Map::new();
    for name in [
        "GrpcResponseStatus",
        "SDPort",
        "StackdriverRootCAFile",
        "StackdriverTokenFile",
        "STSPort",
        "AppVersionFallback",
        "EnableAdditionalLabels",
    ]
    .into_iter()
    .chain(vars.iter().map(|(n, _)| *n))
    {
        let value = vars
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| *v);
        data.insert(name.to_owned(), value.into());
    }
    let vars = serde_json::json!({ "Vars": data });
    gotemplate::render(&std::fs::read_to_string(&path).unwrap(), &vars)
        .unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// A golden metric's labels (name, value) in order, and its counter value.
fn golden(file: &str, count: &str) -> (Vec<(String, String)>, String) {
    let text = render(file, &[("RequestCount", count)]);
    let mut labels = Vec::new();
    let mut value = String::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if let Some(name) = line.strip_prefix("- name: ") {
            let v = lines.next().unwrap().strip_prefix("value: ").unwrap();
            labels.push((name.to_owned(), v.trim_matches('"').to_owned()));
        } else if let Some(v) = line.strip_prefix("value: ") {
            value = v.to_owned();
        }
    }
    (labels, value)
}

/// A node's metadata from Istio's test node template.
fn node_metadata(file: &str) -> String {
    render(file, &[])
}

/// istiod-shaped filters (istio/proxy `testdata/filters/{mx_native,stats}_{in,out}bound`).
const MX_OUTBOUND: &str = r#"{name: mx_outbound, typed_config: {"@type": type.googleapis.com/udpa.type.v1.TypedStruct, type_url: type.googleapis.com/io.istio.http.peer_metadata.Config, value: {upstream_discovery: [{istio_headers: {}}, {workload_discovery: {}}], upstream_propagation: [{istio_headers: {}}]}}}"#;
const MX_INBOUND: &str = r#"{name: mx_inbound, typed_config: {"@type": type.googleapis.com/udpa.type.v1.TypedStruct, type_url: type.googleapis.com/io.istio.http.peer_metadata.Config, value: {downstream_discovery: [{istio_headers: {}}], downstream_propagation: [{istio_headers: {}}]}}}"#;
/// The admin on 127.0.0.1:`admin`'s `/stats/prometheus` text.
fn scrape(admin: u16) -> String {
    http1::get(None, ([127, 0, 0, 1], admin).into(), "/stats/prometheus")
        .unwrap()
        .1
}

const STATS: &str = r#"{name: stats, typed_config: {"@type": type.googleapis.com/udpa.type.v1.TypedStruct, type_url: type.googleapis.com/stats.PluginConfig, value: {}}}"#;

/// An HCM listener (see `bootstrap::http_listener`) with its `traffic_direction`.
fn hcm_listener(name: &str, direction: &str, port: u16, filters: &str, routes: &str) -> String {
    bootstrap::http_listener(name, port, "", filters, &format!("[{routes}]")).replacen(
        &format!("- name: {name}\n"),
        &format!("- name: {name}\n    traffic_direction: {direction}\n"),
        1,
    )
}

/// istiod's `istio` metadata of a cluster to `service` (its host and name).
fn service_metadata((host, short): (&str, &str)) -> String {
    format!(
        "metadata: {{filter_metadata: {{istio: {{services: [{{host: {host}, name: {short}, namespace: default}}]}}}}}}"
    )
}

/// A static cluster to 127.0.0.1:`port`, with istiod's `istio` metadata when `service` is
/// given (its host and name).
fn static_cluster(name: &str, port: u16, service: Option<(&str, &str)>) -> String {
    bootstrap::cluster(name, port, &service.map_or(String::new(), service_metadata))
}

fn node_bootstrap(id: &str, metadata: &str, admin: u16, listeners: &str, clusters: &str) -> String {
    format!(
        "node: {{id: {id}, cluster: test-cluster, metadata: {{{metadata}}}}}\n{}static_resources:\n  listeners:{listeners}\n  clusters:{clusters}\n",
        bootstrap::admin(admin)
    )
}

/// The service the server sidecar's clusters name (host, name).
const SERVER_SERVICE: (&str, &str) = ("server.default.svc.cluster.local", "server");

/// Istio proxy's two-sidecar set-up (its `TestStatsPayload` and `TestStatsGrpcStream`): a
/// client revoy whose OUTBOUND listener sends `/` to the server revoy's INBOUND listener,
/// which sends it on to a backend. Each node has the metadata of Istio's test node; the
/// clusters to the server and to the backend carry [`SERVER_SERVICE`]'s `istio` metadata.
struct Sidecars {
    client_admin: u16,
    client_port: u16,
    server_admin: u16,
    server_port: u16,
    /// Extra fields (lines) of the clusters to the server and to the backend.
    upstreams: &'static str,
}

impl Sidecars {
    /// Free ports for both sidecars' admins and listeners, and `upstreams`: the extra fields of
    /// the clusters to the server and to the backend.
    fn new(upstreams: &'static str) -> Sidecars {
        Sidecars {
            client_admin: free_port(),
            client_port: free_port(),
            server_admin: free_port(),
            server_port: free_port(),
            upstreams,
        }
    }

    /// The cluster `name` to 127.0.0.1:`port`, to the server's service.
    fn upstream(&self, name: &str, port: u16) -> String {
        let metadata = service_metadata(SERVER_SERVICE);
        bootstrap::cluster(name, port, &format!("{metadata}\n{}", self.upstreams))
    }

    /// The client's bootstrap: `filters` (entries each followed by `, `) before its router,
    /// `routes` (likewise) before its route of everything to the server, and `clusters`
    /// besides the server's.
    fn client(&self, filters: &str, routes: &str, clusters: &str) -> String {
        node_bootstrap(
            "client",
            &node_metadata("client_node_metadata.json.tmpl"),
            self.client_admin,
            &hcm_listener(
                "client",
                "OUTBOUND",
                self.client_port,
                filters,
                &format!(
                    "{routes}{{match: {{prefix: /}}, route: {{cluster: server-outbound-cluster}}}}"
                ),
            ),
            &(self.upstream("server-outbound-cluster", self.server_port) + clusters),
        )
    }

    /// The server's bootstrap: `filters` (entries each followed by `, `) before its router,
    /// everything routed to the backend on 127.0.0.1:`backend`, and `listeners` besides.
    fn server(&self, filters: &str, backend: u16, listeners: &str) -> String {
        node_bootstrap(
            "server",
            &node_metadata("server_node_metadata.json.tmpl"),
            self.server_admin,
            &(hcm_listener(
                "server",
                "INBOUND",
                self.server_port,
                filters,
                "{match: {prefix: /}, route: {cluster: server-inbound-cluster}}",
            ) + listeners),
            &self.upstream("server-inbound-cluster", backend),
        )
    }
}

/// An upstream that hands each request head it reads to the test and answers `200`.
fn capturing_upstream() -> (u16, std::sync::mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                http1::answer_heads(&mut s, |head| {
                    let _ = tx.send(head.to_owned());
                    http1::ok("")
                });
            });
        }
    });
    (port, rx)
}

/// One request with `headers` (whole lines): the response head (lowercased names) and body.
fn exchange(port: u16, path: &str, headers: &str) -> (String, String) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nhost: server.test\r\n{headers}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    (head.to_owned(), body.to_owned())
}

/// The value of header `name` in a message head.
fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A Struct value as Istio's exchange writes them: a string or a nested Struct.
#[derive(Debug, PartialEq)]
enum PbValue {
    Text(String),
    Map(Vec<(String, PbValue)>),
}

/// Decodes a `google.protobuf.Struct` from its proto encoding, entries in wire order
/// (written from the protobuf encoding spec: Struct.fields = 1, a map entry's key = 1 and
/// value = 2, Value.string_value = 3, Value.struct_value = 5).
fn decode_struct(mut b: &[u8]) -> Vec<(String, PbValue)> {
    fn varint(b: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = b[0];
            *b = &b[1..];
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        v
    }
    /// The next field: its number and its length-delimited bytes (the only wire type used).
    fn field<'a>(b: &mut &'a [u8]) -> (u64, &'a [u8]) {
        let key = varint(b);
        assert_eq!(key & 7, 2, "length-delimited field expected");
        let len = varint(b) as usize;
        let (bytes, rest) = b.split_at(len);
        *b = rest;
        (key >> 3, bytes)
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let (n, mut entry) = field(&mut b);
        assert_eq!(n, 1);
        let (mut key, mut value) = (String::new(), None);
        while !entry.is_empty() {
            match field(&mut entry) {
                (1, k) => key = String::from_utf8(k.to_vec()).unwrap(),
                (2, mut v) => {
                    let (kind, bytes) = field(&mut v);
                    value = Some(match kind {
                        3 => PbValue::Text(String::from_utf8(bytes.to_vec()).unwrap()),
                        5 => PbValue::Map(decode_struct(bytes)),
                        other => panic!("unexpected Value field {other}"),
                    });
                }
                (other, _) => panic!("unexpected entry field {other}"),
            }
        }
        out.push((key, value.unwrap()));
    }
    out
}

/// An `x-envoy-peer-metadata` value decoded.
fn peer_metadata(value: &str) -> Vec<(String, PbValue)> {
    use base64::Engine;
    decode_struct(
        &base64::engine::general_purpose::STANDARD
            .decode(value)
            .unwrap(),
    )
}

fn text(s: &str) -> PbValue {
    PbValue::Text(s.to_owned())
}

#[test]
fn peer_metadata_headers_and_istio_requests_total_match_istios_goldens() {
    exchange_and_requests_total_match_istios_goldens(
        &format!("{MX_OUTBOUND}, {STATS}, "),
        &format!("{MX_INBOUND}, {STATS}, "),
    );
}

/// The metadata exchange and the stats filter as istiod up to about 1.17-1.21 configured them:
/// Wasm filters running Istio's null-VM plugins (the exchange's config as in istioctl's
/// `configdump.yaml`, the stats' as in PR 37071's listeners). The same on both sides, the
/// listener's direction deciding which way each propagates and reports.
const WASM_MX: &str = r#"{name: istio.metadata_exchange, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm, config: {vm_config: {runtime: envoy.wasm.runtime.null, code: {local: {inline_string: envoy.wasm.metadata_exchange}}}, configuration: {"@type": type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange}}}}"#;

/// `istio.stats` as a Wasm filter of `kind` (`http` or `network`) with `root_id`.
fn wasm_stats(kind: &str, root_id: &str) -> String {
    format!(
        r#"{{name: istio.stats, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.{kind}.wasm.v3.Wasm, config: {{root_id: {root_id}, vm_config: {{vm_id: {root_id}, runtime: envoy.wasm.runtime.null, code: {{local: {{inline_string: envoy.wasm.stats}}}}}}, configuration: {{"@type": type.googleapis.com/google.protobuf.StringValue, value: '{{"debug": "false", "stat_prefix": "istio"}}'}}}}}}}}"#
    )
}

#[test]
fn istios_wasm_plugins_exchange_and_report_as_the_native_filters() {
    exchange_and_requests_total_match_istios_goldens(
        &format!("{WASM_MX}, {}, ", wasm_stats("http", "stats_outbound")),
        &format!("{WASM_MX}, {}, ", wasm_stats("http", "stats_inbound")),
    );
}

/// A client and a server sidecar with `client_filters` and `server_filters` before their
/// routers: the exchange's headers and each side's `istio_requests_total` are Istio's goldens.
fn exchange_and_requests_total_match_istios_goldens(client_filters: &str, server_filters: &str) {
    let sidecars = Sidecars::new("");
    let backend_port = free_port();
    let (capture_port, captured) = capturing_upstream();
    let client = sidecars.client(
        client_filters,
        "{match: {prefix: /capture}, route: {cluster: capture}}, ",
        &static_cluster("capture", capture_port, None),
    );
    let server = sidecars.server(
        server_filters,
        backend_port,
        &hcm_listener(
            "staticreply",
            "UNSPECIFIED",
            backend_port,
            "",
            "{match: {prefix: /}, direct_response: {status: 200, body: {inline_string: hello}}}",
        ),
    );
    let _client = Proxy::with_admin(&client, sidecars.client_admin);
    let _server = Proxy::with_admin(&server, sidecars.server_admin);

    // What the client sends upstream: its node id and its workload, in Istio's format.
    let (head, _) = exchange(sidecars.client_port, "/capture", "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let sent = captured.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(header(&sent, "x-envoy-peer-metadata-id"), Some("client"));
    let metadata = peer_metadata(header(&sent, "x-envoy-peer-metadata").unwrap());
    assert_eq!(
        metadata,
        [
            ("CLUSTER_ID".to_owned(), text("client-cluster")),
            (
                "LABELS".to_owned(),
                PbValue::Map(vec![
                    ("app".to_owned(), text("productpage")),
                    (
                        "service.istio.io/canonical-name".to_owned(),
                        text("productpage-v1")
                    ),
                    (
                        "service.istio.io/canonical-revision".to_owned(),
                        text("version-1")
                    ),
                    ("version".to_owned(), text("v1")),
                ])
            ),
            ("NAME".to_owned(), text("productpage-v1-84975bc778-pxz2w")),
            ("NAMESPACE".to_owned(), text("default")),
            (
                "OWNER".to_owned(),
                text("kubernetes://apis/apps/v1/namespaces/default/deployments/productpage-v1")
            ),
            ("WORKLOAD_NAME".to_owned(), text("productpage-v1")),
        ]
    );

    // The server answers a peer that sent its metadata with its own, and only then.
    let client_headers = format!(
        "x-envoy-peer-metadata-id: client\r\nx-envoy-peer-metadata: {}\r\n",
        header(&sent, "x-envoy-peer-metadata").unwrap()
    );
    let (head, body) = exchange(sidecars.server_port, "/", &client_headers);
    assert_eq!(body, "hello");
    assert_eq!(header(&head, "x-envoy-peer-metadata-id"), Some("server"));
    let answered = peer_metadata(header(&head, "x-envoy-peer-metadata").unwrap());
    assert!(answered.contains(&("WORKLOAD_NAME".to_owned(), text("ratings-v1"))));
    let (head, _) = exchange(sidecars.server_port, "/", "");
    assert_eq!(header(&head, "x-envoy-peer-metadata"), None);

    // Through both: the client's response no longer carries the server's headers.
    for _ in 0..3 {
        let (head, body) = exchange(sidecars.client_port, "/", "");
        assert_eq!(body, "hello");
        assert_eq!(header(&head, "x-envoy-peer-metadata"), None, "{head}");
        assert_eq!(header(&head, "x-envoy-peer-metadata-id"), None, "{head}");
    }

    // Each side's istio_requests_total: the golden's labels, in its order.
    let find = |admin: u16, golden: &[(String, String)]| {
        prometheus::series(&scrape(admin), "istio_requests_total")
            .into_iter()
            .find(|(labels, _)| labels == golden)
    };
    let (client_labels, _) = golden("client_request_total.yaml.tmpl", "3");
    admin::wait_until("the client's three requests counted", || {
        find(sidecars.client_admin, &client_labels).is_some_and(|(_, v)| v == "3")
    });
    // The server saw the three through the client and the direct one with the client's
    // metadata: four from productpage-v1 (the one without metadata is another series).
    let (server_labels, _) = golden("server_request_total.yaml.tmpl", "");
    let server_series = || find(sidecars.server_admin, &server_labels);
    admin::wait_until("the server's requests counted", || {
        server_series().is_some_and(|(_, v)| v == "4")
    });
    let text = scrape(sidecars.client_admin);
    assert!(
        text.contains("# TYPE istio_requests_total counter\n"),
        "{text}"
    );
    assert!(text.contains("# TYPE istio_request_duration_milliseconds histogram\n"));
    assert!(!text.contains("envoy_istiocustom"));
}

/// A TCP upstream echoing every byte back.
fn echo_upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let mut w = s;
                let _ = std::io::copy(&mut r, &mut w);
            });
        }
    });
    port
}

const TCP_MX: &str = r#"{"@type": type.googleapis.com/udpa.type.v1.TypedStruct, type_url: type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange, value: {protocol: istio-peer-exchange}}"#;

/// A protobuf length-delimited field (for the frame this test builds itself).
fn pb_field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![number << 3 | 2];
    let mut len = bytes.len();
    while len >= 0x80 {
        out.push((len as u8 & 0x7f) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(bytes);
    out
}

/// Reads exactly `n` bytes.
fn read_n(r: &mut impl Read, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    r.read_exact(&mut buf).unwrap();
    buf
}

/// A mesh CA for `cluster.local` with its root in `dir` (`root.pem`, the path answered) and
/// the server workload `default/server` (also named `server.test`) issued into `dir`.
fn mesh_with_server(dir: &CertDir) -> (Ca, std::path::PathBuf, certs::Files) {
    let mesh = Ca::new("cluster.local");
    let ca = mesh.write_root_to(dir.path(), "root");
    let server = mesh
        .workload("default", "server")
        .dns("server.test")
        .issue()
        .write_to(dir.path(), "server");
    (mesh, ca, server)
}

/// A filter chain's `transport_socket` (in a chain entry of a YAML listener list) that
/// terminates mutual TLS with `server`, trusting `ca`, negotiating `alpn` (a YAML list).
fn downstream_mtls(server: &certs::Files, ca: &std::path::Path, alpn: &str) -> String {
    format!(
        r#"
      transport_socket:
        name: tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            alpn_protocols: {alpn}
            tls_certificates: [{{certificate_chain: {{filename: {}}}, private_key: {{filename: {}}}}}]
            validation_context: {{trusted_ca: {{filename: {}}}}}"#,
        server.chain.display(),
        server.key.display(),
        ca.display()
    )
}

/// A TLS connection to `server.test` on 127.0.0.1:`port` presenting `identity` from `dir`,
/// offering `alpn` (none when empty).
fn tls_to(
    dir: &CertDir,
    identity: &str,
    port: u16,
    alpn: &[u8],
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let mut config = certs::client_config(dir.path(), Some(identity));
    if !alpn.is_empty() {
        config.alpn_protocols = vec![alpn.to_vec()];
    }
    let name = "server.test".try_into().unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// Two revoys as Istio sidecars for TCP: a client's outbound listener (with `stats`) to a
/// cluster that speaks Istio's TCP metadata exchange over mTLS, and a server's inbound
/// listener (exchange and `stats`) in front of an echo upstream.
struct TcpMesh {
    dir: CertDir,
    client_port: u16,
    client_admin: u16,
    server_port: u16,
    server_admin: u16,
    _proxies: [Proxy; 2],
}

fn tcp_mesh(stats: &str) -> TcpMesh {
    let dir = CertDir::new();
    let (mesh, ca, server_cert) = mesh_with_server(&dir);
    let client_cert = mesh
        .workload("default", "client")
        .issue()
        .write_to(dir.path(), "client");
    let echo = echo_upstream();
    let (client_admin, client_port) = (free_port(), free_port());
    let (server_admin, server_port) = (free_port(), free_port());
    let tcp_proxy = |cluster: &str| {
        format!(
            r#"{{name: tcp, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: {cluster}, cluster: {cluster}}}}}"#
        )
    };
    let server = node_bootstrap(
        "server",
        &node_metadata("server_node_metadata.json.tmpl"),
        server_admin,
        &format!(
            r#"
  - name: inbound
    traffic_direction: INBOUND
    address: {{socket_address: {{address: 127.0.0.1, port_value: {server_port}}}}}
    filter_chains:
    - filters: [{{name: istio.metadata_exchange, typed_config: {TCP_MX}}}, {stats}, {}]{}"#,
            tcp_proxy("echo"),
            downstream_mtls(&server_cert, &ca, "[istio-peer-exchange, istio]"),
        ),
        &static_cluster("echo", echo, Some(SERVER_SERVICE)),
    );
    let client = node_bootstrap(
        "client",
        &node_metadata("client_node_metadata.json.tmpl"),
        client_admin,
        &format!(
            r#"
  - name: outbound
    traffic_direction: OUTBOUND
    address: {{socket_address: {{address: 127.0.0.1, port_value: {client_port}}}}}
    filter_chains: [{{filters: [{stats}, {}]}}]"#,
            tcp_proxy("mesh")
        ),
        &format!(
            r#"{}
    filters: [{{name: envoy.filters.network.upstream.metadata_exchange, typed_config: {TCP_MX}}}]
    transport_socket:
      name: tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: server.test
        common_tls_context:
          alpn_protocols: [istio-peer-exchange, istio]
          tls_certificates: [{{certificate_chain: {{filename: {}}}, private_key: {{filename: {}}}}}]
          validation_context: {{trusted_ca: {{filename: {}}}}}"#,
            static_cluster("mesh", server_port, Some(SERVER_SERVICE)),
            client_cert.chain.display(),
            client_cert.key.display(),
            ca.display()
        ),
    );
    let proxies = [
        Proxy::with_admin(&server, server_admin),
        Proxy::with_admin(&client, client_admin),
    ];
    // The admin answers before the listeners accept: LIVE says they do (a probe connection
    // would count in the metrics the tests read).
    for admin in [server_admin, client_admin] {
        admin::wait_until("LIVE", || {
            http1::get(None, ([127, 0, 0, 1], admin).into(), "/ready")
                .is_ok_and(|(status, body)| status == 200 && body.trim() == "LIVE")
        });
    }
    TcpMesh {
        dir,
        client_port,
        client_admin,
        server_port,
        server_admin,
        _proxies: proxies,
    }
}

#[test]
fn tcp_metadata_exchange_frames_are_exchanged_after_istio_peer_exchange_alpn() {
    let TcpMesh {
        dir,
        client_port,
        client_admin,
        server_port,
        server_admin,
        _proxies,
    } = tcp_mesh(STATS);
    ten_connections_match_istios_goldens(client_port, client_admin, server_admin);

    // A client of this test's own, speaking Istio's framing to the server revoy.
    let tls_client = |alpn: &[u8]| tls_to(&dir, "client", server_port, alpn);
    let mut s = tls_client(b"istio-peer-exchange");
    let data = pb_field(
        1,
        &[
            pb_field(1, b"x-envoy-peer-metadata-id"),
            pb_field(2, &pb_field(3, b"test-peer")),
        ]
        .concat(),
    );
    let any = [
        pb_field(1, b"type.googleapis.com/google.protobuf.Struct"),
        pb_field(2, &data),
    ]
    .concat();
    let mut frame = 0x3D23_0467u32.to_be_bytes().to_vec();
    frame.extend((any.len() as u32).to_be_bytes());
    frame.extend(&any);
    frame.extend(b"ping");
    s.write_all(&frame).unwrap();
    // The server's frame first: magic, length, Any(Struct) with its workload and id.
    let head = read_n(&mut s, 8);
    assert_eq!(head[..4], [0x3D, 0x23, 0x04, 0x67]);
    let len = u32::from_be_bytes(head[4..8].try_into().unwrap()) as usize;
    let any = decode_any(&read_n(&mut s, len));
    assert_eq!(any.0, "type.googleapis.com/google.protobuf.Struct");
    let fields = decode_struct(&any.1);
    assert_eq!(
        fields[1],
        ("x-envoy-peer-metadata-id".to_owned(), text("server"))
    );
    let PbValue::Map(metadata) = &fields[0].1 else {
        panic!("{fields:?}")
    };
    assert_eq!(fields[0].0, "x-envoy-peer-metadata");
    assert!(metadata.contains(&("WORKLOAD_NAME".to_owned(), text("ratings-v1"))));
    // Then the echo of what followed this test's frame, and nothing of the frame.
    assert_eq!(read_n(&mut s, 4), b"ping");

    // Without the exchange's ALPN the bytes pass as they are, both ways.
    let mut s = tls_client(b"istio");
    s.write_all(b"ping").unwrap();
    assert_eq!(read_n(&mut s, 4), b"ping");
}

/// Ten connections through the client and server sidecars of a [`tcp_mesh`]: the bytes arrive
/// as sent (each side took the other's frame off), and each side's
/// `istio_tcp_connections_opened_total` has Istio's golden labels.
fn ten_connections_match_istios_goldens(client_port: u16, client_admin: u16, server_admin: u16) {
    // Through both revoys: each took the other's frame off, so the bytes arrive as sent
    // (ten connections, as in Istio's TCP test).
    for _ in 0..10 {
        let mut conn = TcpStream::connect(("127.0.0.1", client_port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.write_all(b"hello mesh").unwrap();
        assert_eq!(read_n(&mut conn, 10), b"hello mesh");
    }
    // Each side's istio_tcp_connections_opened_total: Istio's golden labels, peers from the
    // exchange and principals from the mTLS certificates.
    for (admin, file) in [
        (client_admin, "tcp_client_connection_open.yaml.tmpl"),
        (server_admin, "tcp_server_connection_open.yaml.tmpl"),
    ] {
        let (labels, value) = golden(file, "");
        assert_eq!(value, "10");
        admin::wait_until(file, || {
            let text = scrape(admin);
            prometheus::series(&text, "istio_tcp_connections_opened_total")
                .iter()
                .any(|(l, v)| *l == labels && v == "10")
        });
    }
}

#[test]
fn istios_wasm_tcp_stats_plugin_reports_as_the_native_filter() {
    let m = tcp_mesh(&wasm_stats("network", "stats_outbound"));
    ten_connections_match_istios_goldens(m.client_port, m.client_admin, m.server_admin);
}

/// Istio's stats filter reports an open TCP connection whose peer it knows at every
/// `tcp_reporting_duration` (istio/proxy `istio_stats.cc`: `onReportTimer` ->
/// `reportHelper(false)`): opened once the exchange has told it the peer, labelled then, and
/// the bytes moved since the report before; closed only when the connection closes. Here every
/// 0.2 s, on both sidecars, while the test's connection stays open.
#[test]
fn an_open_tcp_connection_reports_its_bytes_every_tcp_reporting_duration() {
    let m = tcp_mesh(
        r#"{name: stats, typed_config: {"@type": type.googleapis.com/udpa.type.v1.TypedStruct, type_url: type.googleapis.com/stats.PluginConfig, value: {tcp_reporting_duration: 0.2s}}}"#,
    );
    let total = |admin: u16, family: &str| -> u64 {
        let text = scrape(admin);
        prometheus::series(&text, family)
            .iter()
            .map(|(_, v)| v.parse::<u64>().unwrap())
            .sum()
    };
    let mut conn = TcpStream::connect(("127.0.0.1", m.client_port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(b"hello mesh").unwrap();
    assert_eq!(read_n(&mut conn, 10), b"hello mesh");
    // The client's sidecar: reported opened with the peer's labels (Istio's golden for a
    // client's open connection), and the app's 10 bytes each way, while the connection is open.
    let (labels, _) = golden("tcp_client_connection_open.yaml.tmpl", "");
    admin::wait_until("the client's report while open", || {
        let text = http1::get(
            None,
            ([127, 0, 0, 1], m.client_admin).into(),
            "/stats/prometheus",
        )
        .unwrap()
        .1;
        prometheus::series(&text, "istio_tcp_connections_opened_total")
            .iter()
            .any(|(l, v)| *l == labels && v == "1")
            && total(m.client_admin, "istio_tcp_received_bytes_total") == 10
            && total(m.client_admin, "istio_tcp_sent_bytes_total") == 10
    });
    admin::wait_until("the server's report while open", || {
        total(m.server_admin, "istio_tcp_connections_opened_total") == 1
            && total(m.server_admin, "istio_tcp_received_bytes_total") > 0
    });
    for admin in [m.client_admin, m.server_admin] {
        assert_eq!(total(admin, "istio_tcp_connections_closed_total"), 0);
    }

    // Later bytes come with the next report, the connection still open.
    conn.write_all(b"second").unwrap();
    assert_eq!(read_n(&mut conn, 6), b"second");
    admin::wait_until("the next report", || {
        total(m.client_admin, "istio_tcp_received_bytes_total") == 16
            && total(m.client_admin, "istio_tcp_sent_bytes_total") == 16
    });
    assert_eq!(
        total(m.client_admin, "istio_tcp_connections_closed_total"),
        0
    );
    let server_bytes = total(m.server_admin, "istio_tcp_received_bytes_total");

    // Closed: reported once, nothing counted twice.
    drop(conn);
    for admin in [m.client_admin, m.server_admin] {
        admin::wait_until("closed", || {
            total(admin, "istio_tcp_connections_closed_total") == 1
        });
        assert_eq!(total(admin, "istio_tcp_connections_opened_total"), 1);
    }
    assert_eq!(total(m.client_admin, "istio_tcp_received_bytes_total"), 16);
    assert_eq!(total(m.client_admin, "istio_tcp_sent_bytes_total"), 16);
    assert!(total(m.server_admin, "istio_tcp_received_bytes_total") >= server_bytes);
}

/// A gRPC frame holding `msg`.
fn grpc_frame(msg: &[u8]) -> Vec<u8> {
    let mut f = vec![0];
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    f
}

/// A bidirectional gRPC upstream (over HTTP/2), as Istio's test server answers its stream:
/// the response's headers at once, then for each request message (a big-endian `u32` n) n
/// response messages, and `grpc-status: 0` once the request ends.
async fn bidi_upstream(request: h2_server::Request, mut respond: h2_server::Respond) {
    let mut body = request.into_body();
    let head = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let mut buf = Vec::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
            if buf.len() < 5 + len {
                break;
            }
            let n = u32::from_be_bytes(buf[5..5 + len].try_into().unwrap());
            buf.drain(..5 + len);
            for _ in 0..n {
                let _ = send.send_data(grpc_frame(b"pong").into(), false);
            }
        }
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = send.send_trailers(trailers);
}

/// Sends one request message per entry of `counts` (asking for that many answers) on an
/// open chunked HTTP/1.1 request.
fn send_messages(conn: &mut TcpStream, counts: &[u32]) {
    for n in counts {
        let frame = grpc_frame(&n.to_be_bytes());
        write!(conn, "{:x}\r\n", frame.len()).unwrap();
        conn.write_all(&frame).unwrap();
        conn.write_all(b"\r\n").unwrap();
    }
}

/// Istio's stats filter reports an open gRPC stream's messages every
/// `tcp_reporting_duration` once the exchange has read the peer (istio/proxy
/// `istio_stats.cc`: `decodeHeaders` arms the timer for gRPC, `onReportTimer` ->
/// `reportHelper(false)`), with the reporter's and the ends' labels, the messages since the
/// report before; and the rest when the stream ends (`log` -> `reportHelper(true)`). As
/// Istio's `TestStatsGrpcStream`: a client sidecar and a server sidecar, each with grpc_stats
/// (`emit_filter_state`) and `istio.stats` (here every 0.2 s); 3 messages asking for 1, 5 and
/// 7 answers are counted on both sidecars while the stream stays open (3 and 13), then 5 more
/// and the stream closed: 8 and 27 in all, not counted twice.
#[test]
fn an_open_grpc_stream_reports_its_messages_every_tcp_reporting_duration() {
    const H2: &str = r#"typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {http2_protocol_options: {}}"#;
    let filters = |mx: &str| {
        format!(
            r#"{mx}, {{name: grpc_stats, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig, emit_filter_state: true}}}}, {{name: stats, typed_config: {{"@type": type.googleapis.com/udpa.type.v1.TypedStruct, type_url: type.googleapis.com/stats.PluginConfig, value: {{tcp_reporting_duration: 0.2s}}}}}}, "#
        )
    };
    let sidecars = Sidecars::new(H2);
    let backend = h2_server::serve(bidi_upstream);
    let client = sidecars.client(&filters(MX_OUTBOUND), "", "");
    let server = sidecars.server(&filters(MX_INBOUND), backend, "");
    let _client = listening(&client, &[sidecars.client_port]);
    let _server = listening(&server, &[sidecars.server_port]);

    // Each sidecar's message counters: one series, with the reporter's and the ends' labels
    // (the first 20 of Istio's request goldens, as its message goldens have them).
    let sides = [
        (sidecars.client_admin, "client_request_total.yaml.tmpl"),
        (sidecars.server_admin, "server_request_total.yaml.tmpl"),
    ]
    .map(|(admin, file)| {
        let (mut labels, _) = golden(file, "");
        labels.truncate(20);
        (admin, labels)
    });
    let counted = |admin: u16, labels: &[(String, String)], requests: &str, responses: &str| {
        let text = scrape(admin);
        [
            ("istio_request_messages_total", requests),
            ("istio_response_messages_total", responses),
        ]
        .iter()
        .all(|(family, n)| {
            prometheus::series(&text, family) == [(labels.to_vec(), (*n).to_owned())]
        })
    };

    let mut conn = TcpStream::connect(("127.0.0.1", sidecars.client_port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "POST /svc.Echo/Bidi HTTP/1.1\r\nhost: server.test\r\ncontent-type: application/grpc\r\nte: trailers\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reader = conn.try_clone().unwrap();
    let response = std::thread::spawn(move || {
        let mut raw = Vec::new();
        let _ = reader.read_to_end(&mut raw);
        String::from_utf8_lossy(&raw).into_owned()
    });
    send_messages(&mut conn, &[1, 5, 7]);
    for (admin, labels) in &sides {
        admin::wait_until("the messages reported while the stream is open", || {
            counted(*admin, labels, "3", "13")
        });
        // The stream is still open: no request counted yet.
        assert!(prometheus::series(&scrape(*admin), "istio_requests_total").is_empty());
    }

    send_messages(&mut conn, &[10, 1, 1, 1, 1]);
    conn.write_all(b"0\r\n\r\n").unwrap();
    let response = response.join().unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    for (admin, _) in &sides {
        admin::wait_until("the stream counted", || {
            prometheus::series(&scrape(*admin), "istio_requests_total")
                .iter()
                .any(|(_, v)| v == "1")
        });
    }
    for (admin, labels) in &sides {
        assert!(counted(*admin, labels, "8", "27"), "{}", scrape(*admin));
    }
}

/// An `Any`'s type URL and value (fields 1 and 2).
fn decode_any(b: &[u8]) -> (String, Vec<u8>) {
    let mut rest = b;
    let (mut url, mut value) = (String::new(), Vec::new());
    while !rest.is_empty() {
        let key = rest[0];
        let (len, used) = {
            let (mut v, mut i) = (0usize, 1);
            loop {
                let byte = rest[i];
                v |= usize::from(byte & 0x7f) << (7 * (i - 1));
                i += 1;
                if byte & 0x80 == 0 {
                    break (v, i);
                }
            }
        };
        let bytes = &rest[used..used + len];
        match key >> 3 {
            1 => url = String::from_utf8(bytes.to_vec()).unwrap(),
            2 => value = bytes.to_vec(),
            other => panic!("unexpected Any field {other}"),
        }
        rest = &rest[used + len..];
    }
    (url, value)
}

/// The RBAC shapes istiod emits for AuthorizationPolicy `principals` and `namespaces`
/// (istioctl's authz testdata): `filter_state` matchers on `io.istio.peer_principal`, which
/// the `istio_authn` network filter first on each inbound chain sets from the peer's SPIFFE
/// certificate (istio/proxy `source/extensions/filters/network/istio_authn`). Through revoy:
/// an HTTP chain with a DENY filter for namespace `other` and an ALLOW filter for namespace
/// `default`, a TCP chain with a network ALLOW for one service account, and the same HTTP
/// chain without `istio_authn` (no principal: the ALLOW matches no one).
#[test]
fn istio_authn_principals_are_what_authorization_policies_match() {
    let dir = CertDir::new();
    let (mesh, ca, server) = mesh_with_server(&dir);
    for (ns, sa) in [
        ("default", "sleep"),
        ("default", "web"),
        ("other", "intruder"),
    ] {
        mesh.workload(ns, sa).issue().write_to(dir.path(), sa);
    }
    let (upstream, _heads) = capturing_upstream();
    let echo = echo_upstream();
    let (admin, with_authn, without_authn, tcp) =
        (free_port(), free_port(), free_port(), free_port());
    let authn = r#"{name: istio_authn, typed_config: {"@type": type.googleapis.com/udpa.type.v1.TypedStruct, type_url: type.googleapis.com/io.istio.network.authn.Config}}"#;
    let principal =
        |m: &str| format!("{{filter_state: {{key: io.istio.peer_principal, string_match: {m}}}}}");
    let rbac = |name: &str, action: &str, policy: &str, m: &str| {
        format!(
            r#"{{name: {name}, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC, rules: {{action: {action}, policies: {{"{policy}": {{permissions: [{{and_rules: {{rules: [{{any: true}}]}}}}], principals: [{{and_ids: {{ids: [{{or_ids: {{ids: [{}]}}}}]}}}}]}}}}}}}}}}"#,
            principal(m)
        )
    };
    let deny_other = rbac(
        "deny",
        "DENY",
        "ns[default]-policy[deny-other]-rule[0]",
        "{safe_regex: {regex: '.*/ns/other/.*'}}",
    );
    let allow_default = rbac(
        "allow",
        "ALLOW",
        "ns[default]-policy[allow-default]-rule[0]",
        "{safe_regex: {regex: '.*/ns/default/.*'}}",
    );
    let tls = downstream_mtls(&server, &ca, "[]");
    // Each chain logs the principals as `%FILTER_STATE()%` reads them, into a file of its own.
    let log = |name: &str| {
        format!(
            r#"{{name: {name}, typed_config: {{"@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: {}, log_format: {{text_format_source: {{inline_string: "%FILTER_STATE(io.istio.peer_principal:PLAIN)% %FILTER_STATE(io.istio.local_principal)%\n"}}}}}}}}"#,
            dir.path().join(format!("{name}.log")).display()
        )
    };
    let hcm = |prefix: &str| {
        format!(
            r#"{{name: hcm, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager, stat_prefix: {prefix}, access_log: [{}], http_filters: [{deny_other}, {allow_default}, {{name: router, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}], route_config: {{virtual_hosts: [{{name: all, domains: ["*"], routes: [{{match: {{prefix: /}}, route: {{cluster: app}}}}]}}]}}}}}}"#,
            log(prefix)
        )
    };
    let network_allow = format!(
        r#"{{name: envoy.filters.network.rbac, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC, stat_prefix: tcp., rules: {{action: ALLOW, policies: {{"ns[default]-policy[sleep]-rule[0]": {{permissions: [{{any: true}}], principals: [{}]}}}}}}}}}}"#,
        principal("{exact: 'spiffe://cluster.local/ns/default/sa/sleep'}")
    );
    let listener = |name: &str, port: u16, filters: String| {
        format!(
            "\n  - name: {name}\n    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}\n    filter_chains:\n    - filters: [{filters}]{tls}"
        )
    };
    let tcp_proxy = format!(
        r#"{{name: tcp, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: echo, cluster: echo, access_log: [{}]}}}}"#,
        log("tcp")
    );
    let listeners = [
        listener(
            "with_authn",
            with_authn,
            format!("{authn}, {}", hcm("with_authn")),
        ),
        listener("without_authn", without_authn, hcm("without_authn")),
        listener("tcp", tcp, format!("{authn}, {network_allow}, {tcp_proxy}")),
    ]
    .concat();
    let clusters = [
        static_cluster("app", upstream, None),
        static_cluster("echo", echo, None),
    ]
    .concat();
    let config = node_bootstrap("server", "", admin, &listeners, &clusters);
    let ports = [with_authn, without_authn, tcp];
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_revoy"));
    command.args([
        "--config-yaml",
        &config,
        "--concurrency",
        "1",
        "-l",
        "error",
    ]);
    command.args(["--file-flush-interval-msec", "50"]);
    let _revoy = Proxy::spawn(command, || {
        ports
            .iter()
            .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
    });

    let connect = |port: u16, identity: &str| tls_to(&dir, identity, port, b"");
    let status = |port: u16, identity: &str| {
        let mut s = connect(port, identity);
        s.write_all(b"GET / HTTP/1.1\r\nhost: server.test\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let status = raw.get(9..12).unwrap_or("").to_owned();
        (status, raw)
    };
    for (identity, want) in [("sleep", "200"), ("web", "200"), ("intruder", "403")] {
        let (got, raw) = status(with_authn, identity);
        assert_eq!(got, want, "{identity} through istio_authn: {raw}");
        if want == "403" {
            assert!(raw.ends_with("RBAC: access denied"), "{raw}");
        }
    }
    let (got, raw) = status(without_authn, "sleep");
    assert_eq!(
        got, "403",
        "without istio_authn there is no principal: {raw}"
    );

    let echoes = |identity: &str| {
        let mut s = connect(tcp, identity);
        if s.write_all(b"ping").is_err() {
            return false;
        }
        let mut got = [0u8; 4];
        s.read_exact(&mut got).is_ok() && &got == b"ping"
    };
    assert!(echoes("sleep"), "the allowed service account's connection");
    assert!(
        !echoes("web"),
        "another service account's connection is closed"
    );

    // The principals as `%FILTER_STATE()%` renders a string object in Envoy 1.40 (bare with
    // `PLAIN`, JSON-quoted by default): the client's and this side's SPIFFE identities.
    let id = |ns: &str, sa: &str| format!("spiffe://cluster.local/ns/{ns}/sa/{sa}");
    let line = |ns: &str, sa: &str| format!("{} \"{}\"", id(ns, sa), id("default", "server"));
    let lines =
        |name: &str, n: usize| log_lines::read_lines(&dir.path().join(format!("{name}.log")), n);
    assert_eq!(
        lines("with_authn", 3),
        [
            line("default", "sleep"),
            line("default", "web"),
            line("other", "intruder")
        ]
    );
    assert_eq!(
        lines("without_authn", 1),
        ["- -"],
        "no istio_authn, no filter state"
    );
    // The connection the network RBAC closed never reached tcp_proxy, and logs nothing.
    assert_eq!(lines("tcp", 1), [line("default", "sleep")]);
}

/// Requests that never get an upstream's answer, with the status and the flags Envoy gives
/// them (`NR`: no route, `UH`: a cluster without endpoints, `UF`: an endpoint refusing
/// connections, `DC`: the client leaves while the upstream holds the request).
const FAILING: [(&str, &str, &str); 4] = [
    ("/nowhere", "404", "NR"),
    ("/empty", "503", "UH"),
    ("/refused", "503", "UF"),
    ("/held", "0", "DC"),
];

/// The routes and clusters behind [`FAILING`] (`refused`: a loopback port nothing listens on;
/// `held`: an upstream that never answers).
fn failing_routes(refused: u16, held: u16) -> (&'static str, String) {
    let routes = "{match: {prefix: /empty}, route: {cluster: empty}}, {match: {prefix: /refused}, route: {cluster: refused}}, {match: {prefix: /held}, route: {cluster: held}}";
    let clusters = format!(
        "{}{}\n  - name: empty\n    connect_timeout: 1s\n    load_assignment: {{cluster_name: empty, endpoints: []}}",
        static_cluster(
            "refused",
            refused,
            Some(("refused.default.svc.cluster.local", "refused"))
        ),
        static_cluster("held", held, None)
    );
    (routes, clusters)
}

/// An upstream that accepts connections, tells the test, and never answers.
fn holding_upstream() -> (u16, std::sync::mpsc::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
            let _ = tx.send(());
        }
    });
    (port, rx)
}

/// Sends [`FAILING`]'s requests to `port`, the last one abandoned once the holding upstream
/// (`held`) has its connection; the heads of the answered ones.
fn send_failing(port: u16, held: &std::sync::mpsc::Receiver<()>) -> Vec<String> {
    let (answered, [(abandoned, _, _)]) = FAILING.split_at(FAILING.len() - 1) else {
        unreachable!()
    };
    let heads = answered
        .iter()
        .map(|(path, _, _)| exchange(port, path, "").0)
        .collect();
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        conn,
        "GET {abandoned} HTTP/1.1\r\nhost: server.test\r\n\r\n"
    )
    .unwrap();
    held.recv_timeout(Duration::from_secs(10)).unwrap();
    drop(conn);
    heads
}

/// A file access log entry (flow style) writing `format` and a newline to `path`.
fn file_access_log(path: &std::path::Path, format: &str) -> String {
    format!(
        r#"{{name: f, typed_config: {{"@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog, path: "{}", log_format: {{text_format_source: {{inline_string: "{format}\n"}}}}}}}}"#,
        path.display()
    )
}

/// Envoy on `yaml` (admin `admin`, its base id too) flushing its access logs every 50 ms,
/// ready once its listener on `port` accepts a connection.
fn envoy_flushing_logs(envoy: &std::path::Path, yaml: &str, admin: u16, port: u16) -> Proxy {
    let mut command = std::process::Command::new(envoy);
    command
        .args(["--config-yaml", yaml, "--concurrency", "1", "-l", "error"])
        .args(["--base-id", &admin.to_string(), "--disable-hot-restart"])
        .args(["--file-flush-interval-msec", "50"]);
    Proxy::spawn(command, || TcpStream::connect(("127.0.0.1", port)).is_ok())
}

/// What Envoy 1.40 logs as each of [`FAILING`]'s requests' `%RESPONSE_CODE% %RESPONSE_FLAGS%`
/// (`None` when Envoy is missing: skipped loudly).
fn envoy_failing_flags() -> Option<Vec<(String, String, String)>> {
    let envoy = oracle::envoy_or_skip("response_flags: Envoy's flags for the failing requests")?;
    let (admin, port, refused) = (free_port(), free_port(), free_port());
    let (held, accepted) = holding_upstream();
    let log = std::env::temp_dir().join(format!("revoy-rflags-{}-{port}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let access_log = format!(
        "access_log: [{}]",
        file_access_log(&log, "%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS%")
    );
    let (routes, clusters) = failing_routes(refused, held);
    let yaml = bootstrap::with_admin(
        admin,
        &bootstrap::http_listener("envoy", port, &access_log, "", &format!("[{routes}]")),
        &clusters,
    );
    let _envoy = envoy_flushing_logs(&envoy, &yaml, admin, port);
    send_failing(port, &accepted);
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    admin::wait_until("Envoy's access log has every request", || {
        lines().lines().count() == FAILING.len()
    });
    let logged = lines()
        .lines()
        .map(|l| {
            let mut f = l.split(' ').map(str::to_owned);
            (f.next().unwrap(), f.next().unwrap(), f.next().unwrap())
        })
        .collect();
    let _ = std::fs::remove_file(&log);
    Some(logged)
}

#[test]
fn istio_requests_total_carries_the_response_flags_envoy_gives_a_request() {
    if let Some(logged) = envoy_failing_flags() {
        let expected: Vec<_> = FAILING
            .iter()
            .map(|(p, c, f)| (p.to_string(), c.to_string(), f.to_string()))
            .collect();
        assert_eq!(logged, expected, "Envoy's flags for the failing requests");
    }
    let (admin, port, refused) = (free_port(), free_port(), free_port());
    let (held, accepted) = holding_upstream();
    let (routes, clusters) = failing_routes(refused, held);
    let client = node_bootstrap(
        "client",
        &node_metadata("client_node_metadata.json.tmpl"),
        admin,
        &hcm_listener(
            "client",
            "OUTBOUND",
            port,
            &format!("{MX_OUTBOUND}, {STATS}, "),
            routes,
        ),
        &clusters,
    );
    let _client = listening(&client, &[port]);
    for (head, (path, code, _)) in send_failing(port, &accepted).iter().zip(FAILING) {
        assert!(
            head.starts_with(&format!("HTTP/1.1 {code}")),
            "{path}: {head}"
        );
    }
    let series = || {
        let text = scrape(admin);
        prometheus::series(&text, "istio_requests_total")
    };
    admin::wait_until("the failing requests counted", || {
        series().len() == FAILING.len()
    });
    let mut seen: Vec<_> = series()
        .into_iter()
        .map(|(labels, value)| {
            assert_eq!(prometheus::label(&labels, "reporter"), "source");
            (
                prometheus::label(&labels, "response_code"),
                prometheus::label(&labels, "response_flags"),
                value,
            )
        })
        .collect();
    seen.sort();
    let mut expected: Vec<_> = FAILING
        .iter()
        .map(|(_, c, f)| (c.to_string(), f.to_string(), "1".to_owned()))
        .collect();
    expected.sort();
    assert_eq!(seen, expected);
}

/// A tcp_proxy to `cluster` (its `access_log` entries `log`, may be empty), as a filter entry.
fn tcp_proxy_logging(cluster: &str, log: &str) -> String {
    format!(
        r#"{{name: tcp, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: {cluster}, cluster: {cluster}{log}}}}}"#
    )
}

/// A plaintext listener `name` on `port` whose one chain runs `filters`.
fn tcp_listener(name: &str, port: u16, filters: &str) -> String {
    format!(
        r#"
  - name: {name}
    traffic_direction: OUTBOUND
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains: [{{filters: [{filters}]}}]"#
    )
}

/// Connects to `port` and reads until the proxy closes the connection; false when the
/// connection was refused (the listener is not up yet).
fn connect_until_closed(port: u16) -> bool {
    let Ok(mut conn) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    true
}

/// What Envoy 1.40 logs as `%RESPONSE_FLAGS%` for a tcp_proxy connection to a refused port
/// (`None` when Envoy is missing: skipped loudly).
fn envoy_refused_tcp_flags() -> Option<String> {
    let envoy = oracle::envoy_or_skip("response_flags: Envoy's flags for a refused TCP upstream")?;
    let (admin, port, refused) = (free_port(), free_port(), free_port());
    let log = std::env::temp_dir().join(format!(
        "revoy-rflags-tcp-{}-{port}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&log);
    let access_log = format!(
        ", access_log: [{}]",
        file_access_log(&log, "%RESPONSE_FLAGS%")
    );
    let yaml = bootstrap::with_admin(
        admin,
        &tcp_listener("tcp", port, &tcp_proxy_logging("refused", &access_log)),
        &bootstrap::cluster("refused", refused, ""),
    );
    // Ready once the listener accepted a connection: the first one logged.
    let _envoy = envoy_flushing_logs(&envoy, &yaml, admin, port);
    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    admin::wait_until("Envoy's access log has the probe", || !lines().is_empty());
    let before = lines().lines().count();
    assert!(connect_until_closed(port));
    admin::wait_until("Envoy's access log has the connection", || {
        lines().lines().count() > before
    });
    let flags = lines().lines().last().unwrap().to_owned();
    let _ = std::fs::remove_file(&log);
    Some(flags)
}

#[test]
fn istio_tcp_metrics_carry_the_response_flags_envoy_gives_a_connection() {
    const REFUSED_TCP: &str = "UF,URX";
    if let Some(flags) = envoy_refused_tcp_flags() {
        assert_eq!(
            flags, REFUSED_TCP,
            "Envoy's flags for a refused TCP upstream"
        );
    }
    let (admin, port, refused) = (free_port(), free_port(), free_port());
    let client = node_bootstrap(
        "client",
        &node_metadata("client_node_metadata.json.tmpl"),
        admin,
        &tcp_listener(
            "tcp",
            port,
            &format!("{STATS}, {}", tcp_proxy_logging("refused", "")),
        ),
        &static_cluster(
            "refused",
            refused,
            Some(("refused.default.svc.cluster.local", "refused")),
        ),
    );
    let _client = Proxy::with_admin(&client, admin);
    // One connection, once the listener is up.
    admin::wait_until("revoy's tcp listener", || connect_until_closed(port));
    for family in [
        "istio_tcp_connections_opened_total",
        "istio_tcp_connections_closed_total",
    ] {
        admin::wait_until(family, || {
            prometheus::series(&scrape(admin), family)
                .iter()
                .any(|(labels, v)| {
                    v == "1"
                        && labels.contains(&("response_flags".to_owned(), REFUSED_TCP.to_owned()))
                        && labels.contains(&(
                            "destination_service".to_owned(),
                            "refused.default.svc.cluster.local".to_owned(),
                        ))
                })
        });
    }
}
