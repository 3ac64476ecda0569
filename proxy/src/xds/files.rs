//! `path_config_source` for LDS, CDS and SDS: a file holding a `DiscoveryResponse` (YAML or JSON,
//! `resources` as `@type` Anys), read at start and again whenever it changes — written in
//! place, renamed over, or swapped by a symlink as Kubernetes mounts do (the directory is
//! watched, not the file: its own, or the `watched_directory`), or at each `poll_interval`. Each version goes through the same handler as an ADS response;
//! a file that does not decode keeps the previous version serving.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::Watcher;
use proto::pb::envoy::service::discovery::v3::DiscoveryResponse;
use xds_client::{Handler, Resource, SECRET_TYPE_URL, Update};

use crate::config::watched_file::{Trigger, WatchedFile};

/// How long changes settle before the file is read (an editor's write is several events).
const SETTLE: Duration = Duration::from_millis(100);

/// Why a file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// It is not a `DiscoveryResponse`.
    #[error("{path}: {source}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the field path.
        source: proto::DecodeError,
    },
    /// A resource is not of the subscription's type.
    #[error("{path}: resources[{index}] is a {found}, not a {expected}")]
    WrongType {
        /// The file.
        path: PathBuf,
        /// The resource's index.
        index: usize,
        /// Its type URL.
        found: String,
        /// The subscription's type URL.
        expected: String,
    },
    /// A resource's name cannot be read.
    #[error("{path}: resources[{index}]: {source}")]
    Name {
        /// The file.
        path: PathBuf,
        /// The resource's index.
        index: usize,
        /// Why.
        source: xds_client::client::NameError,
    },
}

/// Reads `path` as a `DiscoveryResponse` of `type_url` resources: its version, a digest of
/// its text and its resources.
pub fn read(path: &Path, type_url: &str) -> Result<(String, String, Vec<Resource>), FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let decode_error = |source| FileError::Decode {
        path: path.to_owned(),
        source,
    };
    let value = proto::Codec::parse_text(&text, proto::Format::from_path(&path.to_string_lossy()))
        .map_err(decode_error)?;
    let codec = proto::Codec::for_document("envoy.service.discovery.v3.DiscoveryResponse", &value);
    let response: DiscoveryResponse = codec.decode(value, false).map_err(decode_error)?.message;
    let version = if response.version_info.is_empty() {
        content_version(&text)
    } else {
        response.version_info
    };
    let mut resources = Vec::with_capacity(response.resources.len());
    for (index, any) in response.resources.into_iter().enumerate() {
        if any.type_url != type_url {
            return Err(FileError::WrongType {
                path: path.to_owned(),
                index,
                found: any.type_url,
                expected: type_url.to_owned(),
            });
        }
        let value = bytes::Bytes::from(any.value);
        let name = xds_client::client::resource_name(&value).map_err(|source| FileError::Name {
            path: path.to_owned(),
            index,
            source,
        })?;
        resources.push(Resource {
            name,
            version: version.clone(),
            value,
        });
    }
    Ok((version, content_version(&text), resources))
}

/// A version for a file that names none: a digest of its text.
fn content_version(text: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// What makes files be read again: a change in one of some directories (each burst of events
/// settled into one), or the tick of a poll.
pub(super) struct Changes {
    /// Kept for as long as the directories are watched.
    _watcher: Option<notify::RecommendedWatcher>,
    events: tokio::sync::mpsc::UnboundedReceiver<()>,
    poll: Option<tokio::time::Interval>,
}

impl Changes {
    /// Changes in `dirs` (a directory that cannot be watched is logged, and never changes),
    /// or every `poll`.
    pub(super) fn new(dirs: &[PathBuf], poll: Option<Duration>) -> Self {
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        let watcher = if dirs.is_empty() {
            None
        } else {
            match notify::recommended_watcher(move |_event| {
                let _ = tx.send(());
            }) {
                Ok(mut w) => {
                    for dir in dirs {
                        if let Err(e) = w.watch(dir, notify::RecursiveMode::NonRecursive) {
                            tracing::error!(dir = %dir.display(), error = %e, "cannot watch; changes there are not seen");
                        }
                    }
                    Some(w)
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot watch files; they are read once");
                    None
                }
            }
        };
        let poll = poll.map(|every| {
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval.reset();
            interval
        });
        Changes {
            _watcher: watcher,
            events,
            poll,
        }
    }

    /// Waits for the next change; `false` when none can come any more.
    pub(super) async fn next(&mut self) -> bool {
        let changed = match &mut self.poll {
            Some(poll) => {
                poll.tick().await;
                return true;
            }
            None => self.events.recv().await.is_some(),
        };
        if changed {
            tokio::time::sleep(SETTLE).await;
            while self.events.try_recv().is_ok() {}
        }
        changed
    }
}

/// Applies `file` now and on every change (see [`Changes`]), until the process ends: a text
/// unchanged since the last version applied is skipped, except SDS's, whose secrets may name
/// files (a Kubernetes symlink swap changes those, not the text; the secret handler skips a
/// secret whose files read the same).
pub fn watch(file: WatchedFile, type_url: &'static str, handler: Arc<dyn Handler>) {
    let poll = match file.trigger {
        Trigger::Poll(every) => Some(every),
        _ => None,
    };
    let mut changes = Changes::new(file.directory().as_slice(), poll);
    let path = file.path;
    tokio::spawn(async move {
        let mut known = BTreeSet::new();
        let mut last = None;
        loop {
            match read(&path, type_url) {
                Ok((version, digest, resources)) => {
                    let seen = (version, digest);
                    if type_url == SECRET_TYPE_URL || last.as_ref() != Some(&seen) {
                        known = apply(&handler, type_url, &seen.0, resources, &known);
                        last = Some(seen);
                    }
                }
                Err(e) => tracing::error!("{e}; the previous version keeps serving"),
            }
            if !changes.next().await {
                return;
            }
        }
    });
}

/// Applies one version of the file: what it no longer names is removed. Returns the names it
/// holds.
fn apply(
    handler: &Arc<dyn Handler>,
    type_url: &str,
    version: &str,
    resources: Vec<Resource>,
    known: &BTreeSet<String>,
) -> BTreeSet<String> {
    let names: BTreeSet<String> = resources.iter().map(|r| r.name.clone()).collect();
    let applied = handler.apply(Update {
        type_url: type_url.to_owned(),
        version_info: version.to_owned(),
        resources,
        removed: known.difference(&names).cloned().collect(),
    });
    if applied.rejected.is_empty() {
        tracing::info!(%type_url, %version, "file version applied");
    }
    for r in &applied.rejected {
        tracing::warn!(%type_url, %version, resource = %r.name, "rejected: {}", r.reason);
    }
    names
}
