//! The secrets TLS contexts use, by name and source, as live values: a handshake reads the
//! current one, so an SDS rotation reaches new handshakes at once and rebuilds nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwapOption;
use tokio::sync::watch;

use crate::config::tls::sds::{SecretRef, SecretSource};
use crate::config::tls::secret::SecretValue;
use proto::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

/// One secret as it is now, with what `/config_dump` shows of it.
#[derive(Debug)]
pub struct Delivered {
    /// The compiled secret.
    pub value: SecretValue,
    /// The `version_info` it came with.
    pub version: String,
    /// When it was applied.
    pub updated: SystemTime,
    /// The `Secret` proto as delivered, with an SDS secret's files read in as Envoy does
    /// (private keys included: `/config_dump` redacts them).
    pub proto: Secret,
}

/// One named secret from one source.
#[derive(Debug)]
pub struct SecretCell {
    /// Its name.
    pub name: String,
    /// Where it comes from.
    pub source: SecretSource,
    /// When a context first asked for it (what `/config_dump` shows while it warms).
    pub created: SystemTime,
    current: ArcSwapOption<Delivered>,
    /// Bumped on each change; consumers that derive values from the secret cache by it.
    generation: AtomicU64,
    arrived: watch::Sender<bool>,
    /// What reads the secret's files again when they change, while the cell lives.
    follower: Mutex<Option<Follower>>,
}

/// A task reading again the files a delivered secret names when they change; ended when the
/// secret is forgotten or delivered naming other files.
#[derive(Debug)]
pub struct Follower {
    /// The secret as delivered, its files not read in.
    raw: Secret,
    task: tokio::task::AbortHandle,
}

impl Follower {
    /// `task` follows the files of `raw`.
    pub fn new(raw: Secret, task: tokio::task::AbortHandle) -> Self {
        Follower { raw, task }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SecretCell {
    fn new(name: &str, source: &SecretSource) -> Self {
        SecretCell {
            name: name.to_owned(),
            source: source.clone(),
            created: SystemTime::now(),
            current: ArcSwapOption::empty(),
            generation: AtomicU64::new(0),
            arrived: watch::Sender::new(false),
            follower: Mutex::new(None),
        }
    }

    /// Whether the files of `raw` (a secret as delivered) are followed already.
    pub fn follows(&self, raw: &Secret) -> bool {
        self.follower
            .lock()
            .expect("secret follower lock")
            .as_ref()
            .is_some_and(|f| f.raw == *raw)
    }

    /// Follows the secret's files with `follower` from now on (`None`: not at all), ending the
    /// previous one.
    pub fn follow(&self, follower: Option<Follower>) {
        *self.follower.lock().expect("secret follower lock") = follower;
    }

    /// The secret now, if it has arrived.
    pub fn current(&self) -> Option<Arc<Delivered>> {
        self.current.load_full()
    }

    /// Changes each time the secret does.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the secret has arrived.
    pub fn is_ready(&self) -> bool {
        *self.arrived.borrow()
    }

    /// Waits until the secret has arrived.
    pub async fn ready(&self) {
        let mut rx = self.arrived.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// Stores a new value; whether it replaced one.
    fn set(&self, delivered: Delivered) -> bool {
        let replaced = self.current.swap(Some(Arc::new(delivered))).is_some();
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.arrived.send_replace(true);
        replaced
    }
}

/// Every secret some TLS context uses or the bootstrap defines.
#[derive(Debug, Default)]
pub struct SecretStore {
    cells: Mutex<HashMap<(String, SecretSource), Arc<SecretCell>>>,
    /// Bumped when a secret is first asked for, so SDS subscriptions follow.
    wanted: watch::Sender<u64>,
}

impl SecretStore {
    /// An empty store.
    pub fn new() -> Self {
        SecretStore::default()
    }

    /// The cell of the secret `r` names, made (and so subscribed to) on first use.
    pub fn cell(&self, r: &SecretRef) -> Arc<SecretCell> {
        let mut cells = self.cells.lock().expect("secret store lock");
        let key = (r.name.clone(), r.source.clone());
        if let Some(cell) = cells.get(&key) {
            return cell.clone();
        }
        let cell = Arc::new(SecretCell::new(&r.name, &r.source));
        cells.insert(key, cell.clone());
        drop(cells);
        self.wanted.send_modify(|n| *n += 1);
        cell
    }

    /// Whether the secret `name` from `source` holds `proto` now (as delivered, its files read
    /// in): a delivery of the same content changes nothing, as Envoy's hash of a secret and
    /// its files decides.
    pub fn holds(
        &self,
        name: &str,
        source: &SecretSource,
        proto: &proto::pb::envoy::extensions::transport_sockets::tls::v3::Secret,
    ) -> bool {
        let cells = self.cells.lock().expect("secret store lock");
        cells
            .get(&(name.to_owned(), source.clone()))
            .and_then(|cell| cell.current())
            .is_some_and(|now| now.proto == *proto)
    }

    /// Stores a secret's new value (a cell is made if nothing asked for it yet); whether it
    /// replaced a value.
    pub fn set(&self, name: &str, source: &SecretSource, delivered: Delivered) -> bool {
        self.delivered(name, source).set(delivered)
    }

    /// The cell of the secret `name` from `source`, made if nothing asked for it yet (without
    /// subscribing: it is being delivered).
    pub fn delivered(&self, name: &str, source: &SecretSource) -> Arc<SecretCell> {
        let mut cells = self.cells.lock().expect("secret store lock");
        cells
            .entry((name.to_owned(), source.clone()))
            .or_insert_with(|| Arc::new(SecretCell::new(name, source)))
            .clone()
    }

    /// The names wanted from `source` that some context still uses (or that arrived), sorted.
    pub fn names(&self, source: &SecretSource) -> Vec<String> {
        let cells = self.cells.lock().expect("secret store lock");
        let mut names: Vec<String> = cells
            .iter()
            .filter(|((_, s), _)| s == source)
            .map(|((n, _), _)| n.clone())
            .collect();
        names.sort();
        names
    }

    /// Every source some secret is wanted from.
    pub fn sources(&self) -> Vec<SecretSource> {
        let cells = self.cells.lock().expect("secret store lock");
        let mut sources: Vec<SecretSource> = cells.keys().map(|(_, s)| s.clone()).collect();
        sources.sort();
        sources.dedup();
        sources
    }

    /// Every cell, sorted by source and name (for `/certs` and `/config_dump`).
    pub fn cells(&self) -> Vec<Arc<SecretCell>> {
        let cells = self.cells.lock().expect("secret store lock");
        let mut out: Vec<_> = cells.values().cloned().collect();
        out.sort_by(|a, b| (&a.source, &a.name).cmp(&(&b.source, &b.name)));
        out
    }

    /// Forgets the cells nothing uses any more (no context holds them), so their
    /// subscriptions end; returns how many went.
    pub fn prune(&self) -> usize {
        let mut cells = self.cells.lock().expect("secret store lock");
        let before = cells.len();
        cells.retain(|(_, source), cell| {
            *source == SecretSource::Static || Arc::strong_count(cell) > 1
        });
        before - cells.len()
    }

    /// Changes whenever a secret is first asked for.
    pub fn watch_wanted(&self) -> watch::Receiver<u64> {
        self.wanted.subscribe()
    }
}
