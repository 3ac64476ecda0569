//! Reading an admin's `/stats/prometheus` text.
// Each test binary that includes this file uses part of it.
#![allow(dead_code)]

/// The series of `family` in a `/stats/prometheus` text: labels in order, and the value.
pub fn series(text: &str, family: &str) -> Vec<(Vec<(String, String)>, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
        .map(|rest| {
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            let labels = labels
                .split("\",")
                .map(|pair| {
                    let (k, v) = pair.split_once("=\"").unwrap();
                    (k.to_owned(), v.trim_end_matches('"').to_owned())
                })
                .collect();
            (labels, value.to_owned())
        })
        .collect()
}

/// The value of the label `name` among `labels` (empty when absent).
pub fn label(labels: &[(String, String)], name: &str) -> String {
    labels
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}
