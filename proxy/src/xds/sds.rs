//! SDS: keeps every secret a TLS context names current from where the context says it comes
//! from — the ADS stream, a `SecretDiscoveryService` stream of its own (Istio's `sds-grpc`
//! cluster on pilot-agent's unix socket), or a watched file — and stores each version in the
//! [`SecretStore`](crate::tls::SecretStore), where the next handshake finds it. A secret that
//! does not compile is NACKed by name; the previous version keeps serving.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use prost::Message;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use xds_client::client::{self, Client, Mode, Service};
use xds_client::{Applied, Handler, Rejected, SECRET_TYPE_URL, Update};

use crate::config::dynamic::cluster_target;
use crate::config::tls::sds::SecretSource;
use crate::config::watched_file::WatchedFile;
use crate::config::{Context, SystemIo};
use crate::process::Process;
use crate::tls::SecretStore;
use crate::tls::secrets::{Delivered, Follower};

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
        let mut resources = update.resources;
        if matches!(self.source, SecretSource::File(_)) {
            rejected = one_secret_per_file(&mut resources, &self.store.names(&self.source));
        }
        for r in resources {
            let delivered = Secret::decode(r.value.clone())
                .map_err(|e| format!("secret '{}': cannot decode: {e}", r.name))
                .and_then(|raw| {
                    deliver(&self.store, &self.source, &r.name, &r.version, &raw)
                        .map(|stored| (raw, stored))
                });
            match delivered {
                Ok((raw, stored)) => {
                    match stored {
                        Some(true) => changed.push(r.name.clone()),
                        Some(false) => added.push(r.name.clone()),
                        None => {}
                    }
                    follow_files(&self.store, &self.source, &r.name, &r.version, raw);
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

/// Envoy's rule for an SDS file (each secret read from a file reads the whole file): it must
/// hold exactly one secret, named as the secret read from it. Answers why for each secret the
/// file is read for (`wanted`) that it does not serve: `Unexpected SDS secrets length: N` for
/// every one when the file holds several (then `resources` is emptied: none is applied),
/// `Unexpected SDS secret (expecting W): R` for each other than the one it holds (which is
/// stored all the same, for a secret of its name read from the file later).
fn one_secret_per_file(
    resources: &mut Vec<xds_client::Resource>,
    wanted: &[String],
) -> Vec<Rejected> {
    let refuse = |name: &String, reason: String| Rejected {
        name: name.clone(),
        reason,
    };
    match resources.as_slice() {
        [] => Vec::new(),
        [held] => wanted
            .iter()
            .filter(|w| **w != held.name)
            .map(|w| {
                let reason = format!("Unexpected SDS secret (expecting {w}): {}", held.name);
                refuse(w, reason)
            })
            .collect(),
        several => {
            let reason = format!("Unexpected SDS secrets length: {}", several.len());
            resources.clear();
            wanted.iter().map(|w| refuse(w, reason.clone())).collect()
        }
    }
}

/// Reads the files `raw` names (as Envoy holds an SDS secret: `inline_files`), compiles it and
/// stores it unless it is what the store holds already; answers whether it was stored
/// (`Some`), replacing a value (`Some(true)`).
fn deliver(
    store: &SecretStore,
    source: &SecretSource,
    name: &str,
    version: &str,
    raw: &Secret,
) -> Result<Option<bool>, String> {
    let io = SystemIo;
    let ctx = Context::new(&io);
    let mut proto = raw.clone();
    crate::config::tls::secret::inline_files(&ctx, &mut proto);
    // What the store holds compiled once: a poll or a watch reading the same again costs no
    // compile.
    if store.holds(name, source, &proto) {
        tracing::debug!(secret = %name, %version, "secret unchanged");
        return Ok(None);
    }
    let value = crate::config::tls::secret::compile(&ctx, &proto)
        .map_err(|e| format!("secret '{name}': {e}"))?;
    tracing::info!(secret = %name, %version, ?source, "secret applied");
    let replaced = store.set(
        name,
        source,
        Delivered {
            value,
            version: version.to_owned(),
            updated: SystemTime::now(),
            proto,
        },
    );
    Ok(Some(replaced))
}

/// Reads the files of the delivered secret `raw` again whenever its watched directories change
/// ([`watched_directories`](crate::config::tls::secret::watched_directories): its
/// `watched_directory`, else the files' own), as Envoy rotates an SDS secret's files: new
/// handshakes get what they hold now. Files that do not compile leave the previous version
/// serving. A secret naming no file is not followed.
fn follow_files(
    store: &Arc<SecretStore>,
    source: &SecretSource,
    name: &str,
    version: &str,
    raw: Secret,
) {
    let cell = store.delivered(name, source);
    if cell.follows(&raw) {
        return;
    }
    let dirs = crate::config::tls::secret::watched_directories(&raw);
    if dirs.is_empty() {
        cell.follow(None);
        return;
    }
    let mut changes = super::files::Changes::new(&dirs, None);
    let (store, source, name, version) = (
        store.clone(),
        source.clone(),
        name.to_owned(),
        version.to_owned(),
    );
    let followed = raw.clone();
    let task = tokio::spawn(async move {
        while changes.next().await {
            if let Err(reason) = deliver(&store, &source, &name, &version, &followed) {
                tracing::warn!(secret = %name, "its files changed: {reason}; the previous version keeps serving");
            }
        }
    });
    cell.follow(Some(Follower::new(raw, task.abort_handle())));
}

/// Follows the store's wanted secrets for as long as the process runs: subscribes their names
/// on the ADS stream (`ads`), opens an SDS stream per `api_config_source` cluster and watches
/// each file.
pub fn follow(process: Arc<Process>, ads: Option<Client>) {
    tokio::spawn(async move {
        let mut wanted = process.shared.secrets.watch_wanted();
        let mut streams: HashMap<SecretSource, Client> = HashMap::new();
        let mut files: HashSet<WatchedFile> = HashSet::new();
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
                    SecretSource::File(file) => {
                        if files.insert(file.clone()) {
                            let handler = Arc::new(SecretHandler::new(
                                process.shared.secrets.clone(),
                                source.clone(),
                            ));
                            super::files::watch(file.clone(), SECRET_TYPE_URL, handler);
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
