//! Envoy's `/stats` output formats: text (`name: value`), JSON and Prometheus.

use std::collections::BTreeMap;

use super::Metric;
use super::tags::TagProducer;
use regex::Regex;

/// Selects metrics like Envoy's `/stats?usedonly&filter=...`.
fn selected<'a>(
    metrics: &'a [(String, Metric)],
    used_only: bool,
    filter: Option<&'a Regex>,
) -> impl Iterator<Item = &'a (String, Metric)> {
    metrics.iter().filter(move |(name, m)| {
        (!used_only || m.used()) && filter.is_none_or(|f| f.is_match(name))
    })
}

/// `name: value` lines, sorted by name.
pub fn render_text(
    metrics: &[(String, Metric)],
    used_only: bool,
    filter: Option<&Regex>,
) -> String {
    let mut out = String::new();
    for (name, m) in selected(metrics, used_only, filter) {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(&m.value().to_string());
        out.push('\n');
    }
    out
}

/// `{"stats":[{"name":..,"value":..}]}` like Envoy's `/stats?format=json`.
pub fn render_json(
    metrics: &[(String, Metric)],
    used_only: bool,
    filter: Option<&Regex>,
) -> serde_json::Value {
    let stats: Vec<_> = selected(metrics, used_only, filter)
        .map(|(name, m)| serde_json::json!({"name": name, "value": m.value()}))
        .collect();
    serde_json::json!({ "stats": stats })
}

/// Prometheus text exposition as Envoy writes it: tags extracted by `tags` become labels, one
/// `# TYPE` line per metric family (`envoy_` + the tag-extracted name, sanitized).
pub fn render_prometheus(
    metrics: &[(String, Metric)],
    used_only: bool,
    filter: Option<&Regex>,
    tags: &TagProducer,
) -> String {
    // Envoy lists counter families, then gauge families, each sorted by name.
    let mut families: BTreeMap<(u8, String), Vec<(String, u64)>> = BTreeMap::new();
    for (name, m) in selected(metrics, used_only, filter) {
        let (extracted, tags) = tags.produce(name);
        let labels: Vec<String> = tags
            .iter()
            .map(|(n, v)| format!("{}=\"{}\"", sanitize(n), escape(v)))
            .collect();
        let order = match m {
            Metric::Counter(_) => 0,
            Metric::Gauge(_) => 1,
        };
        families
            .entry((order, format!("envoy_{}", sanitize(&extracted))))
            .or_default()
            .push((labels.join(","), m.value()));
    }
    let mut out = String::new();
    for ((order, family), series) in families {
        let kind = if order == 0 { "counter" } else { "gauge" };
        out.push_str(&format!("# TYPE {family} {kind}\n"));
        for (labels, value) in series {
            out.push_str(&format!("{family}{{{labels}}} {value}\n"));
        }
    }
    out
}

/// A Prometheus metric or label name: anything but ASCII letters, digits and `_` becomes `_`.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
