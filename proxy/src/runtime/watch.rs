//! The watch on the disk layers' `symlink_root`s, as Envoy's: the directory holding each is
//! watched, and only a rename onto the symlink (inotify's `IN_MOVED_TO`, the usual atomic
//! swap: a new symlink renamed over the old one) counts; writes under the old target do not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use notify::event::{EventKind, ModifyKind, RenameMode};
use notify::{RecursiveMode, Watcher};

/// The running watch; dropping it stops it.
#[derive(Debug)]
pub(super) struct SymlinkWatch {
    _watcher: notify::RecommendedWatcher,
}

impl SymlinkWatch {
    /// Watches the symlinks `roots` (one per disk layer, repeated when layers share one):
    /// `changed(n)` runs on the watch's thread after each rename onto a root, `n` being how
    /// many layers have that root.
    pub(super) fn start(
        roots: &[&str],
        changed: impl Fn(usize) + Send + 'static,
    ) -> notify::Result<SymlinkWatch> {
        let mut layers: BTreeMap<PathBuf, usize> = BTreeMap::new();
        let mut dirs: Vec<PathBuf> = Vec::new();
        for root in roots {
            let root = Path::new(root);
            let dir = directory(root);
            let name = root.file_name().map(|n| dir.join(n)).unwrap_or(dir.clone());
            *layers.entry(name).or_default() += 1;
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        let watched = layers.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else { return };
                if event.kind != EventKind::Modify(ModifyKind::Name(RenameMode::To)) {
                    return;
                }
                for path in &event.paths {
                    if let Some(n) = watched.get(path) {
                        changed(*n);
                    }
                }
            })?;
        for dir in dirs {
            watcher.watch(&dir, RecursiveMode::NonRecursive)?;
        }
        Ok(SymlinkWatch { _watcher: watcher })
    }
}

/// The directory holding `root`, as the watch reports its entries' paths.
fn directory(root: &Path) -> PathBuf {
    match root.parent() {
        Some(p) if p.as_os_str().is_empty() => PathBuf::from("."),
        Some(p) => p.to_path_buf(),
        None => PathBuf::from("/"),
    }
}
