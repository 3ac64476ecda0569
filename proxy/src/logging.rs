//! Logging setup from `-l`, `--component-log-level` and `--log-path`, with a reload handle so
//! the admin `/logging` endpoint can change levels at run time.

use std::sync::{Mutex, OnceLock};

use crate::loggers::{LevelError, Loggers};

use tracing_subscriber::{
    EnvFilter, Registry, layer::SubscriberExt, reload, util::SubscriberInitExt,
};

static RELOAD: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();
static LOGGERS: OnceLock<Mutex<Loggers>> = OnceLock::new();

/// Every logger at `level`, then `components` (`name:level` pairs, `,`-separated) over it.
/// Names Envoy does not have are left out and returned.
fn loggers(level: &str, components: &str) -> Result<(Loggers, Vec<String>), String> {
    let mut l = Loggers::new(level).map_err(|_| format!("invalid log level '{level}'"))?;
    let mut unknown = Vec::new();
    for pair in components.split(',').filter(|p| !p.is_empty()) {
        let (name, lvl) = pair
            .split_once(':')
            .ok_or_else(|| format!("component log level '{pair}' is not component:level"))?;
        match l.set_one(name, lvl) {
            Ok(()) => {}
            Err(LevelError::UnknownName) => unknown.push(name.to_owned()),
            Err(_) => return Err(format!("invalid log level '{lvl}' for component '{name}'")),
        }
    }
    Ok((l, unknown))
}

/// Installs the global subscriber. Returns the components Envoy has no logger for.
pub fn init(level: &str, components: &str, path: Option<&str>) -> Result<Vec<String>, String> {
    let (loggers, unknown) = loggers(level, components)?;
    let filter = EnvFilter::try_new(loggers.directive()).map_err(|e| e.to_string())?;
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
    let _ = LOGGERS.set(Mutex::new(loggers));
    Ok(unknown)
}

/// Applies `/logging`'s parameters as Envoy does: none lists, `level=` sets every logger,
/// `paths=name:level,...` sets some, `name=level` sets one, and more than one parameter is
/// refused. The loggers that stand for revoy's modules take effect at once.
pub fn change(params: &[(String, String)]) -> Result<(), LevelError> {
    let Some(state) = LOGGERS.get() else {
        return Ok(());
    };
    let mut loggers = state.lock().expect("loggers");
    match params {
        [] => return Ok(()),
        [(k, v)] if k == "level" => loggers.set_all(v)?,
        [(k, v)] if k == "paths" => loggers.set_paths(v)?,
        [(name, level)] => loggers.set_one(name, level)?,
        _ => return Err(LevelError::InvalidParameters),
    }
    if let (Some(h), Ok(filter)) = (RELOAD.get(), EnvFilter::try_new(loggers.directive())) {
        let _ = h.reload(filter);
    }
    Ok(())
}

/// `/logging`'s listing of every logger and its level.
pub fn listing() -> String {
    LOGGERS
        .get()
        .map(|l| l.lock().expect("loggers").listing())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoy_levels_and_components() {
        let (l, unknown) = loggers("warning", "upstream:debug,misc:error,nope:info").unwrap();
        assert_eq!(l.directive(), "warn,revoy::upstream=debug");
        assert_eq!(unknown, vec!["nope"]);
        assert!(loggers("loud", "").is_err());
        assert!(loggers("info", "upstream").is_err());
        assert!(loggers("info", "upstream:loud").is_err());
    }
}
