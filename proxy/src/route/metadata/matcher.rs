//! Envoy's `MetadataMatcher` and `ValueMatcher` at run time (compiled by
//! `config::metadata_matcher`): a value at a path of a namespace, matched by type.

use proto::pb::google::protobuf::{Value, value::Kind};

use super::DynamicMetadata;
use crate::route::matcher::StringMatcher;

/// A compiled `MetadataMatcher`.
#[derive(Debug, Clone)]
pub struct MetadataMatcher {
    /// `filter`: the namespace.
    pub namespace: String,
    /// `path`: the keys leading to the value.
    pub path: Vec<String>,
    /// `value`.
    pub value: ValueMatcher,
    /// `invert`: the result is negated.
    pub invert: bool,
}

impl MetadataMatcher {
    /// Whether `metadata` (none: no filter set any) matches; a missing value matches only
    /// through `invert`, as Envoy's matchers all fail on an unset value.
    pub fn matches(&self, metadata: Option<&DynamicMetadata>) -> bool {
        let value = metadata.and_then(|m| m.value(&self.namespace, &self.path));
        value.is_some_and(|v| self.value.matches(v)) != self.invert
    }
}

/// A compiled `ValueMatcher`.
#[derive(Debug, Clone)]
pub enum ValueMatcher {
    /// `null_match`: a null value.
    Null,
    /// `double_match` with a range `[start, end)`.
    Range(f64, f64),
    /// `double_match` with `exact`.
    Exact(f64),
    /// `string_match`.
    String(StringMatcher),
    /// `bool_match`.
    Bool(bool),
    /// `present_match`: any value (when true; never when false).
    Present(bool),
    /// `list_match.one_of`: a list with an element matching.
    ListOneOf(Box<ValueMatcher>),
    /// `or_match`: any of these.
    Or(Vec<ValueMatcher>),
}

impl ValueMatcher {
    /// Whether `value` (a set value) matches.
    pub fn matches(&self, value: &Value) -> bool {
        let Some(kind) = &value.kind else {
            return false;
        };
        match (self, kind) {
            (ValueMatcher::Null, Kind::NullValue(_)) => true,
            (ValueMatcher::Range(start, end), Kind::NumberValue(n)) => start <= n && n < end,
            (ValueMatcher::Exact(x), Kind::NumberValue(n)) => x == n,
            (ValueMatcher::String(m), Kind::StringValue(s)) => m.matches(s),
            (ValueMatcher::Bool(b), Kind::BoolValue(v)) => b == v,
            (ValueMatcher::Present(p), _) => *p,
            (ValueMatcher::ListOneOf(m), Kind::ListValue(l)) => {
                l.values.iter().any(|v| m.matches(v))
            }
            (ValueMatcher::Or(all), _) => all.iter().any(|m| m.matches(value)),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use proto::pb::google::protobuf::ListValue;

    use super::*;
    use crate::route::metadata::{number_value, string_value};

    fn matcher(path: &[&str], value: ValueMatcher, invert: bool) -> MetadataMatcher {
        MetadataMatcher {
            namespace: "ns".into(),
            path: path.iter().map(|p| (*p).to_owned()).collect(),
            value,
            invert,
        }
    }

    #[test]
    fn values_match_by_type_and_missing_ones_only_through_invert() {
        let mut md = DynamicMetadata::default();
        md.insert("ns", "n", number_value(5.0));
        md.insert("ns", "s", string_value("abc"));
        md.insert(
            "ns",
            "l",
            Value {
                kind: Some(Kind::ListValue(ListValue {
                    values: vec![string_value("x"), number_value(1.0)],
                })),
            },
        );
        let md = Some(&md);
        assert!(matcher(&["n"], ValueMatcher::Range(5.0, 6.0), false).matches(md));
        assert!(!matcher(&["n"], ValueMatcher::Range(4.0, 5.0), false).matches(md));
        assert!(matcher(&["n"], ValueMatcher::Exact(5.0), false).matches(md));
        assert!(!matcher(&["s"], ValueMatcher::Exact(5.0), false).matches(md));
        let abc = StringMatcher::Exact("abc".into(), false);
        assert!(matcher(&["s"], ValueMatcher::String(abc.clone()), false).matches(md));
        assert!(!matcher(&["n"], ValueMatcher::String(abc), false).matches(md));
        let one = ValueMatcher::ListOneOf(Box::new(ValueMatcher::Exact(1.0)));
        assert!(matcher(&["l"], one, false).matches(md));
        assert!(matcher(&["s"], ValueMatcher::Present(true), false).matches(md));
        assert!(!matcher(&["missing"], ValueMatcher::Present(true), false).matches(md));
        assert!(matcher(&["missing"], ValueMatcher::Present(true), true).matches(md));
        assert!(!matcher(&["n"], ValueMatcher::Present(false), false).matches(md));
        assert!(matcher(&["n"], ValueMatcher::Null, true).matches(None));
        let or = ValueMatcher::Or(vec![ValueMatcher::Bool(true), ValueMatcher::Exact(5.0)]);
        assert!(matcher(&["n"], or, false).matches(md));
    }
}
