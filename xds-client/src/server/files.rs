//! Snapshots from a directory of YAML/JSON files, and reloading them when the directory
//! changes.
//!
//! Each `*.yaml`, `*.yml` or `*.json` file holds either a DiscoveryResponse-shaped document
//! (`resources: [{"@type": ..., ...}, ...]`, the format of Envoy's `path_config_source`
//! files) or one resource with its `@type`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proto::pb::google::protobuf::Any;
use proto::{Codec, DecodeError, Format};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::snapshot::Fnv;
use super::{Server, Snapshot};
use crate::ENDPOINT_TYPE_URL;

/// Why a directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The directory or a file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The directory or file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not valid YAML/JSON.
    #[error("{}: {source}", file.display())]
    Parse {
        /// The file.
        file: PathBuf,
        /// The parser's error.
        source: DecodeError,
    },
    /// A file is neither a `resources` list nor one resource with `@type`.
    #[error("{}: expected a `resources` list or one resource with `@type`", file.display())]
    Shape {
        /// The file.
        file: PathBuf,
    },
    /// A resource is wrong; `path` names the field (`resources[2].address.socket_address`).
    #[error("{}: {path}: {message}", file.display())]
    Resource {
        /// The file.
        file: PathBuf,
        /// The field path within the file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Two resources of one type have the same name.
    #[error("{type_url} `{name}` is defined in {} and again in {}", first.display(), second.display())]
    Duplicate {
        /// The type URL.
        type_url: String,
        /// The name.
        name: String,
        /// The file that defined it first.
        first: PathBuf,
        /// The file that defined it again.
        second: PathBuf,
    },
}

/// Loads every `*.yaml`, `*.yml` and `*.json` file of `dir`, in name order, into one snapshot
/// whose version is a hash of its content (an unchanged directory loads to the same version).
pub fn load_dir(dir: &Path) -> Result<Snapshot, LoadError> {
    let read_err = |path: &Path| {
        let path = path.to_owned();
        move |source| LoadError::Read { path, source }
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err(dir))? {
        let path = entry.map_err(read_err(dir))?.path();
        let ext = path.extension().and_then(|e| e.to_str());
        if matches!(ext, Some("yaml" | "yml" | "json")) && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    let codec = Codec::new();
    let mut snapshot = Snapshot::new("");
    let mut origin: BTreeMap<(String, String), PathBuf> = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(read_err(&file))?;
        let format = Format::from_path(&file.to_string_lossy());
        for (name, any, version) in decode_file(&codec, &file, &text, format)? {
            let key = (any.type_url.clone(), name);
            if let Some(first) = origin.get(&key) {
                return Err(LoadError::Duplicate {
                    type_url: key.0,
                    name: key.1,
                    first: first.clone(),
                    second: file,
                });
            }
            snapshot.insert_versioned(&key.0, key.1.clone(), any, version);
            origin.insert(key, file.clone());
        }
    }
    let version = snapshot.content_hash();
    snapshot.set_version(version);
    Ok(snapshot)
}

/// The resources of one file, with their names.
fn decode_file(
    codec: &Codec,
    file: &Path,
    text: &str,
    format: Format,
) -> Result<Vec<(String, Any, String)>, LoadError> {
    let doc = Codec::parse_text(text, format).map_err(|source| LoadError::Parse {
        file: file.to_owned(),
        source,
    })?;
    let items: Vec<(String, Value)> = match doc {
        Value::Object(mut map) if map.contains_key("resources") => match map.remove("resources") {
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("resources[{i}]"), v))
                .collect(),
            _ => {
                return Err(LoadError::Resource {
                    file: file.to_owned(),
                    path: "resources".into(),
                    message: "expected a list".into(),
                });
            }
        },
        Value::Object(map) if map.contains_key("@type") => {
            vec![(String::new(), Value::Object(map))]
        }
        Value::Null => Vec::new(),
        _ => {
            return Err(LoadError::Shape {
                file: file.to_owned(),
            });
        }
    };
    items
        .into_iter()
        .map(|(path, value)| decode_resource(codec, file, &path, value))
        .collect()
}

/// One resource: its `@type`, its name (`cluster_name` for a ClusterLoadAssignment, `name`
/// otherwise), the message packed, and its version: a hash of the resource as written, since
/// the packed bytes of a message with maps (metadata's `Struct`s) differ from one encoding to
/// the next.
fn decode_resource(
    codec: &Codec,
    file: &Path,
    path: &str,
    value: Value,
) -> Result<(String, Any, String), LoadError> {
    let err = |field: &str, message: String| LoadError::Resource {
        file: file.to_owned(),
        path: join(path, field),
        message,
    };
    let Some(type_url) = value
        .get("@type")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return Err(err(
            "@type",
            "missing (every resource names its type)".into(),
        ));
    };
    if !codec.knows(proto::type_name_of(&type_url)) {
        return Err(err("@type", format!("unknown type {type_url}")));
    }
    let name_field = if type_url == ENDPOINT_TYPE_URL {
        "cluster_name"
    } else {
        "name"
    };
    let name = match value.get(name_field) {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        _ => return Err(err(name_field, "missing (the resource's name)".into())),
    };
    let mut version = Fnv::new();
    version.write(value.to_string().as_bytes());
    let decoded = codec
        .decode_at::<Any>(value, false, path)
        .map_err(|e| match e {
            DecodeError::Field { path, message } => LoadError::Resource {
                file: file.to_owned(),
                path,
                message,
            },
            other => err("", other.to_string()),
        })?;
    for (at, unknown) in &decoded.unknown_types {
        tracing::warn!(file = %file.display(), path = %at, type_url = %unknown,
            "unknown extension type kept as an opaque TypedStruct");
    }
    Ok((name, decoded.message, version.hex()))
}

/// `a` + `.b` (or whichever is not empty).
fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_owned(),
        (_, true) => a.to_owned(),
        _ => format!("{a}.{b}"),
    }
}

/// Why a directory cannot be watched.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch {}: {source}", dir.display())]
pub struct WatchError {
    /// The directory.
    pub dir: PathBuf,
    /// The watcher's error.
    pub source: notify::Error,
}

/// A running directory watch; dropping it stops the watch.
pub struct DirWatch {
    _watcher: notify::RecommendedWatcher,
    task: JoinHandle<()>,
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long the directory must stay quiet before a reload (an editor's save or a `cp` of
/// several files is one burst of events).
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// Reloads `dir` into `server` when a file in it changes (after [`DEBOUNCE`] of quiet). A
/// snapshot of unchanged content is not set again; a load error is logged with its file and
/// field, and the previous snapshot keeps serving. Must be called within a tokio runtime.
pub fn watch(dir: &Path, server: Server) -> Result<DirWatch, WatchError> {
    use notify::Watcher as _;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let watch_err = |source| WatchError {
        dir: dir.to_owned(),
        source,
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.as_ref().is_ok_and(|e| is_read(&e.kind)) {
            return;
        }
        let _ = tx.send(event);
    })
    .map_err(watch_err)?;
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .map_err(watch_err)?;
    let dir = dir.to_owned();
    let task = tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            if let Err(e) = event {
                tracing::warn!(dir = %dir.display(), error = %e, "directory watch error");
            }
            while let Ok(Some(_)) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
            reload(&dir, &server).await;
        }
    });
    Ok(DirWatch {
        _watcher: watcher,
        task,
    })
}

/// Whether `kind` only reads a file (opened, read, closed unwritten): the reload's own reads
/// are such events, which must not start another reload.
fn is_read(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => false,
        EventKind::Access(_) => true,
        _ => false,
    }
}

/// Loads `dir` (off the async threads) and sets the snapshot if its content changed.
async fn reload(dir: &Path, server: &Server) {
    let path = dir.to_owned();
    let loaded = tokio::task::spawn_blocking(move || load_dir(&path)).await;
    match loaded {
        Ok(Ok(snapshot)) => {
            let current = server.snapshot();
            if current.as_deref().map(Snapshot::version) == Some(snapshot.version()) {
                tracing::debug!(dir = %dir.display(), "directory changed, content did not");
                return;
            }
            tracing::info!(dir = %dir.display(), version = %snapshot.version(),
                counts = ?snapshot.counts(), "snapshot reloaded");
            server.set(snapshot);
        }
        Ok(Err(e)) => tracing::error!(dir = %dir.display(), error = %e,
            "reload failed; the previous snapshot keeps serving"),
        Err(e) => tracing::error!(dir = %dir.display(), error = %e, "reload task failed"),
    }
}
