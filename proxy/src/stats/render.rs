//! Envoy's `/stats` output formats: text (`name: value`), JSON and Prometheus.

use super::Metric;
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

/// Prometheus text exposition: `envoy_` prefix, dots to underscores, TYPE lines.
pub fn render_prometheus(
    metrics: &[(String, Metric)],
    used_only: bool,
    filter: Option<&Regex>,
) -> String {
    let mut out = String::new();
    for (name, m) in selected(metrics, used_only, filter) {
        let prom: String = format!("envoy_{name}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let kind = match m {
            Metric::Counter(_) => "counter",
            Metric::Gauge(_) => "gauge",
        };
        out.push_str(&format!("# TYPE {prom} {kind}\n{prom}{{}} {}\n", m.value()));
    }
    out
}
