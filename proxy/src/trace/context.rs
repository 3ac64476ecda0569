//! Trace context on the wire: W3C `traceparent`/`tracestate` (OpenTelemetry) and B3, multi-
//! header or single `b3` (Zipkin); read from a request to join its trace, written on the
//! request sent upstream.

use http::{HeaderMap, HeaderName, HeaderValue};

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
static B3: HeaderName = HeaderName::from_static("b3");
static B3_TRACE_ID: HeaderName = HeaderName::from_static("x-b3-traceid");
static B3_SPAN_ID: HeaderName = HeaderName::from_static("x-b3-spanid");
static B3_PARENT: HeaderName = HeaderName::from_static("x-b3-parentspanid");
static B3_SAMPLED: HeaderName = HeaderName::from_static("x-b3-sampled");
static B3_FLAGS: HeaderName = HeaderName::from_static("x-b3-flags");

/// The context a request arrived with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// The trace.
    pub trace_id: u128,
    /// Whether the id came as 128 bits.
    pub trace_id_128: bool,
    /// The caller's span.
    pub span_id: u64,
    /// The caller's parent (B3 only).
    pub parent_id: Option<u64>,
    /// The caller's sampling flag, when it said.
    pub sampled: Option<bool>,
    /// W3C `tracestate`.
    pub tracestate: String,
    /// B3 came as the single `b3` header (Envoy then propagates it the same way).
    pub single: bool,
}

fn hex_u64(s: &str) -> Option<u64> {
    (s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
}

fn hex_u128(s: &str) -> Option<u128> {
    (s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u128::from_str_radix(s, 16).ok())
        .flatten()
}

/// A `traceparent` (version 00 layout; all-zero ids refused), with `tracestate`.
pub fn w3c(headers: &HeaderMap) -> Option<Incoming> {
    let v = headers.get(&TRACEPARENT)?.to_str().ok()?;
    let mut parts = v.split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || flags.len() != 2 {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace_id = hex_u128(trace).filter(|t| *t != 0)?;
    let span_id = hex_u64(span).filter(|s| *s != 0)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let tracestate = headers
        .get_all(&TRACESTATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    Some(Incoming {
        trace_id,
        trace_id_128: true,
        span_id,
        parent_id: None,
        sampled: Some(flags & 1 == 1),
        tracestate,
        single: false,
    })
}

/// A B3 trace id: 16 or 32 hex digits.
fn b3_trace_id(s: &str) -> Option<(u128, bool)> {
    match s.len() {
        16 => hex_u64(s).map(|t| (u128::from(t), false)),
        32 => hex_u128(s).map(|t| (t, true)),
        _ => None,
    }
}

fn b3_sampled(s: &str) -> Option<bool> {
    match s {
        "1" | "true" | "d" => Some(true),
        "0" | "false" => Some(false),
        _ => None,
    }
}

/// B3: the single `b3` header first, else the `x-b3-*` headers. `Err` when headers are there
/// but malformed (the request is then not joined).
pub fn b3(headers: &HeaderMap) -> Option<Incoming> {
    if let Some(v) = headers.get(&B3).and_then(|v| v.to_str().ok()) {
        let parts: Vec<&str> = v.split('-').collect();
        if parts.len() < 2 {
            return None;
        }
        let (trace_id, wide) = b3_trace_id(parts[0])?;
        let span_id = hex_u64(parts[1])?;
        let sampled = match parts.get(2) {
            Some(s) => Some(b3_sampled(s)?),
            None => None,
        };
        let parent_id = match parts.get(3) {
            Some(p) => Some(hex_u64(p)?),
            None => None,
        };
        return Some(Incoming {
            trace_id,
            trace_id_128: wide,
            span_id,
            parent_id,
            sampled,
            tracestate: String::new(),
            single: true,
        });
    }
    let get = |n: &HeaderName| headers.get(n).and_then(|v| v.to_str().ok());
    let (trace_id, wide) = b3_trace_id(get(&B3_TRACE_ID)?)?;
    let span_id = hex_u64(get(&B3_SPAN_ID)?)?;
    let parent_id = match get(&B3_PARENT) {
        Some(p) => Some(hex_u64(p)?),
        None => None,
    };
    let sampled = if get(&B3_FLAGS) == Some("1") {
        Some(true)
    } else {
        get(&B3_SAMPLED).and_then(b3_sampled)
    };
    Some(Incoming {
        trace_id,
        trace_id_128: wide,
        span_id,
        parent_id,
        sampled,
        tracestate: String::new(),
        single: false,
    })
}

/// The sampling flag a B3 request carries on its own (`b3: 0`, `x-b3-sampled`), if any.
pub fn b3_sampled_only(headers: &HeaderMap) -> Option<bool> {
    if let Some(v) = headers.get(&B3).and_then(|v| v.to_str().ok()) {
        return match v {
            "0" => Some(false),
            "1" | "d" => Some(true),
            _ => None,
        };
    }
    headers
        .get(&B3_SAMPLED)
        .and_then(|v| v.to_str().ok())
        .and_then(b3_sampled)
}

/// The low `digits` hex digits of `n`, zero-padded, appended to `out` (what `{:0Nx}` writes,
/// without the formatting machinery: this runs for every traced request, sampled or not).
fn push_hex(out: &mut Vec<u8>, n: u128, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend(
        (0..digits)
            .rev()
            .map(|i| HEX[((n >> (i * 4)) & 0xf) as usize]),
    );
}

/// A header value of hex digits and dashes, taking `bytes` without a copy.
fn hex_value(bytes: Vec<u8>) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(bytes))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Appends the B3 hex of a trace id: 16 digits for a 64-bit trace, else 32.
fn push_b3_trace(out: &mut Vec<u8>, trace_id: u128, wide: bool) {
    if wide {
        push_hex(out, trace_id, 32);
    } else {
        push_hex(out, trace_id, 16);
    }
}

/// Writes `traceparent` (and `tracestate`, empty when there is none, as Envoy does).
pub fn inject_w3c(
    headers: &mut HeaderMap,
    trace_id: u128,
    span_id: u64,
    sampled: bool,
    tracestate: &str,
) {
    let mut v = Vec::with_capacity(55);
    v.extend_from_slice(b"00-");
    push_hex(&mut v, trace_id, 32);
    v.push(b'-');
    push_hex(&mut v, u128::from(span_id), 16);
    v.extend_from_slice(if sampled { b"-01" } else { b"-00" });
    headers.insert(&TRACEPARENT, hex_value(v));
    let state = HeaderValue::from_str(tracestate).unwrap_or_else(|_| HeaderValue::from_static(""));
    headers.insert(&TRACESTATE, state);
}

/// The B3 hex of a trace id: 16 digits for a 64-bit trace, else 32.
pub fn b3_trace_hex(trace_id: u128, wide: bool) -> String {
    let mut out = Vec::with_capacity(32);
    push_b3_trace(&mut out, trace_id, wide);
    String::from_utf8(out).expect("hex digits are UTF-8")
}

/// Writes a span's B3 context: the single `b3` header (`single`: the request came with one) or
/// the `x-b3-*` headers.
pub fn inject_b3(
    headers: &mut HeaderMap,
    trace_id: u128,
    wide: bool,
    span_id: u64,
    parent_id: Option<u64>,
    sampled: bool,
    single: bool,
) {
    if single {
        let mut v = Vec::with_capacity(68);
        push_b3_trace(&mut v, trace_id, wide);
        v.push(b'-');
        push_hex(&mut v, u128::from(span_id), 16);
        v.extend_from_slice(if sampled { b"-1" } else { b"-0" });
        if let Some(p) = parent_id {
            v.push(b'-');
            push_hex(&mut v, u128::from(p), 16);
        }
        headers.insert(&B3, hex_value(v));
        return;
    }
    let mut trace = Vec::with_capacity(32);
    push_b3_trace(&mut trace, trace_id, wide);
    headers.insert(&B3_TRACE_ID, hex_value(trace));
    headers.insert(&B3_SPAN_ID, hex_id(span_id));
    match parent_id {
        Some(p) => {
            headers.insert(&B3_PARENT, hex_id(p));
        }
        None => {
            headers.remove(&B3_PARENT);
        }
    }
    headers.insert(
        &B3_SAMPLED,
        HeaderValue::from_static(if sampled { "1" } else { "0" }),
    );
}

/// A 64-bit id as 16 hex digits.
fn hex_id(id: u64) -> HeaderValue {
    let mut v = Vec::with_capacity(16);
    push_hex(&mut v, u128::from(id), 16);
    hex_value(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn traceparent_is_read_and_written() {
        let h = headers(&[
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("tracestate", "a=1"),
        ]);
        let c = w3c(&h).unwrap();
        assert_eq!(c.trace_id, 0x0af7651916cd43dd8448eb211c80319c);
        assert_eq!(c.span_id, 0xb7ad6b7169203331);
        assert_eq!((c.sampled, c.tracestate.as_str()), (Some(true), "a=1"));
        let mut out = HeaderMap::new();
        inject_w3c(&mut out, c.trace_id, 1, false, "");
        assert_eq!(
            out["traceparent"],
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000001-00"
        );
        assert_eq!(out["tracestate"], "");
        for bad in [
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-xyz-b7ad6b7169203331-01",
        ] {
            assert!(w3c(&headers(&[("traceparent", bad)])).is_none(), "{bad}");
        }
    }

    #[test]
    fn b3_multi_and_single() {
        let h = headers(&[
            ("x-b3-traceid", "463ac35c9f6413ad"),
            ("x-b3-spanid", "a2fb4a1d1a96d312"),
            ("x-b3-parentspanid", "0020000000000001"),
            ("x-b3-sampled", "1"),
        ]);
        let c = b3(&h).unwrap();
        assert_eq!((c.trace_id, c.trace_id_128), (0x463ac35c9f6413ad, false));
        assert_eq!(
            (c.parent_id, c.sampled),
            (Some(0x0020000000000001), Some(true))
        );
        let single = headers(&[(
            "b3",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-0-05e3ac9a4f6e3b90",
        )]);
        let c = b3(&single).unwrap();
        assert!(c.trace_id_128);
        assert_eq!(
            (c.sampled, c.parent_id),
            (Some(false), Some(0x05e3ac9a4f6e3b90))
        );
        assert_eq!(b3_sampled_only(&headers(&[("b3", "0")])), Some(false));
        assert!(b3(&headers(&[("x-b3-traceid", "463ac35c9f6413ad")])).is_none());
    }

    #[test]
    fn b3_is_written_zero_padded_single_or_multi() {
        let mut out = HeaderMap::new();
        inject_b3(
            &mut out,
            0x1_0000_0000_0000_00ff,
            true,
            0xab,
            Some(2),
            false,
            true,
        );
        assert_eq!(
            out["b3"],
            "000000000000000100000000000000ff-00000000000000ab-0-0000000000000002"
        );
        let mut out = headers(&[("x-b3-parentspanid", "0000000000000009")]);
        inject_b3(
            &mut out,
            0x1_0000_0000_0000_00ff,
            false,
            0xab,
            None,
            true,
            false,
        );
        assert_eq!(out["x-b3-traceid"], "00000000000000ff");
        assert_eq!(out["x-b3-spanid"], "00000000000000ab");
        assert_eq!(out["x-b3-sampled"], "1");
        assert!(!out.contains_key("x-b3-parentspanid"));
        inject_b3(&mut out, 7, true, 1, Some(u64::MAX), false, false);
        assert_eq!(out["x-b3-traceid"], "00000000000000000000000000000007");
        assert_eq!(out["x-b3-parentspanid"], "ffffffffffffffff");
        assert_eq!(out["x-b3-sampled"], "0");
        assert_eq!(b3_trace_hex(u128::MAX, false), "ffffffffffffffff");
    }
}
