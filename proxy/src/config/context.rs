//! What a compile takes from outside the protos: files (`filename` data sources), environment
//! variables (`environment_variable` data sources, `%ENVIRONMENT(..)%`) and the host name
//! (`%HOSTNAME%`), access-log files opened as Envoy opens them at load, all through an injected [`ConfigIo`], so compiling stays pure and testable.
//! The [`Context`] also shares compiled regexes within one compile, and carries the
//! bootstrap's static runtime (the keys that override configured values).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::sync::OnceLock;

use super::ConfigError;
use crate::route::format::Machine;

/// The I/O a compile may do.
pub trait ConfigIo {
    /// The contents of the file at `path`.
    fn read_file(&self, path: &str) -> io::Result<Vec<u8>>;
    /// The value of environment variable `name`, when it is set (and valid Unicode).
    fn env(&self, name: &str) -> Option<String>;
    /// This machine's host name.
    fn hostname(&self) -> String;
    /// Opens the access-log file at `path` for appending (created when missing), as Envoy
    /// does when it loads a file access log; the error says why it cannot be.
    fn open_log(&self, path: &str) -> io::Result<()>;
    /// Whether `path` is a directory (following symlinks).
    fn is_dir(&self, path: &str) -> bool;
}

/// The real file system and process environment, as the binary uses them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemIo;

impl ConfigIo for SystemIo {
    fn read_file(&self, path: &str) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    /// `/proc/sys/kernel/hostname`, else `$HOSTNAME`, read once per process.
    fn hostname(&self) -> String {
        static NAME: OnceLock<String> = OnceLock::new();
        NAME.get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_owned())
                .ok()
                .filter(|s| !s.is_empty())
                .or_else(|| std::env::var("HOSTNAME").ok())
                .unwrap_or_default()
        })
        .clone()
    }

    /// Opens it in the process's access-log files, which keep it open for its loggers.
    fn open_log(&self, path: &str) -> io::Result<()> {
        crate::access_log::file::open(std::path::Path::new(path)).map(drop)
    }

    fn is_dir(&self, path: &str) -> bool {
        std::path::Path::new(path).is_dir()
    }
}

/// An in-memory file system, environment and host name, for tests.
#[derive(Debug, Clone, Default)]
pub struct FakeIo {
    files: HashMap<String, Vec<u8>>,
    env: HashMap<String, String>,
    hostname: String,
    unopenable: HashMap<String, io::ErrorKind>,
    dirs: Vec<String>,
}

impl FakeIo {
    /// No files, no environment variables, an empty host name.
    pub fn new() -> Self {
        FakeIo::default()
    }

    /// Adds a file at `path`.
    pub fn with_file(mut self, path: &str, contents: impl Into<Vec<u8>>) -> Self {
        self.files.insert(path.to_owned(), contents.into());
        self
    }

    /// Sets environment variable `name`.
    pub fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.insert(name.to_owned(), value.to_owned());
        self
    }

    /// Makes opening the access-log file at `path` fail with `kind` (every other opens).
    pub fn with_unopenable_log(mut self, path: &str, kind: io::ErrorKind) -> Self {
        self.unopenable.insert(path.to_owned(), kind);
        self
    }

    /// Adds a directory at `path`.
    pub fn with_dir(mut self, path: &str) -> Self {
        self.dirs.push(path.to_owned());
        self
    }

    /// Sets the host name.
    pub fn with_hostname(mut self, name: &str) -> Self {
        self.hostname = name.to_owned();
        self
    }
}

impl ConfigIo for FakeIo {
    fn read_file(&self, path: &str) -> io::Result<Vec<u8>> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "No such file or directory"))
    }

    fn env(&self, name: &str) -> Option<String> {
        self.env.get(name).cloned()
    }

    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    fn open_log(&self, path: &str) -> io::Result<()> {
        match self.unopenable.get(path) {
            Some(kind) => Err(io::Error::from(*kind)),
            None => Ok(()),
        }
    }

    fn is_dir(&self, path: &str) -> bool {
        self.dirs.iter().any(|d| d == path)
    }
}

/// Compiled regexes by pattern: unanchored, anchored.
type RegexCache = [HashMap<String, regex::Regex>; 2];

/// The context of one compile (a bootstrap, one xDS resource): its I/O, and the regexes it
/// compiled so far, so identical patterns (Istio repeats its header matchers on every route)
/// are compiled once and share one program. Make one per compile: its cache lives as long as
/// it does.
pub struct Context<'io> {
    io: &'io dyn ConfigIo,
    regexes: RefCell<RegexCache>,
}

impl<'io> Context<'io> {
    /// A context doing its I/O through `io`, with an empty regex cache.
    pub fn new(io: &'io dyn ConfigIo) -> Self {
        Context {
            io,
            regexes: RefCell::default(),
        }
    }

    /// The I/O this compile does.
    pub fn io(&self) -> &'io dyn ConfigIo {
        self.io
    }

    /// Whether `path` is a directory.
    pub fn is_dir(&self, path: &str) -> bool {
        self.io.is_dir(path)
    }

    /// `re` compiled by [`compile_regex`](super::route::compile_regex), or the copy compiled
    /// earlier in this context (a `Regex` clone shares the compiled program).
    pub fn regex(&self, re: &str, anchored: bool) -> Result<regex::Regex, ConfigError> {
        if let Some(hit) = self.regexes.borrow()[usize::from(anchored)].get(re) {
            return Ok(hit.clone());
        }
        let compiled = super::route::compile_regex(re, anchored)?;
        self.regexes.borrow_mut()[usize::from(anchored)].insert(re.to_owned(), compiled.clone());
        Ok(compiled)
    }

    /// How many distinct regexes this context holds.
    #[cfg(test)]
    pub(crate) fn cached_regexes(&self) -> usize {
        self.regexes.borrow().iter().map(HashMap::len).sum()
    }
}

impl Machine for Context<'_> {
    fn env(&self, name: &str) -> Option<String> {
        self.io.env(name)
    }

    fn hostname(&self) -> String {
        self.io.hostname()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regexes_are_shared_within_a_context() {
        let io = FakeIo::new();
        let ctx = Context::new(&io);
        let a = ctx.regex("ab+c", true).unwrap();
        let b = ctx.regex("ab+c", true).unwrap();
        ctx.regex("ab+c", false).unwrap();
        assert_eq!(ctx.cached_regexes(), 2);
        assert!(a.is_match("abbc") && !a.is_match("xabbc"));
        assert_eq!(a.as_str(), b.as_str());
        assert!(ctx.regex("(", true).is_err());
        assert_eq!(ctx.cached_regexes(), 2);
        assert_eq!(Context::new(&io).cached_regexes(), 0);
    }

    #[test]
    fn fake_io_answers_what_it_was_given() {
        let io = FakeIo::new()
            .with_file("/etc/body", "hello")
            .with_env("ZONE", "eu")
            .with_hostname("pod-1");
        assert_eq!(io.read_file("/etc/body").unwrap(), b"hello");
        assert_eq!(
            io.read_file("/nope").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(io.env("ZONE").as_deref(), Some("eu"));
        assert_eq!(io.env("PATH"), None);
        assert_eq!(io.hostname(), "pod-1");
    }
}
