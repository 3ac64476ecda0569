//! Access-log files, as Envoy's AccessLogManager keeps them: one buffered writer per path,
//! shared by every logger naming it, opened when the configuration naming it loads, written by
//! a thread of its own. As in Envoy 1.40, a file's first line is written at once, later ones
//! when the file's flush timer fires (every flush interval from the file's opening) or as
//! soon as the buffer passes the flush size. A worker only appends to the buffer under a short
//! lock; a file that cannot be written (a full disk, a FIFO nobody reads) never stalls it:
//! past [`BUFFER_LIMIT`] lines are dropped and counted.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

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

/// Envoy's `filesystem.*` stats, shared by every file (`write_dropped` is revoy's: Envoy never
/// drops). Like Envoy 1.40, revoy shows them from start-up, with or without a log file.
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
        let c = |n: &str| store.counter(&format!("filesystem.{n}"));
        FileStats {
            write_buffered: c("write_buffered"),
            write_completed: c("write_completed"),
            write_failed: c("write_failed"),
            flushed_by_timer: c("flushed_by_timer"),
            reopen_failed: c("reopen_failed"),
            write_dropped: c("write_dropped"),
            write_total_buffered: store.gauge("filesystem.write_total_buffered"),
        }
    }
}

/// What the workers and the flush thread share.
#[derive(Debug, Default)]
struct Pending {
    buf: Vec<u8>,
    reopen: bool,
    /// The flush policy changed: the timer starts again with it.
    kick: bool,
    /// A line has been buffered before (the first one is written at once).
    written: bool,
    /// Write what is buffered now (the first line).
    flush_now: bool,
}

/// One log file: its buffer and the thread that writes it. A worker only appends to the
/// buffer under its lock; the flush thread takes the buffer out under that lock and writes it
/// after releasing it, so a write(2) that blocks holds up no worker.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    pending: Mutex<Pending>,
    wake: Condvar,
}

impl LogFile {
    /// Appends `line`; never waits for the file. Over [`BUFFER_LIMIT`] it is dropped.
    pub fn write(&self, line: &[u8]) {
        let settings = settings();
        let mut p = self.pending.lock().expect("log buffer lock");
        if p.buf.len() + line.len() > BUFFER_LIMIT {
            drop(p);
            settings.stats.write_dropped.inc();
            return;
        }
        p.buf.extend_from_slice(line);
        settings.stats.write_total_buffered.add(line.len() as u64);
        let first = !std::mem::replace(&mut p.written, true);
        p.flush_now |= first;
        let len = p.buf.len();
        drop(p);
        settings.stats.write_buffered.inc();
        if first || len > settings.policy.min_size {
            self.wake.notify_one();
        }
    }

    /// Asks the flush thread to reopen the file, then write what is buffered to it.
    pub fn reopen(&self) {
        self.pending.lock().expect("log buffer lock").reopen = true;
        self.wake.notify_one();
    }

    /// The path written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The flush thread: waits for the file's flush timer (which counts `flushed_by_timer`
    /// each time it fires, as Envoy's does, whether or not anything waits), a full buffer, the
    /// first line or a reopen, then writes `file` (opened again when it is missing or a reopen
    /// was asked for).
    fn run(self: Arc<Self>, mut file: Option<File>) {
        let mut tick = Instant::now() + settings().policy.interval;
        loop {
            let (data, reopen) = {
                let mut p = self.pending.lock().expect("log buffer lock");
                loop {
                    let policy = settings().policy;
                    if std::mem::take(&mut p.kick) {
                        tick = Instant::now() + policy.interval;
                    }
                    if p.flush_now || p.reopen || p.buf.len() > policy.min_size {
                        break;
                    }
                    let now = Instant::now();
                    if now >= tick {
                        settings().stats.flushed_by_timer.inc();
                        tick = now + policy.interval;
                        break;
                    }
                    p = self
                        .wake
                        .wait_timeout(p, tick - now)
                        .expect("log buffer lock")
                        .0;
                }
                p.flush_now = false;
                let reopen = std::mem::take(&mut p.reopen);
                (std::mem::take(&mut p.buf), reopen)
            };
            // As Envoy's flush thread: the file is reopened before what was buffered is
            // written, so lines logged before the reopen land in the new file.
            if reopen {
                file = None;
                match open_file(&self.path) {
                    Ok(f) => file = Some(f),
                    Err(e) => {
                        tracing::warn!(path = %self.path.display(), error = %e, "access log file cannot be reopened");
                        settings().stats.reopen_failed.inc();
                    }
                }
            }
            if !data.is_empty() {
                self.write_out(&mut file, &data);
                settings().stats.write_total_buffered.sub(data.len() as u64);
            }
        }
    }

    fn write_out(&self, file: &mut Option<File>, data: &[u8]) {
        let stats = &settings().stats;
        if file.is_none() {
            match open_file(&self.path) {
                Ok(f) => *file = Some(f),
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "access log file cannot be opened");
                }
            }
        }
        match file.as_mut().map(|f| f.write_all(data)) {
            Some(Ok(())) => stats.write_completed.inc(),
            Some(Err(e)) => {
                tracing::warn!(path = %self.path.display(), error = %e, "access log write failed");
                stats.write_failed.inc();
            }
            None => stats.write_failed.inc(),
        }
    }
}

/// Opens `path` for appending, creating it, as Envoy opens access-log files.
fn open_file(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// The flush policy and the stats every file counts into.
#[derive(Debug, Default)]
struct Settings {
    policy: FlushPolicy,
    stats: FileStats,
}

/// Set once by [`init`]; until then (files opened while the bootstrap compiles) Envoy's
/// defaults and uncounted stats.
static SETTINGS: OnceLock<Settings> = OnceLock::new();

fn settings() -> &'static Settings {
    static UNSET: LazyLock<Settings> = LazyLock::new(Settings::default);
    SETTINGS.get().unwrap_or(&UNSET)
}

/// Every log file of the process, by path (Envoy's AccessLogManager).
static FILES: LazyLock<Mutex<HashMap<PathBuf, Arc<LogFile>>>> = LazyLock::new(Mutex::default);

/// Sets the flush policy of every log file and counts into `store` (once, at start-up; later
/// calls change nothing). Files opened before (by the bootstrap's compile) follow it from now.
pub fn init(policy: FlushPolicy, store: &Store) {
    let _ = SETTINGS.set(Settings {
        policy,
        stats: FileStats::new(store),
    });
    for f in FILES.lock().expect("log files lock").values() {
        f.pending.lock().expect("log buffer lock").kick = true;
        f.wake.notify_one();
    }
}

/// The log file at `path`, shared with every logger that names it: the one already open, or
/// the file opened now (created when missing) with its flush thread. Fails as Envoy's config
/// load does when the file cannot be opened.
pub fn open(path: &Path) -> io::Result<Arc<LogFile>> {
    let mut by_path = FILES.lock().expect("log files lock");
    if let Some(f) = by_path.get(path) {
        return Ok(f.clone());
    }
    let opened = open_file(path)?;
    Ok(register(&mut by_path, path, Some(opened)))
}

/// The log file at `path` as [`open`] finds it, or, when it cannot be opened now, one that
/// tries again at each flush (counting `write_failed` until it can).
pub fn get(path: &Path) -> Arc<LogFile> {
    let mut by_path = FILES.lock().expect("log files lock");
    if let Some(f) = by_path.get(path) {
        return f.clone();
    }
    let opened = open_file(path)
        .inspect_err(|e| tracing::warn!(path = %path.display(), error = %e, "access log file cannot be opened"))
        .ok();
    register(&mut by_path, path, opened)
}

fn register(
    by_path: &mut HashMap<PathBuf, Arc<LogFile>>,
    path: &Path,
    opened: Option<File>,
) -> Arc<LogFile> {
    let file = Arc::new(LogFile {
        path: path.to_owned(),
        pending: Mutex::new(Pending::default()),
        wake: Condvar::new(),
    });
    let runner = file.clone();
    let spawned = std::thread::Builder::new()
        .name("access-log".into())
        .spawn(move || runner.run(opened));
    if let Err(e) = spawned {
        tracing::error!(path = %path.display(), error = %e, "access log flush thread did not start");
    }
    by_path.insert(path.to_owned(), file.clone());
    file
}

/// Reopens every log file (`POST /reopen_logs`, SIGUSR1): what is buffered, and what follows,
/// goes to the file now at the path, as in Envoy.
pub fn reopen_all() {
    for f in FILES.lock().expect("log files lock").values() {
        f.reopen();
    }
}
