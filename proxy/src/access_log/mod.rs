//! Access logs as Envoy writes them: a [`Record`] per request or connection, filled where the
//! data path learns each fact, rendered by each logger's [`LogFormat`] and appended to its
//! file when its [`Filter`] passes. Built only for connection managers, tcp_proxies and
//! listeners that have access logs; the others pay nothing.

pub mod file;
pub mod filter;
mod flags_out;
pub mod format;
pub mod record;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub use filter::Filter;
pub use flags_out::FlagsOut;
pub use format::LogFormat;
pub use record::{AtTunnelEnd, AttemptTarget, Flags, Record, ResponseFlag, UpstreamSans};

/// One configured access log: which records, how they read, and the file they go to.
#[derive(Debug)]
pub struct AccessLog {
    /// The filter, when set.
    pub filter: Option<Filter>,
    /// The line format.
    pub format: LogFormat,
    /// The file (`/dev/stdout` and `/dev/stderr` for the stream loggers).
    pub path: PathBuf,
    /// The shared writer of `path`, taken on the first line written.
    file: OnceLock<Arc<file::LogFile>>,
}

impl AccessLog {
    /// A log writing `format` to `path` when `filter` passes.
    pub fn new(filter: Option<Filter>, format: LogFormat, path: PathBuf) -> AccessLog {
        AccessLog {
            filter,
            format,
            path,
            file: OnceLock::new(),
        }
    }

    /// Writes `rec` if the filter passes.
    pub fn log(&self, rec: &Record) {
        if self.filter.as_ref().is_some_and(|f| !f.passes(rec)) {
            return;
        }
        let line = self.format.render(rec);
        self.file
            .get_or_init(|| file::get(&self.path))
            .write(line.as_bytes());
    }
}

/// The access logs of one connection manager, tcp_proxy or listener (empty: none).
#[derive(Debug, Clone, Default)]
pub struct AccessLogs {
    logs: Arc<[AccessLog]>,
    /// The configuration they were compiled from (encoded), which decides equality.
    source: Arc<[u8]>,
}

impl AccessLogs {
    /// The logs compiled from `source` (their encoded protos).
    pub fn new(logs: Vec<AccessLog>, source: Vec<u8>) -> AccessLogs {
        AccessLogs {
            logs: logs.into(),
            source: source.into(),
        }
    }

    /// Whether there is no log (and so no record need be kept).
    pub fn is_empty(&self) -> bool {
        self.logs.is_empty()
    }

    /// The logs.
    pub fn logs(&self) -> &[AccessLog] {
        &self.logs
    }

    /// Writes `rec` to every log whose filter passes.
    pub fn log(&self, rec: &Record) {
        for l in self.logs.iter() {
            l.log(rec);
        }
    }
}

impl PartialEq for AccessLogs {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for AccessLogs {}
