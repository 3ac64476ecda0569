//! Collected samples, their medians, and the Markdown / JSON / SVG outputs.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::{Value, json};

use crate::contender::Kind;
use crate::stats::median;

/// A metric: key (JSON) and column title (Markdown).
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// JSON key.
    pub key: &'static str,
    /// Column title.
    pub title: &'static str,
}

/// Every metric, in column order.
pub const METRICS: [Metric; 26] = [
    Metric {
        key: "rps",
        title: "req/s",
    },
    Metric {
        key: "handshakes_s",
        title: "handshakes/s",
    },
    Metric {
        key: "mib_s",
        title: "MiB/s",
    },
    Metric {
        key: "cpu_us_per_req",
        title: "CPU µs/req",
    },
    Metric {
        key: "cpu_ms_per_s",
        title: "CPU ms/s",
    },
    Metric {
        key: "cpu_us_per_handshake",
        title: "CPU µs/handshake",
    },
    Metric {
        key: "cpu_ms_per_gib",
        title: "CPU ms/GiB",
    },
    Metric {
        key: "sys_pct",
        title: "kernel % of CPU",
    },
    Metric {
        key: "log_bytes_per_req",
        title: "access-log bytes written/req",
    },
    Metric {
        key: "all_cpu_ms_per_gib",
        title: "all processes' CPU ms/GiB",
    },
    Metric {
        key: "cores_busy",
        title: "cores busy",
    },
    Metric {
        key: "bound_mib_s",
        title: "MiB/s at every core busy",
    },
    Metric {
        key: "p50_us",
        title: "p50 µs",
    },
    Metric {
        key: "p99_us",
        title: "p99 µs",
    },
    Metric {
        key: "p999_us",
        title: "p99.9 µs",
    },
    Metric {
        key: "added_p99_us",
        title: "added p99 µs",
    },
    Metric {
        key: "rss_mib",
        title: "RSS MiB after the run",
    },
    Metric {
        key: "idle_rss_mib",
        title: "idle RSS MiB",
    },
    Metric {
        key: "peak_rss_mib",
        title: "peak RSS MiB",
    },
    Metric {
        key: "mesh_idle_rss_mib",
        title: "mesh idle RSS MiB",
    },
    Metric {
        key: "mesh_peak_rss_mib",
        title: "mesh peak RSS MiB",
    },
    Metric {
        key: "kib_per_idle_conn",
        title: "KiB per idle connection",
    },
    Metric {
        key: "kib_per_idle_tls_conn",
        title: "KiB per idle TLS connection",
    },
    Metric {
        key: "kib_per_idle_tls_conn_reencrypt",
        title: "KiB per idle TLS connection, re-encrypting",
    },
    Metric {
        key: "resumed",
        title: "resumed handshakes",
    },
    Metric {
        key: "errors",
        title: "errors",
    },
];

/// Samples per scenario, contender and metric (one per round).
#[derive(Debug, Default)]
pub struct Results {
    samples: BTreeMap<(String, &'static str), BTreeMap<&'static str, Vec<f64>>>,
    scenarios: Vec<String>,
}

impl Results {
    /// Records one sample.
    pub fn record(&mut self, scenario: &str, contender: Kind, metric: &'static str, value: f64) {
        if !self.scenarios.iter().any(|s| s == scenario) {
            self.scenarios.push(scenario.to_string());
        }
        self.samples
            .entry((scenario.to_string(), contender.name()))
            .or_default()
            .entry(metric)
            .or_default()
            .push(value);
    }

    /// The median of the samples of one cell.
    pub fn median(&self, scenario: &str, contender: Kind, metric: &str) -> Option<f64> {
        median(
            self.samples
                .get(&(scenario.to_string(), contender.name()))?
                .get(metric)?,
        )
    }

    /// Scenarios in the order they were first recorded.
    pub fn scenarios(&self) -> &[String] {
        &self.scenarios
    }

    /// Fills `added_p99_us` (p99 minus direct's p99) for every scenario with latencies.
    pub fn derive_added_latency(&mut self) {
        for scenario in self.scenarios.clone() {
            let Some(direct) = self.median(&scenario, Kind::Direct, "p99_us") else {
                continue;
            };
            for kind in Kind::ALL {
                if let Some(p99) = self.median(&scenario, kind, "p99_us") {
                    self.record(&scenario, kind, "added_p99_us", p99 - direct);
                }
            }
        }
    }

    /// Medians as JSON: `{scenario: {contender: {metric: median}}}`, plus raw samples.
    pub fn to_json(&self) -> Value {
        let mut medians = serde_json::Map::new();
        let mut raw = serde_json::Map::new();
        for ((scenario, contender), metrics) in &self.samples {
            let m = medians
                .entry(scenario.clone())
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("object");
            let r = raw
                .entry(scenario.clone())
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("object");
            let cell: serde_json::Map<String, Value> = metrics
                .iter()
                .map(|(k, v)| (k.to_string(), json!(median(v))))
                .collect();
            m.insert(contender.to_string(), Value::Object(cell));
            r.insert(contender.to_string(), json!(metrics));
        }
        json!({"medians": medians, "samples": raw})
    }

    /// Whether any contender has a sample of `metric` in `scenario`.
    pub fn has(&self, scenario: &str, metric: &str) -> bool {
        Kind::ALL
            .iter()
            .any(|&k| self.median(scenario, k, metric).is_some())
    }

    /// One Markdown table per scenario; each cell shows the median and its ratio to Envoy.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        for scenario in &self.scenarios {
            let columns: Vec<Metric> = METRICS
                .into_iter()
                .filter(|m| self.has(scenario, m.key))
                .collect();
            let _ = writeln!(out, "#### {scenario}\n");
            let _ = writeln!(
                out,
                "| contender | {} |",
                columns
                    .iter()
                    .map(|m| m.title)
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            let _ = writeln!(out, "|---|{}", "---:|".repeat(columns.len()));
            for kind in Kind::ALL {
                if columns
                    .iter()
                    .all(|m| self.median(scenario, kind, m.key).is_none())
                {
                    continue;
                }
                let cells: Vec<String> = columns
                    .iter()
                    .map(|m| self.cell(scenario, kind, m.key))
                    .collect();
                let _ = writeln!(out, "| {} | {} |", kind.name(), cells.join(" | "));
            }
            out.push('\n');
        }
        out
    }

    fn cell(&self, scenario: &str, kind: Kind, metric: &str) -> String {
        let Some(value) = self.median(scenario, kind, metric) else {
            return "—".into();
        };
        let shown = format_value(value);
        if matches!(metric, "errors" | "resumed") || kind == Kind::Envoy {
            return shown;
        }
        match self.median(scenario, Kind::Envoy, metric) {
            Some(envoy) if envoy.abs() > f64::EPSILON => format!("{shown} ({:.2}×)", value / envoy),
            _ => shown,
        }
    }
}

/// The machine in one line: CPU model, cores, RAM, kernel.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']))
        .unwrap_or("?");
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib / 1024 / 1024);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{model}, {cores} cores, {mem} GiB RAM, Linux {}",
        kernel.trim()
    )
}

/// The first non-empty line `program arg` prints (its version), or "" if it cannot run.
pub fn version(program: &std::path::Path, arg: &str) -> String {
    std::process::Command::new(program)
        .arg(arg)
        .output()
        .map(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// A target row: its description, the measured value (a ratio or figure) as shown, and
/// whether it is met (`None`: not measured).
pub type Target = (String, String, Option<bool>);

/// Adds the row of a target: `value` compared with `limit` (at most, or at least).
pub fn check(
    out: &mut Vec<Target>,
    name: &str,
    value: Option<f64>,
    limit: f64,
    at_most: bool,
    unit: &str,
) {
    let met = value.map(|v| if at_most { v <= limit } else { v >= limit });
    let shown = value.map_or("not measured".to_string(), |v| {
        format!("{}{unit}", format_value(v))
    });
    out.push((name.to_string(), shown, met));
}

/// The targets as a Markdown table.
pub fn targets_markdown(rows: &[Target]) -> String {
    let mut out = String::from("| target | revoy | met |\n|---|---:|---|\n");
    for (name, value, met) in rows {
        let met = match met {
            Some(true) => "met",
            Some(false) => "not met",
            None => "—",
        };
        out += &format!("| {name} | {value} | {met} |\n");
    }
    out
}

/// The targets as JSON rows.
pub fn targets_json(rows: &[Target]) -> Value {
    rows.iter()
        .map(|(n, v, m)| json!({"target": n, "revoy": v, "met": m}))
        .collect()
}

/// Rounds a figure for a table: integers above 100, one decimal above 10, else two.
pub fn format_value(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// Height of a bar chart's title line, in pixels.
const TITLE_HEIGHT: f64 = 26.0;
/// Height of each bar's row in a bar chart, in pixels.
const BAR_HEIGHT: f64 = 26.0;

/// A horizontal bar chart (SVG fragment) at (`x`, `y`) with the given width.
fn bar_chart(out: &mut String, title: &str, bars: &[(&str, f64)], x: f64, y: f64, width: f64) {
    let max = bars
        .iter()
        .map(|b| b.1)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let label_width = 70.0;
    let bar_space = width - label_width - 70.0;
    let _ = writeln!(
        out,
        r#"<text x="{x}" y="{}" font-size="14" font-weight="bold">{title}</text>"#,
        y + 14.0
    );
    for (i, (name, value)) in bars.iter().enumerate() {
        let top = y + TITLE_HEIGHT + i as f64 * BAR_HEIGHT;
        let len = bar_space * value / max;
        let colour = match *name {
            "revoy" => "#d9480f",
            "revoy-xds" => "#f08c00",
            "revoy-base" => "#ffa94d",
            _ => "#4c6ef5",
        };
        let _ = writeln!(
            out,
            r#"<text x="{x}" y="{}" font-size="12">{name}</text>"#,
            top + 14.0
        );
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{top}" width="{len:.1}" height="18" fill="{colour}"/>"#,
            x + label_width
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" font-size="12">{}</text>"#,
            x + label_width + len + 4.0,
            top + 14.0,
            format_value(*value)
        );
    }
}

/// Whether a scenario is a memory row (drawn last).
fn is_memory(scenario: &str) -> bool {
    scenario == "memory" || scenario == "tls_memory"
}

/// The two charts of a scenario's row: what it delivers and what it costs, as
/// (metric, title) pairs; `None` for a scenario that has neither.
fn chart_pair(results: &Results, scenario: &str) -> Option<[(&'static str, &'static str); 2]> {
    let has = |metric: &str| results.has(scenario, metric);
    if scenario == "tls_memory" {
        return Some([
            (
                "kib_per_idle_tls_conn",
                "KiB per idle TLS connection (lower is better)",
            ),
            (
                "kib_per_idle_tls_conn_reencrypt",
                "the same, re-encrypting (lower is better)",
            ),
        ]);
    }
    if scenario == "memory" {
        let peak = if has("mesh_peak_rss_mib") {
            (
                "mesh_peak_rss_mib",
                "mesh config peak RSS MiB (lower is better)",
            )
        } else {
            ("peak_rss_mib", "peak RSS MiB (lower is better)")
        };
        return Some([("idle_rss_mib", "idle RSS MiB (lower is better)"), peak]);
    }
    if has("handshakes_s") {
        return Some([
            ("handshakes_s", "full handshakes/s (higher is better)"),
            (
                "cpu_us_per_handshake",
                "proxy CPU µs/handshake (lower is better)",
            ),
        ]);
    }
    if has("rps") {
        return Some([
            ("rps", "requests/s (higher is better)"),
            ("cpu_us_per_req", "proxy CPU µs/request (lower is better)"),
        ]);
    }
    if has("mib_s") {
        return Some([
            ("mib_s", "MiB/s (higher is better)"),
            ("cpu_ms_per_gib", "proxy CPU ms/GiB (lower is better)"),
        ]);
    }
    None
}

/// An SVG with a row per scenario (memory last): throughput and CPU cost per contender side
/// by side (for memory: idle and peak RSS; for the TLS config's: RSS per idle TLS connection).
pub fn svg_chart(results: &Results) -> String {
    let (mut order, memory): (Vec<&str>, Vec<&str>) = results
        .scenarios()
        .iter()
        .map(String::as_str)
        .partition(|s| !is_memory(s));
    order.extend(memory);
    let rows: Vec<Vec<ChartPanel>> = order
        .into_iter()
        .filter_map(|scenario| {
            let pair = chart_pair(results, scenario)?;
            Some(
                pair.into_iter()
                    .map(|(metric, title)| ChartPanel {
                        title: format!("{scenario}: {title}"),
                        bars: Kind::ALL
                            .iter()
                            .filter_map(|&k| Some((k.name(), results.median(scenario, k, metric)?)))
                            .collect(),
                    })
                    .collect(),
            )
        })
        .collect();
    svg_page(&rows)
}

/// One bar chart of an SVG page: its title and a (contender, value) bar each.
pub struct ChartPanel {
    /// The chart's title line.
    pub title: String,
    /// The bars, top to bottom.
    pub bars: Vec<(&'static str, f64)>,
}

/// An SVG page of bar charts, a row each, up to two side by side.
pub fn svg_page(rows: &[Vec<ChartPanel>]) -> String {
    let mut body = String::new();
    let mut y = 10.0;
    for row in rows {
        let mut height = 0;
        for (i, panel) in row.iter().enumerate() {
            height = height.max(panel.bars.len());
            let x = 10.0 + i as f64 * 500.0;
            bar_chart(&mut body, &panel.title, &panel.bars, x, y, 480.0);
        }
        y += TITLE_HEIGHT + height as f64 * BAR_HEIGHT + 20.0;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"{y:.0}\" font-family=\"sans-serif\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}</svg>\n"
    )
}

/// A bench binary's `main`: parses its options, runs it, and exits with 2 on bad options
/// and 1 on a failed run, each message prefixed by `name`.
pub fn run_main<O>(
    name: &str,
    parse: impl FnOnce() -> Result<O, String>,
    run: impl FnOnce(&O) -> Result<(), String>,
) {
    let opts = parse().unwrap_or_else(|e| {
        eprintln!("{name}: {e}");
        std::process::exit(2);
    });
    if let Err(e) = run(&opts) {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Results {
        let mut r = Results::default();
        for (kind, rps, p99) in [
            (Kind::Envoy, 10.0, 300.0),
            (Kind::Revoy, 40.0, 150.0),
            (Kind::Direct, 80.0, 100.0),
        ] {
            r.record("s", kind, "rps", rps);
            r.record("s", kind, "rps", rps + 2.0);
            r.record("s", kind, "rps", rps + 1.0);
            r.record("s", kind, "p99_us", p99);
        }
        r
    }

    #[test]
    fn medians_and_ratios() {
        let mut r = sample();
        assert_eq!(r.median("s", Kind::Revoy, "rps"), Some(41.0));
        r.derive_added_latency();
        assert_eq!(r.median("s", Kind::Envoy, "added_p99_us"), Some(200.0));
        assert_eq!(r.median("s", Kind::Revoy, "added_p99_us"), Some(50.0));
        let md = r.to_markdown();
        assert!(
            md.contains("| revoy | 41.0 (3.73×) | 150 (0.50×) | 50.0 (0.25×) |"),
            "{md}"
        );
        assert!(!md.contains("| haproxy"), "{md}");
        assert_eq!(r.to_json()["medians"]["s"]["envoy"]["rps"], json!(11.0));
    }

    #[test]
    fn chart_has_a_bar_per_contender_and_a_row_per_scenario() {
        let mut r = sample();
        for (kind, cpu) in [(Kind::Envoy, 40.0), (Kind::Revoy, 10.0)] {
            r.record("s", kind, "cpu_us_per_req", cpu);
            r.record("tcp", kind, "mib_s", cpu * 100.0);
            r.record("tcp", kind, "cpu_ms_per_gib", cpu * 20.0);
        }
        r.record("memory", Kind::Revoy, "idle_rss_mib", 6.0);
        r.record("memory", Kind::Revoy, "peak_rss_mib", 12.0);
        let svg = svg_chart(&r);
        assert!(svg.starts_with("<svg"));
        // s: 3 req/s bars, 2 CPU bars; tcp: 2 + 2; memory: 1 + 1.
        assert_eq!(svg.matches("<rect x=").count(), 11, "{svg}");
        for title in [
            "s: requests/s",
            "s: proxy CPU µs/request",
            "tcp: MiB/s",
            "tcp: proxy CPU ms/GiB",
            "memory: idle RSS MiB",
            "memory: peak RSS MiB (lower",
        ] {
            assert!(svg.contains(title), "{title} missing: {svg}");
        }
        assert!(
            svg.find("tcp: MiB/s") < svg.find("memory: idle"),
            "memory is the last row"
        );
    }
}
