//! Each stream's upstream wire bytes (`%UPSTREAM_WIRE_BYTES_SENT%`,
//! `%UPSTREAM_WIRE_BYTES_RECEIVED%`) and header bytes (`%UPSTREAM_HEADER_BYTES_*%`) against
//! Envoy 1.40, over an HTTP/1.1 upstream: a GET, a POST with a `content-length`, a chunked
//! POST (one chunk: Envoy re-chunks a body by what each read brought, revoy forwards the
//! client's chunks as they came, so several chunks read at once are framed differently), a
//! chunked response, a keep-alive connection's second request (on the same upstream
//! connection), a GET and a POST to an upstream over TLS (plaintext bytes, as Envoy's codec
//! counts them), a request retried once (both attempts' bytes), a direct response (no
//! upstream) and a dead upstream (`503`, no connection); and over an HTTP/2 upstream
//! connection: a GET and a POST from an HTTP/1.1 client on one connection (the second
//! request's header block smaller as the HPACK tables fill; the POST's body ended by a DATA
//! frame of its own) and a POST from an HTTP/2 client (its body ending with its last frame).

use super::wire::{curl_h2_with, exchange, wire_upstream};
use super::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use certs::{Ca, Issued};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::{ServerConfig, ServerConnection, StreamOwned};

/// An upstream over TLS, presenting `cert`: reads each request whole (`content-length`) and
/// answers `hello world\n`.
fn tls_upstream(cert: &Issued) -> u16 {
    let chain = CertificateDer::pem_slice_iter(cert.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("the chain parses");
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("the key parses");
    let config = Arc::new(
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the certificate fits its key"),
    );
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let conn = ServerConnection::new(config).expect("a TLS session");
                let mut tls = StreamOwned::new(conn, s);
                let mut buf = Vec::new();
                while let Some((_, length)) = read_head(&mut tls, &mut buf) {
                    let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello world\n";
                    if !read_body(&mut tls, &mut buf, length)
                        || tls.write_all(reply).and_then(|()| tls.flush()).is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// An HTTP/2 upstream: reads each request's body, then answers `200` with `hello world\n`
/// (a HEADERS frame, then one DATA frame ending the stream).
fn h2_upstream() -> u16 {
    super::h2_server::serve(|request, mut respond| async move {
        let mut body = request.into_body();
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        let head = http::Response::builder()
            .status(200)
            .header("content-length", "12")
            .body(())
            .unwrap();
        if let Ok(mut send) = respond.send_response(head, false) {
            let _ = send.send_data(bytes::Bytes::from_static(b"hello world\n"), true);
        }
    })
}

/// The logger's line.
const UPSTREAM_WIRE: &str = "%REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %UPSTREAM_WIRE_BYTES_SENT% %UPSTREAM_WIRE_BYTES_RECEIVED% %UPSTREAM_HEADER_BYTES_SENT% %UPSTREAM_HEADER_BYTES_RECEIVED% %UPSTREAM_LOCAL_ADDRESS%\n";

/// An upstream that answers its first request `503` and the others `hello world\n`.
fn retried_upstream() -> u16 {
    static ANSWERED: AtomicBool = AtomicBool::new(false);
    ANSWERED.store(false, Ordering::Relaxed);
    head_upstream(|_, s| {
        let reply: &[u8] = if ANSWERED.swap(true, Ordering::Relaxed) {
            b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello world\n"
        } else {
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n"
        };
        s.write_all(reply).is_ok()
    })
}

/// The ports of the upstreams: plaintext, over TLS, one that fails its first request, and
/// one nothing listens on.
struct Upstreams {
    plain: u16,
    tls: u16,
    retried: u16,
    dead: u16,
    h2: u16,
}

fn upstream_wire_bootstrap(admin: u16, http: u16, up: &Upstreams, dir: &Path) -> String {
    let log = logger(&dir.join("upstream-wire.log"), &text(UPSTREAM_WIRE));
    let tls = format!(
        "transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, sni: up.test, common_tls_context: {{validation_context: {{trusted_ca: {{filename: {}}}}}}}}}}}, ",
        dir.join("root.pem").display()
    );
    let cluster = |name: &str, port: u16, transport: &str| {
        format!(
            "  - {{name: {name}, connect_timeout: 1s, {transport}load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}}}\n"
        )
    };
    format!(
        r#"{head}          codec_type: AUTO
          preserve_external_request_id: true
          access_log: [{log}]
          http_filters: [{{name: r, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router, suppress_envoy_headers: true}}}}]
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - {{match: {{prefix: /direct}}, direct_response: {{status: 200, body: {{inline_string: abc}}}}}}
              - {{match: {{prefix: /dead}}, route: {{cluster: dead}}}}
              - {{match: {{prefix: /tls}}, route: {{cluster: tls}}}}
              - {{match: {{prefix: /retried}}, route: {{cluster: retried, retry_policy: {{retry_on: 5xx, num_retries: 1}}}}}}
              - {{match: {{prefix: /up}}, route: {{cluster: up}}}}
              - {{match: {{prefix: /h2}}, route: {{cluster: h2}}}}
  clusters:
{up}{dead}{tls}{retried}{h2}"#,
        head = hcm_bootstrap_head(admin, http, "upstream_wire"),
        up = cluster("up", up.plain, ""),
        dead = cluster("dead", up.dead, ""),
        tls = cluster("tls", up.tls, &tls),
        retried = cluster("retried", up.retried, ""),
        h2 = cluster(
            "h2",
            up.h2,
            "typed_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {\"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {http2_protocol_options: {}}}}, "
        ),
    )
}

/// The requests, in order; how many lines they log.
const LINES: usize = 14;

fn observe_upstream_wire(dir: &Path, start: impl FnOnce(&str) -> Proxy) -> Vec<String> {
    let ca = Ca::new("cluster.local");
    ca.write_root_to(dir, "root");
    let up = Upstreams {
        plain: wire_upstream(),
        tls: tls_upstream(&ca.server(&["up.test"]).issue()),
        retried: retried_upstream(),
        dead: free_port(),
        h2: h2_upstream(),
    };
    let (admin, http) = (free_port(), free_port());
    let _proxy = start(&upstream_wire_bootstrap(admin, http, &up, dir));
    exchange(
        http,
        &[b"GET /up HTTP/1.1\r\nhost: h.test\r\nuser-agent: test/1\r\n\r\n"],
    );
    exchange(
        http,
        &[b"POST /up/post HTTP/1.1\r\nhost: h.test\r\ncontent-length: 10\r\n\r\n0123456789"],
    );
    exchange(
        http,
        &[b"POST /up/chunked-post HTTP/1.1\r\nhost: h.test\r\ntransfer-encoding: chunked\r\n\r\na\r\n0123456789\r\n0\r\n\r\n"],
    );
    exchange(http, &[b"GET /up/chunked HTTP/1.1\r\nhost: h.test\r\n\r\n"]);
    // Two requests on one connection, the second on the upstream connection of the first.
    exchange(
        http,
        &[
            b"GET /up/first HTTP/1.1\r\nhost: h.test\r\n\r\n",
            b"GET /up/second HTTP/1.1\r\nhost: h.test\r\nx-extra: spaced\r\n\r\n",
        ],
    );
    exchange(
        http,
        &[
            b"GET /tls HTTP/1.1\r\nhost: h.test\r\n\r\n",
            b"POST /tls/post HTTP/1.1\r\nhost: h.test\r\ncontent-length: 10\r\n\r\n0123456789",
        ],
    );
    // Retried once: both attempts' bytes.
    exchange(http, &[b"GET /retried HTTP/1.1\r\nhost: h.test\r\n\r\n"]);
    exchange(http, &[b"GET /direct HTTP/1.1\r\nhost: h.test\r\n\r\n"]);
    let answer = send_raw(
        http,
        b"GET /dead HTTP/1.1\r\nhost: h.test\r\nconnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    exchange(
        http,
        &[
            b"GET /h2/first HTTP/1.1\r\nhost: h.test\r\nuser-agent: test/1\r\nx-request-id: 0000002a-aaaa-4bbb-8ccc-dddddddddddd\r\n\r\n",
            b"POST /h2/post HTTP/1.1\r\nhost: h.test\r\ncontent-length: 10\r\nx-request-id: 0000002b-aaaa-4bbb-8ccc-dddddddddddd\r\n\r\n0123456789",
        ],
    );
    curl_h2_with(
        http,
        "/h2/h2-post",
        Some("0123456789"),
        &["x-request-id: 0000002c-aaaa-4bbb-8ccc-dddddddddddd"],
    );
    let lines = read_lines(&dir.join("upstream-wire.log"), LINES);
    assert_eq!(
        upstream_connection(&lines[4]),
        upstream_connection(&lines[5]),
        "the keep-alive requests share an upstream connection: {lines:#?}"
    );
    lines.iter().map(|l| without_connection(l)).collect()
}

/// The line's upstream connection (its local address, the last field).
fn upstream_connection(line: &str) -> &str {
    line.rsplit_once(' ').map_or("", |(_, local)| local)
}

/// The line without its upstream connection, which differs from proxy to proxy.
fn without_connection(line: &str) -> String {
    line.rsplit_once(' ')
        .map_or(line, |(rest, _)| rest)
        .to_owned()
}

#[test]
fn upstream_wire_bytes_match_envoy() {
    let test = "upstream_wire_bytes_match_envoy";
    let Some(envoy) = oracle::envoy_or_skip(test) else {
        return;
    };
    let envoy_dir = log_dir("upstream-wire-envoy");
    let theirs = observe_upstream_wire(&envoy_dir, |yaml| {
        envoy_proxy(&envoy, yaml, "4719", port_of(yaml))
    });
    assert_eq!(theirs.len(), LINES, "Envoy's log: {theirs:#?}");
    let revoy_dir = log_dir("upstream-wire-revoy");
    let ours = observe_upstream_wire(&revoy_dir, |yaml| revoy_proxy(yaml, port_of(yaml)));
    assert_eq!(ours, theirs);
    let _ = std::fs::remove_dir_all(&envoy_dir);
    let _ = std::fs::remove_dir_all(&revoy_dir);
}
