//! Loading the router-check inputs: the route configuration (a RouteConfiguration or a
//! Bootstrap whose first HTTP connection manager has an inline `route_config`) and the test
//! file (Envoy's `RouterCheckToolSchema.Validation` in JSON or YAML).

use proto::pb::envoy::config::route::v3::RouteConfiguration;
use proto::{Codec, Format};
use serde_json::Value;

/// Reads and decodes the route configuration at `path`.
pub fn load_route_config(codec: &Codec, path: &str) -> Result<RouteConfiguration, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let value = parse(&text, path)?;
    let value = if value.get("static_resources").is_some() || value.get("staticResources").is_some()
    {
        first_inline_route_config(&value).ok_or_else(|| {
            format!(
                "{path}: the bootstrap has no HTTP connection manager with an inline route_config"
            )
        })?
    } else {
        value
    };
    let mut value = value;
    durations_as_strings(&mut value);
    codec
        .decode::<RouteConfiguration>(value, false)
        .map(|d| d.message)
        .map_err(|e| format!("{path}: {e}"))
}

/// Parses JSON (leniently: trailing commas allowed, like upstream's parser) or YAML.
pub fn parse(text: &str, path: &str) -> Result<Value, String> {
    let format = Format::from_path(path);
    let text = match format {
        Format::Json => strip_trailing_commas(text),
        Format::Yaml => text.to_owned(),
    };
    Codec::parse_text(&text, format).map_err(|e| format!("{path}: {e}"))
}

fn get<'v>(v: &'v Value, snake: &str, camel: &str) -> Option<&'v Value> {
    v.get(snake).or_else(|| v.get(camel))
}

fn first_inline_route_config(bootstrap: &Value) -> Option<Value> {
    let listeners = get(bootstrap, "static_resources", "staticResources")?.get("listeners")?;
    for listener in listeners.as_array()? {
        let chains = get(listener, "filter_chains", "filterChains").and_then(Value::as_array);
        for chain in chains.into_iter().flatten() {
            for filter in chain
                .get("filters")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let config = get(filter, "typed_config", "typedConfig");
                if let Some(rc) = config.and_then(|c| get(c, "route_config", "routeConfig")) {
                    return Some(rc.clone());
                }
            }
        }
    }
    None
}

/// Rewrites `{seconds, nanos}` objects as proto3-JSON duration strings (Envoy's loader accepts
/// both forms; upstream's test configs use the object form).
fn durations_as_strings(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let is_duration = !map.is_empty()
                && map.keys().all(|k| k == "seconds" || k == "nanos")
                && map.values().all(|x| x.is_number() || x.is_string());
            if is_duration {
                let num = |k: &str| {
                    map.get(k)
                        .and_then(|x| {
                            x.as_i64()
                                .or_else(|| x.as_str().and_then(|s| s.parse().ok()))
                        })
                        .unwrap_or(0)
                };
                let (secs, nanos) = (num("seconds"), num("nanos"));
                *v = Value::String(format!("{secs}.{nanos:09}s"));
            } else {
                map.values_mut().for_each(durations_as_strings);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(durations_as_strings),
        _ => {}
    }
}

/// Removes commas that directly precede `]` or `}` (outside strings).
pub fn strip_trailing_commas(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut pending_comma: Option<String> = None;
    for c in text.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if let Some(pending) = pending_comma.as_mut() {
            if c.is_whitespace() {
                pending.push(c);
                continue;
            }
            let pending = pending_comma.take().unwrap_or_default();
            if c == ']' || c == '}' {
                out.push_str(&pending[1..]);
            } else {
                out.push_str(&pending);
            }
        }
        match c {
            ',' => pending_comma = Some(String::from(",")),
            '"' => {
                in_string = true;
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    if let Some(p) = pending_comma {
        out.push_str(&p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_commas() {
        assert_eq!(strip_trailing_commas("[1, 2, ]"), "[1, 2 ]");
        assert_eq!(
            strip_trailing_commas("{\"a\": \"x,]\",\n}"),
            "{\"a\": \"x,]\"\n}"
        );
        assert_eq!(strip_trailing_commas("[1,2]"), "[1,2]");
    }
}
