//! SDS: keeps every secret a TLS context names current from where the context says it comes
//! from — the ADS stream, a `SecretDiscoveryService` stream of its own (Istio's `sds-grpc`
//! cluster on pilot-agent's unix socket), or a watched file — and stores each version in the
//! [`SecretStore`](crate::tls::SecretStore), where the next handshake finds it. A secret that
//! does not compile is NACKed by name; the previous version keeps serving.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use prost::Message;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use xds_client::client::{self, Client, Mode, Service};
use xds_client::{Applied, Handler, Rejected, SECRET_TYPE_URL, Update};

use crate::config::dynamic::cluster_target;
use crate::config::tls::sds::SecretSource;
use crate::config::{Context, SystemIo};
use crate::process::Process;
use crate::tls::SecretStore;
use crate::tls::secrets::Delivered;

/// Applies the secrets of one source to the store.
pub struct SecretHandler {
    store: Arc<SecretStore>,
    source: SecretSource,
}

impl SecretHandler {
    /// A handler storing what `source` delivers into `store`.
    pub fn new(store: Arc<SecretStore>, source: SecretSource) -> Self {
        SecretHandler { store, source }
    }
}

impl Handler for SecretHandler {
    fn apply(&self, update: Update) -> Applied {
        let mut rejected = Vec::new();
        let (mut added, mut changed) = (Vec::new(), Vec::new());
        if update.type_url != SECRET_TYPE_URL {
            rejected.extend(update.resources.into_iter().map(|r| Rejected {
                name: r.name,
                reason: format!("an SDS stream carries secrets, not {}", update.type_url),
            }));
            return Applied::rejecting(rejected);
        }
        let io = SystemIo;
        let ctx = Context::new(&io);
        for r in update.resources {
            let compiled = Secret::decode(r.value.clone())
                .map_err(|e| format!("secret '{}': cannot decode: {e}", r.name))
                .and_then(|mut s| {
                    crate::config::tls::secret::inline_files(&ctx, &mut s);
                    crate::config::tls::secret::compile(&ctx, &s)
                        .map(|value| (s, value))
                        .map_err(|e| format!("secret '{}': {e}", r.name))
                });
            match compiled {
                Ok((proto, _)) if self.store.holds(&r.name, &self.source, &proto) => {
                    tracing::debug!(secret = %r.name, version = %r.version, "secret unchanged");
                }
                Ok((proto, value)) => {
                    tracing::info!(secret = %r.name, version = %r.version, source = ?self.source, "secret applied");
                    let name = r.name.clone();
                    let replaced = self.store.set(
                        &r.name,
                        &self.source,
                        Delivered {
                            value,
                            version: r.version,
                            updated: SystemTime::now(),
                            proto,
                        },
                    );
                    if replaced {
                        changed.push(name);
                    } else {
                        added.push(name);
                    }
                }
                Err(reason) => {
                    tracing::warn!(secret = %r.name, version = %r.version, "rejected: {reason}; the previous version keeps serving");
                    rejected.push(Rejected {
                        name: r.name,
                        reason,
                    });
                }
            }
        }
        for name in update.removed {
            tracing::info!(secret = %name, "secret removed by the server; its last version keeps serving");
        }
        Applied {
            rejected,
            added,
            changed,
        }
    }
}

/// Follows the store's wanted secrets for as long as the process runs: subscribes their names
/// on the ADS stream (`ads`), opens an SDS stream per `api_config_source` cluster and watches
/// each file.
pub fn follow(process: Arc<Process>, ads: Option<Client>) {
    tokio::spawn(async move {
        let mut wanted = process.shared.secrets.watch_wanted();
        let mut streams: HashMap<SecretSource, Client> = HashMap::new();
        let mut files: HashSet<PathBuf> = HashSet::new();
        loop {
            process.shared.secrets.prune();
            for source in process.shared.secrets.sources() {
                let names = process.shared.secrets.names(&source);
                match &source {
                    SecretSource::Static => {}
                    SecretSource::Ads => match &ads {
                        Some(c) => c.subscribe(SECRET_TYPE_URL, names),
                        None => tracing::error!(
                            ?names,
                            "secrets from ads: {{}} need dynamic_resources.ads_config; they never arrive"
                        ),
                    },
                    SecretSource::Grpc { cluster, delta } => {
                        if !streams.contains_key(&source) {
                            match stream(&process, cluster, *delta, &source) {
                                Ok(c) => {
                                    streams.insert(source.clone(), c);
                                }
                                Err(e) => {
                                    tracing::error!(%cluster, "SDS: {e}; its secrets never arrive");
                                    continue;
                                }
                            }
                        }
                        if let Some(c) = streams.get(&source) {
                            c.subscribe(SECRET_TYPE_URL, names);
                        }
                    }
                    SecretSource::File(path) => {
                        if files.insert(path.clone()) {
                            let handler = Arc::new(SecretHandler::new(
                                process.shared.secrets.clone(),
                                source.clone(),
                            ));
                            super::files::watch(path.clone(), SECRET_TYPE_URL, handler);
                        }
                    }
                }
            }
            if wanted.changed().await.is_err() {
                return;
            }
        }
    });
}

/// The secrets the bootstrap's static clusters wait for (those SDS delivers).
pub fn static_cluster_secrets(process: &Process) -> Vec<crate::config::tls::sds::SecretRef> {
    process
        .bootstrap
        .clusters
        .iter()
        .flat_map(super::handler::cluster_secrets)
        .filter(|r| r.source != SecretSource::Static)
        .collect()
}

/// Waits until every one of `secrets` has arrived, each for at most its
/// `initial_fetch_timeout` (none: for ever), as Envoy's initialization waits for them.
pub async fn secrets_arrived(process: &Process, secrets: &[crate::config::tls::sds::SecretRef]) {
    let start = tokio::time::Instant::now();
    for r in secrets {
        let cell = process.shared.secrets.cell(r);
        match r.initial_fetch_timeout {
            None => cell.ready().await,
            Some(timeout) => {
                if tokio::time::timeout_at(start + timeout, cell.ready())
                    .await
                    .is_err()
                {
                    tracing::warn!(secret = %r.name, "initial_fetch_timeout: the secret did not come; going on without it");
                }
            }
        }
    }
}

/// Opens the SDS stream to the static cluster `cluster`.
fn stream(
    process: &Process,
    cluster: &str,
    delta: bool,
    source: &SecretSource,
) -> Result<Client, String> {
    let bootstrap = process.bootstrap.proto.decode();
    let target = cluster_target(&bootstrap, cluster).map_err(|e| e.message)?;
    let transport = super::transport(process, &target, Some(cluster))?;
    let node = crate::load::effective_node(bootstrap.node.as_ref(), &process.options);
    let mode = if delta { Mode::Delta } else { Mode::Sotw };
    let mut config = client::Config::new(transport, mode, node);
    config.service = Service::Secret;
    let handler = Arc::new(SecretHandler::new(
        process.shared.secrets.clone(),
        source.clone(),
    ));
    Ok(client::start(config, handler))
}
