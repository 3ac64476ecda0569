//! Reading an admin's `/stats/prometheus` text.

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
