//! Numbers written the ways Envoy's admin writes them: `{fmt}`'s shortest form (quantiles in
//! text), printf's `%g` (bucket bounds; `%.32g` in Prometheus), and JSON numbers.

/// A finite value's shortest round-trip digits and decimal exponent (`d.ddd × 10^exp`).
fn shortest_parts(v: f64) -> (String, i32) {
    let s = format!("{:e}", v.abs());
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    (mantissa.replace('.', ""), exp.parse().unwrap_or(0))
}

/// `digits` (`d.ddd`) times `10^exp` in C's scientific form (`1.5e+06`).
fn scientific(neg: bool, digits: &str, exp: i32) -> String {
    let sign = if neg { "-" } else { "" };
    let (first, rest) = digits.split_at(1);
    let dot = if rest.is_empty() { "" } else { "." };
    let esign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{first}{dot}{rest}e{esign}{:02}", exp.abs())
}

/// `digits` times `10^exp` in fixed notation.
fn fixed(neg: bool, digits: &str, exp: i32) -> String {
    let sign = if neg { "-" } else { "" };
    let body = if exp < 0 {
        format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
    } else if (exp as usize) + 1 >= digits.len() {
        format!("{digits}{}", "0".repeat(exp as usize + 1 - digits.len()))
    } else {
        let (int, frac) = digits.split_at(exp as usize + 1);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

/// How both formats spell NaN, the infinities and zero.
fn special(v: f64) -> Option<&'static str> {
    if v.is_nan() {
        Some("nan")
    } else if v.is_infinite() {
        Some(if v < 0.0 { "-inf" } else { "inf" })
    } else if v == 0.0 {
        Some("0")
    } else {
        None
    }
}

/// `{fmt}`'s `{}` for a double: shortest round-trip digits, scientific from 1e16 or under
/// 1e-4; `nan` and `inf` spelled so.
pub fn shortest(v: f64) -> String {
    if let Some(special) = special(v) {
        return special.into();
    }
    let (digits, exp) = shortest_parts(v);
    if !(-5..16).contains(&exp) {
        scientific(v < 0.0, &digits, exp)
    } else {
        fixed(v < 0.0, &digits, exp)
    }
}

/// printf's `%.<precision>g`.
pub fn general(v: f64, precision: usize) -> String {
    if let Some(special) = special(v) {
        return special.into();
    }
    let p = precision.max(1);
    let s = format!("{:.*e}", p - 1, v.abs());
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits = mantissa.replace('.', "");
    let digits = digits.trim_end_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    if exp < -4 || exp >= p as i32 {
        scientific(v < 0.0, digits, exp)
    } else {
        fixed(v < 0.0, digits, exp)
    }
}

/// A JSON number for a double: `null` for NaN (as Envoy's streamer); an integral value as an
/// integer (Envoy writes the shortest text, `3e+05` or `1800000`: the same number).
pub fn json(v: f64) -> serde_json::Value {
    if !v.is_finite() {
        return serde_json::Value::Null;
    }
    if v.fract() == 0.0 && v.abs() < 9e15 {
        return serde_json::Value::from(v as i64);
    }
    serde_json::Value::from(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoys_number_forms() {
        assert_eq!(shortest(57.333333333333336), "57.333333333333336");
        assert_eq!(shortest(2.05), "2.05");
        assert_eq!(shortest(0.0), "0");
        assert_eq!(shortest(f64::NAN), "nan");
        assert_eq!(shortest(3600000.0), "3600000");
        assert_eq!(general(1800000.0, 6), "1.8e+06");
        assert_eq!(general(300000.0, 6), "300000");
        assert_eq!(general(0.5, 6), "0.5");
        assert_eq!(general(0.1, 6), "0.1");
        assert_eq!(general(0.5, 32), "0.5");
        assert_eq!(general(3600000.0, 32), "3600000");
        assert_eq!(
            general(7.098285438299928, 32),
            "7.0982854382999276410259881231468"
        );
    }
}
