//! The `grpc-timeout` request header: a gRPC client's deadline. Envoy turns it into the
//! stream's time limit (`max_stream_duration.grpc_timeout_header_max`) or the route timeout
//! (the deprecated `max_grpc_timeout`), and rewrites it for the upstream.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

/// The header's name.
pub static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The largest count the header may carry (eight digits).
const MAX_COUNT: u64 = 99_999_999;

/// The request's `grpc-timeout`, when present and well formed.
pub fn of(headers: &HeaderMap) -> Option<Duration> {
    parse(headers.get(&GRPC_TIMEOUT)?.as_bytes())
}

/// The timeout a header value states, in whole milliseconds rounded up (Envoy's precision);
/// `None` unless it is at most eight digits followed by one of the units `H M S m u n`.
pub fn parse(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let count: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    if count > MAX_COUNT {
        return None;
    }
    let ms = match unit {
        b'H' => count * 3_600_000,
        b'M' => count * 60_000,
        b'S' => count * 1_000,
        b'm' => count,
        b'u' => count.div_ceil(1_000),
        b'n' => count.div_ceil(1_000_000),
        _ => return None,
    };
    Some(Duration::from_millis(ms))
}

/// The value Envoy writes for `timeout`: milliseconds, else the first of seconds, minutes and
/// hours whose count fits in eight digits (clipped at 99999999 hours).
pub fn encode(timeout: Duration) -> HeaderValue {
    let mut count = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let mut unit = 'm';
    if count > MAX_COUNT {
        count /= 1_000;
        unit = 'S';
    }
    while count > MAX_COUNT {
        if unit == 'H' {
            count = MAX_COUNT;
        } else {
            count /= 60;
            unit = if unit == 'S' { 'M' } else { 'H' };
        }
    }
    HeaderValue::try_from(format!("{count}{unit}")).expect("digits and a unit letter")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit_rounding_up_to_milliseconds() {
        let ms = |v: &str| parse(v.as_bytes()).map(|d| d.as_millis());
        assert_eq!(ms("2H"), Some(7_200_000));
        assert_eq!(ms("3M"), Some(180_000));
        assert_eq!(ms("5S"), Some(5_000));
        assert_eq!(ms("200m"), Some(200));
        assert_eq!(ms("1500u"), Some(2));
        assert_eq!(ms("1000u"), Some(1));
        assert_eq!(ms("1n"), Some(1));
        assert_eq!(ms("0m"), Some(0));
        assert_eq!(ms("99999999S"), Some(99_999_999_000));
    }

    #[test]
    fn rejects_malformed_values() {
        for v in ["", "m", "200", "200x", "-1m", "100000000m", "1.5S"] {
            assert_eq!(parse(v.as_bytes()), None, "{v:?}");
        }
    }

    #[test]
    fn encodes_in_the_smallest_unit_that_fits() {
        let enc = |ms: u64| encode(Duration::from_millis(ms));
        assert_eq!(enc(250), "250m");
        assert_eq!(enc(99_999_999), "99999999m");
        assert_eq!(enc(100_000_000), "100000S");
        assert_eq!(enc(100_000_000_000), "1666666M");
        assert_eq!(enc(u64::MAX), "99999999H");
    }
}
