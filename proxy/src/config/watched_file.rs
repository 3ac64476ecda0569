//! `path_config_source` (and the deprecated `path`) -> [`WatchedFile`]: the file a
//! `DiscoveryResponse` is read from, and what makes revoy read it again (`watched_directory`,
//! `poll_interval`, else its own directory).

use std::path::PathBuf;
use std::time::Duration;

use proto::pb::envoy::config::core::v3::PathConfigSource;

use super::ConfigError;

/// A file of resources and what makes it be read again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchedFile {
    /// The file.
    pub path: PathBuf,
    /// What makes it be read again.
    pub trigger: Trigger,
}

/// What makes a file be read again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Trigger {
    /// A change in the file's own directory (Envoy watches the path for moves; revoy watches
    /// its directory, so a file renamed over it or a symlink swapped beside it is seen).
    OwnDirectory,
    /// `watched_directory`: a change in that directory (Envoy: a move to an entry of it, as
    /// Kubernetes' `..data` swap of a mounted ConfigMap or Secret).
    Directory(PathBuf),
    /// `poll_interval`: read again at that interval.
    Poll(Duration),
}

impl WatchedFile {
    /// The deprecated `path`: the file, watched through its directory.
    pub fn path(path: &str) -> Self {
        WatchedFile {
            path: PathBuf::from(path),
            trigger: Trigger::OwnDirectory,
        }
    }

    /// The directory watched (`None` when polled): the `watched_directory`, else the file's.
    pub fn directory(&self) -> Option<PathBuf> {
        match &self.trigger {
            Trigger::OwnDirectory => Some(parent(&self.path)),
            Trigger::Directory(dir) => Some(dir.clone()),
            Trigger::Poll(_) => None,
        }
    }
}

/// The directory of `path` (`.` for a bare name).
pub fn parent(path: &std::path::Path) -> PathBuf {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), std::path::Path::to_owned)
}

/// Compiles a `path_config_source`; errors name fields relative to it. As Envoy, it refuses
/// `watched_directory` together with `poll_interval`, and a poll shorter than 1 ms.
pub fn compile(p: &PathConfigSource) -> Result<WatchedFile, ConfigError> {
    if p.path.is_empty() {
        return Err(ConfigError::new(
            "path",
            "value length must be at least 1 characters",
        ));
    }
    let trigger = match (&p.watched_directory, &p.poll_interval) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                "poll_interval",
                "cannot be set together with watched_directory",
            ));
        }
        (Some(dir), None) if dir.path.is_empty() => {
            return Err(ConfigError::new(
                "watched_directory.path",
                "value length must be at least 1 characters",
            ));
        }
        (Some(dir), None) => Trigger::Directory(PathBuf::from(&dir.path)),
        (None, Some(d)) => {
            let interval = super::route::duration(d);
            if interval < Duration::from_millis(1) {
                return Err(ConfigError::new(
                    "poll_interval",
                    "value must be greater than or equal to 0.001s",
                ));
            }
            Trigger::Poll(interval)
        }
        (None, None) => Trigger::OwnDirectory,
    };
    Ok(WatchedFile {
        path: PathBuf::from(&p.path),
        trigger,
    })
}

#[cfg(test)]
mod tests {
    use proto::pb::envoy::config::core::v3::WatchedDirectory;

    use super::*;

    fn source(dir: Option<&str>, poll_ms: Option<i32>) -> PathConfigSource {
        PathConfigSource {
            path: "/etc/sds/sds.yaml".into(),
            watched_directory: dir.map(|d| WatchedDirectory {
                path: d.into(),
                ..Default::default()
            }),
            poll_interval: poll_ms.map(|ms| proto::pb::google::protobuf::Duration {
                seconds: 0,
                nanos: ms * 1_000_000,
            }),
        }
    }

    #[test]
    fn the_directory_watched_is_the_watched_directory_else_the_files() {
        let own = compile(&source(None, None)).expect("compiles");
        assert_eq!(own.directory(), Some(PathBuf::from("/etc/sds")));
        let dir = compile(&source(Some("/var/mount"), None)).expect("compiles");
        assert_eq!(dir.directory(), Some(PathBuf::from("/var/mount")));
        let polled = compile(&source(None, Some(200))).expect("compiles");
        assert_eq!(polled.trigger, Trigger::Poll(Duration::from_millis(200)));
        assert_eq!(polled.directory(), None);
        assert_eq!(
            WatchedFile::path("sds.yaml").directory(),
            Some(PathBuf::from("."))
        );
    }

    #[test]
    fn watched_directory_with_poll_interval_or_a_short_poll_is_refused() {
        let both = compile(&source(Some("/var/mount"), Some(200))).expect_err("refused");
        assert_eq!(both.path, "poll_interval");
        let short = compile(&source(None, Some(0))).expect_err("refused");
        assert_eq!(short.path, "poll_interval");
        let empty = compile(&source(Some(""), None)).expect_err("refused");
        assert_eq!(empty.path, "watched_directory.path");
    }
}
