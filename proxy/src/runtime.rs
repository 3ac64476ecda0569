//! The runtime as the data path reads it: the bootstrap's layers (`config::runtime`) merged
//! into one snapshot, swapped whole when `/runtime_modify` changes the admin layer, as Envoy's
//! loader does. Route `runtime_fraction` matchers, the fault filter's keys, the filters'
//! fractions and feature flags read it per request or connection; `/runtime` lists it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;

use crate::config::runtime::{LayerKind, RuntimeFlag, RuntimeValue, StaticRuntime};
use crate::route::matcher::FractionalPercent;
use crate::stats::{Counter, Gauge, Store};

/// The merged values, a later layer's winning, each with what every layer says of it.
#[derive(Debug, Default)]
struct Snapshot {
    values: HashMap<String, Entry>,
}

#[derive(Debug)]
struct Entry {
    value: RuntimeValue,
    /// Each layer's text for the key (empty where the layer does not set it).
    layer_values: Vec<String>,
}

impl crate::route::matcher::Runtime for LiveRuntime {
    /// Envoy's `featureEnabled`: the key's fractional percent, else its integer as a percent
    /// (over 100: always), else `default`.
    fn feature_enabled(&self, key: &str, default: FractionalPercent, random_value: u64) -> bool {
        self.value(key, |v| match v {
            RuntimeValue {
                fraction: Some(f), ..
            } => Some(*f),
            RuntimeValue { uint: Some(n), .. } => Some(FractionalPercent {
                numerator: (*n).min(100) as u32,
                denominator: 100,
            }),
            _ => None,
        })
        .unwrap_or(default)
        .enabled(random_value)
    }
}

/// `runtime_modify` without an admin layer in the bootstrap.
#[derive(Debug, thiserror::Error)]
#[error("No admin layer specified")]
pub struct NoAdminLayer;

/// Envoy's `runtime.*` stats.
#[derive(Debug)]
struct RuntimeStats {
    num_keys: Gauge,
    num_layers: Gauge,
    admin_overrides_active: Gauge,
    load_success: Counter,
    /// Envoy's stats for what revoy never has (no disk layers, no deprecated features).
    _zeros: [Counter; 4],
    _zero_gauge: Gauge,
}

/// The live runtime.
#[derive(Debug)]
pub struct LiveRuntime {
    layers: StaticRuntime,
    /// The admin layer's overrides, when the bootstrap has an admin layer.
    admin: Option<Mutex<BTreeMap<String, RuntimeValue>>>,
    current: ArcSwap<Snapshot>,
    /// Whether the snapshot has any value (else requests skip loading it).
    any: AtomicBool,
    stats: RuntimeStats,
}

impl LiveRuntime {
    /// The runtime of the bootstrap's `layers`, its stats in `store`.
    pub fn new(layers: &StaticRuntime, store: &Store) -> LiveRuntime {
        let c = |name: &str| store.counter(&format!("runtime.{name}"));
        let g = |name: &str| store.gauge(&format!("runtime.{name}"));
        let live = LiveRuntime {
            admin: layers
                .layers
                .iter()
                .any(|l| l.kind == LayerKind::Admin)
                .then(Mutex::default),
            layers: layers.clone(),
            current: ArcSwap::default(),
            any: AtomicBool::new(false),
            stats: RuntimeStats {
                num_keys: g("num_keys"),
                num_layers: g("num_layers"),
                admin_overrides_active: g("admin_overrides_active"),
                load_success: c("load_success"),
                _zeros: [
                    c("load_error"),
                    c("override_dir_exists"),
                    c("override_dir_not_exists"),
                    c("deprecated_feature_use"),
                ],
                _zero_gauge: g("deprecated_feature_seen_since_process_start"),
            },
        };
        live.stats.num_layers.set(layers.layers.len() as u64);
        live.load(&BTreeMap::new());
        live
    }

    /// The current snapshot's value at `key`, read without taking a reference on the
    /// snapshot (nothing is loaded when the runtime is empty).
    fn value<T>(&self, key: &str, read: impl FnOnce(&RuntimeValue) -> Option<T>) -> Option<T> {
        if key.is_empty() || !self.any.load(Ordering::Relaxed) {
            return None;
        }
        read(&self.current.load().values.get(key)?.value)
    }

    /// Whether `flag` is on: the runtime's boolean at its key (Envoy's `getBoolean`), else
    /// its default.
    pub fn flag(&self, flag: &RuntimeFlag) -> bool {
        self.value(&flag.key, |v| v.boolean).unwrap_or(flag.default)
    }

    /// Envoy's `getInteger`: the key's non-negative integer (a number truncated), if any.
    pub fn integer(&self, key: &str) -> Option<u64> {
        self.value(key, |v| v.uint)
    }

    /// `/runtime_modify`: sets (or, with an empty value, removes) admin-layer overrides and
    /// publishes the new snapshot.
    pub fn modify(&self, changes: &[(String, String)]) -> Result<(), NoAdminLayer> {
        let admin = self.admin.as_ref().ok_or(NoAdminLayer)?;
        let mut overrides = admin.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, value) in changes {
            if value.is_empty() {
                overrides.remove(key);
            } else {
                overrides.insert(key.clone(), RuntimeValue::parse(value.clone()));
            }
        }
        self.stats
            .admin_overrides_active
            .set(u64::from(!overrides.is_empty()));
        self.load(&overrides);
        Ok(())
    }

    /// Merges the layers (with `overrides` as the admin layer) into a new snapshot.
    fn load(&self, overrides: &BTreeMap<String, RuntimeValue>) {
        let n = self.layers.layers.len();
        let mut values: HashMap<String, Entry> = HashMap::new();
        for (i, layer) in self.layers.layers.iter().enumerate() {
            let layer_values: Box<dyn Iterator<Item = (&String, &RuntimeValue)>> = match &layer.kind
            {
                LayerKind::Static(v) => Box::new(v.iter()),
                LayerKind::Admin => Box::new(overrides.iter()),
                LayerKind::NotRead => Box::new(std::iter::empty()),
            };
            for (key, value) in layer_values {
                let entry = values.entry(key.clone()).or_insert_with(|| Entry {
                    value: value.clone(),
                    layer_values: vec![String::new(); n],
                });
                entry.value = value.clone();
                entry.layer_values[i].clone_from(&value.raw);
            }
        }
        self.stats.num_keys.set(values.len() as u64);
        self.any.store(!values.is_empty(), Ordering::Relaxed);
        self.current.store(Arc::new(Snapshot { values }));
        self.stats.load_success.inc();
    }

    /// `/runtime`: the layers' names and every key's final value and per-layer values.
    pub fn listing(&self) -> serde_json::Value {
        let snapshot = self.current.load();
        let entries: serde_json::Map<String, serde_json::Value> = snapshot
            .values
            .iter()
            .map(|(key, e)| {
                (
                    key.clone(),
                    serde_json::json!({
                        "final_value": e.value.raw,
                        "layer_values": e.layer_values,
                    }),
                )
            })
            .collect();
        serde_json::json!({
            "layers": self.layers.layers.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
            "entries": entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::matcher::Runtime;

    fn live(yaml: &str) -> LiveRuntime {
        let layers = crate::config::runtime::from_bootstrap_yaml(yaml).unwrap();
        LiveRuntime::new(&layers, &Store::default())
    }

    const HALF: FractionalPercent = FractionalPercent {
        numerator: 50,
        denominator: 100,
    };

    #[test]
    fn an_admin_override_wins_until_removed() {
        let rt = live(
            "layered_runtime: {layers: [{name: s, static_layer: {k: 0}}, {name: a, admin_layer: {}}]}",
        );
        let enabled = |rt: &LiveRuntime, r| rt.feature_enabled("k", HALF, r);
        assert!(!enabled(&rt, 10));
        rt.modify(&[("k".into(), "100".into())]).unwrap();
        assert!(enabled(&rt, 99));
        rt.modify(&[("k".into(), "".into())]).unwrap();
        assert!(!enabled(&rt, 10));
        let listing = rt.listing();
        assert_eq!(listing["layers"], serde_json::json!(["s", "a"]));
        assert_eq!(
            listing["entries"]["k"]["layer_values"],
            serde_json::json!(["0", ""])
        );
    }

    #[test]
    fn integers_are_percents_fractions_are_fractions() {
        let rt = live(
            "layered_runtime: {layers: [{name: s, static_layer: {big: 500, f: {numerator: 1, denominator: TEN_THOUSAND}, t: hello}}]}",
        );
        let s = &rt;
        assert!(s.feature_enabled("big", HALF, 99));
        assert!(s.feature_enabled("f", HALF, 10_000));
        assert!(!s.feature_enabled("f", HALF, 1));
        assert!(s.feature_enabled("t", HALF, 49), "text: the default");
        assert!(!s.feature_enabled("", HALF, 50));
    }

    #[test]
    fn without_an_admin_layer_nothing_is_modified() {
        let rt = live("layered_runtime: {layers: [{name: s, static_layer: {}}]}");
        assert!(rt.modify(&[("k".into(), "1".into())]).is_err());
        assert!(rt.feature_enabled("k", HALF, 10), "k: its default");
        assert_eq!(rt.integer("k"), None);
    }
}
