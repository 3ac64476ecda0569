//! Histograms as Envoy keeps them: each thread records into bins of its own (no lock, no
//! cache line another thread writes), and a stats flush merges every thread's bins into the
//! interval view (what the last flush period recorded) and the cumulative view (everything up
//! to the last flush). Values recorded since the last flush are in neither yet, as in Envoy.
//!
//! Like the counters, histograms live in blocks: a fixed list of names under one prefix (a
//! cluster's five), the prefix once and the histograms in one allocation.
//!
//! A flush visits only the blocks recorded into since the previous one (they put themselves on
//! a [`Pending`] list at their first value of a period) and those the previous flush gave an
//! interval, so its cost follows what traffic touched, not how many clusters exist.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::circllhist::{self, Bin, DECADES, PER_DECADE};

thread_local! {
    /// The shard this thread records into: 0 for any thread but a worker.
    static SHARD: Cell<usize> = const { Cell::new(0) };
}

/// Makes the current thread worker `index`: its recordings go to a shard only it writes.
pub fn enter_worker(index: usize) {
    SHARD.with(|s| s.set(index + 1));
}

/// One decade's 90 bins.
type Decade = [AtomicU64; PER_DECADE];

/// One thread's bins of one histogram, on cache lines of their own. Decades are allocated on
/// first use (a latency histogram touches two or three).
#[repr(align(64))]
#[derive(Default)]
struct Shard {
    zero: AtomicU64,
    decades: [AtomicPtr<Decade>; DECADES],
}

impl Shard {
    #[inline]
    fn record(&self, value: u64) {
        let bin = circllhist::bin_of(value);
        // SeqCst, as the loads of `count` and `add_to` and the block's `dirty` flag: see
        // `Values::record`. (On x86 every read-modify-write is already a full barrier.)
        if bin == 0 {
            self.zero.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let i = usize::from(bin) - 1;
        self.decade(i / PER_DECADE)[i % PER_DECADE].fetch_add(1, Ordering::SeqCst);
    }

    fn decade(&self, d: usize) -> &Decade {
        let cell = &self.decades[d];
        let mut p = cell.load(Ordering::Acquire);
        if p.is_null() {
            let fresh = Box::into_raw(Box::new(std::array::from_fn(|_| AtomicU64::new(0))));
            p = match cell.compare_exchange(
                std::ptr::null_mut(),
                fresh,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => fresh,
                Err(theirs) => {
                    // SAFETY: `fresh` came from Box::into_raw just above and was never shared.
                    drop(unsafe { Box::from_raw(fresh) });
                    theirs
                }
            };
        }
        // SAFETY: a non-null pointer in `decades` is a leaked Box freed only in Drop.
        unsafe { &*p }
    }

    /// How many values this shard holds.
    fn count(&self) -> u64 {
        let decades = self.decades.iter().filter_map(|cell| {
            let p = cell.load(Ordering::Acquire);
            // SAFETY: as in `decade`.
            (!p.is_null()).then(|| unsafe { &*p })
        });
        let binned: u64 = decades
            .flat_map(|d| d.iter())
            .map(|c| c.load(Ordering::SeqCst))
            .sum();
        self.zero.load(Ordering::SeqCst) + binned
    }

    /// Adds this shard's counts to `totals` (indexed by bin).
    fn add_to(&self, totals: &mut [u64]) {
        totals[0] += self.zero.load(Ordering::SeqCst);
        for (d, cell) in self.decades.iter().enumerate() {
            let p = cell.load(Ordering::Acquire);
            if p.is_null() {
                continue;
            }
            // SAFETY: as in `decade`.
            let decade = unsafe { &*p };
            for (i, c) in decade.iter().enumerate() {
                totals[1 + d * PER_DECADE + i] += c.load(Ordering::SeqCst);
            }
        }
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        for cell in &mut self.decades {
            let p = *cell.get_mut();
            if !p.is_null() {
                // SAFETY: leaked by `decade`, and nothing else holds the shard any more.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

/// What the last flush made of a histogram.
#[derive(Debug, Default, Clone)]
struct Merged {
    interval: Vec<(Bin, u64)>,
    cumulative: Vec<(Bin, u64)>,
    /// How many values `cumulative` holds.
    count: u64,
}

/// One histogram of a block.
#[derive(Default)]
struct Histo {
    /// One shard per thread slot (0: threads other than the workers), made at the first value.
    shards: OnceLock<Box<[Shard]>>,
    /// `None` until a flush found values.
    merged: Mutex<Option<Box<Merged>>>,
}

impl std::fmt::Debug for Histo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histo").finish_non_exhaustive()
    }
}

/// Bucket bounds per histogram name: `stats_config.histogram_bucket_settings`.
#[derive(Debug, Default)]
pub struct BucketSettings {
    rules: Vec<(crate::route::matcher::StringMatcher, Arc<[f64]>)>,
}

impl BucketSettings {
    /// Rules in order: the first whose matcher matches a histogram's name gives its bounds
    /// (each list sorted ascending; checked positive and unique by the bootstrap compile).
    pub fn new(rules: Vec<(crate::route::matcher::StringMatcher, Vec<f64>)>) -> Self {
        BucketSettings {
            rules: rules
                .into_iter()
                .map(|(m, mut b)| {
                    b.sort_by(f64::total_cmp);
                    (m, b.into())
                })
                .collect(),
        }
    }

    /// The index of the rule for `name`, or `u16::MAX` for the default buckets.
    fn rule_for(&self, name: &str) -> u16 {
        self.rules
            .iter()
            .position(|(m, _)| m.matches(name))
            .map_or(u16::MAX, |i| i as u16)
    }

    fn bounds(&self, rule: u16) -> Arc<[f64]> {
        match self.rules.get(usize::from(rule)) {
            Some((_, b)) => b.clone(),
            None => Arc::from(&circllhist::DEFAULT_BUCKETS[..]),
        }
    }
}

/// A block's names, values and settings.
#[derive(Debug)]
pub(super) struct Values {
    pub(super) prefix: Box<str>,
    names: &'static [&'static str],
    histos: Box<[Histo]>,
    /// Per histogram, its bucket rule in `settings`.
    rules: Box<[u16]>,
    settings: Arc<BucketSettings>,
    /// How many thread slots a histogram's shards have (the workers and one more).
    slots: Arc<AtomicUsize>,
    /// Whether the block is on `pending` for the next flush.
    dirty: AtomicBool,
    /// The list the block puts itself on when recorded into.
    pending: Arc<Pending>,
    /// The block itself, for `pending`.
    me: Weak<Values>,
}

/// The blocks recorded into since the last stats flush, each once.
#[derive(Debug, Default)]
pub(super) struct Pending(Mutex<Vec<Weak<Values>>>);

impl Pending {
    /// Takes the blocks listed so far (those still alive).
    fn take(&self) -> Vec<Arc<Values>> {
        std::mem::take(&mut *self.0.lock().expect("histogram lock"))
            .into_iter()
            .filter_map(|b| b.upgrade())
            .collect()
    }
}

/// What a stats flush merges: the blocks recorded into since the previous flush, and those the
/// previous flush left an interval in (it must become empty if nothing came since).
#[derive(Debug, Default)]
pub(super) struct FlushSet {
    pending: Arc<Pending>,
    with_interval: Mutex<Vec<Weak<Values>>>,
}

impl FlushSet {
    /// The list blocks made for this set put themselves on.
    pub(super) fn pending(&self) -> Arc<Pending> {
        self.pending.clone()
    }

    /// A stats flush: every histogram's values since the last one become its interval and
    /// join its cumulative view; the blocks not visited keep an empty interval.
    pub(super) fn flush(&self) {
        let mut with_interval = self.with_interval.lock().expect("histogram lock");
        let recorded = self.pending.take();
        let mut totals = vec![0u64; circllhist::BINS];
        let fresh: std::collections::HashSet<*const Values> =
            recorded.iter().map(Arc::as_ptr).collect();
        for b in std::mem::take(&mut *with_interval) {
            if let Some(b) = b.upgrade().filter(|b| !fresh.contains(&Arc::as_ptr(b))) {
                b.flush_with(&mut totals);
            }
        }
        for b in &recorded {
            b.flush_with(&mut totals);
        }
        *with_interval = recorded.iter().map(Arc::downgrade).collect();
    }
}

/// A block of histograms under one prefix. Cheap to clone; every clone is the same block.
#[derive(Clone, Debug)]
pub struct HistogramBlock(pub(super) Arc<Values>);

/// A histogram of a block, borrowed from it.
#[derive(Clone, Copy, Debug)]
pub struct HistogramRef<'a> {
    block: &'a Values,
    index: usize,
}

impl HistogramRef<'_> {
    /// Records one value (milliseconds, or a count) on the calling thread's shard.
    #[inline]
    pub fn record(self, value: u64) {
        self.block.record(self.index, value);
    }
}

/// A histogram of its own (an owned reference into its block).
#[derive(Clone, Debug)]
pub struct Histogram(HistogramBlock);

impl Histogram {
    /// Records one value on the calling thread's shard.
    #[inline]
    pub fn record(&self, value: u64) {
        (self.0).0.record(0, value);
    }
}

impl Values {
    fn new(
        prefix: &str,
        names: &'static [&'static str],
        settings: Arc<BucketSettings>,
        slots: Arc<AtomicUsize>,
        pending: Arc<Pending>,
        me: Weak<Values>,
    ) -> Self {
        Values {
            prefix: prefix.into(),
            names,
            histos: names.iter().map(|_| Histo::default()).collect(),
            rules: names
                .iter()
                .map(|n| settings.rule_for(&format!("{prefix}{n}")))
                .collect(),
            settings,
            slots,
            dirty: AtomicBool::new(false),
            pending,
            me,
        }
    }

    pub(super) fn names(&self) -> &'static [&'static str] {
        self.names
    }

    #[inline]
    fn record(&self, index: usize, value: u64) {
        let shards = self.histos[index].shards.get_or_init(|| {
            let n = self.slots.load(Ordering::Relaxed).max(1);
            (0..n).map(|_| Shard::default()).collect()
        });
        let slot = SHARD.with(Cell::get);
        shards.get(slot).unwrap_or(&shards[0]).record(value);
        // After the value: a flush clears the flag before it reads the values, so either it
        // sees this value or this load sees the flag cleared and lists the block again.
        if !self.dirty.load(Ordering::SeqCst) {
            self.list_for_flush();
        }
    }

    /// Puts the block on the next flush's list, once per flush period.
    #[cold]
    fn list_for_flush(&self) {
        if !self.dirty.swap(true, Ordering::SeqCst) {
            self.pending
                .0
                .lock()
                .expect("histogram lock")
                .push(self.me.clone());
        }
    }

    /// Merges every histogram's shards: the interval becomes what was recorded since the
    /// previous flush, the cumulative view everything so far.
    #[cfg(test)]
    pub(super) fn flush(&self) {
        self.flush_with(&mut vec![0u64; circllhist::BINS]);
    }

    /// [`Values::flush`] with `totals` (`circllhist::BINS` long) as scratch space: one buffer
    /// for a whole stats flush rather than one per block.
    pub(super) fn flush_with(&self, totals: &mut [u64]) {
        self.dirty.store(false, Ordering::SeqCst);
        for h in &self.histos {
            let mut merged = h.merged.lock().expect("histogram lock");
            let Some(shards) = h.shards.get() else {
                continue;
            };
            // Nothing recorded since the last flush (most of an Istio sidecar's thousands of
            // histograms): the interval is empty, without merging every bin.
            let count: u64 = shards.iter().map(Shard::count).sum();
            if let Some(m) = merged.as_mut()
                && m.count == count
            {
                m.interval.clear();
                continue;
            }
            totals.fill(0);
            for s in shards.iter() {
                s.add_to(totals);
            }
            let m = merged.get_or_insert_with(Default::default);
            m.count = count;
            let before = std::mem::take(&mut m.cumulative);
            let mut previous = before.iter().peekable();
            m.interval.clear();
            for (bin, &count) in totals.iter().enumerate() {
                if count == 0 {
                    continue;
                }
                let bin = bin as Bin;
                let mut before = 0;
                while let Some(&&(b, c)) = previous.peek() {
                    if b > bin {
                        break;
                    }
                    if b == bin {
                        before = c;
                    }
                    previous.next();
                }
                if count > before {
                    m.interval.push((bin, count - before));
                }
                m.cumulative.push((bin, count));
            }
        }
    }

    /// The block's histograms as the last flush left them.
    pub(super) fn views(&self) -> impl Iterator<Item = HistogramView> + '_ {
        self.names
            .iter()
            .zip(&self.histos)
            .zip(self.rules.iter())
            .map(|((name, h), rule)| {
                let merged = h.merged.lock().expect("histogram lock").clone();
                HistogramView {
                    name: format!("{}{name}", self.prefix),
                    merged: merged.map(|m| *m).unwrap_or_default(),
                    bounds: self.settings.bounds(*rule),
                }
            })
    }
}

impl HistogramBlock {
    pub(super) fn values(
        prefix: &str,
        names: &'static [&'static str],
        settings: Arc<BucketSettings>,
        slots: Arc<AtomicUsize>,
        pending: Arc<Pending>,
    ) -> Self {
        HistogramBlock(Arc::new_cyclic(|me| {
            Values::new(prefix, names, settings, slots, pending, me.clone())
        }))
    }

    /// The histogram at `index` of the block's names.
    pub fn get(&self, index: usize) -> HistogramRef<'_> {
        HistogramRef {
            block: &self.0,
            index,
        }
    }

    /// The block's only histogram (one asked for by its whole name).
    pub(super) fn single(self) -> Histogram {
        Histogram(self)
    }
}

/// A histogram as the last flush left it, for rendering.
#[derive(Debug, Clone)]
pub struct HistogramView {
    /// Its full name.
    pub name: String,
    merged: Merged,
    /// Its bucket upper bounds, ascending.
    pub bounds: Arc<[f64]>,
}

impl HistogramView {
    /// Whether a flush has found values in it (Envoy's `used`).
    pub fn used(&self) -> bool {
        !self.merged.cumulative.is_empty()
    }

    /// The bins recorded in the last flush period.
    pub fn interval(&self) -> &[(Bin, u64)] {
        &self.merged.interval
    }

    /// The bins recorded up to the last flush.
    pub fn cumulative(&self) -> &[(Bin, u64)] {
        &self.merged.cumulative
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(slots: usize) -> HistogramBlock {
        static NAMES: [&str; 2] = ["a_ms", "b_ms"];
        HistogramBlock::values(
            "x.",
            &NAMES,
            Arc::default(),
            Arc::new(AtomicUsize::new(slots)),
            Arc::default(),
        )
    }

    fn view(b: &HistogramBlock, i: usize) -> HistogramView {
        b.0.views().nth(i).expect("a histogram")
    }

    #[test]
    fn nothing_shows_before_a_flush_and_intervals_follow_flushes() {
        let b = block(3);
        b.get(0).record(5);
        b.get(0).record(52);
        assert!(!view(&b, 0).used());
        b.0.flush();
        let v = view(&b, 0);
        assert!(v.used());
        let five = circllhist::bin_of(5);
        let fifty_two = circllhist::bin_of(52);
        assert_eq!(v.interval(), [(five, 1), (fifty_two, 1)]);
        assert_eq!(v.cumulative(), v.interval());
        assert!(!view(&b, 1).used());
        b.get(0).record(52);
        b.0.flush();
        let v = view(&b, 0);
        assert_eq!(v.interval(), [(fifty_two, 1)]);
        assert_eq!(v.cumulative(), [(five, 1), (fifty_two, 2)]);
        b.0.flush();
        let v = view(&b, 0);
        assert!(v.interval().is_empty() && v.used());
        assert_eq!(v.name, "x.a_ms");
    }

    #[test]
    fn a_flush_set_merges_recorded_blocks_and_empties_their_intervals_later() {
        static NAMES: [&str; 1] = ["t_ms"];
        let set = FlushSet::default();
        let make = |prefix| {
            HistogramBlock::values(
                prefix,
                &NAMES,
                Arc::default(),
                Arc::new(AtomicUsize::new(1)),
                set.pending(),
            )
        };
        let (a, b) = (make("a."), make("b."));
        a.get(0).record(3);
        a.get(0).record(4);
        set.flush();
        assert_eq!(circllhist::count(view(&a, 0).interval()), 2);
        assert!(!view(&b, 0).used());
        // Listed once per period however many values come.
        assert!(set.pending.0.lock().unwrap().is_empty());
        b.get(0).record(7);
        b.get(0).record(8);
        assert_eq!(set.pending.0.lock().unwrap().len(), 1);
        set.flush();
        // `a` had nothing new: its interval is emptied though it was not recorded into.
        let va = view(&a, 0);
        assert!(va.interval().is_empty() && va.used());
        assert_eq!(circllhist::count(va.cumulative()), 2);
        assert_eq!(circllhist::count(view(&b, 0).interval()), 2);
        a.get(0).record(5);
        set.flush();
        assert_eq!(circllhist::count(view(&a, 0).interval()), 1);
        assert_eq!(circllhist::count(view(&a, 0).cumulative()), 3);
        assert!(view(&b, 0).interval().is_empty());
        // A block dropped while listed is skipped.
        let c = make("c.");
        c.get(0).record(1);
        drop(c);
        set.flush();
    }

    #[test]
    fn workers_record_on_their_own_shards_and_flushes_merge_them() {
        let b = block(3);
        let threads: Vec<_> = (0..4)
            .map(|w| {
                let b = b.clone();
                std::thread::spawn(move || {
                    // Worker 2 has no slot of its own (two workers): it shares slot 0.
                    if w < 3 {
                        enter_worker(w);
                    }
                    for v in 0..1000 {
                        b.get(1).record(v);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("recording thread");
        }
        b.0.flush();
        let v = view(&b, 1);
        assert_eq!(circllhist::count(v.cumulative()), 4000);
        assert_eq!(v.cumulative()[0], (0, 4));
        let shards = b.0.histos[1].shards.get().expect("shards");
        assert_eq!(shards.len(), 3);
        assert_eq!(std::mem::align_of::<Shard>(), 64);
    }

    #[test]
    fn bucket_rules_pick_the_first_match_else_the_defaults() {
        use crate::route::matcher::StringMatcher;
        let settings = Arc::new(BucketSettings::new(vec![
            (StringMatcher::Suffix("b_ms".into(), false), vec![10.0, 1.0]),
            (StringMatcher::Prefix("x.".into(), false), vec![7.0]),
        ]));
        static NAMES: [&str; 2] = ["a_ms", "b_ms"];
        let b = HistogramBlock::values("x.", &NAMES, settings, Arc::default(), Arc::default());
        let bounds: Vec<Vec<f64>> = b.0.views().map(|v| v.bounds.to_vec()).collect();
        assert_eq!(bounds, [vec![7.0], vec![1.0, 10.0]]);
        let d = HistogramBlock::values(
            "y.",
            &NAMES[..1],
            Arc::default(),
            Arc::default(),
            Arc::default(),
        );
        assert_eq!(
            d.0.views().next().map(|v| v.bounds.len()),
            Some(circllhist::DEFAULT_BUCKETS.len())
        );
    }
}
