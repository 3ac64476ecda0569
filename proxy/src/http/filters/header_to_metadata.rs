//! `envoy.filters.http.header_to_metadata`: request rules turn request headers (or cookies)
//! into dynamic metadata as the request passes, response rules response headers as the
//! response does (an [`super::Encoder`]). A route's config replaces the filter's, as Envoy's.
//!
//! Per rule, as Envoy 1.40: a header's values are joined with `,` (and the header removed
//! under `remove`); when present, `on_header_present` writes its `value`, else the header's
//! (rewritten by `regex_value_rewrite`); when missing, `on_header_missing` writes its
//! `value`. Nothing is written for an empty value, one of 8 KiB or more, one that is not
//! base64 under `BASE64`, a `NUMBER` that does not parse or a `PROTOBUF_VALUE` that does not
//! decode. What the rules write is set per namespace after all ran (top-level keys replaced).

use std::collections::BTreeMap;

use base64::Engine as _;
use http::HeaderMap;
use proto::pb::google::protobuf::{Struct, Value};

use crate::config::http_filter::header_to_metadata::{Pair, Rule, Source, ValueKind};
use crate::route::metadata::{DynamicMetadata, number_value, string_value};

/// Envoy's limit: values this long or longer are not written.
const MAX_VALUE_LEN: usize = 8 * 1024;

/// Applies `rules` to `headers`, writing what they yield into `metadata`.
pub(super) fn apply(rules: &[Rule], headers: &mut HeaderMap, metadata: &mut DynamicMetadata) {
    let mut written: BTreeMap<&str, Struct> = BTreeMap::new();
    for rule in rules {
        let found = extract(rule, headers);
        let (pair, value) = match (found, &rule.on_present, &rule.on_missing) {
            (Some(v), Some(pair), _) => (pair, v),
            (None, _, Some(pair)) => (pair, String::new()),
            _ => continue,
        };
        let value = if !pair.value.is_empty() {
            pair.value.clone()
        } else if let Some((re, sub)) = &pair.rewrite {
            re.replace_all(&value, sub.as_str()).into_owned()
        } else {
            value
        };
        if value.is_empty() {
            continue;
        }
        if let Some(v) = typed(pair, &value) {
            written
                .entry(&pair.namespace)
                .or_default()
                .fields
                .insert(pair.key.clone(), v);
        }
    }
    for (namespace, fields) in written {
        metadata.set(namespace, fields);
    }
}

/// The rule's value in `headers`, if present (a header removed under `remove`).
fn extract(rule: &Rule, headers: &mut HeaderMap) -> Option<String> {
    match &rule.source {
        Source::Header(None) => None,
        Source::Header(Some(name)) => {
            let mut values = headers.get_all(name).iter();
            let first = values.next()?;
            let mut joined = String::from_utf8_lossy(first.as_bytes()).into_owned();
            for v in values {
                joined.push(',');
                joined.push_str(&String::from_utf8_lossy(v.as_bytes()));
            }
            if rule.remove {
                headers.remove(name);
            }
            Some(joined)
        }
        Source::Cookie(name) => crate::route::policy::cookie_in(headers, name)
            .filter(|v| !v.is_empty())
            .map(str::to_owned),
    }
}

/// `value` decoded and typed as `pair` says, or `None` when it cannot be.
fn typed(pair: &Pair, value: &str) -> Option<Value> {
    if value.len() >= MAX_VALUE_LEN {
        tracing::debug!(key = %pair.key, "header_to_metadata: value too long");
        return None;
    }
    let bytes = if pair.base64 {
        let decoded = decode_base64(value).filter(|d| !d.is_empty());
        if decoded.is_none() {
            tracing::debug!(key = %pair.key, "header_to_metadata: base64 decode failed");
        }
        decoded?
    } else {
        value.as_bytes().to_vec()
    };
    match pair.kind {
        ValueKind::String => Some(string_value(String::from_utf8_lossy(&bytes))),
        ValueKind::Number => std::str::from_utf8(&bytes)
            .ok()?
            .trim()
            .parse::<f64>()
            .ok()
            .map(number_value),
        ValueKind::ProtobufValue => prost::Message::decode(bytes.as_slice()).ok(),
    }
}

/// Envoy's `Base64::decodeWithoutPadding`: the standard alphabet, padding optional (and any
/// run of trailing `=` ignored).
fn decode_base64(value: &str) -> Option<Vec<u8>> {
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    engine.decode(value.trim_end_matches('=')).ok()
}

#[cfg(test)]
mod tests {
    use http::{HeaderName, HeaderValue};

    use super::*;
    use crate::route::metadata::json;

    fn pair(namespace: &str, key: &str, kind: ValueKind, base64: bool) -> Pair {
        Pair {
            namespace: namespace.into(),
            key: key.into(),
            value: String::new(),
            rewrite: None,
            kind,
            base64,
        }
    }

    fn header_rule(name: &'static str, on_present: Pair, remove: bool) -> Rule {
        Rule {
            source: Source::Header(Some(HeaderName::from_static(name))),
            on_present: Some(on_present),
            on_missing: None,
            remove,
        }
    }

    #[test]
    fn headers_become_typed_values_and_bad_ones_are_skipped() {
        let mut missing = pair("a", "m", ValueKind::String, false);
        missing.value = "none".into();
        let rules = vec![
            header_rule("x-k", pair("a", "k", ValueKind::String, false), false),
            header_rule("x-n", pair("a", "n", ValueKind::Number, false), true),
            header_rule("x-b", pair("a", "b", ValueKind::String, true), false),
            header_rule("x-bad", pair("a", "bad", ValueKind::Number, false), false),
            Rule {
                source: Source::Header(Some(HeaderName::from_static("x-absent"))),
                on_present: None,
                on_missing: Some(missing),
                remove: false,
            },
            Rule {
                source: Source::Cookie("c".into()),
                on_present: Some(pair("b", "c", ValueKind::String, false)),
                on_missing: None,
                remove: false,
            },
        ];
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("x-k", "v1"),
            ("x-k", "v2"),
            ("x-n", " 42 "),
            ("x-b", "aGVsbG8"),
            ("x-bad", "abc"),
            ("cookie", "d=e; c=\"choc\""),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let mut md = DynamicMetadata::default();
        apply(&rules, &mut headers, &mut md);
        assert_eq!(
            json::struct_json(md.namespace("a").unwrap()),
            r#"{"b":"hello","k":"v1,v2","m":"none","n":42}"#
        );
        assert_eq!(
            json::struct_json(md.namespace("b").unwrap()),
            r#"{"c":"choc"}"#
        );
        assert!(!headers.contains_key("x-n") && headers.contains_key("x-k"));
    }

    #[test]
    fn base64_padding_is_optional() {
        assert_eq!(decode_base64("aGVsbG8").as_deref(), Some(&b"hello"[..]));
        assert_eq!(decode_base64("aGVsbG8==").as_deref(), Some(&b"hello"[..]));
        assert_eq!(decode_base64("!!!"), None);
    }
}
