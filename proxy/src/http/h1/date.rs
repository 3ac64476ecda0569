//! The `date` header value, formatted once per second per worker thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// An IMF-fixdate is always this long (`Sun, 06 Nov 1994 08:49:37 GMT`).
const LEN: usize = 29;

thread_local! {
    static CACHED: RefCell<(u64, [u8; LEN])> = const { RefCell::new((u64::MAX, [0; LEN])) };
}

/// Appends the current date to `out`.
pub(super) fn extend(out: &mut Vec<u8>) {
    with(|text| out.extend_from_slice(text));
}

/// Calls `f` with the current date.
pub(in crate::http) fn with<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with_borrow_mut(|(at, text)| {
        if *at != second {
            let formatted = httpdate::fmt_http_date(now);
            if formatted.len() == LEN {
                text.copy_from_slice(formatted.as_bytes());
            }
            *at = second;
        }
        f(text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_is_an_http_date_of_now() {
        let mut out = Vec::new();
        extend(&mut out);
        let parsed = httpdate::parse_http_date(std::str::from_utf8(&out).unwrap()).unwrap();
        let skew = SystemTime::now().duration_since(parsed).unwrap();
        assert!(skew.as_secs() <= 1, "{skew:?}");
    }
}
