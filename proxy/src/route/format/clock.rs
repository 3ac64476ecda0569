//! `START_TIME(...)`-style time formatting: a strftime subset in UTC with the Abseil
//! extensions Envoy accepts (`%E3S`, `%E*S`, `%Es`, `%Ez`, `%f`, `%3f`...). Unknown
//! conversions are kept literally, as Envoy does.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Envoy's default `START_TIME` format.
pub const DEFAULT_FORMAT: &str = "%Y-%m-%dT%H:%M:%E3SZ";

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A UTC instant broken down into calendar fields.
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u64,
    minute: u64,
    second: u64,
    nanos: u32,
    weekday: usize,
    yearday: u32,
    unix: i64,
}

impl Civil {
    fn of(t: SystemTime) -> Civil {
        let (unix, nanos) = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
            Err(e) => {
                let d = e.duration();
                let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
                if n == 0 {
                    (-s, 0)
                } else {
                    (-s - 1, 1_000_000_000 - n)
                }
            }
        };
        let days = unix.div_euclid(86_400);
        let secs = unix.rem_euclid(86_400) as u64;
        let (year, month, day) = civil_from_days(days);
        let yearday = (days - days_from_civil(year, 1, 1)) as u32 + 1;
        Civil {
            year,
            month,
            day,
            hour: secs / 3600,
            minute: secs / 60 % 60,
            second: secs % 60,
            nanos,
            weekday: (days + 4).rem_euclid(7) as usize,
            yearday,
            unix,
        }
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) to days since 1970-01-01.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Formats `t` (UTC) with a strftime-style `format`.
pub fn format(t: SystemTime, format: &str) -> String {
    let c = Civil::of(t);
    let mut out = String::with_capacity(format.len() + 16);
    let mut rest = format;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let used = conversion(&c, rest, &mut out);
        rest = &rest[used..];
    }
    out.push_str(rest);
    out
}

/// Writes the conversion at the start of `spec` (which starts with `%`); returns the bytes used.
fn conversion(c: &Civil, spec: &str, out: &mut String) -> usize {
    let b = spec.as_bytes();
    let Some(&k) = b.get(1) else {
        out.push('%');
        return 1;
    };
    // `%Nf`, `%ENS`, `%ENf`, `%E*S`, `%Es`, `%Ez`.
    if k.is_ascii_digit() && b.get(2) == Some(&b'f') {
        push_fraction(out, c.nanos, usize::from(k - b'0'));
        return 3;
    }
    if k == b'E' {
        match (b.get(2), b.get(3)) {
            (Some(d), Some(b'S')) if d.is_ascii_digit() => {
                let _ = write!(out, "{:02}", c.second);
                let digits = usize::from(d - b'0');
                if digits > 0 {
                    out.push('.');
                    push_fraction(out, c.nanos, digits);
                }
                return 4;
            }
            (Some(d), Some(b'f')) if d.is_ascii_digit() => {
                push_fraction(out, c.nanos, usize::from(d - b'0'));
                return 4;
            }
            (Some(b'*'), Some(b'S')) => {
                let _ = write!(out, "{:02}", c.second);
                let mut frac = format!("{:09}", c.nanos);
                while frac.ends_with('0') {
                    frac.pop();
                }
                if !frac.is_empty() {
                    out.push('.');
                    out.push_str(&frac);
                }
                return 4;
            }
            (Some(b's'), _) => {
                let _ = write!(out, "{}", c.unix);
                return 3;
            }
            (Some(b'z'), _) => {
                out.push_str("+00:00");
                return 3;
            }
            _ => {}
        }
    }
    match k {
        b'%' => out.push('%'),
        b'Y' => {
            let _ = write!(out, "{}", c.year);
        }
        b'y' => {
            let _ = write!(out, "{:02}", c.year.rem_euclid(100));
        }
        b'm' => {
            let _ = write!(out, "{:02}", c.month);
        }
        b'd' => {
            let _ = write!(out, "{:02}", c.day);
        }
        b'e' => {
            let _ = write!(out, "{:2}", c.day);
        }
        b'j' => {
            let _ = write!(out, "{:03}", c.yearday);
        }
        b'H' => {
            let _ = write!(out, "{:02}", c.hour);
        }
        b'I' => {
            let _ = write!(out, "{:02}", (c.hour + 11) % 12 + 1);
        }
        b'p' => out.push_str(if c.hour < 12 { "AM" } else { "PM" }),
        b'M' => {
            let _ = write!(out, "{:02}", c.minute);
        }
        b'S' => {
            let _ = write!(out, "{:02}", c.second);
        }
        b'f' => push_fraction(out, c.nanos, 9),
        b's' => {
            let _ = write!(out, "{}", c.unix);
        }
        b'z' => out.push_str("+0000"),
        b'Z' => out.push_str("UTC"),
        b'a' => out.push_str(&DAYS[c.weekday][..3]),
        b'A' => out.push_str(DAYS[c.weekday]),
        b'b' | b'h' => out.push_str(&MONTHS[c.month as usize - 1][..3]),
        b'B' => out.push_str(MONTHS[c.month as usize - 1]),
        b'D' => {
            let _ = write!(
                out,
                "{:02}/{:02}/{:02}",
                c.month,
                c.day,
                c.year.rem_euclid(100)
            );
        }
        b'F' => {
            let _ = write!(out, "{}-{:02}-{:02}", c.year, c.month, c.day);
        }
        b'T' => {
            let _ = write!(out, "{:02}:{:02}:{:02}", c.hour, c.minute, c.second);
        }
        b'R' => {
            let _ = write!(out, "{:02}:{:02}", c.hour, c.minute);
        }
        b'c' => {
            let _ = write!(
                out,
                "{} {} {:2} {:02}:{:02}:{:02} {}",
                &DAYS[c.weekday][..3],
                &MONTHS[c.month as usize - 1][..3],
                c.day,
                c.hour,
                c.minute,
                c.second,
                c.year
            );
        }
        _ => {
            let end = spec[1..].chars().next().map_or(1, |ch| 1 + ch.len_utf8());
            out.push_str(&spec[..end]);
            return end;
        }
    }
    2
}

/// The first `digits` digits of the nanoseconds (right-padded with zeros beyond 9).
fn push_fraction(out: &mut String, nanos: u32, digits: usize) {
    let all = format!("{nanos:09}");
    out.push_str(&all[..digits.min(9)]);
    for _ in 9..digits {
        out.push('0');
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn default_format_is_iso8601_with_millis() {
        // 2026-11-30T12:42:07.265533Z (a Monday, day 334 of the year).
        let t = at(1_796_042_527, 265_533_000);
        assert_eq!(format(t, DEFAULT_FORMAT), "2026-11-30T12:42:07.265Z");
        assert_eq!(
            format(t, "%e|%I|%p|%Z|%E6S|%9f|%1f|%y|%D|%T|%F|%R|%A|%B|%Q"),
            "30|12|PM|UTC|07.265533|265533000|2|26|11/30/26|12:42:07|2026-11-30|12:42|Monday|November|%Q"
        );
        assert_eq!(
            format(t, "%Es|%s|%E*S|%%|%f%f"),
            "1796042527|1796042527|07.265533|%|265533000265533000"
        );
        assert_eq!(
            format(t, "%Ez|%E4f|%c|%j"),
            "+00:00|2655|Mon Nov 30 12:42:07 2026|334"
        );
    }

    #[test]
    fn calendar_edges() {
        assert_eq!(format(at(0, 0), "%F %T %a"), "1970-01-01 00:00:00 Thu");
        // 2024-02-29 (leap day) and 2000-12-31 (day 366).
        assert_eq!(format(at(1_709_164_800, 0), "%F %j"), "2024-02-29 060");
        assert_eq!(format(at(978_220_800, 0), "%F %j"), "2000-12-31 366");
    }
}
