//! Pure compilation of Envoy protos into runtime structures. No sockets, no tokio: every
//! function here takes protos and returns compiled values or a [`ConfigError`] naming the field.

pub mod bootstrap;
pub mod cluster;
pub mod filter_chain_match;
pub mod hcm;
pub mod listener;
pub mod route;
pub mod tcp_proxy;

use std::fmt;

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

/// Non-fatal findings of a compile: unsupported-but-tolerated features, named by path.
pub type Warnings = Vec<String>;

/// Prefixes the warnings added since `from` with `prefix.`, so a warning raised deep in a
/// compile names its full path.
pub fn prefix_warnings(warnings: &mut Warnings, from: usize, prefix: &str) {
    for w in &mut warnings[from..] {
        *w = format!("{prefix}.{w}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_get_the_enclosing_path() {
        let mut w: Warnings = vec!["kept".into(), "http_filters[0]: x".into()];
        prefix_warnings(&mut w, 1, "listeners[2]");
        assert_eq!(w, vec!["kept", "listeners[2].http_filters[0]: x"]);
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
