//! Header values for integers (`x-envoy-upstream-service-time`, `x-envoy-expected-rq-timeout-ms`,
//! `content-length`, attempt counts) without formatting and allocating on every request: the
//! same few numbers repeat, so each worker thread keeps the values it made last.

use std::cell::RefCell;

use http::HeaderValue;

/// How many recently made values each thread keeps.
const CACHED: usize = 8;

thread_local! {
    static RECENT: RefCell<[(u64, Option<HeaderValue>); CACHED]> =
        const { RefCell::new([const { (0, None) }; CACHED]) };
}

/// The header value `n`, shared with earlier requests when it was made recently.
pub fn int_value(n: u64) -> HeaderValue {
    RECENT.with(|recent| {
        let mut recent = recent.borrow_mut();
        let slot = (n % CACHED as u64) as usize;
        if let (m, Some(v)) = &recent[slot]
            && *m == n
        {
            return v.clone();
        }
        let v = HeaderValue::from(n);
        recent[slot] = (n, Some(v.clone()));
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_right_whether_cached_or_not() {
        for n in [0u64, 1, 15000, 8, 15000, 0, u64::MAX, 16] {
            assert_eq!(int_value(n), HeaderValue::from(n));
        }
    }
}
