//! Envoy's named loggers, each with its level, as `/logging` shows and changes them and
//! `--component-log-level` sets them. revoy's own code logs under a few module targets; a
//! logger that stands for one of them (see [`TARGETS`]) moves that target's level, the others
//! are kept and shown only, so an operator's tooling (`istioctl proxy-config log`) works the
//! same against revoy.

/// Envoy 1.40's loggers, in the order its `/logging` lists them.
pub const NAMES: &[&str] = &[
    "a2a",
    "admin",
    "ai_protocol_manager",
    "alternate_protocols_cache",
    "aws",
    "assert",
    "backtrace",
    "basic_auth",
    "cache_filter",
    "client",
    "config",
    "connection",
    "conn_handler",
    "compression",
    "credential_injector",
    "decompression",
    "dns",
    "dubbo",
    "envoy_bug",
    "ext_authz",
    "ext_proc",
    "rocketmq",
    "file",
    "filter",
    "forward_proxy",
    "geolocation",
    "grpc",
    "happy_eyeballs",
    "hc",
    "health_checker",
    "http",
    "http2",
    "hystrix",
    "init",
    "io",
    "jwt",
    "json_rpc",
    "kafka",
    "key_value_store",
    "lua",
    "local_rate_limit",
    "main",
    "matcher",
    "mcp",
    "misc",
    "mongo",
    "multi_connection",
    "notification",
    "oauth2",
    "quic",
    "quic_stream",
    "pool",
    "rate_limit_quota",
    "rbac",
    "rds",
    "redis",
    "router",
    "runtime",
    "stats",
    "secret",
    "sse",
    "tap",
    "testing",
    "thrift",
    "tracing",
    "upstream",
    "udp",
    "wasm",
    "websocket",
    "golang",
    "stats_sinks",
    "dynamic_modules",
    "ip_tagging",
];

/// The loggers that stand for revoy's module targets.
pub const TARGETS: &[(&str, &str)] = &[
    ("admin", "revoy::admin"),
    ("config", "revoy::config"),
    ("connection", "revoy::listener"),
    ("conn_handler", "revoy::listener"),
    ("http", "revoy::http"),
    ("router", "revoy::http"),
    ("upstream", "revoy::upstream"),
    ("pool", "revoy::upstream"),
    ("filter", "revoy::tcp"),
    ("main", "revoy::server"),
];

/// Envoy's level names, least to most verbose after `off`.
const LEVELS: &[&str] = &[
    "off", "critical", "error", "warning", "info", "debug", "trace",
];

/// Why a change of levels was refused, in Envoy's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LevelError {
    /// A level name Envoy does not have.
    #[error("unknown logger level")]
    UnknownLevel,
    /// A logger name Envoy does not have.
    #[error("unknown logger name")]
    UnknownName,
    /// `/logging` with more than one parameter.
    #[error("invalid number of parameters")]
    InvalidParameters,
}

/// Every logger's level, and the level of everything no logger names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loggers {
    levels: Vec<&'static str>,
    base: &'static str,
}

impl Loggers {
    /// Every logger at `level` (an Envoy level name, or `warn`).
    pub fn new(level: &str) -> Result<Loggers, LevelError> {
        let level = level_of(level)?;
        Ok(Loggers {
            levels: vec![level; NAMES.len()],
            base: level,
        })
    }

    /// Sets every logger to `level`.
    pub fn set_all(&mut self, level: &str) -> Result<(), LevelError> {
        *self = Loggers::new(level)?;
        Ok(())
    }

    /// Sets `name:level` pairs, separated by `,` (all or none).
    pub fn set_paths(&mut self, pairs: &str) -> Result<(), LevelError> {
        let mut next = self.clone();
        for pair in pairs.split(',').filter(|p| !p.is_empty()) {
            let (name, level) = pair.split_once(':').ok_or(LevelError::UnknownLevel)?;
            next.set_one(name, level)?;
        }
        *self = next;
        Ok(())
    }

    /// Sets one logger.
    pub fn set_one(&mut self, name: &str, level: &str) -> Result<(), LevelError> {
        let level = level_of(level)?;
        let i = NAMES
            .iter()
            .position(|n| *n == name)
            .ok_or(LevelError::UnknownName)?;
        self.levels[i] = level;
        Ok(())
    }

    /// `/logging`'s listing: `active loggers:`, a line `  name: level` per logger, and an
    /// empty line, as Envoy writes it.
    pub fn listing(&self) -> String {
        let mut out = String::from("active loggers:\n");
        for (name, level) in NAMES.iter().zip(&self.levels) {
            out.push_str(&format!("  {name}: {level}\n"));
        }
        out.push('\n');
        out
    }

    /// The tracing filter directive: the base level, and each revoy target at the most
    /// verbose level of the loggers that stand for it, where that differs.
    pub fn directive(&self) -> String {
        let mut out = tracing_level(self.base).to_owned();
        let mut targets: Vec<&str> = TARGETS.iter().map(|(_, t)| *t).collect();
        targets.sort_unstable();
        targets.dedup();
        for target in targets {
            let level = TARGETS
                .iter()
                .filter(|(_, t)| *t == target)
                .filter_map(|(n, _)| NAMES.iter().position(|x| x == n))
                .map(|i| self.levels[i])
                .max_by_key(|l| verbosity(l))
                .unwrap_or(self.base);
            if level != self.base {
                out.push_str(&format!(",{target}={}", tracing_level(level)));
            }
        }
        out
    }
}

fn level_of(name: &str) -> Result<&'static str, LevelError> {
    let name = if name == "warn" { "warning" } else { name };
    LEVELS
        .iter()
        .find(|l| **l == name)
        .copied()
        .ok_or(LevelError::UnknownLevel)
}

fn verbosity(level: &str) -> usize {
    LEVELS.iter().position(|l| *l == level).unwrap_or(0)
}

/// tracing's name for an Envoy level (`warning` -> `warn`, `critical` -> `error`).
fn tracing_level(level: &str) -> &'static str {
    match level {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" => "warn",
        "error" | "critical" => "error",
        _ => "off",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_change_per_logger_and_drive_the_targets() {
        let mut l = Loggers::new("warning").unwrap();
        assert_eq!(l.directive(), "warn");
        l.set_paths("upstream:debug,router:trace").unwrap();
        assert_eq!(
            l.directive(),
            "warn,revoy::http=trace,revoy::upstream=debug"
        );
        assert!(
            l.listing()
                .contains("\n  upstream: debug\n  udp: warning\n")
        );
        assert_eq!(
            l.set_paths("upstream:info,nope:debug"),
            Err(LevelError::UnknownName)
        );
        assert!(l.listing().contains("  upstream: debug\n"), "all or none");
        assert_eq!(l.set_one("misc", "loud"), Err(LevelError::UnknownLevel));
        l.set_all("critical").unwrap();
        assert_eq!(l.directive(), "error");
    }
}
