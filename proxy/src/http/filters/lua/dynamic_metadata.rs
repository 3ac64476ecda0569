//! `streamInfo():dynamicMetadata()` (Envoy's `DynamicMetadataMapWrapper`): the request's
//! dynamic metadata, read with `get(filterName)` (a table, or no value), written with
//! `set(filterName, key, value)` and iterated with `pairs` (filter name, table).

use std::sync::{Arc, Mutex};

use mlua::{Lua, MetaMethod, Table, UserData, UserDataMethods, Value, Variadic};
use proto::pb::google::protobuf::{self as pb, value::Kind};

use super::handle::Flow;

/// The handle's view of the request's dynamic metadata (kept in its [`Flow`]).
pub(super) struct DynamicMetadataMap(pub(super) Arc<Mutex<Flow>>);

impl UserData for DynamicMetadataMap {
    fn add_methods<M: UserDataMethods<Self>>(methods: &mut M) {
        methods.add_method("get", |lua, this, name: String| {
            let flow = this.0.lock().unwrap_or_else(|p| p.into_inner());
            // An absent namespace is no value at all, as in Envoy.
            match flow.metadata.namespace(&name) {
                Some(s) => Ok(Variadic::from_iter([Value::Table(struct_to_lua(lua, s)?)])),
                None => Ok(Variadic::new()),
            }
        });
        methods.add_method(
            "set",
            |_, this, (name, key, value): (String, String, Value)| {
                let value = lua_to_value(&value)?;
                let mut flow = this.0.lock().unwrap_or_else(|p| p.into_inner());
                flow.metadata.insert(&name, &key, value);
                Ok(())
            },
        );
        methods.add_meta_method(MetaMethod::Pairs, |lua, this, ()| {
            let entries: Vec<(String, pb::Struct)> = {
                let flow = this.0.lock().unwrap_or_else(|p| p.into_inner());
                flow.metadata
                    .iter()
                    .map(|(k, v)| (k.to_owned(), v.clone()))
                    .collect()
            };
            let mut entries = entries.into_iter();
            let next = lua.create_function_mut(move |lua, _: Variadic<Value>| {
                Ok(match entries.next() {
                    Some((k, v)) => (
                        Value::String(lua.create_string(k)?),
                        Value::Table(struct_to_lua(lua, &v)?),
                    ),
                    None => (Value::Nil, Value::Nil),
                })
            })?;
            Ok((next, Value::Nil, Value::Nil))
        });
    }
}

/// A `Struct` as a Lua table.
fn struct_to_lua(lua: &Lua, s: &pb::Struct) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    for (k, v) in &s.fields {
        t.raw_set(k.as_str(), value_to_lua(lua, v)?)?;
    }
    Ok(t)
}

/// A protobuf `Value` as Lua sees it (null as nil, a list as a sequence).
fn value_to_lua(lua: &Lua, v: &pb::Value) -> mlua::Result<Value> {
    Ok(match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Nil,
        Some(Kind::BoolValue(b)) => Value::Boolean(*b),
        Some(Kind::NumberValue(n)) => Value::Number(*n),
        Some(Kind::StringValue(s)) => Value::String(lua.create_string(s)?),
        Some(Kind::StructValue(s)) => Value::Table(struct_to_lua(lua, s)?),
        Some(Kind::ListValue(l)) => {
            let t = lua.create_table()?;
            for (i, v) in l.values.iter().enumerate() {
                t.raw_set(i + 1, value_to_lua(lua, v)?)?;
            }
            Value::Table(t)
        }
    })
}

/// A Lua value as a protobuf `Value`: a table whose keys are 1..n is a list, any other a
/// struct (its keys strings or numbers); functions and the like are an error.
fn lua_to_value(v: &Value) -> mlua::Result<pb::Value> {
    let kind = match v {
        Value::Nil => Kind::NullValue(0),
        Value::Boolean(b) => Kind::BoolValue(*b),
        Value::Integer(i) => Kind::NumberValue(*i as f64),
        Value::Number(n) => Kind::NumberValue(*n),
        Value::String(s) => Kind::StringValue(s.to_str()?.to_owned()),
        Value::Table(t) => {
            let mut pairs = Vec::new();
            for pair in t.clone().pairs::<Value, Value>() {
                pairs.push(pair?);
            }
            let len = pairs.len();
            let is_list = len > 0
                && (1..=len).all(|i| {
                    pairs.iter().any(|(k, _)| match k {
                        Value::Integer(n) => *n as usize == i,
                        Value::Number(n) => *n == i as f64,
                        _ => false,
                    })
                });
            if is_list {
                let mut values = Vec::with_capacity(len);
                for i in 1..=len {
                    values.push(lua_to_value(&t.raw_get::<Value>(i)?)?);
                }
                Kind::ListValue(pb::ListValue { values })
            } else {
                let mut fields = std::collections::HashMap::new();
                for (k, v) in pairs {
                    let key = match k {
                        Value::String(s) => s.to_str()?.to_owned(),
                        Value::Integer(n) => n.to_string(),
                        Value::Number(n) => n.to_string(),
                        _ => return Err(mlua::Error::runtime("metadata keys must be strings")),
                    };
                    fields.insert(key, lua_to_value(&v)?);
                }
                Kind::StructValue(pb::Struct {
                    fields: fields.into_iter().collect(),
                })
            }
        }
        other => {
            return Err(mlua::Error::runtime(format!(
                "unexpected type '{}' in dynamicMetadata",
                other.type_name()
            )));
        }
    };
    Ok(pb::Value { kind: Some(kind) })
}
