//! YAML text to a JSON value as Envoy's loader (yaml-cpp) reads it.
//!
//! serde_yaml_ng resolves plain scalars by YAML 1.2's core schema, where only `true` / `false`
//! (and their capitalised forms) are booleans. Envoy converts a plain scalar to a boolean
//! whenever yaml-cpp's `convert<bool>` takes it: `y`, `yes`, `true`, `on` and `n`, `no`,
//! `false`, `off`, all lower case, all upper case, or capitalised (`Yes`, `OFF`). So
//! `metadata: {k: yes}` holds the boolean `true` in Envoy, and `cluster: n` (a string field) is
//! refused there as a boolean. A quoted or block scalar stays a string in both.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Parses one YAML document into a JSON value, reading plain scalars as Envoy does.
pub fn to_json(text: &str) -> Result<Value, serde_yaml_ng::Error> {
    serde_yaml_ng::Deserializer::from_str(text).deserialize_any(Node { text })
}

/// A node of the document whose text is `text` (to tell a plain scalar from a quoted one: the
/// parser lends a scalar's characters out of the text, after its opening quote if quoted).
#[derive(Clone, Copy)]
struct Node<'t> {
    text: &'t str,
}

impl Node<'_> {
    /// Whether `s`, lent out of the text, starts right after a quote.
    fn quoted(&self, s: &str) -> bool {
        let start = (s.as_ptr() as usize).wrapping_sub(self.text.as_ptr() as usize);
        start <= self.text.len()
            && start > 0
            && matches!(self.text.as_bytes()[start - 1], b'"' | b'\'')
    }
}

/// yaml-cpp's `convert<bool>`: the YAML 1.1 words, in lower, upper or capitalised case.
fn yaml_cpp_bool(s: &str) -> Option<bool> {
    let mut rest = s.chars();
    let first = rest.next()?;
    let rest = rest.as_str();
    let lower = |t: &str| t.chars().all(|c| c.is_ascii_lowercase());
    let upper = |t: &str| t.chars().all(|c| c.is_ascii_uppercase());
    let flexible = lower(s) || (first.is_ascii_uppercase() && (lower(rest) || upper(rest)));
    if !flexible {
        return None;
    }
    match s.to_ascii_lowercase().as_str() {
        "y" | "yes" | "true" | "on" => Some(true),
        "n" | "no" | "false" | "off" => Some(false),
        _ => None,
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    /// A scalar the parser could not lend out of the text: escaped, folded or a block; a
    /// string in Envoy too.
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Value, E> {
        Ok(match yaml_cpp_bool(v).filter(|_| !self.quoted(v)) {
            Some(b) => Value::Bool(b),
            None => Value::String(v.to_owned()),
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_yaml_1_1_words_are_booleans_quoted_ones_strings() {
        let v = to_json(
            "a: yes\nb: \"yes\"\nc: On\nd: oN\ne: y\nf: NO\ng: n\nh: 'n'\ni: off\nk: True\n\
             l: tRUE\nm: [y, n, \"n\"]\nn: {y: n}\no: ~\np: 3\nv: |\n  n\nw: \"a\\tb\"\n",
        )
        .unwrap();
        let want = serde_json::json!({
            "a": true, "b": "yes", "c": true, "d": "oN", "e": true, "f": false, "g": false,
            "h": "n", "i": false, "k": true, "l": "tRUE", "m": [true, false, "n"],
            "n": {"y": false}, "o": null, "p": 3, "v": "n\n", "w": "a\tb",
        });
        assert_eq!(v, want);
        assert_eq!(to_json("n").unwrap(), Value::Bool(false));
    }
}
