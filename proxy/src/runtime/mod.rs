//! The runtime as the data path reads it: the bootstrap's layers (`config::runtime`) merged
//! into one snapshot, swapped whole when `/runtime_modify` changes the admin layer, a disk
//! layer's symlink is swapped or an RTDS layer arrives over xDS (`crate::xds`), as Envoy's
//! loader does. Disk layers' directories are read at each load (`disk`): a layer whose
//! directory is missing is left out, one that fails to read is left out and counted in
//! `runtime.load_error`. Route `runtime_fraction` matchers, the fault filter's keys, the
//! filters' fractions and feature flags read it per request or connection; `/runtime` lists
//! it.

mod disk;
mod watch;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use arc_swap::ArcSwap;

use crate::config::runtime::{LayerKind, RuntimeFlag, RuntimeValue, StaticRuntime};
use crate::route::matcher::FractionalPercent;
use crate::stats::{Counter, Gauge, Store};

/// The merged values, a later layer's winning, each with what every layer says of it.
#[derive(Debug, Default)]
struct Snapshot {
    /// The layers loaded (a disk layer whose directory is missing or unreadable is not).
    layers: Vec<String>,
    values: HashMap<String, Entry>,
}

#[derive(Debug)]
struct Entry {
    value: RuntimeValue,
    /// Each loaded layer's text for the key (empty where the layer does not set it).
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
    load_error: Counter,
    /// Loads that found more than one disk layer (Envoy's test, whatever the layers are).
    override_dir_exists: Counter,
    override_dir_not_exists: Counter,
    /// Envoy's stats for what revoy never has (no deprecated features).
    _zero: Counter,
    _zero_gauge: Gauge,
}

/// What changes while the process runs, besides the disk layers.
#[derive(Debug, Default)]
struct Changing {
    /// The admin layer's overrides.
    overrides: BTreeMap<String, RuntimeValue>,
    /// Each RTDS layer's values, by resource name, once received.
    rtds: HashMap<String, HashMap<String, RuntimeValue>>,
}

/// The live runtime.
#[derive(Debug)]
pub struct LiveRuntime {
    layers: StaticRuntime,
    /// The node's cluster, a subdirectory of disk layers with `append_service_cluster`.
    service_cluster: String,
    /// Whether the bootstrap has an admin layer (else nothing may be modified).
    admin: bool,
    /// The admin layer's overrides and the RTDS layers' values; held while a snapshot is
    /// made, so loads are serialized.
    changing: Mutex<Changing>,
    current: ArcSwap<Snapshot>,
    /// Whether the snapshot has any value (else requests skip loading it).
    any: AtomicBool,
    stats: RuntimeStats,
    /// The watch on the disk layers' symlinks, once started.
    watch: OnceLock<watch::SymlinkWatch>,
}

impl LiveRuntime {
    /// The runtime of the bootstrap's `layers` for a node of cluster `service_cluster`, its
    /// stats in `store`, loaded twice as Envoy 1.40 loads it at start-up (its
    /// `runtime.load_success` is 2 before anything changes).
    pub fn new(layers: &StaticRuntime, service_cluster: &str, store: &Store) -> LiveRuntime {
        let c = |name: &str| store.counter(&format!("runtime.{name}"));
        let g = |name: &str| store.gauge(&format!("runtime.{name}"));
        let live = LiveRuntime {
            admin: layers.layers.iter().any(|l| l.kind == LayerKind::Admin),
            service_cluster: service_cluster.to_owned(),
            changing: Mutex::default(),
            layers: layers.clone(),
            current: ArcSwap::default(),
            any: AtomicBool::new(false),
            stats: RuntimeStats {
                num_keys: g("num_keys"),
                num_layers: g("num_layers"),
                admin_overrides_active: g("admin_overrides_active"),
                load_success: c("load_success"),
                load_error: c("load_error"),
                override_dir_exists: c("override_dir_exists"),
                override_dir_not_exists: c("override_dir_not_exists"),
                _zero: c("deprecated_feature_use"),
                _zero_gauge: g("deprecated_feature_seen_since_process_start"),
            },
            watch: OnceLock::new(),
        };
        live.reload();
        live.reload();
        live
    }

    /// Starts watching the disk layers' symlinks: each rename onto one reloads the runtime
    /// once per disk layer with that `symlink_root` (Envoy adds a watch per layer). A watch
    /// that cannot start is logged, and its layers are read only at start-up.
    pub fn watch_disk_layers(self: &Arc<Self>) {
        let roots: Vec<&str> = self
            .layers
            .layers
            .iter()
            .filter_map(|l| match &l.kind {
                LayerKind::Disk(d) => Some(d.symlink_root.as_str()),
                _ => None,
            })
            .collect();
        if roots.is_empty() {
            return;
        }
        let weak = Arc::downgrade(self);
        match watch::SymlinkWatch::start(&roots, move |times| {
            if let Some(live) = weak.upgrade() {
                for _ in 0..times {
                    live.reload();
                }
            }
        }) {
            Ok(w) => {
                let _ = self.watch.set(w);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot watch the runtime's disk layers; they are not read again")
            }
        }
    }

    /// Reads the disk layers again and publishes the new snapshot.
    pub fn reload(&self) {
        let changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        self.load(&changing);
    }

    /// The bootstrap's RTDS layers.
    pub fn rtds_layers(&self) -> Vec<&crate::config::runtime::RtdsLayer> {
        self.layers.rtds_layers()
    }

    /// Sets the values of the RTDS layer `name` (`None`: the resource was removed, the layer
    /// is empty again) and publishes the new snapshot.
    pub fn set_rtds(&self, name: &str, values: Option<HashMap<String, RuntimeValue>>) {
        let mut changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        match values {
            Some(values) => changing.rtds.insert(name.to_owned(), values),
            None => changing.rtds.remove(name),
        };
        self.load(&changing);
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
        if !self.admin {
            return Err(NoAdminLayer);
        }
        let mut changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, value) in changes {
            if value.is_empty() {
                changing.overrides.remove(key);
            } else {
                changing
                    .overrides
                    .insert(key.clone(), RuntimeValue::parse(value.clone()));
            }
        }
        self.stats
            .admin_overrides_active
            .set(u64::from(!changing.overrides.is_empty()));
        self.load(&changing);
        Ok(())
    }

    /// Merges the layers (the admin and RTDS layers from `changing`, the disk layers read now)
    /// into a new snapshot, counted as Envoy counts its loads.
    fn load(&self, changing: &Changing) {
        let (mut disk_layers, mut errors) = (0, 0);
        let mut loaded: Vec<(&str, Cow<'_, HashMap<String, RuntimeValue>>)> = Vec::new();
        for layer in &self.layers.layers {
            let values = match &layer.kind {
                LayerKind::Static(v) => Cow::Borrowed(v),
                LayerKind::Admin => Cow::Owned(changing.overrides.clone().into_iter().collect()),
                LayerKind::Rtds(r) => match changing.rtds.get(&r.name) {
                    Some(values) => Cow::Borrowed(values),
                    None => Cow::Owned(HashMap::new()),
                },
                LayerKind::Disk(d) => {
                    let dir = d.path(&self.service_cluster);
                    let dir = Path::new(&dir);
                    if !dir.is_dir() {
                        continue;
                    }
                    match disk::read_layer(dir) {
                        Ok(values) => {
                            disk_layers += 1;
                            Cow::Owned(values)
                        }
                        Err(e) => {
                            errors += 1;
                            tracing::debug!(layer = %layer.name, error = %e, "error loading runtime values from disk");
                            continue;
                        }
                    }
                }
            };
            loaded.push((&layer.name, values));
        }
        let n = loaded.len();
        let mut values: HashMap<String, Entry> = HashMap::new();
        let mut layers = Vec::with_capacity(n);
        for (i, (name, layer_values)) in loaded.into_iter().enumerate() {
            layers.push(name.to_owned());
            for (key, value) in layer_values.iter() {
                let entry = values.entry(key.clone()).or_insert_with(|| Entry {
                    value: value.clone(),
                    layer_values: vec![String::new(); n],
                });
                entry.value = value.clone();
                entry.layer_values[i].clone_from(&value.raw);
            }
        }
        self.stats.num_layers.set(n as u64);
        self.stats.num_keys.set(values.len() as u64);
        if errors == 0 {
            self.stats.load_success.inc();
        } else {
            self.stats.load_error.inc();
        }
        if disk_layers > 1 {
            self.stats.override_dir_exists.inc();
        } else {
            self.stats.override_dir_not_exists.inc();
        }
        self.any.store(!values.is_empty(), Ordering::Relaxed);
        self.current.store(Arc::new(Snapshot { layers, values }));
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
            "layers": snapshot.layers,
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
        LiveRuntime::new(&layers, "svc", &Store::default())
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
    fn an_rtds_layer_is_empty_until_set_and_after_removal() {
        let rt = live(
            "layered_runtime: {layers: [{name: s, static_layer: {k: 0}}, {name: r, rtds_layer: {name: res, rtds_config: {ads: {}}}}]}",
        );
        assert_eq!(rt.listing()["layers"], serde_json::json!(["s", "r"]));
        assert!(!rt.feature_enabled("k", HALF, 10));
        let values = [("k".to_owned(), RuntimeValue::parse("100".to_owned()))];
        rt.set_rtds("res", Some(values.into_iter().collect()));
        assert!(rt.feature_enabled("k", HALF, 99));
        assert_eq!(
            rt.listing()["entries"]["k"]["layer_values"],
            serde_json::json!(["0", "100"])
        );
        rt.set_rtds("res", None);
        assert!(!rt.feature_enabled("k", HALF, 10));
    }

    #[test]
    fn without_an_admin_layer_nothing_is_modified() {
        let rt = live("layered_runtime: {layers: [{name: s, static_layer: {}}]}");
        assert!(rt.modify(&[("k".into(), "1".into())]).is_err());
        assert!(rt.feature_enabled("k", HALF, 10), "k: its default");
        assert_eq!(rt.integer("k"), None);
    }
}
