//! `envoy.extensions.filters.http.lua.v3.Lua` and `LuaPerRoute` -> [`LuaConfig`] and
//! [`LuaPerRouteConfig`]: the filter's scripts, each loaded once here so that a script that
//! does not load (a syntax error, or an error while its top level runs) rejects the config as
//! Envoy's does (`script load error: ...`). The runtime is `crate::http::filters::lua`.

use std::collections::HashMap;
use std::sync::Arc;

use proto::pb::envoy::config::core::v3::DataSource;
use proto::pb::envoy::extensions::filters::http::lua::v3::{Lua, LuaPerRoute, lua_per_route};

use crate::config::tls::source;
use crate::config::{ConfigError, Context};

/// The entry point run on each request's headers.
pub const ON_REQUEST: &str = "envoy_on_request";
/// The entry point run on each response's headers.
pub const ON_RESPONSE: &str = "envoy_on_response";

/// One script, checked to load.
#[derive(Debug)]
pub struct LuaScript {
    /// Its source.
    pub source: Arc<str>,
    /// Whether it defines `envoy_on_request`.
    pub on_request: bool,
    /// Whether it defines `envoy_on_response`.
    pub on_response: bool,
}

impl LuaScript {
    /// Loads `source` into a fresh Lua state and runs its top level, as each worker's state
    /// does, to find its entry points; the error is Envoy's `script load error: ...`.
    pub fn load(source: &str) -> Result<LuaScript, String> {
        let lua = mlua::Lua::new();
        Self::run_top_level(&lua, source)
            .map_err(|e| format!("script load error: {}", message(&e)))?;
        let defines = |name: &str| {
            matches!(
                lua.globals().get::<mlua::Value>(name),
                Ok(mlua::Value::Function(_))
            )
        };
        Ok(LuaScript {
            source: Arc::from(source),
            on_request: defines(ON_REQUEST),
            on_response: defines(ON_RESPONSE),
        })
    }

    /// Runs `source`'s top level in `lua`, named as Envoy names it (`[string "first line..."]`
    /// in messages).
    pub fn run_top_level(lua: &mlua::Lua, source: &str) -> mlua::Result<()> {
        lua.load(source).set_name(source).exec()
    }
}

/// The message of a Lua error as Lua reports it (`[string "..."]:3: boom`), without mlua's
/// framing.
pub fn message(e: &mlua::Error) -> String {
    match e {
        mlua::Error::SyntaxError { message, .. } | mlua::Error::RuntimeError(message) => message
            .split_once("\nstack traceback:")
            .map_or(message.as_str(), |(m, _)| m)
            .to_owned(),
        mlua::Error::CallbackError { cause, .. } => message(cause),
        mlua::Error::WithContext { cause, .. } => message(cause),
        other => other.to_string(),
    }
}

/// The filter's configuration.
#[derive(Debug, Default)]
pub struct LuaConfig {
    /// The script run where no route names another (`inline_code`, else
    /// `default_source_code`).
    pub default: Option<Arc<LuaScript>>,
    /// `source_codes`, which routes name.
    pub named: HashMap<String, Arc<LuaScript>>,
    /// `clear_route_cache` (default true): the route is chosen again after a script changed
    /// the request headers.
    pub clear_route_cache: bool,
    /// `stat_prefix`: the filter's stats are `http.<hcm prefix>.lua.<stat_prefix>.*`.
    pub stat_prefix: String,
    /// `filter_context`, which `handle:filterContext()` returns where a route sets none.
    pub filter_context: Option<Arc<FilterContext>>,
}

/// A `filter_context` as JSON.
pub type FilterContext = serde_json::Map<String, serde_json::Value>;

/// A route's `LuaPerRoute`.
#[derive(Debug)]
pub struct LuaPerRouteConfig {
    /// What runs on the route.
    pub script: PerRouteScript,
    /// `filter_context`, replacing the filter's.
    pub filter_context: Option<Arc<FilterContext>>,
}

/// What a `LuaPerRoute` runs.
#[derive(Debug)]
pub enum PerRouteScript {
    /// `disabled`: the filter does nothing here.
    Disabled,
    /// `name`: the filter's `source_codes` entry run here (nothing runs when it has none,
    /// as in Envoy).
    Named(String),
    /// `source_code`: this script runs here.
    Source(Arc<LuaScript>),
}

/// Compiles the filter's configuration, loading every script.
pub fn compile(ctx: &Context<'_>, c: &Lua) -> Result<LuaConfig, ConfigError> {
    no_package_paths(&c.package_paths, &c.package_cpaths)?;
    #[allow(deprecated)]
    let inline = &c.inline_code;
    if !inline.is_empty() && c.default_source_code.is_some() {
        return Err(ConfigError::new(
            "",
            "Only one of inline_code or default_source_code can be set for the Lua filter.",
        ));
    }
    let default = if !inline.is_empty() {
        Some(script(inline, "inline_code")?)
    } else if let Some(source) = &c.default_source_code {
        Some(from_source(ctx, source, "default_source_code")?)
    } else {
        None
    };
    let mut named = HashMap::new();
    for (name, source) in &c.source_codes {
        let at = format!("source_codes[{name}]");
        named.insert(name.clone(), from_source(ctx, source, &at)?);
    }
    Ok(LuaConfig {
        default,
        named,
        clear_route_cache: c.clear_route_cache.is_none_or(|b| b.value),
        stat_prefix: c.stat_prefix.clone(),
        filter_context: c.filter_context.as_ref().map(context),
    })
}

/// Compiles a route's `LuaPerRoute`.
pub fn compile_per_route(
    ctx: &Context<'_>,
    c: &LuaPerRoute,
) -> Result<LuaPerRouteConfig, ConfigError> {
    no_package_paths(&c.package_paths, &c.package_cpaths)?;
    let script = match &c.r#override {
        Some(lua_per_route::Override::Disabled(true)) => PerRouteScript::Disabled,
        Some(lua_per_route::Override::Name(name)) if !name.is_empty() => {
            PerRouteScript::Named(name.clone())
        }
        Some(lua_per_route::Override::SourceCode(source)) => {
            PerRouteScript::Source(from_source(ctx, source, "source_code")?)
        }
        _ => {
            return Err(ConfigError::new(
                "",
                "LuaPerRoute: one of disabled (true), name or source_code is required",
            ));
        }
    };
    Ok(LuaPerRouteConfig {
        script,
        filter_context: c.filter_context.as_ref().map(context),
    })
}

/// A `filter_context` as the handle returns it.
fn context(s: &proto::pb::google::protobuf::Struct) -> Arc<FilterContext> {
    match crate::config::route::struct_to_json(s) {
        serde_json::Value::Object(m) => Arc::new(m),
        _ => Arc::default(),
    }
}

/// `package_paths` / `package_cpaths`: revoy loads no Lua modules from files.
fn no_package_paths(paths: &[String], cpaths: &[String]) -> Result<(), ConfigError> {
    for (field, set) in [("package_paths", paths), ("package_cpaths", cpaths)] {
        if !set.is_empty() {
            return Err(ConfigError::new(field, "is not supported by revoy"));
        }
    }
    Ok(())
}

/// The script a data source holds.
fn from_source(
    ctx: &Context<'_>,
    source: &DataSource,
    at: &str,
) -> Result<Arc<LuaScript>, ConfigError> {
    let bytes = source::data(ctx, Some(source), at)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| ConfigError::new(at, "the Lua source is not UTF-8"))?;
    script(&text, at)
}

/// Loads `source`, its error at `at`.
fn script(source: &str, at: &str) -> Result<Arc<LuaScript>, ConfigError> {
    LuaScript::load(source)
        .map(Arc::new)
        .map_err(|e| ConfigError::new(at, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_are_found_and_load_errors_named_as_envoy_does() {
        let s = LuaScript::load("function envoy_on_response(h) end").unwrap();
        assert!(!s.on_request && s.on_response);
        let e = LuaScript::load("function envoy_on_request(h) x = = 1\nend").unwrap_err();
        assert_eq!(
            e,
            "script load error: [string \"function envoy_on_request(h) x = = 1...\"]:1: unexpected symbol near '='"
        );
        let e = LuaScript::load("error('at load')").unwrap_err();
        assert_eq!(
            e,
            "script load error: [string \"error('at load')\"]:1: at load"
        );
    }

    #[test]
    fn per_route_configs_and_fields_revoy_lacks() {
        let io = crate::config::context::FakeIo::new();
        let ctx = Context::new(&io);
        let named = LuaPerRoute {
            r#override: Some(lua_per_route::Override::Name("n".into())),
            ..Default::default()
        };
        assert!(matches!(
            compile_per_route(&ctx, &named).unwrap().script,
            PerRouteScript::Named(n) if n == "n"
        ));
        let empty = LuaPerRoute::default();
        assert!(compile_per_route(&ctx, &empty).is_err());
        let paths = Lua {
            package_paths: vec!["/lib/?.lua".into()],
            ..Default::default()
        };
        let e = compile(&ctx, &paths).unwrap_err();
        assert!(e.to_string().contains("package_paths"), "{e}");
    }
}
