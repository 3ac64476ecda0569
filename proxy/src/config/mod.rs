//! Pure compilation of Envoy protos into runtime structures. No sockets, no tokio: every
//! function here takes protos and returns compiled values or a [`ConfigError`] naming the field.
//! What a compile reads from outside (files, environment, host name) comes through the
//! [`Context`] it is given.

pub mod access_log;
pub mod bootstrap;
pub mod cluster;
pub mod context;
pub mod dynamic;
pub mod fail_closed;
pub mod filter_chain_match;
pub mod filter_disabled;
pub mod hcm;
pub mod http_filter;
pub mod istio;
pub mod listen_address;
pub mod listener;
pub mod local_reply;
pub mod metadata_matcher;
pub mod network_limits;
pub mod rbac;
pub mod route;
pub mod runtime;
pub mod stats_flush;
pub mod tcp_proxy;
pub mod tls;
pub mod token_bucket;
pub mod tracing;
pub mod upstream_transport;
pub mod watched_file;

use std::fmt;

pub use context::{ConfigIo, Context, FakeIo, SystemIo};

/// A configuration problem: where it is (a field path like
/// `static_resources.listeners[0].filter_chains[1]`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// Field path from the document root (or from the resource, for xDS).
    pub path: String,
    /// What is wrong, in Envoy's words where Envoy has them.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl ConfigError {
    /// An error at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            path: path.into(),
            message: message.into(),
        }
    }

    /// `what` (at `path`) is a feature revoy does not implement and must not skip.
    pub fn unimplemented(path: impl Into<String>, what: &str) -> Self {
        ConfigError::new(path, format!("{what} is not implemented by revoy"))
    }

    /// The same error seen from an enclosing field: `prefix` is prepended to the path.
    pub fn within(mut self, prefix: &str) -> Self {
        self.path = match (prefix.is_empty(), self.path.is_empty()) {
            (true, _) => self.path,
            (false, true) => prefix.to_owned(),
            (false, false) if self.path.starts_with('[') => format!("{prefix}{}", self.path),
            (false, false) => format!("{prefix}.{}", self.path),
        };
        self
    }
}

/// How a compile finding affects traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Tolerated as configured; the message says what revoy does instead, if anything.
    Note,
    /// A feature revoy does not implement and leaves out. It has no security effect, so
    /// traffic flows without it.
    Skipped,
    /// A feature revoy does not implement whose absence would make it less safe than its
    /// config (access control, limits, upstream TLS): the traffic it governs is refused.
    FailsClosed,
}

/// One non-fatal finding of a compile, named by the field path it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// What it means for traffic.
    pub severity: Severity,
    /// Field path (relative to the resource the compile started at, then prefixed).
    pub path: String,
    /// What revoy does about it.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.severity {
            Severity::Note => {}
            Severity::Skipped => f.write_str("not implemented (skipped): ")?,
            Severity::FailsClosed => f.write_str("not implemented (fails closed): ")?,
        }
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// The non-fatal findings of a compile, in the order found.
#[derive(Debug, Clone, Default)]
pub struct Warnings(Vec<Warning>);

impl Warnings {
    /// No findings yet.
    pub fn new() -> Self {
        Warnings(Vec::new())
    }

    /// Records a finding at `path`.
    pub fn add(&mut self, severity: Severity, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Warning {
            severity,
            path: path.into(),
            message: message.into(),
        });
    }

    /// Records a tolerated finding.
    pub fn note(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.add(Severity::Note, path, message);
    }

    /// Records a feature that is not implemented and left out.
    pub fn skipped(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.add(Severity::Skipped, path, message);
    }

    /// Records a feature that is not implemented and whose traffic is refused.
    pub fn fails_closed(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.add(Severity::FailsClosed, path, message);
    }

    /// How many findings there are (a mark for [`Warnings::prefix_since`]).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The findings, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Warning> {
        self.0.iter()
    }

    /// Whether any finding fails closed.
    pub fn any_fails_closed(&self) -> bool {
        self.0.iter().any(|w| w.severity == Severity::FailsClosed)
    }

    /// Prefixes the paths of the findings added since `from` with `prefix`, so a finding
    /// raised deep in a compile names its full path.
    pub fn prefix_since(&mut self, from: usize, prefix: &str) {
        for w in &mut self.0[from..] {
            w.path = if w.path.is_empty() {
                prefix.to_owned()
            } else if w.path.starts_with('[') {
                format!("{prefix}{}", w.path)
            } else {
                format!("{prefix}.{}", w.path)
            };
        }
    }
}

impl<'a> IntoIterator for &'a Warnings {
    type Item = &'a Warning;
    type IntoIter = std::slice::Iter<'a, Warning>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_get_the_enclosing_path() {
        let mut w = Warnings::new();
        w.note("kept", "a");
        w.skipped("http_filters[0]", "x");
        w.prefix_since(1, "listeners[2]");
        let shown: Vec<String> = w.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "kept: a",
                "not implemented (skipped): listeners[2].http_filters[0]: x"
            ]
        );
        assert!(!w.any_fails_closed());
        w.fails_closed("", "y");
        assert!(w.any_fails_closed());
    }

    #[test]
    fn paths_nest() {
        let e = ConfigError::new("match.safe_regex", "missing )")
            .within("routes[2]")
            .within("virtual_hosts[0]");
        assert_eq!(
            e.to_string(),
            "virtual_hosts[0].routes[2].match.safe_regex: missing )"
        );
        let e = ConfigError::new("[3]", "dup").within("listeners");
        assert_eq!(e.path, "listeners[3]");
    }
}
