//! Metadata values written as Envoy writes them in access logs: protobuf JSON with an object's
//! keys sorted, integral numbers without a fraction.

use std::fmt::Write;

use proto::pb::google::protobuf::{Struct, Value, value::Kind};

/// `value` as text: a string as it is, anything else as JSON (Envoy's text formatters).
pub fn text(value: &Value) -> String {
    match &value.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        _ => {
            let mut out = String::new();
            write_value(&mut out, value);
            out
        }
    }
}

/// `s` as a JSON object.
pub fn struct_json(s: &Struct) -> String {
    let mut out = String::new();
    write_struct(&mut out, s);
    out
}

/// A JSON value as a protobuf `Value` (numbers become doubles, as Envoy's JSON conversion).
pub fn from_json(json: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match json {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(list) => Kind::ListValue(proto::pb::google::protobuf::ListValue {
            values: list.iter().map(from_json).collect(),
        }),
        J::Object(map) => Kind::StructValue(struct_from_json(map)),
    };
    Value { kind: Some(kind) }
}

/// A JSON object as a protobuf `Struct`.
pub fn struct_from_json(map: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
    }
}

/// Writes `value` as JSON.
pub fn write_value(out: &mut String, value: &Value) {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => out.push_str("null"),
        Some(Kind::NumberValue(n)) => write_number(out, *n),
        Some(Kind::StringValue(s)) => write_string(out, s),
        Some(Kind::BoolValue(b)) => out.push_str(if *b { "true" } else { "false" }),
        Some(Kind::StructValue(s)) => write_struct(out, s),
        Some(Kind::ListValue(l)) => {
            out.push('[');
            for (i, v) in l.values.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, v);
            }
            out.push(']');
        }
    }
}

/// Writes `s` as a JSON object, its keys sorted.
pub fn write_struct(out: &mut String, s: &Struct) {
    let mut keys: Vec<&String> = s.fields.keys().collect();
    keys.sort();
    out.push('{');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, k);
        out.push(':');
        write_value(out, &s.fields[k]);
    }
    out.push('}');
}

/// A number as Envoy prints it: integral values below 2^64 in full (`12345678901234567168`),
/// others in their shortest form.
fn write_number(out: &mut String, n: f64) {
    if n.is_finite() && n.fract() == 0.0 && n.abs() < 18_446_744_073_709_551_616.0 {
        let _ = write!(out, "{}", n as i128);
    } else {
        let _ = write!(out, "{n}");
    }
}

/// Writes `s` as a JSON string.
fn write_string(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned()));
}

#[cfg(test)]
mod tests {
    use proto::pb::google::protobuf::ListValue;

    use super::*;
    use crate::route::metadata::{number_value, string_value};

    #[test]
    fn values_render_as_envoy_writes_them() {
        let list = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![
                    number_value(1.0),
                    string_value("s"),
                    Value {
                        kind: Some(Kind::NullValue(0)),
                    },
                ],
            })),
        };
        let s = Struct {
            fields: [
                ("z".to_owned(), number_value(2.0)),
                ("a".to_owned(), number_value(1.5)),
                ("l".to_owned(), list),
                (
                    "b".to_owned(),
                    Value {
                        kind: Some(Kind::BoolValue(true)),
                    },
                ),
                ("q".to_owned(), string_value("say \"hi\"")),
            ]
            .into_iter()
            .collect(),
        };
        assert_eq!(
            struct_json(&s),
            r#"{"a":1.5,"b":true,"l":[1,"s",null],"q":"say \"hi\"","z":2}"#
        );
        assert_eq!(
            text(&number_value(12345678901234567890.0)),
            "12345678901234567168"
        );
        assert_eq!(text(&string_value("plain")), "plain");
    }
}
