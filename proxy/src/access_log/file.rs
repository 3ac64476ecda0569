//! Access-log files, as Envoy's AccessLogManager keeps them: one buffered writer per path,
//! shared by every logger naming it, flushed on a thread of its own every flush interval or
//! as soon as its buffer passes the flush size. A worker only appends to the buffer under a
//! short lock; a file that cannot be written (a full disk, a FIFO nobody reads) never stalls
//! it: past [`BUFFER_LIMIT`] lines are dropped and counted.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::stats::{Counter, Gauge, Store};

/// Bytes a file's buffer may hold before lines are dropped.
pub const BUFFER_LIMIT: usize = 16 * 1024 * 1024;

/// Flush timing: Envoy's `--file-flush-interval-msec` and `--file-flush-min-size-kb`.
#[derive(Debug, Clone, Copy)]
pub struct FlushPolicy {
    /// Written at least this often.
    pub interval: Duration,
    /// Written as soon as this many bytes wait.
    pub min_size: usize,
}

impl Default for FlushPolicy {
    /// Envoy's defaults: 10 s, 64 KiB.
    fn default() -> Self {
        FlushPolicy {
            interval: Duration::from_secs(10),
            min_size: 64 * 1024,
        }
    }
}

/// Envoy's `access_log_file.*` stats (`write_dropped` is revoy's: Envoy never drops).
#[derive(Debug, Clone, Default)]
struct FileStats {
    write_buffered: Counter,
    write_completed: Counter,
    write_failed: Counter,
    flushed_by_timer: Counter,
    reopen_failed: Counter,
    write_dropped: Counter,
    write_total_buffered: Gauge,
}

impl FileStats {
    fn new(store: &Store) -> FileStats {
        let c = |n: &str| store.counter(&format!("access_log_file.{n}"));
        FileStats {
            write_buffered: c("write_buffered"),
            write_completed: c("write_completed"),
            write_failed: c("write_failed"),
            flushed_by_timer: c("flushed_by_timer"),
            reopen_failed: c("reopen_failed"),
            write_dropped: c("write_dropped"),
            write_total_buffered: store.gauge("access_log_file.write_total_buffered"),
        }
    }
}

/// What the workers and the flush thread share.
#[derive(Debug, Default)]
struct Pending {
    buf: Vec<u8>,
    reopen: bool,
}

/// One log file: its buffer and the thread that writes it.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    pending: Mutex<Pending>,
    wake: Condvar,
    policy: FlushPolicy,
    stats: FileStats,
}

impl LogFile {
    /// Appends `line`; never waits for the file. Over [`BUFFER_LIMIT`] it is dropped.
    pub fn write(&self, line: &[u8]) {
        let mut p = self.pending.lock().expect("log buffer lock");
        if p.buf.len() + line.len() > BUFFER_LIMIT {
            drop(p);
            self.stats.write_dropped.inc();
            return;
        }
        p.buf.extend_from_slice(line);
        let len = p.buf.len();
        drop(p);
        self.stats.write_buffered.inc();
        self.stats.write_total_buffered.set(len as u64);
        if len >= self.policy.min_size {
            self.wake.notify_one();
        }
    }

    /// Asks the flush thread to reopen the file (after writing what is buffered).
    pub fn reopen(&self) {
        self.pending.lock().expect("log buffer lock").reopen = true;
        self.wake.notify_one();
    }

    /// The path written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The flush thread: waits for the interval or a full buffer, then writes.
    fn run(self: Arc<Self>) {
        let mut file: Option<File> = None;
        loop {
            let (data, reopen, by_timer) = {
                let p = self.pending.lock().expect("log buffer lock");
                let (mut p, timeout) = self
                    .wake
                    .wait_timeout_while(p, self.policy.interval, |p| {
                        p.buf.len() < self.policy.min_size && !p.reopen
                    })
                    .expect("log buffer lock");
                let reopen = std::mem::take(&mut p.reopen);
                (std::mem::take(&mut p.buf), reopen, timeout.timed_out())
            };
            self.stats.write_total_buffered.set(0);
            if by_timer {
                self.stats.flushed_by_timer.inc();
            }
            if !data.is_empty() {
                self.write_out(&mut file, &data);
            }
            if reopen {
                file = None;
                if self.open().is_none() {
                    self.stats.reopen_failed.inc();
                }
            }
        }
    }

    fn open(&self) -> Option<File> {
        match OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
        {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "access log file cannot be opened");
                None
            }
        }
    }

    fn write_out(&self, file: &mut Option<File>, data: &[u8]) {
        if file.is_none() {
            *file = self.open();
        }
        match file.as_mut().map(|f| f.write_all(data)) {
            Some(Ok(())) => self.stats.write_completed.inc(),
            Some(Err(e)) => {
                tracing::warn!(path = %self.path.display(), error = %e, "access log write failed");
                self.stats.write_failed.inc();
            }
            None => self.stats.write_failed.inc(),
        }
    }
}

/// Every log file of the process, by path (Envoy's AccessLogManager).
#[derive(Debug)]
pub struct Files {
    by_path: Mutex<HashMap<PathBuf, Arc<LogFile>>>,
    policy: FlushPolicy,
    stats: FileStats,
}

static FILES: OnceLock<Files> = OnceLock::new();

/// Sets up the process's log files with `policy` and counts into `store` (once, at start-up;
/// later calls change nothing).
pub fn init(policy: FlushPolicy, store: &Store) {
    let _ = FILES.get_or_init(|| Files {
        by_path: Mutex::new(HashMap::new()),
        policy,
        stats: FileStats::new(store),
    });
}

fn files() -> &'static Files {
    FILES.get_or_init(|| Files {
        by_path: Mutex::new(HashMap::new()),
        policy: FlushPolicy::default(),
        stats: FileStats::default(),
    })
}

/// The log file at `path`, shared with every logger that names it; its flush thread starts
/// with it.
pub fn open(path: &Path) -> Arc<LogFile> {
    let files = files();
    let mut by_path = files.by_path.lock().expect("log files lock");
    if let Some(f) = by_path.get(path) {
        return f.clone();
    }
    let file = Arc::new(LogFile {
        path: path.to_owned(),
        pending: Mutex::new(Pending::default()),
        wake: Condvar::new(),
        policy: files.policy,
        stats: files.stats.clone(),
    });
    let runner = file.clone();
    let spawned = std::thread::Builder::new()
        .name("access-log".into())
        .spawn(move || runner.run());
    if let Err(e) = spawned {
        tracing::error!(path = %path.display(), error = %e, "access log flush thread did not start");
    }
    by_path.insert(path.to_owned(), file.clone());
    file
}

/// Reopens every log file (`POST /reopen_logs`, SIGUSR1): what is buffered goes to the file
/// as it was, what follows to the file now at the path.
pub fn reopen_all() {
    for f in files().by_path.lock().expect("log files lock").values() {
        f.reopen();
    }
}
