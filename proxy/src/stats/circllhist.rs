//! The maths of Envoy's histograms: libcircllhist's log-linear bins (two significant decimal
//! digits) for the integer values Envoy records, and what Envoy computes from them (type-1
//! quantiles with samples spread evenly inside a bin, the approximate sum, the counts at or
//! below a bucket bound). Written from libcircllhist's documented behaviour; Envoy 1.40's
//! output for the same recorded values is the reference (see the tests).

/// Decades a `u64` spans (`10^0` .. `10^19`), each of 90 bins (`10..=99` times a power of 10).
pub const DECADES: usize = 20;
/// Bins per decade.
pub const PER_DECADE: usize = 90;
/// Bins in all: the zero bin, then every decade's.
pub const BINS: usize = 1 + DECADES * PER_DECADE;

/// The quantiles Envoy computes, in order.
pub const QUANTILES: [f64; 10] = [0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0];

/// Envoy's default bucket upper bounds (`HistogramSettingsImpl::defaultBuckets`).
pub const DEFAULT_BUCKETS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];

/// A bin: 0 is the zero bin; `1 + decade * 90 + (v - 10)` holds values whose two leading
/// digits are `v` (`10..=99`) at exponent `decade` (the value `v / 10 * 10^decade`).
pub type Bin = u16;

const POW10: [u64; 20] = {
    let mut p = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        p[i] = p[i - 1] * 10;
        i += 1;
    }
    p
};

/// The bin of an integer value, as libcircllhist's `int_scale_to_hist_bucket(value, 0)`.
#[inline]
pub fn bin_of(value: u64) -> Bin {
    if value == 0 {
        return 0;
    }
    let (decade, lead) = if value < 10 {
        (0, value * 10)
    } else {
        let digits = value.ilog10() as usize + 1;
        (digits - 1, value / POW10[digits - 2])
    };
    (1 + decade * PER_DECADE + (lead as usize - 10)) as Bin
}

/// The decade and the two leading digits of a non-zero bin.
fn parts(bin: Bin) -> (i32, f64) {
    let i = usize::from(bin) - 1;
    ((i / PER_DECADE) as i32, (i % PER_DECADE + 10) as f64)
}

/// `10^e` as the literal libcircllhist's table holds.
fn pow10(e: i32) -> f64 {
    format!("1e{e}").parse().unwrap_or(f64::NAN)
}

/// The lower bound of a bin.
pub fn lower(bin: Bin) -> f64 {
    if bin == 0 {
        return 0.0;
    }
    let (e, v) = parts(bin);
    v / 10.0 * pow10(e)
}

/// The width of a bin (0 for the zero bin).
pub fn width(bin: Bin) -> f64 {
    if bin == 0 {
        return 0.0;
    }
    pow10(parts(bin).0) / 10.0
}

/// The point libcircllhist takes for a bin's samples when summing (the harmonic mean of its
/// bounds).
fn midpoint(bin: Bin) -> f64 {
    if bin == 0 {
        return 0.0;
    }
    let (bottom, w) = (lower(bin), width(bin));
    let top = bottom + w;
    bottom + w * (bottom / (bottom + top))
}

/// The bin `threshold` falls in, as libcircllhist's `double_to_hist_bucket`, as an ordering
/// key comparable with [`Bin`]s; `None` for a threshold at or below zero.
fn threshold_bin(threshold: f64) -> Option<Bin> {
    if threshold.is_nan() || threshold <= 0.0 {
        return None;
    }
    if threshold.is_infinite() {
        return Some(Bin::MAX);
    }
    let mut e = threshold.log10().floor() as i32;
    let mut v = (threshold / pow10(e) * 10.0 + 1e-13).floor() as i64;
    if v == 100 {
        v = 10;
        e += 1;
    }
    // Below 1 no recorded value is (they are integers): the threshold sorts after the zero
    // bin and before every other one; past u64 after them all.
    if e < 0 {
        return Some(0);
    }
    if e as usize >= DECADES || !(10..=99).contains(&v) {
        return Some(Bin::MAX);
    }
    Some((1 + e as usize * PER_DECADE + (v as usize - 10)) as Bin)
}

/// A merged histogram: its non-empty bins in ascending order, with their counts.
pub type Bins = [(Bin, u64)];

/// Envoy's quantiles ([`QUANTILES`]) of `bins`: NaN each when empty. libcircllhist's type-1
/// quantile: the sample of rank `ceil(q * n)` (at least the first), where the `c` samples of
/// a bin sit at `1/(c+1) .. c/(c+1)` of its width.
pub fn quantiles(bins: &Bins) -> [f64; 10] {
    let total: f64 = bins.iter().map(|(_, c)| *c as f64).sum();
    let mut out = [f64::NAN; 10];
    if total == 0.0 {
        return out;
    }
    let mut i = 0;
    let mut below = 0.0;
    let mut upto = bins[0].1 as f64;
    for (q, out) in QUANTILES.iter().zip(out.iter_mut()) {
        let rank = total * q;
        while i + 1 < bins.len() && upto < rank {
            i += 1;
            below = upto;
            upto += bins[i].1 as f64;
        }
        let (bin, count) = bins[i];
        let w = width(bin);
        *out = if w == 0.0 {
            lower(bin)
        } else {
            let k = (rank - below).ceil().max(1.0);
            lower(bin) + k / (count + 1) as f64 * w
        };
    }
    out
}

/// libcircllhist's approximate sum of the samples.
pub fn sum(bins: &Bins) -> f64 {
    bins.iter()
        .fold(0.0, |s, (bin, c)| s + midpoint(*bin) * *c as f64)
}

/// The number of samples.
pub fn count(bins: &Bins) -> u64 {
    bins.iter().map(|(_, c)| c).sum()
}

/// Samples in the bins at or below the bin of each bound (Envoy's cumulative buckets).
pub fn cumulative(bins: &Bins, bounds: &[f64]) -> Vec<u64> {
    bounds
        .iter()
        .map(|b| match threshold_bin(*b) {
            None => 0,
            Some(t) => bins
                .iter()
                .take_while(|(bin, _)| *bin <= t)
                .map(|(_, c)| c)
                .sum(),
        })
        .collect()
}

/// Envoy's disjoint buckets: each bound's samples not counted by the bound before it.
pub fn disjoint(bins: &Bins, bounds: &[f64]) -> Vec<u64> {
    let cumulative = cumulative(bins, bounds);
    let mut prev = 0;
    cumulative
        .into_iter()
        .map(|c| {
            let d = c.saturating_sub(prev);
            prev = c;
            d
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values: &[u64]) -> Vec<(Bin, u64)> {
        let mut counts = std::collections::BTreeMap::new();
        for v in values {
            *counts.entry(bin_of(*v)).or_insert(0) += 1;
        }
        counts.into_iter().collect()
    }

    #[test]
    fn bins_have_two_significant_digits() {
        assert_eq!((lower(bin_of(0)), width(bin_of(0))), (0.0, 0.0));
        assert_eq!((lower(bin_of(6)), width(bin_of(6))), (6.0, 0.1));
        assert_eq!((lower(bin_of(52)), width(bin_of(52))), (52.0, 1.0));
        assert_eq!((lower(bin_of(1234)), width(bin_of(1234))), (1200.0, 100.0));
        assert_eq!(bin_of(1299), bin_of(1200));
        assert!(bin_of(99) < bin_of(100));
        // 18_446_744_073_709_551_615: leading digits 18 at exponent 19.
        assert_eq!(usize::from(bin_of(u64::MAX)), 1 + 19 * 90 + 8);
    }

    // Expected values: Envoy 1.40's /stats for the same recorded values (a run with three
    // requests through a listener and a cluster, 2026-12).
    #[test]
    fn quantiles_match_envoys_for_the_same_values() {
        // upstream_cx_connect_ms with 0, 2 and 5 recorded.
        let q = quantiles(&hist(&[0, 2, 5]));
        assert_eq!(
            q,
            [0.0, 0.0, 2.05, 5.05, 5.05, 5.05, 5.05, 5.05, 5.05, 5.05]
        );
        // downstream_cx_length_ms with 57, 57 and 63.
        let q = quantiles(&hist(&[57, 57, 63]));
        assert_eq!(q[0].to_string(), "57.333333333333336");
        assert_eq!(q[2].to_string(), "57.666666666666664");
        assert_eq!(q[3], 63.5);
        // Six values: 0, 1, 2, 2, 3, 3.
        let q = quantiles(&hist(&[0, 1, 2, 2, 3, 3]));
        assert_eq!(q[1], 1.05);
        assert_eq!(q[2].to_string(), "2.033333333333333");
        assert_eq!(q[4].to_string(), "3.066666666666667");
        // Three samples in one bin: 1/4, 2/4, 3/4 of its width.
        let q = quantiles(&hist(&[1, 1, 1]));
        assert_eq!(&q[..4], &[1.025, 1.025, 1.05, 1.075]);
        assert!(quantiles(&[]).iter().all(|v| v.is_nan()));
    }

    #[test]
    fn sums_match_envoys() {
        // Envoy's `_sum` lines (`%.32g`) for single values 6, 33 and 1, and for 0, 2, 5.
        let sum32 = |values: &[u64]| crate::stats::number::general(sum(&hist(values)), 32);
        assert_eq!(sum32(&[6]), "6.0495867768595044111634706496261");
        assert_eq!(sum32(&[33]), "33.492537313432833911974739748985");
        assert_eq!(sum32(&[1]), "1.0476190476190476719153821250075");
        assert_eq!(sum32(&[0, 2, 5]), "7.0982854382999276410259881231468");
        assert_eq!(sum32(&[52, 53, 56]), "162.48614041928075835130584891886");
        assert_eq!(count(&hist(&[0, 2, 5])), 3);
    }

    #[test]
    fn buckets_count_the_bins_at_or_below_each_bound() {
        let h = hist(&[0, 2, 5, 5, 52, 4000]);
        let bounds = [0.5, 1.0, 5.0, 10.0, 50.0, 100.0, 5000.0];
        assert_eq!(cumulative(&h, &bounds), [1, 1, 4, 4, 4, 5, 6]);
        assert_eq!(disjoint(&h, &bounds), [1, 0, 3, 0, 0, 1, 1]);
        // A bound inside a bin counts that bin (libcircllhist compares bins).
        assert_eq!(cumulative(&hist(&[55]), &[55.5, 54.9]), [1, 0]);
        assert_eq!(cumulative(&h, &[f64::INFINITY]), [6]);
    }
}
