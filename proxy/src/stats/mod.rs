//! Counters, gauges, text readouts and histograms with Envoy's names. Handles are resolved once (at config compile time)
//! and then only touch atomics; the store is read by the admin API.
//!
//! Metrics live in blocks: a block is a fixed [`Layout`] of metrics under one name prefix,
//! its values in one allocation, its prefix kept once (a cluster's `cluster.<name>.*`: some
//! thirty stats whose names would otherwise repeat the cluster's name each). A metric asked
//! for by its whole name that no block holds is a block of one. Envoy keeps stat names as
//! sequences of shared symbols for the same reason.

pub mod circllhist;
pub mod histogram;
pub mod keyed;
pub mod matcher;
mod number;
mod render;
pub mod tags;
mod text;

pub use histogram::{BucketSettings, Histogram, HistogramBlock, HistogramRef, HistogramView};
pub use render::{BucketsMode, Selection, render_json, render_prometheus, render_text};
pub use text::TextReadout;

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Whether a metric only grows or goes up and down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Envoy's counter.
    Counter,
    /// Envoy's gauge.
    Gauge,
}

/// One metric of a [`Layout`].
#[derive(Debug)]
pub struct Slot {
    /// Its name after the block's prefix.
    pub name: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// Whether it exists as soon as its block does; otherwise from its first use through
    /// [`Block::declare`] or a lookup by name (the stats Envoy creates only when needed).
    pub eager: bool,
}

impl Slot {
    /// A counter named `name`, listed from its block's start.
    pub const fn counter(name: &'static str) -> Slot {
        Slot {
            name,
            kind: Kind::Counter,
            eager: true,
        }
    }

    /// A gauge named `name`, listed from its block's start.
    pub const fn gauge(name: &'static str) -> Slot {
        Slot {
            name,
            kind: Kind::Gauge,
            eager: true,
        }
    }
}

/// The metrics of a block, in slot order (at most 64).
pub type Layout = [Slot];

/// The layout of a metric of its own, whose prefix is its whole name.
static SINGLE_COUNTER: [Slot; 1] = [Slot {
    name: "",
    kind: Kind::Counter,
    eager: true,
}];

/// See [`SINGLE_COUNTER`].
static SINGLE_GAUGE: [Slot; 1] = [Slot {
    name: "",
    kind: Kind::Gauge,
    eager: true,
}];

/// A block's prefix, layout and values.
#[derive(Debug)]
struct Values {
    prefix: Box<str>,
    layout: &'static Layout,
    /// Bit `i`: slot `i` exists (is listed).
    declared: AtomicU64,
    /// Bit `i`: slot `i` was ever written (Envoy's `used`).
    used: AtomicU64,
    values: Box<[AtomicU64]>,
    /// Metrics listed under the prefix that are always 0 and never written: Envoy's stats
    /// for events revoy never has (no storage of their own; every block's share one zero).
    zeros: &'static Layout,
}

impl Values {
    fn new(prefix: &str, layout: &'static Layout) -> Self {
        Self::with_zeros(prefix, layout, &[])
    }

    fn with_zeros(prefix: &str, layout: &'static Layout, zeros: &'static Layout) -> Self {
        assert!(layout.len() <= 64, "a stats block holds at most 64 metrics");
        let eager = layout
            .iter()
            .enumerate()
            .filter(|(_, s)| s.eager)
            .fold(0, |bits, (i, _)| bits | 1 << i);
        Values {
            prefix: prefix.into(),
            layout,
            declared: AtomicU64::new(eager),
            used: AtomicU64::new(0),
            values: layout.iter().map(|_| AtomicU64::new(0)).collect(),
            zeros,
        }
    }

    fn declared(&self, slot: usize) -> bool {
        self.declared.load(Ordering::Relaxed) & 1 << slot != 0
    }

    fn declare(&self, slot: usize) {
        if !self.declared(slot) {
            self.declared.fetch_or(1 << slot, Ordering::Relaxed);
        }
    }

    fn used(&self, slot: usize) -> bool {
        self.used.load(Ordering::Relaxed) & 1 << slot != 0
    }

    fn mark(&self, slot: usize) {
        if !self.used(slot) {
            self.used.fetch_or(1 << slot, Ordering::Relaxed);
        }
    }

    /// The slot named `name` of `kind`, declared.
    fn slot(&self, name: &str, kind: Kind) -> Option<usize> {
        let i = self
            .layout
            .iter()
            .position(|s| s.name == name && s.kind == kind)?;
        self.declare(i);
        Some(i)
    }

    fn add(&self, slot: usize, n: u64) {
        self.values[slot].fetch_add(n, Ordering::Relaxed);
        self.mark(slot);
    }

    fn sub(&self, slot: usize, n: u64) {
        self.values[slot].fetch_sub(n, Ordering::Relaxed);
        self.mark(slot);
    }

    fn set(&self, slot: usize, v: u64) {
        self.values[slot].store(v, Ordering::Relaxed);
        self.mark(slot);
    }

    fn value(&self, slot: usize) -> u64 {
        self.values[slot].load(Ordering::Relaxed)
    }
}

/// A counter of a block, borrowed from it (what a block's owner hands out per use).
#[derive(Clone, Copy, Debug)]
pub struct CounterRef<'a> {
    block: &'a Values,
    slot: usize,
}

impl CounterRef<'_> {
    /// Adds one.
    pub fn inc(self) {
        self.block.add(self.slot, 1);
    }
    /// Adds `n`.
    pub fn add(self, n: u64) {
        self.block.add(self.slot, n);
    }
    /// The current value.
    pub fn value(self) -> u64 {
        self.block.value(self.slot)
    }
}

/// A gauge of a block, borrowed from it.
#[derive(Clone, Copy, Debug)]
pub struct GaugeRef<'a> {
    block: &'a Values,
    slot: usize,
}

impl GaugeRef<'_> {
    /// Adds one.
    pub fn inc(self) {
        self.block.add(self.slot, 1);
    }
    /// Subtracts one (saturating at zero is the caller's contract: every dec follows an inc).
    pub fn dec(self) {
        self.block.sub(self.slot, 1);
    }
    /// Sets the value.
    pub fn set(self, v: u64) {
        self.block.set(self.slot, v);
    }
    /// The current value.
    pub fn value(self) -> u64 {
        self.block.value(self.slot)
    }
}

/// A block of metrics under one prefix, laid out by a [`Layout`]. Cheap to clone; every
/// clone is the same block.
#[derive(Clone, Debug)]
pub struct Block(Arc<Values>);

impl Block {
    /// The names' common prefix (`cluster.<name>.`).
    pub fn prefix(&self) -> &str {
        &self.0.prefix
    }

    /// The counter in `slot` (a [`Kind::Counter`] slot of the layout).
    pub fn counter(&self, slot: usize) -> CounterRef<'_> {
        debug_assert_eq!(self.0.layout[slot].kind, Kind::Counter);
        CounterRef {
            block: &self.0,
            slot,
        }
    }

    /// The gauge in `slot` (a [`Kind::Gauge`] slot of the layout).
    pub fn gauge(&self, slot: usize) -> GaugeRef<'_> {
        debug_assert_eq!(self.0.layout[slot].kind, Kind::Gauge);
        GaugeRef {
            block: &self.0,
            slot,
        }
    }

    /// Makes `slot` exist from now on (listed even while unused), as Envoy creates a stat on
    /// first need.
    pub fn declare(&self, slot: usize) {
        self.0.declare(slot);
    }

    /// The counter named `name` (after the prefix), declared; `None` when the layout has none.
    pub fn named_counter(&self, name: &str) -> Option<Counter> {
        let slot = self.0.slot(name, Kind::Counter)?;
        Some(Counter(Handle::new(&self.0, slot)))
    }

    /// The gauge named `name` (after the prefix), declared; `None` when the layout has none.
    pub fn named_gauge(&self, name: &str) -> Option<Gauge> {
        let slot = self.0.slot(name, Kind::Gauge)?;
        Some(Gauge(Handle::new(&self.0, slot)))
    }
}

/// An owned reference to one slot of a block.
#[derive(Clone, Debug)]
struct Handle {
    block: Arc<Values>,
    slot: u32,
}

impl Handle {
    fn new(block: &Arc<Values>, slot: usize) -> Self {
        Handle {
            block: block.clone(),
            slot: slot as u32,
        }
    }

    /// A metric of its own, in no store.
    fn detached(layout: &'static Layout) -> Self {
        Handle::new(&Arc::new(Values::new("", layout)), 0)
    }

    fn slot(&self) -> usize {
        self.slot as usize
    }
}

/// A monotonically increasing count (Envoy counter). Cheap to clone; clones count together.
#[derive(Clone, Debug)]
pub struct Counter(Handle);

impl Default for Counter {
    /// A counter in no store.
    fn default() -> Self {
        Counter(Handle::detached(&SINGLE_COUNTER))
    }
}

/// A value that goes up and down (Envoy gauge). Cheap to clone; clones share the value.
#[derive(Clone, Debug)]
pub struct Gauge(Handle);

impl Default for Gauge {
    /// A gauge in no store.
    fn default() -> Self {
        Gauge(Handle::detached(&SINGLE_GAUGE))
    }
}

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.block.add(self.0.slot(), n);
    }
    /// The current value.
    pub fn value(&self) -> u64 {
        self.0.block.value(self.0.slot())
    }
}

impl Gauge {
    /// Adds one.
    pub fn inc(&self) {
        self.0.block.add(self.0.slot(), 1);
    }
    /// Subtracts one (saturating at zero is the caller's contract: every dec follows an inc).
    pub fn dec(&self) {
        self.0.block.sub(self.0.slot(), 1);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.block.add(self.0.slot(), n);
    }
    /// Subtracts `n` (every sub follows adds at least as large).
    pub fn sub(&self, n: u64) {
        self.0.block.sub(self.0.slot(), n);
    }
    /// Sets the value.
    pub fn set(&self, v: u64) {
        self.0.block.set(self.0.slot(), v);
    }
    /// The current value.
    pub fn value(&self) -> u64 {
        self.0.block.value(self.0.slot())
    }
}

/// One named metric in the store.
#[derive(Clone, Debug)]
pub enum Metric {
    /// A counter.
    Counter(Counter),
    /// A gauge.
    Gauge(Gauge),
}

impl Metric {
    fn handle(&self) -> &Handle {
        match self {
            Metric::Counter(c) => &c.0,
            Metric::Gauge(g) => &g.0,
        }
    }

    /// The current value.
    pub fn value(&self) -> u64 {
        let h = self.handle();
        h.block.value(h.slot())
    }

    /// Whether it was ever written (Envoy's `usedonly`).
    pub fn used(&self) -> bool {
        let h = self.handle();
        h.block.used(h.slot())
    }
}

/// `<prefix>.downstream_cx_total` and `<prefix>.downstream_cx_active` of a listener, one of
/// its workers, or a connection manager; a listener's and a manager's also record
/// `<prefix>.downstream_cx_length_ms`.
#[derive(Clone, Debug)]
pub struct Connections {
    total: Counter,
    active: Gauge,
    length: Option<Histogram>,
}

impl Connections {
    /// Resolves the two handles under `prefix`.
    pub fn new(store: &Store, prefix: &str) -> Self {
        Connections {
            total: store.counter(&format!("{prefix}.downstream_cx_total")),
            active: store.gauge(&format!("{prefix}.downstream_cx_active")),
            length: None,
        }
    }

    /// The two handles and `<prefix>.downstream_cx_length_ms`.
    pub fn timed(store: &Store, prefix: &str) -> Self {
        Connections {
            length: Some(store.histogram(&format!("{prefix}.downstream_cx_length_ms"))),
            ..Connections::new(store, prefix)
        }
    }

    /// Counts a connection; it stays active until the guard drops (also when its task is
    /// cancelled), which records its length when timed.
    pub fn open(&self) -> Open<'_> {
        self.total.inc();
        self.active.inc();
        Open {
            cx: self,
            since: self.length.as_ref().map(|_| std::time::Instant::now()),
        }
    }
}

/// A connection counted active by [`Connections::open`].
#[derive(Debug)]
pub struct Open<'a> {
    cx: &'a Connections,
    since: Option<std::time::Instant>,
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.cx.active.dec();
        if let (Some(h), Some(since)) = (&self.cx.length, self.since) {
            h.record(since.elapsed().as_millis() as u64);
        }
    }
}

/// A block in the store, ordered and looked up by its prefix.
#[derive(Debug)]
struct ByPrefix(Arc<Values>);

impl Borrow<str> for ByPrefix {
    fn borrow(&self) -> &str {
        &self.0.prefix
    }
}

impl PartialEq for ByPrefix {
    fn eq(&self, other: &Self) -> bool {
        self.0.prefix == other.0.prefix
    }
}

impl Eq for ByPrefix {}

impl PartialOrd for ByPrefix {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByPrefix {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.prefix.cmp(&other.0.prefix)
    }
}

/// The process-wide registry of metrics: blocks by prefix. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Store {
    blocks: Arc<Mutex<BTreeSet<ByPrefix>>>,
    histograms: Arc<Histograms>,
    texts: Arc<Mutex<BTreeMap<Box<str>, TextReadout>>>,
    /// The metrics made with their tags given ([`Store::tagged_counter`]), by full name.
    tagged: Arc<Mutex<HashMap<Box<str>, Arc<Tagged>>>>,
}

/// A metric's tag-extracted name and tags as given when it was made, rather than found by
/// the tag extraction rules (Envoy's stats made from a name and a tag vector, as Istio's
/// stats filter makes them).
#[derive(Debug, PartialEq, Eq)]
pub struct Tagged {
    /// The name without its tags.
    pub family: Box<str>,
    /// The tags, in order.
    pub tags: Box<[(Box<str>, Box<str>)]>,
}

impl Tagged {
    /// The full name Envoy gives such a metric: the name, then each tag's name and value,
    /// joined by dots.
    fn full_name(family: &str, tags: &[(&str, &str)]) -> String {
        let mut name = String::from(family);
        for (k, v) in tags {
            name.push('.');
            name.push_str(k);
            name.push('.');
            name.push_str(v);
        }
        name
    }
}

/// The store's histogram blocks and what they are made with.
#[derive(Debug, Default)]
struct Histograms {
    blocks: Mutex<BTreeMap<Box<str>, HistogramBlock>>,
    settings: Mutex<Arc<BucketSettings>>,
    /// Thread slots per histogram: the workers, and one for every other thread.
    slots: Arc<AtomicUsize>,
    /// The blocks the next flush visits.
    flush: histogram::FlushSet,
}

impl Store {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The block of `layout` under `prefix`, created on first use. Asking again returns the
    /// same block. The names of its slots must not have been asked for one by one before.
    pub fn block(&self, prefix: &str, layout: &'static Layout) -> Block {
        self.block_with_zeros(prefix, layout, &[])
    }

    /// The block of `layout` under `prefix` that also lists `zeros` (their `eager` ignored) at
    /// 0, never written: Envoy's stats for events revoy never has, which cost no storage per
    /// block. A name in `zeros` must not be counted elsewhere; if it is, the counted metric
    /// is the one listed.
    pub fn block_with_zeros(
        &self,
        prefix: &str,
        layout: &'static Layout,
        zeros: &'static Layout,
    ) -> Block {
        let mut blocks = self.blocks.lock().expect("stats lock");
        if let Some(b) = blocks.get(prefix)
            && std::ptr::eq(b.0.layout, layout)
            && std::ptr::eq(b.0.zeros, zeros)
        {
            return Block(b.0.clone());
        }
        let b = Arc::new(Values::with_zeros(prefix, layout, zeros));
        blocks.replace(ByPrefix(b.clone()));
        Block(b)
    }

    /// The counter named `name`, created on first use. Asking again returns the same counter.
    pub fn counter(&self, name: &str) -> Counter {
        Counter(self.named(name, Kind::Counter, &SINGLE_COUNTER))
    }

    /// The gauge named `name`, created on first use.
    pub fn gauge(&self, name: &str) -> Gauge {
        Gauge(self.named(name, Kind::Gauge, &SINGLE_GAUGE))
    }

    /// The metric `name` of `kind`: a metric of its own, or the slot of a block whose prefix
    /// ends at one of the name's dots; else a new metric of its own.
    fn named(&self, name: &str, kind: Kind, single: &'static Layout) -> Handle {
        let mut blocks = self.blocks.lock().expect("stats lock");
        if let Some(b) = blocks.get(name)
            && std::ptr::eq(b.0.layout, single)
        {
            return Handle::new(&b.0, 0);
        }
        for (dot, _) in name.match_indices('.') {
            let (prefix, rest) = name.split_at(dot + 1);
            if let Some(b) = blocks.get(prefix)
                && let Some(slot) = b.0.slot(rest, kind)
            {
                return Handle::new(&b.0, slot);
            }
        }
        let b = Arc::new(Values::new(name, single));
        blocks.replace(ByPrefix(b.clone()));
        Handle::new(&b, 0)
    }

    /// The counter `family` with `tags` (see [`Tagged`]), made on first use.
    pub fn tagged_counter(&self, family: &str, tags: &[(&str, &str)]) -> Counter {
        let name = self.tag(family, tags);
        self.counter(&name)
    }

    /// The histogram `family` with `tags` (see [`Tagged`]), made on first use.
    pub fn tagged_histogram(&self, family: &str, tags: &[(&str, &str)]) -> Histogram {
        let name = self.tag(family, tags);
        self.histogram(&name)
    }

    /// Records the tags of the metric `family` with `tags`; answers its full name.
    fn tag(&self, family: &str, tags: &[(&str, &str)]) -> String {
        let name = Tagged::full_name(family, tags);
        let mut tagged = self.tagged.lock().expect("stats lock");
        if !tagged.contains_key(name.as_str()) {
            tagged.insert(
                name.as_str().into(),
                Arc::new(Tagged {
                    family: family.into(),
                    tags: tags
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                }),
            );
        }
        name
    }

    /// The metrics made with their tags, by full name.
    pub fn tagged(&self) -> HashMap<Box<str>, Arc<Tagged>> {
        self.tagged.lock().expect("stats lock").clone()
    }

    /// The text readout named `name`, made on first use.
    pub fn text_readout(&self, name: &str) -> TextReadout {
        let mut texts = self.texts.lock().expect("stats lock");
        if let Some(t) = texts.get(name) {
            return t.clone();
        }
        let t = TextReadout::default();
        texts.insert(name.into(), t.clone());
        t
    }

    /// Every text readout, sorted by name.
    pub fn text_readouts(&self) -> Vec<(String, TextReadout)> {
        let texts = self.texts.lock().expect("stats lock");
        texts
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect()
    }

    /// Gives histograms made from now on a shard per worker (`workers` of them) besides the
    /// one every other thread shares.
    pub fn set_workers(&self, workers: usize) {
        self.histograms.slots.store(workers + 1, Ordering::Relaxed);
    }

    /// Sets the bucket bounds of histograms made from now on (the bootstrap's
    /// `stats_config.histogram_bucket_settings`).
    pub fn set_bucket_settings(&self, settings: BucketSettings) {
        *self.histograms.settings.lock().expect("stats lock") = Arc::new(settings);
    }

    /// The histograms `names` under `prefix`, made on first use; asking again with the same
    /// names returns the same block.
    pub fn histogram_block(&self, prefix: &str, names: &'static [&'static str]) -> HistogramBlock {
        let mut blocks = self.histograms.blocks.lock().expect("stats lock");
        if let Some(b) = blocks.get(prefix)
            && std::ptr::eq(b.0.names(), names)
        {
            return b.clone();
        }
        let settings = self.histograms.settings.lock().expect("stats lock").clone();
        let b = HistogramBlock::values(
            prefix,
            names,
            settings,
            self.histograms.slots.clone(),
            self.histograms.flush.pending(),
        );
        blocks.insert(prefix.into(), b.clone());
        b
    }

    /// The histogram named `name`, made on first use.
    pub fn histogram(&self, name: &str) -> Histogram {
        static SINGLE: [&str; 1] = [""];
        self.histogram_block(name, &SINGLE).single()
    }

    /// The histogram named `name`, made on first use, for values recorded off the workers
    /// (the xDS thread's `update_duration`): one shard, not one per worker, so each of
    /// thousands of EDS clusters pays for one.
    pub fn control_histogram(&self, name: &str) -> Histogram {
        static SINGLE: [&str; 1] = [""];
        let mut blocks = self.histograms.blocks.lock().expect("stats lock");
        if let Some(b) = blocks.get(name)
            && std::ptr::eq(b.0.names(), &SINGLE)
        {
            return b.clone().single();
        }
        let settings = self.histograms.settings.lock().expect("stats lock").clone();
        let b = HistogramBlock::values(
            name,
            &SINGLE,
            settings,
            Arc::new(AtomicUsize::new(1)),
            self.histograms.flush.pending(),
        );
        blocks.insert(name.into(), b.clone());
        b.single()
    }

    /// A stats flush: every histogram's values since the last one become its interval and
    /// join its cumulative view.
    pub fn flush_histograms(&self) {
        self.histograms.flush.flush();
    }

    /// Every histogram as the last flush left it, sorted by name.
    pub fn histogram_views(&self) -> Vec<HistogramView> {
        let blocks: Vec<HistogramBlock> = {
            let blocks = self.histograms.blocks.lock().expect("stats lock");
            blocks.values().cloned().collect()
        };
        let mut out: Vec<HistogramView> = blocks.iter().flat_map(|b| b.0.views()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// A sorted copy of every metric, for rendering.
    pub fn snapshot(&self) -> Vec<(String, Metric)> {
        self.snapshot_with(true)
    }

    /// A sorted copy of every metric, the blocks' zeros only when `zeros` (they are never
    /// used, so a `usedonly` rendering need not make them: some fifty per cluster).
    pub fn snapshot_with(&self, zeros: bool) -> Vec<(String, Metric)> {
        let blocks: Vec<Arc<Values>> = {
            let blocks = self.blocks.lock().expect("stats lock");
            blocks.iter().map(|b| b.0.clone()).collect()
        };
        let (zero_counter, zero_gauge) = (Counter::default(), Gauge::default());
        let is_zero = |m: &Metric| {
            Arc::ptr_eq(&m.handle().block, &zero_counter.0.block)
                || Arc::ptr_eq(&m.handle().block, &zero_gauge.0.block)
        };
        let mut out = Vec::new();
        for b in &blocks {
            for (i, slot) in b.layout.iter().enumerate() {
                if b.declared(i) {
                    let h = Handle::new(b, i);
                    let metric = match slot.kind {
                        Kind::Counter => Metric::Counter(Counter(h)),
                        Kind::Gauge => Metric::Gauge(Gauge(h)),
                    };
                    out.push((format!("{}{}", b.prefix, slot.name), metric));
                }
            }
            for slot in b.zeros.iter().filter(|_| zeros) {
                let metric = match slot.kind {
                    Kind::Counter => Metric::Counter(zero_counter.clone()),
                    Kind::Gauge => Metric::Gauge(zero_gauge.clone()),
                };
                out.push((format!("{}{}", b.prefix, slot.name), metric));
            }
        }
        // A name both counted and listed as a zero shows the counted metric.
        out.sort_by(|a, b| a.0.cmp(&b.0).then(is_zero(&a.1).cmp(&is_zero(&b.1))));
        out.dedup_by(|later, first| later.0 == first.0 && is_zero(&later.1));
        out
    }

    /// Drops the metrics named `prefix*` that nothing but the store holds any more (those of
    /// a removed cluster or listener, once its last connection or request let go). Answers
    /// whether some under `prefix` are still held, so the caller can try again later.
    pub fn release(&self, prefix: &str) -> bool {
        let mut blocks = self.blocks.lock().expect("stats lock");
        let mut held = false;
        let unheld: Vec<Arc<Values>> = blocks
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|b| b.0.prefix.starts_with(prefix))
            .filter(|b| {
                let keep = Arc::strong_count(&b.0) > 1;
                held |= keep;
                !keep
            })
            .map(|b| b.0.clone())
            .collect();
        for b in unheld {
            blocks.remove(&*b.prefix);
        }
        drop(blocks);
        let mut histograms = self.histograms.blocks.lock().expect("stats lock");
        histograms.retain(|p, b| {
            if !p.starts_with(prefix) {
                return true;
            }
            let keep = Arc::strong_count(&b.0) > 1;
            held |= keep;
            keep
        });
        drop(histograms);
        self.texts.lock().expect("stats lock").retain(|n, t| {
            if !n.starts_with(prefix) {
                return true;
            }
            let keep = t.shared();
            held |= keep;
            keep
        });
        held
    }

    /// Sets every counter back to zero (`/reset_counters`).
    pub fn reset_counters(&self) {
        let blocks = self.blocks.lock().expect("stats lock");
        for b in blocks.iter() {
            for (slot, value) in b.0.layout.iter().zip(b.0.values.iter()) {
                if slot.kind == Kind::Counter {
                    value.store(0, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_active_until_its_guard_drops() {
        let s = Store::new();
        let cx = Connections::new(&s, "listener.a");
        let open = cx.open();
        let (total, active) = (
            s.counter("listener.a.downstream_cx_total"),
            s.gauge("listener.a.downstream_cx_active"),
        );
        assert_eq!((total.value(), active.value()), (1, 1));
        drop(open);
        assert_eq!((total.value(), active.value()), (1, 0));
    }

    #[test]
    fn release_drops_only_what_nothing_else_holds() {
        let s = Store::new();
        let held = s.counter("cluster.gone.upstream_rq_total");
        s.gauge("cluster.gone.membership_total");
        s.counter("cluster.gone2.upstream_rq_total");
        assert!(s.release("cluster.gone."));
        let names: Vec<String> = s.snapshot().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "cluster.gone.upstream_rq_total",
                "cluster.gone2.upstream_rq_total"
            ]
        );
        drop(held);
        assert!(!s.release("cluster.gone."));
        assert_eq!(s.snapshot().len(), 1);
    }

    #[test]
    fn text_readouts_are_kept_by_name_and_released_like_the_others() {
        let s = Store::new();
        s.text_readout("cluster.gone.version_text").set("v1");
        let held = s.text_readout("cluster.kept.version_text");
        assert_eq!(s.text_readout("cluster.gone.version_text").value(), "v1");
        assert!(!s.release("cluster.gone."));
        assert!(s.release("cluster.kept."));
        let names: Vec<String> = s.text_readouts().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["cluster.kept.version_text"]);
        assert!(!held.used());
    }

    static LAYOUT: [Slot; 3] = [
        Slot {
            name: "rq_active",
            kind: Kind::Gauge,
            eager: true,
        },
        Slot {
            name: "rq_rare",
            kind: Kind::Counter,
            eager: false,
        },
        Slot {
            name: "rq_total",
            kind: Kind::Counter,
            eager: true,
        },
    ];

    fn names(s: &Store) -> Vec<String> {
        s.snapshot().into_iter().map(|(n, _)| n).collect()
    }

    #[test]
    fn a_block_lists_its_eager_slots_and_the_others_once_declared() {
        let s = Store::new();
        let b = s.block("cluster.a.b.", &LAYOUT);
        s.counter("cluster.a.b.upstream_rq_200").inc();
        assert_eq!(
            names(&s),
            [
                "cluster.a.b.rq_active",
                "cluster.a.b.rq_total",
                "cluster.a.b.upstream_rq_200"
            ]
        );
        b.declare(1);
        assert!(names(&s).contains(&"cluster.a.b.rq_rare".to_owned()));
        // Asking again is the same block.
        s.block("cluster.a.b.", &LAYOUT).counter(2).add(2);
        assert_eq!(b.counter(2).value(), 2);
    }

    #[test]
    fn a_name_in_a_block_resolves_to_its_slot() {
        let s = Store::new();
        let b = s.block("cluster.a.b.", &LAYOUT);
        let total = s.counter("cluster.a.b.rq_total");
        total.inc();
        b.counter(2).inc();
        assert_eq!(total.value(), 2);
        s.gauge("cluster.a.b.rq_active").set(7);
        assert_eq!(b.gauge(0).value(), 7);
        // A lazy slot asked for by name is declared by it.
        s.counter("cluster.a.b.rq_rare").inc();
        let snap = s.snapshot();
        let rare = snap.iter().find(|(n, _)| n == "cluster.a.b.rq_rare");
        assert_eq!(rare.map(|(_, m)| (m.value(), m.used())), Some((1, true)));
        // The same suffix with the wrong kind is not the slot: a metric of its own.
        s.gauge("cluster.a.b.rq_total").set(3);
        assert_eq!(b.counter(2).value(), 2);
        assert_eq!(names(&s).len(), 4);
    }

    #[test]
    fn block_slots_track_use_and_reset_like_the_others() {
        let s = Store::new();
        let b = s.block("listener.x.", &LAYOUT);
        b.gauge(0).set(0);
        b.counter(2).add(5);
        let used: Vec<(String, bool)> = s
            .snapshot()
            .into_iter()
            .map(|(n, m)| (n, m.used()))
            .collect();
        assert_eq!(
            used,
            [
                ("listener.x.rq_active".to_owned(), true),
                ("listener.x.rq_total".to_owned(), true)
            ]
        );
        b.gauge(0).set(4);
        s.reset_counters();
        assert_eq!((b.gauge(0).value(), b.counter(2).value()), (4, 0));
    }

    #[test]
    fn release_drops_a_block_once_nothing_holds_it() {
        let s = Store::new();
        let b = s.block("cluster.gone.", &LAYOUT);
        s.block("cluster.gone2.", &LAYOUT);
        assert!(s.release("cluster.gone."));
        assert_eq!(names(&s).len(), 4);
        drop(b);
        assert!(!s.release("cluster.gone."));
        assert_eq!(
            names(&s),
            ["cluster.gone2.rq_active", "cluster.gone2.rq_total"]
        );
    }

    #[test]
    fn zeros_are_listed_unused_and_give_way_to_a_counted_metric() {
        static ZEROS: [Slot; 2] = [Slot::counter("rq_never"), Slot::gauge("rq_total")];
        let s = Store::new();
        let b = s.block_with_zeros("cluster.z.", &LAYOUT, &ZEROS);
        b.counter(2).inc();
        let listed: Vec<(String, u64, bool, bool)> = s
            .snapshot()
            .into_iter()
            .map(|(n, m)| {
                let gauge = matches!(m, Metric::Gauge(_));
                (n, m.value(), m.used(), gauge)
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("cluster.z.rq_active".to_owned(), 0, false, true),
                ("cluster.z.rq_never".to_owned(), 0, false, false),
                ("cluster.z.rq_total".to_owned(), 1, true, false),
            ]
        );
        s.reset_counters();
        assert_eq!(s.snapshot().len(), 3);
        // Without the zeros (a `usedonly` rendering): the counted metric stays.
        let names: Vec<String> = s.snapshot_with(false).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["cluster.z.rq_active", "cluster.z.rq_total"]);
    }

    #[test]
    fn handles_share_one_value_and_track_use() {
        let s = Store::new();
        let a = s.counter("cluster.x.upstream_rq_total");
        let b = s.counter("cluster.x.upstream_rq_total");
        let g = s.gauge("server.state");
        assert!(!s.snapshot().iter().any(|(_, m)| m.used()));
        a.inc();
        b.add(2);
        g.set(0);
        assert_eq!(a.value(), 3);
        let snap = s.snapshot();
        assert_eq!(snap.len(), 2);
        assert!(snap.iter().all(|(_, m)| m.used()));
        s.reset_counters();
        assert_eq!(b.value(), 0);
    }
}
