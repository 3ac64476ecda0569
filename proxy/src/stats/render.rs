//! Envoy's `/stats` output formats: text (`name: value`, text readouts as `name: "text"`,
//! histograms as quantile or bucket lines), JSON and Prometheus.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::circllhist::{self, QUANTILES};
use super::histogram::HistogramView;
use super::number;
use super::tags::TagProducer;
use super::{Metric, TextReadout, circllhist::Bin};
use regex::Regex;

/// Which stats a request asks for: Envoy's `usedonly` and `filter`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selection<'a> {
    /// Only those ever written (histograms: with values at the last flush).
    pub used_only: bool,
    /// Only those whose name the regex finds a match in.
    pub filter: Option<&'a Regex>,
    /// Only those the bootstrap's `stats_matcher` keeps.
    pub matcher: Option<&'a super::matcher::StatsMatcher>,
}

impl Selection<'_> {
    fn takes(&self, name: &str, used: bool) -> bool {
        (!self.used_only || used)
            && self.filter.is_none_or(|f| f.is_match(name))
            && self.matcher.is_none_or(|m| m.keeps(name))
    }
}

/// How histograms are shown: Envoy's `histogram_buckets` parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BucketsMode {
    /// Quantiles (`summary`, the default).
    #[default]
    Summary,
    /// Samples at or below each bucket bound.
    Cumulative,
    /// Samples per bucket.
    Disjoint,
    /// The circllhist bins themselves, and the quantiles.
    Detailed,
}

impl BucketsMode {
    /// Parses the parameter as Envoy does for `/stats` (`prometheusnative` is only for
    /// `/stats/prometheus`); `Err` is Envoy's 400 text.
    pub fn parse(value: Option<&str>) -> Result<Self, &'static str> {
        match value {
            None | Some("summary") => Ok(BucketsMode::Summary),
            Some("cumulative") => Ok(BucketsMode::Cumulative),
            Some("disjoint") => Ok(BucketsMode::Disjoint),
            Some("detailed") => Ok(BucketsMode::Detailed),
            Some("prometheusnative") => {
                Err("Invalid histogram_buckets type for non prometheus stats type")
            }
            Some(_) => Err(
                "usage: /stats?histogram_buckets=(cumulative|disjoint|detailed|summary|prometheusnative)\n",
            ),
        }
    }
}

/// Selects metrics like Envoy's `/stats?usedonly&filter=...`.
fn selected<'a>(
    metrics: &'a [(String, Metric)],
    sel: Selection<'a>,
) -> impl Iterator<Item = &'a (String, Metric)> {
    metrics
        .iter()
        .filter(move |(name, m)| sel.takes(name, m.used()))
}

fn selected_texts<'a>(
    texts: &'a [(String, TextReadout)],
    sel: Selection<'a>,
) -> impl Iterator<Item = (&'a str, String)> {
    texts
        .iter()
        .filter(move |(name, t)| sel.takes(name, t.used()))
        .map(|(name, t)| (name.as_str(), t.value()))
}

fn selected_histograms<'a>(
    histograms: &'a [HistogramView],
    sel: Selection<'a>,
) -> impl Iterator<Item = &'a HistogramView> {
    histograms
        .iter()
        .filter(move |h| sel.takes(&h.name, h.used()))
}

/// The text readouts' `name: "text"` lines (the text as it is, unescaped, as Envoy prints
/// it), `name: value` lines sorted by name, then the histograms' lines.
pub fn render_text(
    metrics: &[(String, Metric)],
    texts: &[(String, TextReadout)],
    histograms: &[HistogramView],
    sel: Selection<'_>,
    mode: BucketsMode,
) -> String {
    let mut out = String::new();
    for (name, text) in selected_texts(texts, sel) {
        out.push_str(name);
        out.push_str(": \"");
        out.push_str(&text);
        out.push_str("\"\n");
    }
    for (name, m) in selected(metrics, sel) {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(&m.value().to_string());
        out.push('\n');
    }
    for h in selected_histograms(histograms, sel) {
        out.push_str(&h.name);
        if !h.used() {
            out.push_str(": No recorded values\n");
            continue;
        }
        match mode {
            BucketsMode::Summary => {
                out.push_str(": ");
                out.push_str(&quantile_summary(h));
            }
            BucketsMode::Cumulative | BucketsMode::Disjoint => {
                let (interval, cumulative) = buckets(h, mode);
                out.push_str(": ");
                let lines: Vec<String> = h
                    .bounds
                    .iter()
                    .zip(interval.iter().zip(&cumulative))
                    .map(|(b, (i, c))| format!("B{}({i},{c})", number::general(*b, 6)))
                    .collect();
                out.push_str(&lines.join(" "));
            }
            BucketsMode::Detailed => {
                out.push_str(":\n  totals=");
                out.push_str(&detail(h.cumulative()));
                out.push_str("\n  intervals=");
                out.push_str(&detail(h.interval()));
                out.push_str("\n  summary=");
                out.push_str(&quantile_summary(h));
            }
        }
        out.push('\n');
    }
    out
}

/// `P0(interval,cumulative) P25(..) ..`.
fn quantile_summary(h: &HistogramView) -> String {
    let interval = circllhist::quantiles(h.interval());
    let cumulative = circllhist::quantiles(h.cumulative());
    QUANTILES
        .iter()
        .zip(interval.iter().zip(&cumulative))
        .map(|(q, (i, c))| {
            format!(
                "P{}({},{})",
                number::general(q * 100.0, 6),
                number::shortest(*i),
                number::shortest(*c)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The interval's and the cumulative view's counts per bucket bound, cumulative or disjoint.
fn buckets(h: &HistogramView, mode: BucketsMode) -> (Vec<u64>, Vec<u64>) {
    let count = if mode == BucketsMode::Disjoint {
        circllhist::disjoint
    } else {
        circllhist::cumulative
    };
    (
        count(h.interval(), &h.bounds),
        count(h.cumulative(), &h.bounds),
    )
}

/// `lower,width:count, ..` of each bin.
fn detail(bins: &[(Bin, u64)]) -> String {
    bins.iter()
        .map(|(b, c)| {
            format!(
                "{},{}:{c}",
                number::general(circllhist::lower(*b), 6),
                number::general(circllhist::width(*b), 6)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `{"stats":[{"name":..,"value":..}, .., {"histograms":..}]}` like Envoy's
/// `/stats?format=json` (text readouts first, their values strings); the histograms' entry
/// only when some are selected.
pub fn render_json(
    metrics: &[(String, Metric)],
    texts: &[(String, TextReadout)],
    histograms: &[HistogramView],
    sel: Selection<'_>,
    mode: BucketsMode,
) -> serde_json::Value {
    let mut stats: Vec<_> = selected_texts(texts, sel)
        .map(|(name, text)| serde_json::json!({"name": name, "value": text}))
        .collect();
    stats.extend(
        selected(metrics, sel)
            .map(|(name, m)| serde_json::json!({"name": name, "value": m.value()})),
    );
    let chosen: Vec<&HistogramView> = selected_histograms(histograms, sel).collect();
    if !chosen.is_empty() {
        stats.push(serde_json::json!({ "histograms": json_histograms(&chosen, mode) }));
    }
    serde_json::json!({ "stats": stats })
}

fn supported_percentiles() -> Vec<serde_json::Value> {
    QUANTILES.iter().map(|q| number::json(q * 100.0)).collect()
}

/// Per quantile, `{"cumulative":..,"interval":..}`.
fn json_percentiles(h: &HistogramView) -> Vec<serde_json::Value> {
    let interval = circllhist::quantiles(h.interval());
    let cumulative = circllhist::quantiles(h.cumulative());
    cumulative
        .iter()
        .zip(&interval)
        .map(|(c, i)| serde_json::json!({"cumulative": number::json(*c), "interval": number::json(*i)}))
        .collect()
}

fn json_histograms(chosen: &[&HistogramView], mode: BucketsMode) -> serde_json::Value {
    match mode {
        BucketsMode::Summary => {
            let computed: Vec<_> = chosen
                .iter()
                .map(|h| serde_json::json!({"name": h.name, "values": json_percentiles(h)}))
                .collect();
            serde_json::json!({
                "supported_quantiles": supported_percentiles(),
                "computed_quantiles": computed,
            })
        }
        BucketsMode::Cumulative | BucketsMode::Disjoint => chosen
            .iter()
            .map(|h| {
                let (interval, cumulative) = buckets(h, mode);
                let buckets: Vec<_> = h
                    .bounds
                    .iter()
                    .zip(interval.iter().zip(&cumulative))
                    .map(|(b, (i, c))| {
                        serde_json::json!({"upper_bound": number::json(*b), "interval": i, "cumulative": c})
                    })
                    .collect();
                serde_json::json!({"name": h.name, "buckets": buckets})
            })
            .collect(),
        BucketsMode::Detailed => {
            let bins = |bins: &[(Bin, u64)]| -> Vec<serde_json::Value> {
                bins.iter()
                    .map(|(b, c)| {
                        serde_json::json!({
                            "lower_bound": number::json(circllhist::lower(*b)),
                            "width": number::json(circllhist::width(*b)),
                            "count": c,
                        })
                    })
                    .collect()
            };
            let details: Vec<_> = chosen
                .iter()
                .map(|h| {
                    serde_json::json!({
                        "name": h.name,
                        "totals": bins(h.cumulative()),
                        "intervals": bins(h.interval()),
                        "percentiles": json_percentiles(h),
                    })
                })
                .collect();
            serde_json::json!({
                "supported_percentiles": supported_percentiles(),
                "details": details,
            })
        }
    }
}

/// Prometheus text exposition as Envoy writes it: tags extracted by `tags` become labels, one
/// `# TYPE` line per metric family (`envoy_` + the tag-extracted name, sanitized). Text
/// readouts (those passed: Envoy shows them only when asked with `text_readouts`) are gauges
/// of value 0 whose text is the label `text_value`, after the other gauges.
///
/// Metrics made with their tags ([`super::Tagged`], in `tagged`) keep them instead; a name in
/// a custom stat namespace (Istio's `istiocustom`) loses it and gets no `envoy_` prefix.
pub fn render_prometheus(
    metrics: &[(String, Metric)],
    texts: &[(String, TextReadout)],
    histograms: &[HistogramView],
    sel: Selection<'_>,
    tags: &TagProducer,
    tagged: &HashMap<Box<str>, Arc<super::Tagged>>,
) -> String {
    let produce = |name: &str| -> (String, Vec<(&str, String)>) {
        match tagged.get(name) {
            Some(t) => (
                t.family.to_string(),
                t.tags.iter().map(|(k, v)| (&**k, v.to_string())).collect(),
            ),
            None => tags.produce(name),
        }
    };
    // Envoy lists counter families, then gauge families, then text readouts, each sorted by
    // tag-extracted name.
    let mut families: BTreeMap<(u8, Extracted), Vec<(String, u64)>> = BTreeMap::new();
    let labels_of = |tags: &[(&str, String)]| -> Vec<String> {
        tags.iter()
            .map(|(n, v)| format!("{}=\"{}\"", sanitize(n), escape(v)))
            .collect()
    };
    for (name, m) in selected(metrics, sel) {
        let (extracted, tags) = produce(name);
        let labels = labels_of(&tags);
        let order = match m {
            Metric::Counter(_) => 0,
            Metric::Gauge(_) => 1,
        };
        families
            .entry((order, Extracted(extracted)))
            .or_default()
            .push((labels.join(","), m.value()));
    }
    for (name, text) in selected_texts(texts, sel) {
        let (extracted, tags) = tags.produce(name);
        let mut labels = labels_of(&tags);
        labels.push(format!("text_value=\"{}\"", escape(&text)));
        families
            .entry((2, Extracted(extracted)))
            .or_default()
            .push((labels.join(","), 0));
    }
    let mut out = String::new();
    for ((order, extracted), series) in families {
        let family = extracted.family();
        let kind = if order == 0 { "counter" } else { "gauge" };
        out.push_str(&format!("# TYPE {family} {kind}\n"));
        for (labels, value) in series {
            out.push_str(&format!("{family}{{{labels}}} {value}\n"));
        }
    }
    // Then the histogram families: cumulative buckets, `+Inf`, `_sum` and `_count`.
    let mut hfamilies: BTreeMap<Extracted, Vec<(String, &HistogramView)>> = BTreeMap::new();
    for h in selected_histograms(histograms, sel) {
        let (extracted, tags) = produce(&h.name);
        hfamilies
            .entry(Extracted(extracted))
            .or_default()
            .push((labels_of(&tags).join(","), h));
    }
    for (extracted, series) in hfamilies {
        let family = extracted.family();
        out.push_str(&format!("# TYPE {family} histogram\n"));
        for (labels, h) in series {
            let sep = if labels.is_empty() { "" } else { "," };
            let bins = h.cumulative();
            for (bound, count) in h.bounds.iter().zip(circllhist::cumulative(bins, &h.bounds)) {
                let le = number::general(*bound, 32);
                out.push_str(&format!(
                    "{family}_bucket{{{labels}{sep}le=\"{le}\"}} {count}\n"
                ));
            }
            let count = circllhist::count(bins);
            out.push_str(&format!(
                "{family}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}\n"
            ));
            let sum = number::general(circllhist::sum(bins), 32);
            out.push_str(&format!("{family}_sum{{{labels}}} {sum}\n"));
            out.push_str(&format!("{family}_count{{{labels}}} {count}\n"));
        }
    }
    out
}

/// The custom stat namespaces extensions register (Envoy's `customStatNamespaces`): only
/// Istio's stats filter's here.
const CUSTOM_NAMESPACES: [&str; 1] = ["istiocustom"];

/// A tag-extracted stat name, ordered as Envoy orders stat names: token by token (so
/// `cluster.version_text` comes before `cluster_manager.cds.version_text`).
#[derive(PartialEq, Eq)]
struct Extracted(String);

impl Extracted {
    /// The Prometheus family: `envoy_` and the name, sanitized; a name in a custom stat
    /// namespace without it and without the `envoy_`.
    fn family(&self) -> String {
        match CUSTOM_NAMESPACES
            .iter()
            .find_map(|ns| self.0.strip_prefix(ns)?.strip_prefix('.'))
        {
            Some(rest) => sanitize(rest),
            None => format!("envoy_{}", sanitize(&self.0)),
        }
    }
}

impl Ord for Extracted {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.split('.').cmp(other.0.split('.'))
    }
}

impl PartialOrd for Extracted {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Envoy 1.40's output for a CDS `version_info` of `a<b>&c'd\e` newline `f` tab `g é`.
    #[test]
    fn text_readouts_read_as_envoys() {
        let version = "a<b>&c'd\\e\nf\tg é";
        let readout = TextReadout::default();
        readout.set(version);
        let texts = [("cluster_manager.cds.version_text".to_owned(), readout)];
        let all = Selection::default();
        assert_eq!(
            render_text(&[], &texts, &[], all, BucketsMode::Summary),
            "cluster_manager.cds.version_text: \"a<b>&c'd\\e\nf\tg é\"\n"
        );
        assert_eq!(
            render_json(&[], &texts, &[], all, BucketsMode::Summary).to_string(),
            r#"{"stats":[{"name":"cluster_manager.cds.version_text","value":"a<b>&c'd\\e\nf\tg é"}]}"#
        );
        assert_eq!(
            render_prometheus(
                &[],
                &texts,
                &[],
                all,
                &TagProducer::default(),
                &HashMap::new()
            ),
            "# TYPE envoy_cluster_manager_cds_version_text gauge\n\
             envoy_cluster_manager_cds_version_text{text_value=\"a<b>&c'd\\\\e\\nf\tg é\"} 0\n"
        );
        let used_only = Selection {
            used_only: true,
            ..Selection::default()
        };
        let unset = [("x.version_text".to_owned(), TextReadout::default())];
        assert_eq!(
            render_text(&[], &unset, &[], used_only, BucketsMode::Summary),
            ""
        );
    }
}
