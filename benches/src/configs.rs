//! Equivalent configs for every contender, generated from the upstream's addresses.
//!
//! Four shapes: `standard` (an HTTP listener routing `/grpc*` and `/h2*` to an HTTP/2 upstream
//! and everything else to an HTTP/1.1 upstream, plus a TCP proxy listener), `mesh`
//! (1,000 virtual hosts, each routing by Host to its own cluster of 3 endpoints), `tls` (an
//! HTTPS listener, TLS 1.3 with an ECDSA P-256 certificate, routing `/reencrypt*` to the
//! upstream over TLS and everything else to it in plaintext, both HTTP/1.1) and `access_log`
//! (Envoy and revoy only: an HTTP listener to the HTTP/1.1 upstream that logs every request
//! to a file in Istio's default text format).

use std::fmt::Write;
use std::net::SocketAddr;
use std::path::Path;

use crate::tls::{PkiFiles, UPSTREAM_NAME};
use crate::upstream::Upstream;

/// The path prefix the TLS config routes to the upstream over TLS (re-encryption); every other
/// path goes to it in plaintext.
pub const REENCRYPT_PREFIX: &str = "/reencrypt";

/// Number of virtual hosts and clusters in the mesh config.
pub const MESH_SERVICES: usize = 1000;

/// The Host header of mesh service `i` (0-based).
pub fn mesh_host(i: usize) -> String {
    format!("svc-{i}.mesh.local")
}

/// The ports a proxy contender listens on.
#[derive(Clone, Copy, Debug)]
pub struct Listen {
    /// HTTP/1.1 (and, for Envoy and revoy, h2c prior knowledge too).
    pub http: u16,
    /// h2c prior knowledge.
    pub h2: u16,
    /// TCP proxy.
    pub tcp: u16,
    /// Admin (Envoy and revoy).
    pub admin: u16,
}

const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const TCP_PROXY_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const H2_OPTIONS: &str = r#"
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {max_concurrent_streams: 1024}}"#;

fn envoy_head(listen: &Listen) -> String {
    format!(
        "admin:\n  address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}\nstatic_resources:\n  listeners:\n",
        listen.admin
    )
}

/// Istio's default access-log format for sidecars (`EnvoyTextLogFormat`, istio/istio
/// pilot/pkg/model/telemetry_logging.go).
pub const ISTIO_TEXT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n";

/// An HTTP listener; `transport_socket`, when given, is the filter chain's (YAML indented
/// by 8 spaces).
fn envoy_hcm_listener(port: u16, routes_yaml: &str, transport_socket: Option<&str>) -> String {
    envoy_hcm_listener_logged(port, routes_yaml, transport_socket, None, "")
}

/// [`envoy_hcm_listener`], writing an access log to `access_log` when given.
fn envoy_hcm_listener_logged(
    port: u16,
    routes_yaml: &str,
    transport_socket: Option<&str>,
    access_log: Option<&Path>,
    filters: &str,
) -> String {
    let chain = match transport_socket {
        None => "    - filters:\n".to_string(),
        Some(socket) => format!("    - transport_socket:\n{socket}      filters:\n"),
    };
    let log = access_log.map_or_else(String::new, |path| {
        format!(
            "          access_log:\n          - name: envoy.access_loggers.file\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog\n              path: {}\n              log_format: {{text_format_source: {{inline_string: {}}}}}\n",
            path.display(),
            serde_json::to_string(ISTIO_TEXT_FORMAT).expect("a string")
        )
    });
    format!(
        r#"  - name: http
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
{chain}      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {HCM_TYPE}
          stat_prefix: http
          codec_type: AUTO
{log}          http_filters:
{filters}          - name: envoy.filters.http.router
            typed_config: {{"@type": {ROUTER_TYPE}}}
          route_config:
            name: local
            virtual_hosts:
{routes_yaml}"#
    )
}

fn envoy_cluster(name: &str, endpoints: &[SocketAddr], extra: &str) -> String {
    let mut out = format!(
        "  - name: {name}\n    type: STATIC\n    connect_timeout: 1s{extra}\n    load_assignment:\n      cluster_name: {name}\n      endpoints:\n      - lb_endpoints:\n"
    );
    for ep in endpoints {
        let _ = writeln!(
            out,
            "        - endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}",
            ep.ip(),
            ep.port()
        );
    }
    out
}

/// The access-log config for Envoy and revoy (YAML bootstrap): one HTTP listener to the
/// HTTP/1.1 upstream, every request logged to `log` in Istio's default text format.
pub fn envoy_access_log(listen: &Listen, up: &Upstream, log: &Path) -> String {
    let routes = r#"            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route: {cluster: h1}
"#;
    let mut out = envoy_head(listen);
    out += &envoy_hcm_listener_logged(listen.http, routes, None, Some(log), "");
    out += "  clusters:\n";
    out += &envoy_cluster("h1", &up.http[..1], "");
    out
}

/// Istio's typical sidecar chain before the router, configured but not triggered by the
/// bench's requests: an RBAC policy allowing GETs from anyone, a fault filter whose abort
/// applies only to requests carrying `x-fault`, and CORS (the requests have no Origin).
const SIDECAR_CHAIN: &str = r#"          - name: envoy.filters.http.rbac
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC
              rules:
                action: ALLOW
                policies:
                  ns[default]-policy[allow-get]-rule[0]:
                    permissions: [{header: {name: ":method", string_match: {exact: GET}}}]
                    principals: [{any: true}]
          - name: envoy.filters.http.fault
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault
              abort: {http_status: 503, percentage: {numerator: 100}}
              headers: [{name: x-fault, present_match: true}]
          - name: envoy.filters.http.cors
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors}
"#;

/// `http1_small`'s route behind [`SIDECAR_CHAIN`] (Envoy and revoy).
pub fn envoy_sidecar_chain(listen: &Listen, up: &Upstream) -> String {
    let routes = r#"            - name: all
              domains: ["*"]
              typed_per_filter_config:
                envoy.filters.http.cors:
                  "@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy
                  allow_origin_string_match: [{exact: "https://app.example"}]
                  allow_methods: GET
              routes:
              - match: {prefix: "/"}
                route: {cluster: h1}
"#;
    let mut out = envoy_head(listen);
    out += &envoy_hcm_listener_logged(listen.http, routes, None, None, SIDECAR_CHAIN);
    out += "  clusters:\n";
    out += &envoy_cluster("h1", &up.http[..1], "");
    out
}

/// The standard config for Envoy and revoy (YAML bootstrap).
pub fn envoy_standard(listen: &Listen, up: &Upstream) -> String {
    let routes = r#"            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/grpc"}
                route: {cluster: h2}
              - match: {prefix: "/h2"}
                route: {cluster: h2}
              - match: {prefix: "/"}
                route: {cluster: h1}
"#;
    let mut out = envoy_head(listen);
    out += &envoy_hcm_listener(listen.http, routes, None);
    let _ = write!(
        out,
        r#"  - name: tcp
    address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config: {{"@type": {TCP_PROXY_TYPE}, stat_prefix: tcp, cluster: tcp}}
  clusters:
"#,
        listen.tcp
    );
    out += &envoy_cluster("h1", &up.http[..1], "");
    out += &envoy_cluster("h2", &up.http[..1], H2_OPTIONS);
    out += &envoy_cluster("tcp", &[up.tcp], "");
    out
}

const TLS13_ONLY: &str =
    "tls_params: {tls_minimum_protocol_version: TLSv1_3, tls_maximum_protocol_version: TLSv1_3}";

/// The TLS config for Envoy and revoy (YAML bootstrap): a `DownstreamTlsContext` with the
/// proxy's certificate from files, and the re-encrypting cluster's `UpstreamTlsContext` (SNI,
/// the bench CA as `trusted_ca`, the upstream's name as the subject alternative name to match).
pub fn envoy_tls(listen: &Listen, up: &Upstream, files: &PkiFiles) -> String {
    let routes = format!(
        r#"            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "{REENCRYPT_PREFIX}"}}
                route: {{cluster: h1_tls}}
              - match: {{prefix: "/"}}
                route: {{cluster: h1}}
"#
    );
    let downstream = format!(
        r#"        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          common_tls_context:
            {TLS13_ONLY}
            tls_certificates:
            - certificate_chain: {{filename: {}}}
              private_key: {{filename: {}}}
"#,
        files.proxy_cert.display(),
        files.proxy_key.display()
    );
    let upstream = format!(
        r#"
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: {UPSTREAM_NAME}
        common_tls_context:
          {TLS13_ONLY}
          validation_context:
            trusted_ca: {{filename: {}}}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{exact: {UPSTREAM_NAME}}}"#,
        files.ca.display()
    );
    let mut out = envoy_head(listen);
    out += &envoy_hcm_listener(listen.http, &routes, Some(&downstream));
    out += "  clusters:\n";
    out += &envoy_cluster("h1", &up.http[..1], "");
    out += &envoy_cluster("h1_tls", &[up.https], &upstream);
    out
}

/// The mesh config for Envoy and revoy (YAML bootstrap).
pub fn envoy_mesh(listen: &Listen, up: &Upstream) -> String {
    let mut routes = String::new();
    for i in 0..MESH_SERVICES {
        let _ = writeln!(
            routes,
            "            - {{name: svc-{i}, domains: [\"{}\"], routes: [{{match: {{prefix: \"/\"}}, route: {{cluster: svc-{i}}}}}]}}",
            mesh_host(i)
        );
    }
    let mut out = envoy_head(listen);
    out += &envoy_hcm_listener(listen.http, &routes, None);
    out += "  clusters:\n";
    for i in 0..MESH_SERVICES {
        out += &envoy_cluster(&format!("svc-{i}"), &up.http, "");
    }
    out
}

const HAPROXY_HEAD: &str = "global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  option http-keep-alive
  http-reuse always
";

/// The standard config for haproxy.
pub fn haproxy_standard(listen: &Listen, up: &Upstream) -> String {
    let h1 = up.http[0];
    let rules =
        "  use_backend be_h2 if { path_beg /grpc } || { path_beg /h2 }\n  default_backend be_h1\n";
    format!(
        "{HAPROXY_HEAD}frontend fe_http
  bind 127.0.0.1:{http}
{rules}frontend fe_h2
  bind 127.0.0.1:{h2} proto h2
{rules}backend be_h1
  server s1 {h1}
backend be_h2
  server s1 {h1} proto h2
listen tcp
  mode tcp
  bind 127.0.0.1:{tcp}
  server s1 {tcp_up}
",
        http = listen.http,
        h2 = listen.h2,
        tcp = listen.tcp,
        tcp_up = up.tcp,
    )
}

/// The TLS config for haproxy: `ssl crt` on the frontend, `ssl verify required` with the
/// bench CA, SNI and `verifyhost` on the re-encrypting backend.
pub fn haproxy_tls(listen: &Listen, up: &Upstream, files: &PkiFiles) -> String {
    format!(
        "{HAPROXY_HEAD}frontend fe_https
  bind 127.0.0.1:{port} ssl crt {pem} ssl-min-ver TLSv1.3
  use_backend be_h1_tls if {{ path_beg {REENCRYPT_PREFIX} }}
  default_backend be_h1
backend be_h1
  server s1 {h1}
backend be_h1_tls
  server s1 {https} ssl verify required ca-file {ca} sni str({UPSTREAM_NAME}) verifyhost {UPSTREAM_NAME} ssl-min-ver TLSv1.3
",
        port = listen.http,
        pem = files.proxy_pem.display(),
        h1 = up.http[0],
        https = up.https,
        ca = files.ca.display(),
    )
}

/// The mesh config for haproxy; `map_path` is where the Host -> backend map is written by
/// the caller (its content comes from [`haproxy_mesh_map`]).
pub fn haproxy_mesh(listen: &Listen, up: &Upstream, map_path: &str) -> String {
    let mut out = format!(
        "{HAPROXY_HEAD}frontend fe_http\n  bind 127.0.0.1:{}\n  use_backend %[req.hdr(host),lower,map_str({map_path},be_none)]\nbackend be_none\n  http-request return status 404\n",
        listen.http
    );
    for i in 0..MESH_SERVICES {
        let _ = writeln!(out, "backend svc-{i}");
        for (n, ep) in up.http.iter().enumerate() {
            let _ = writeln!(out, "  server s{n} {ep}");
        }
    }
    out
}

/// The Host -> backend map file for [`haproxy_mesh`].
pub fn haproxy_mesh_map() -> String {
    (0..MESH_SERVICES)
        .map(|i| format!("{} svc-{i}\n", mesh_host(i)))
        .collect()
}

fn nginx_head(prefix: &str, with_stream: bool) -> String {
    let module = if with_stream {
        "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n"
    } else {
        ""
    };
    format!(
        "{module}worker_processes 1;
master_process off;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log error;
events {{ worker_connections 8000; }}
http {{
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  client_body_temp_path {prefix}/client_body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  proxy_http_version 1.1;
  proxy_set_header Connection \"\";
  proxy_buffer_size 16k;
  proxy_buffers 8 16k;
"
    )
}

fn nginx_upstream(name: &str, endpoints: &[SocketAddr]) -> String {
    let servers: String = endpoints
        .iter()
        .map(|ep| format!(" server {ep};"))
        .collect();
    format!("  upstream {name} {{{servers} keepalive 64; keepalive_requests 100000000; }}\n")
}

/// The standard config for nginx (`prefix` is its private working directory).
pub fn nginx_standard(listen: &Listen, up: &Upstream, prefix: &str) -> String {
    let mut out = nginx_head(prefix, true);
    out += &nginx_upstream("h1", &up.http[..1]);
    out += &nginx_upstream("h2", &up.http[..1]);
    let _ = write!(
        out,
        "  server {{ listen 127.0.0.1:{}; location / {{ proxy_pass http://h1; }} }}
  server {{ listen 127.0.0.1:{} http2; location /grpc {{ grpc_pass grpc://h2; }} location / {{ proxy_pass http://h1; }} }}
}}
stream {{ server {{ listen 127.0.0.1:{}; proxy_pass {}; }} }}
",
        listen.http, listen.h2, listen.tcp, up.tcp
    );
    out
}

/// The TLS config for nginx (`prefix` is its private working directory): `listen ... ssl`,
/// and `proxy_pass https://` with `proxy_ssl_verify`, the bench CA and SNI for the
/// re-encrypting location.
pub fn nginx_tls(listen: &Listen, up: &Upstream, prefix: &str, files: &PkiFiles) -> String {
    let mut out = nginx_head(prefix, false);
    out += &nginx_upstream("h1", &up.http[..1]);
    out += &nginx_upstream("h1_tls", &[up.https]);
    let _ = write!(
        out,
        "  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.3;
    location / {{ proxy_pass http://h1; }}
    location {REENCRYPT_PREFIX} {{
      proxy_pass https://h1_tls;
      proxy_ssl_server_name on;
      proxy_ssl_name {UPSTREAM_NAME};
      proxy_ssl_verify on;
      proxy_ssl_trusted_certificate {ca};
      proxy_ssl_protocols TLSv1.3;
    }}
  }}
}}
",
        port = listen.http,
        cert = files.proxy_cert.display(),
        key = files.proxy_key.display(),
        ca = files.ca.display(),
    );
    out
}

/// The mesh config for nginx (`prefix` is its private working directory).
pub fn nginx_mesh(listen: &Listen, up: &Upstream, prefix: &str) -> String {
    let mut out = nginx_head(prefix, false);
    out += "  map_hash_bucket_size 128;\n  map $host $svc {\n    default none;\n";
    for i in 0..MESH_SERVICES {
        let _ = writeln!(out, "    {} svc-{i};", mesh_host(i));
    }
    out += "  }\n";
    for i in 0..MESH_SERVICES {
        out += &nginx_upstream(&format!("svc-{i}"), &up.http);
    }
    let _ = write!(
        out,
        "  server {{ listen 127.0.0.1:{}; location / {{ if ($svc = none) {{ return 404; }} proxy_pass http://$svc; }} }}\n}}\n",
        listen.http
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::bootstrap::v3::Bootstrap;
    use proto::pb::envoy::config::core::v3::{TransportSocket, transport_socket::ConfigType};
    use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
        DownstreamTlsContext, UpstreamTlsContext,
    };

    fn upstream() -> Upstream {
        Upstream {
            http: vec![
                "127.0.0.1:1001".parse().unwrap(),
                "127.0.0.2:1002".parse().unwrap(),
                "127.0.0.3:1003".parse().unwrap(),
            ],
            tcp: "127.0.0.1:2000".parse().unwrap(),
            https: "127.0.0.1:1443".parse().unwrap(),
            pki: std::sync::Arc::new(crate::tls::Pki::generate().unwrap()),
        }
    }

    fn files() -> PkiFiles {
        PkiFiles {
            ca: "/d/ca.crt".into(),
            proxy_cert: "/d/proxy.crt".into(),
            proxy_key: "/d/proxy.key".into(),
            proxy_pem: "/d/proxy.pem".into(),
        }
    }

    const LISTEN: Listen = Listen {
        http: 3000,
        h2: 3001,
        tcp: 3002,
        admin: 3003,
    };

    #[test]
    fn envoy_mesh_has_every_service_with_three_endpoints() {
        let text = envoy_mesh(&LISTEN, &upstream());
        assert_eq!(text.matches("- name: svc-").count(), MESH_SERVICES);
        assert_eq!(text.matches("port_value: 1003").count(), MESH_SERVICES);
        assert!(text.contains("domains: [\"svc-999.mesh.local\"]"));
    }

    #[test]
    fn standard_configs_point_at_the_upstream() {
        let up = upstream();
        for text in [
            envoy_standard(&LISTEN, &up),
            haproxy_standard(&LISTEN, &up),
            nginx_standard(&LISTEN, &up, "/p"),
        ] {
            assert!(text.contains("1001"), "{text}");
            assert!(text.contains("2000"), "{text}");
            assert!(text.contains("3000") && text.contains("3002"), "{text}");
        }
    }

    #[test]
    fn tls_configs_terminate_and_reencrypt_with_validation() {
        let up = upstream();
        let envoy = envoy_tls(&LISTEN, &up, &files());
        assert!(envoy.contains("DownstreamTlsContext") && envoy.contains("UpstreamTlsContext"));
        assert!(envoy.contains("sni: upstream.bench.local"));
        assert!(envoy.contains("trusted_ca: {filename: /d/ca.crt}"));
        assert!(envoy.contains("matcher: {exact: upstream.bench.local}"));
        // The TLS cluster points at the upstream's TLS listener, the other at plaintext.
        assert!(envoy.contains("port_value: 1443") && envoy.contains("port_value: 1001"));
        // It decodes as a bootstrap, each TLS context where Envoy looks for it.
        let value = proto::Codec::parse_text(&envoy, proto::Format::Yaml).unwrap();
        let codec = proto::Codec::for_document("envoy.config.bootstrap.v3.Bootstrap", &value);
        let resources = codec
            .decode::<Bootstrap>(value, false)
            .unwrap()
            .message
            .static_resources
            .unwrap();
        let socket = |s: &Option<TransportSocket>| match &s.as_ref().unwrap().config_type {
            Some(ConfigType::TypedConfig(any)) => any.clone(),
            None => panic!("no typed_config"),
        };
        let down: DownstreamTlsContext = proto::unpack(&socket(
            &resources.listeners[0].filter_chains[0].transport_socket,
        ))
        .unwrap();
        let common = down.common_tls_context.unwrap();
        assert_eq!(common.tls_certificates.len(), 1);
        assert_eq!(common.tls_params.unwrap().tls_minimum_protocol_version, 4);
        let tls_cluster = &resources.clusters[1];
        assert_eq!(tls_cluster.name, "h1_tls");
        let up_tls: UpstreamTlsContext =
            proto::unpack(&socket(&tls_cluster.transport_socket)).unwrap();
        assert_eq!(up_tls.sni, UPSTREAM_NAME);
        assert!(resources.clusters[0].transport_socket.is_none());
        for text in [
            haproxy_tls(&LISTEN, &up, &files()),
            nginx_tls(&LISTEN, &up, "/p", &files()),
        ] {
            assert!(text.contains("3000") && text.contains("1443"), "{text}");
            assert!(
                text.contains("/d/ca.crt") && text.contains(UPSTREAM_NAME),
                "{text}"
            );
            assert!(text.contains("TLSv1.3"), "{text}");
        }
    }

    #[test]
    fn haproxy_map_covers_every_host() {
        let map = haproxy_mesh_map();
        assert_eq!(map.lines().count(), MESH_SERVICES);
        assert!(map.starts_with("svc-0.mesh.local svc-0\n"));
    }
}
