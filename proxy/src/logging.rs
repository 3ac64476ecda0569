//! Logging setup from `-l`, `--component-log-level` and `--log-path`, with a reload handle so
//! the admin `/logging` endpoint can change levels at run time.

use std::sync::OnceLock;

use tracing_subscriber::{
    EnvFilter, Registry, layer::SubscriberExt, reload, util::SubscriberInitExt,
};

static RELOAD: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();
static CURRENT: OnceLock<std::sync::Mutex<String>> = OnceLock::new();

/// Envoy component names and the revoy modules they stand for.
const COMPONENTS: &[(&str, &str)] = &[
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

/// Maps Envoy's level names to tracing's (`warning` -> `warn`, `critical` -> `error`).
pub fn level_name(envoy: &str) -> Option<&'static str> {
    Some(match envoy {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warning" | "warn" => "warn",
        "error" | "critical" => "error",
        "off" => "off",
        _ => return None,
    })
}

/// Builds the filter directive for a default level plus `component:level` pairs.
/// Components revoy has no module for are reported back.
pub fn directives(level: &str, components: &str) -> Result<(String, Vec<String>), String> {
    let base = level_name(level).ok_or_else(|| format!("invalid log level '{level}'"))?;
    let mut out = base.to_owned();
    let mut unmapped = Vec::new();
    for pair in components.split(',').filter(|p| !p.is_empty()) {
        let (name, lvl) = pair
            .split_once(':')
            .ok_or_else(|| format!("component log level '{pair}' is not component:level"))?;
        let lvl = level_name(lvl)
            .ok_or_else(|| format!("invalid log level '{lvl}' for component '{name}'"))?;
        let targets: Vec<_> = COMPONENTS
            .iter()
            .filter(|(c, _)| *c == name)
            .map(|(_, t)| *t)
            .collect();
        if targets.is_empty() {
            unmapped.push(name.to_owned());
        }
        for t in targets {
            out.push_str(&format!(",{t}={lvl}"));
        }
    }
    Ok((out, unmapped))
}

/// Installs the global subscriber. Returns the components that map to nothing in revoy.
pub fn init(level: &str, components: &str, path: Option<&str>) -> Result<Vec<String>, String> {
    let (directive, unmapped) = directives(level, components)?;
    let filter = EnvFilter::try_new(&directive).map_err(|e| e.to_string())?;
    let (layer, handle) = reload::Layer::new(filter);
    let writer: Box<dyn Fn() -> Box<dyn std::io::Write> + Send + Sync> = match path {
        Some(p) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("cannot open log path {p}: {e}"))?;
            Box::new(move || Box::new(file.try_clone().expect("clone log file")))
        }
        None => Box::new(|| Box::new(std::io::stderr())),
    };
    tracing_subscriber::registry()
        .with(layer)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_target(true)
                .with_ansi(path.is_none() && std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .try_init()
        .map_err(|e| e.to_string())?;
    let _ = RELOAD.set(handle);
    let _ = CURRENT.set(std::sync::Mutex::new(directive));
    Ok(unmapped)
}

/// Changes the active levels (admin `/logging`). Returns the new directive.
pub fn set(level: &str, components: &str) -> Result<String, String> {
    let (directive, _) = directives(level, components)?;
    let filter = EnvFilter::try_new(&directive).map_err(|e| e.to_string())?;
    if let Some(h) = RELOAD.get() {
        h.reload(filter).map_err(|e| e.to_string())?;
    }
    if let Some(c) = CURRENT.get() {
        *c.lock().expect("log directive") = directive.clone();
    }
    Ok(directive)
}

/// The active filter directive.
pub fn current() -> String {
    CURRENT
        .get()
        .map(|c| c.lock().expect("log directive").clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_levels_and_components() {
        let (d, unmapped) = directives("warning", "upstream:debug,misc:error").unwrap();
        assert_eq!(d, "warn,revoy::upstream=debug");
        assert_eq!(unmapped, vec!["misc"]);
        assert!(directives("loud", "").is_err());
        assert!(directives("info", "upstream").is_err());
    }
}
