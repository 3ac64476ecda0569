//! SDS for TLS tests, as Istio delivers certificates: the repository's snapshot server
//! (`xds_client::server`) serving `SecretDiscoveryService` on a unix socket (pilot-agent's
//! `workload-spiffe-uds/socket`), the `sds-grpc` static cluster with a `pipe` endpoint that
//! reaches it, the `SdsSecretConfig`s naming Istio's secrets `default` (the workload
//! certificate) and `ROOTCA` (the trust anchor), and a reader of a proxy's `ssl.*` counters.
//!
//! The test crate declares `support/certs.rs` as `certs` and `support/http1.rs` as `http1`
//! beside this module.
// Each test binary that includes this module uses only some of its pieces.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use proto::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use proto::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use xds_client::server::{Server, Snapshot};
use xds_client::{SECRET_TYPE_URL, Verdict};

use crate::certs::{Ca, Issued};

/// How long a test waits for a proxy to take a secret.
pub const WAIT: Duration = Duration::from_secs(15);

/// An SDS server on a unix socket, serving from a runtime of its own. Its secrets are Istio's:
/// `default` (a certificate with its key) and `ROOTCA` (a `trusted_ca`).
pub struct Sds {
    server: Server,
    socket: PathBuf,
    runtime: tokio::runtime::Runtime,
    /// The secrets being served, by name.
    secrets: std::sync::Mutex<BTreeMap<String, Secret>>,
    version: AtomicU32,
}

impl Sds {
    /// Serves (nothing yet: streams wait for the first [`Sds::set`]) on `<dir>/<name>.sock`.
    pub fn start(dir: &Path, name: &str) -> Sds {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("SDS runtime");
        let server = Server::new();
        let socket = dir.join(format!("{name}.sock"));
        runtime
            .block_on(server.serve_unix(&socket))
            .unwrap_or_else(|e| panic!("serve SDS on {}: {e}", socket.display()));
        Sds {
            server,
            socket,
            runtime,
            secrets: std::sync::Mutex::new(BTreeMap::new()),
            version: AtomicU32::new(0),
        }
    }

    /// The socket path (the `pipe` of the `sds-grpc` cluster).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Serves `default` = `cert` and `ROOTCA` = the root of `ca` as a new version; answers it.
    pub fn serve_mesh(&self, cert: &Issued, ca: &Ca) -> String {
        self.put(&[certificate("default", cert), trust("ROOTCA", ca.root_pem())])
    }

    /// Replaces (or adds) `secrets` and serves the result as a new version; answers it.
    pub fn put(&self, secrets: &[Secret]) -> String {
        let mut all = self.secrets.lock().expect("secrets lock");
        for s in secrets {
            all.insert(s.name.clone(), s.clone());
        }
        let version = format!("v{}", self.version.fetch_add(1, Ordering::Relaxed) + 1);
        let snapshot = all
            .iter()
            .fold(Snapshot::new(version.clone()), |s, (name, secret)| {
                s.with_message(name.clone(), secret)
            });
        self.server.set(snapshot);
        version
    }

    /// Waits for `node` to ACK `version` (on the stream that carries a changed secret).
    pub fn ack(&self, node: &str, version: &str) {
        let verdict =
            self.runtime
                .block_on(self.server.acked(node, SECRET_TYPE_URL, version, WAIT));
        match verdict {
            Some(Verdict::Ack) => {}
            Some(Verdict::Nack(reason)) => panic!("{node} NACKed secrets {version}: {reason}"),
            None => panic!(
                "{node} did not answer secrets {version}: {:#?}",
                self.server.events()
            ),
        }
    }
}

impl Drop for Sds {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn inline(text: &str) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(Specifier::InlineString(text.to_owned())),
        ..Default::default()
    })
}

/// A `tls_certificate` secret `name`: the issued chain and key.
pub fn certificate(name: &str, cert: &Issued) -> Secret {
    Secret {
        name: name.to_owned(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(&cert.chain_pem),
            private_key: inline(&cert.key_pem),
            ..Default::default()
        })),
    }
}

/// A `validation_context` secret `name` trusting the PEM `roots`.
pub fn trust(name: &str, roots: &str) -> Secret {
    Secret {
        name: name.to_owned(),
        r#type: Some(secret::Type::ValidationContext(
            CertificateValidationContext {
                trusted_ca: inline(roots),
                ..Default::default()
            },
        )),
    }
}

/// An `SdsSecretConfig` for secret `name` from the `sds-grpc` cluster, as Istio writes it
/// (flow-style YAML).
pub fn sds_config(name: &str) -> String {
    format!(
        "{{name: {name}, sds_config: {{api_config_source: {{api_type: GRPC, transport_api_version: V3, \
         grpc_services: [{{envoy_grpc: {{cluster_name: sds-grpc}}}}], set_node_on_first_message_only: true}}, \
         initial_fetch_timeout: 0s, resource_api_version: V3}}}}"
    )
}

/// Istio's `common_tls_context` for a workload: `default` presented, peers verified against
/// `ROOTCA` and the SAN matchers `sans` (a flow-style list of `match_typed_subject_alt_names`
/// entries), ALPN `alpn` (a flow-style list); `extra` adds fields (`, tls_params: ...`).
pub fn mesh_tls_context(sans: &str, alpn: &str, extra: &str) -> String {
    format!(
        "common_tls_context: {{alpn_protocols: {alpn}, tls_certificate_sds_secret_configs: [{}], \
         combined_validation_context: {{default_validation_context: {{match_typed_subject_alt_names: {sans}}}, \
         validation_context_sds_secret_config: {}}}{extra}}}",
        sds_config("default"),
        sds_config("ROOTCA"),
    )
}

/// The `sds-grpc` static cluster of Istio's bootstrap: HTTP/2 to the unix socket `socket`; an
/// entry of `static_resources.clusters`.
pub fn sds_cluster(socket: &Path) -> String {
    format!(
        r#"
  - name: sds-grpc
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: sds-grpc
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{pipe: {{path: {}}}}}}}}}]}}]"#,
        socket.display()
    )
}

/// The `ssl.*` counters of a proxy's admin on `admin` under `scope` (`listener.<address>` or
/// `cluster.<name>`), by the name after `ssl.`.
pub fn ssl_counters(admin: u16, scope: &str) -> BTreeMap<String, u64> {
    let addr = SocketAddr::from(([127, 0, 0, 1], admin));
    let (status, body) = crate::http1::get(None, addr, "/stats?filter=ssl")
        .unwrap_or_else(|e| panic!("stats of admin {admin}: {e}"));
    assert_eq!(status, 200, "{body}");
    let prefix = format!("{scope}.ssl.");
    body.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(": ")?;
            Some((
                name.strip_prefix(&prefix)?.to_owned(),
                value.trim().parse().ok()?,
            ))
        })
        .collect()
}

/// What changed from `before` to `after` (counters that grew, by how much).
pub fn grown(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(name, v)| {
            let d = v - before.get(name).copied().unwrap_or(0);
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}
