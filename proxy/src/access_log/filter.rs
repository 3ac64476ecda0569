//! Access-log filters (`envoy.config.accesslog.v3.AccessLogFilter`): which records a logger
//! writes.

use super::record::{Record, ResponseFlag};
use crate::route::matcher::HeaderMatcher;
use crate::route::metadata::matcher::MetadataMatcher;

/// A comparison of `status_code_filter` and `duration_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// `EQ`.
    Eq(u64),
    /// `GE`.
    Ge(u64),
    /// `LE`.
    Le(u64),
    /// `NE`.
    Ne(u64),
}

impl Comparison {
    fn holds(self, v: u64) -> bool {
        match self {
            Comparison::Eq(x) => v == x,
            Comparison::Ge(x) => v >= x,
            Comparison::Le(x) => v <= x,
            Comparison::Ne(x) => v != x,
        }
    }
}

/// A compiled access-log filter.
#[derive(Debug, Clone)]
pub enum Filter {
    /// `status_code_filter`: the response code (0 when none) compared.
    StatusCode(Comparison),
    /// `duration_filter`: the stream's duration in milliseconds compared.
    Duration(Comparison),
    /// `not_health_check_filter`: the request is not a health check.
    NotHealthCheck,
    /// `traceable_filter`: as Envoy's, the connection manager traces the request because a
    /// service forced it (`x-envoy-force-trace` on an internal request, or an `x-request-id`
    /// marked so); sampled and client-forced traces do not match.
    Traceable,
    /// `runtime_filter`: a sample of `numerator` in `denominator` records, chosen as Envoy
    /// chooses: by the request id's leading 32 bits (so every proxy a request passes keeps
    /// or drops it alike), at random without one or with `use_independent_randomness`.
    Runtime {
        /// Records kept...
        numerator: u64,
        /// ...out of this many.
        denominator: u64,
        /// `use_independent_randomness`.
        independent: bool,
    },
    /// `and_filter`.
    And(Vec<Filter>),
    /// `or_filter`.
    Or(Vec<Filter>),
    /// `header_filter`: a request header matcher.
    Header(Box<HeaderMatcher>),
    /// `response_flag_filter`: any of these flags (any flag at all when empty) is set.
    ResponseFlags(Vec<ResponseFlag>),
    /// `grpc_status_filter`: the gRPC status is (or, with `exclude`, is not) one of these.
    GrpcStatus {
        /// The statuses, as numbers.
        statuses: Vec<u32>,
        /// `exclude`.
        exclude: bool,
    },
    /// `metadata_filter`: the request's dynamic metadata at the matcher's path, when set,
    /// must match; when not set (or without a matcher), `match_if_key_not_found` decides.
    Metadata {
        /// `matcher`.
        matcher: Option<MetadataMatcher>,
        /// `match_if_key_not_found` (default true).
        match_if_key_not_found: bool,
    },
}

impl Filter {
    /// Whether the record passes.
    pub fn passes(&self, rec: &Record) -> bool {
        match self {
            Filter::StatusCode(c) => c.holds(u64::from(rec.response_code.unwrap_or(0))),
            Filter::Duration(c) => rec
                .duration()
                .is_some_and(|d| c.holds(d.as_millis() as u64)),
            Filter::NotHealthCheck => !rec.health_check,
            Filter::Traceable => rec.service_forced_trace,
            Filter::Runtime {
                numerator,
                denominator,
                independent,
            } => {
                let value = (!independent)
                    .then(|| request_id_integer(rec))
                    .flatten()
                    .unwrap_or_else(rand::random::<u64>);
                value % *denominator < *numerator
            }
            Filter::And(all) => all.iter().all(|f| f.passes(rec)),
            Filter::Or(any) => any.iter().any(|f| f.passes(rec)),
            Filter::Header(m) => {
                let value = rec.request.as_ref().and_then(|r| match m.name.as_str() {
                    ":method" => Some(r.method.clone()),
                    ":path" => Some(r.path.clone()),
                    ":authority" | "host" => Some(r.authority.clone()),
                    ":scheme" => Some(r.scheme.to_owned()),
                    name => {
                        let values: Vec<&str> = r
                            .headers
                            .get_all(name)
                            .iter()
                            .filter_map(|v| v.to_str().ok())
                            .collect();
                        (!values.is_empty()).then(|| values.join(","))
                    }
                });
                m.matches_value(value.as_deref())
            }
            Filter::ResponseFlags(flags) if flags.is_empty() => !rec.flags.is_empty(),
            Filter::ResponseFlags(flags) => flags.iter().any(|f| rec.flags.has(*f)),
            Filter::GrpcStatus { statuses, exclude } => {
                let found = grpc_status(rec).is_some_and(|s| statuses.contains(&s));
                found != *exclude
            }
            Filter::Metadata {
                matcher,
                match_if_key_not_found,
            } => match matcher {
                Some(m) if rec.metadata.value(&m.namespace, &m.path).is_some() => {
                    m.matches(Some(&rec.metadata))
                }
                _ => *match_if_key_not_found,
            },
        }
    }
}

/// The request id as a number, as Envoy's UUID request-id extension reads it: its first eight
/// characters in hex (none when `x-request-id` is missing, shorter or not hex there).
fn request_id_integer(rec: &Record) -> Option<u64> {
    let id = rec
        .request
        .as_ref()?
        .headers
        .get("x-request-id")?
        .as_bytes();
    let head = std::str::from_utf8(id.get(..8)?).ok()?;
    let digits = head.strip_prefix('+').unwrap_or(head);
    let digits = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
        .unwrap_or(digits);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// The gRPC status of a response: `grpc-status` in its trailers or headers, else mapped from
/// the HTTP status as Envoy maps it (no response: `UNKNOWN`, 2).
fn grpc_status(rec: &Record) -> Option<u32> {
    let header =
        |m: Option<&http::HeaderMap>| m?.get("grpc-status")?.to_str().ok()?.parse::<u32>().ok();
    if let Some(s) =
        header(rec.response_trailers.as_ref()).or(header(rec.response_headers.as_ref()))
    {
        return Some(s);
    }
    Some(match rec.response_code.unwrap_or(0) {
        0 => 2,
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502..=504 => 14,
        _ => 2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access_log::record::Downstream;
    use std::time::Duration;

    fn rec(code: Option<u16>) -> Record {
        let mut r = Record::new(Downstream::default());
        r.response_code = code;
        r
    }

    #[test]
    fn status_code_comparisons() {
        let r = rec(Some(503));
        assert!(Filter::StatusCode(Comparison::Ge(500)).passes(&r));
        assert!(!Filter::StatusCode(Comparison::Le(499)).passes(&r));
        assert!(Filter::StatusCode(Comparison::Eq(503)).passes(&r));
        assert!(!Filter::StatusCode(Comparison::Ne(503)).passes(&r));
        assert!(Filter::StatusCode(Comparison::Eq(0)).passes(&rec(None)));
    }

    #[test]
    fn metadata_filters_match_set_values_and_fall_back_when_unset() {
        use crate::route::metadata::matcher::ValueMatcher;
        let filter = |match_if_key_not_found| Filter::Metadata {
            matcher: Some(MetadataMatcher {
                namespace: "ns".into(),
                path: vec!["k".into()],
                value: ValueMatcher::Bool(true),
                invert: false,
            }),
            match_if_key_not_found,
        };
        let mut r = rec(Some(200));
        assert!(filter(true).passes(&r));
        assert!(!filter(false).passes(&r));
        r.metadata.insert(
            "ns",
            "k",
            crate::route::metadata::string_value("not a bool"),
        );
        assert!(!filter(true).passes(&r));
        let unmatched = Filter::Metadata {
            matcher: None,
            match_if_key_not_found: false,
        };
        assert!(!unmatched.passes(&r));
    }

    #[test]
    fn duration_needs_an_ended_stream() {
        let mut r = rec(Some(200));
        assert!(!Filter::Duration(Comparison::Ge(0)).passes(&r));
        r.end = Some(r.start + Duration::from_millis(30));
        assert!(Filter::Duration(Comparison::Ge(30)).passes(&r));
        assert!(!Filter::Duration(Comparison::Ge(31)).passes(&r));
    }

    #[test]
    fn response_flags_any_or_listed() {
        let mut r = rec(Some(503));
        assert!(!Filter::ResponseFlags(vec![]).passes(&r));
        r.flags.set(ResponseFlag::UpstreamConnectionFailure);
        assert!(Filter::ResponseFlags(vec![]).passes(&r));
        assert!(Filter::ResponseFlags(vec![ResponseFlag::UpstreamConnectionFailure]).passes(&r));
        assert!(!Filter::ResponseFlags(vec![ResponseFlag::NoRouteFound]).passes(&r));
    }

    #[test]
    fn and_or_combine() {
        let r = rec(Some(404));
        let ge400 = Filter::StatusCode(Comparison::Ge(400));
        let eq200 = Filter::StatusCode(Comparison::Eq(200));
        assert!(!Filter::And(vec![ge400.clone(), eq200.clone()]).passes(&r));
        assert!(Filter::Or(vec![ge400, eq200]).passes(&r));
    }

    #[test]
    fn grpc_status_from_header_or_http_status() {
        let mut r = rec(Some(200));
        let mut h = http::HeaderMap::new();
        h.insert("grpc-status", http::HeaderValue::from_static("5"));
        r.response_trailers = Some(h);
        let f = Filter::GrpcStatus {
            statuses: vec![5],
            exclude: false,
        };
        assert!(f.passes(&r));
        let f = Filter::GrpcStatus {
            statuses: vec![14],
            exclude: false,
        };
        assert!(f.passes(&rec(Some(503))));
        assert!(!f.passes(&rec(Some(404))));
    }

    #[test]
    fn runtime_sampling_bounds() {
        let r = rec(Some(200));
        let all = Filter::Runtime {
            numerator: 100,
            denominator: 100,
            independent: false,
        };
        let none = Filter::Runtime {
            numerator: 0,
            denominator: 100,
            independent: false,
        };
        for _ in 0..100 {
            assert!(all.passes(&r));
            assert!(!none.passes(&r));
        }
    }

    fn with_request_id(id: &str) -> Record {
        let mut r = rec(Some(200));
        let mut headers = http::HeaderMap::new();
        headers.insert("x-request-id", http::HeaderValue::from_str(id).unwrap());
        r.request = Some(crate::access_log::record::RequestHead {
            method: "GET".into(),
            path: "/".into(),
            authority: "h".into(),
            scheme: "http",
            headers,
        });
        r
    }

    #[test]
    fn runtime_sampling_follows_the_request_id() {
        let half = |independent| Filter::Runtime {
            numerator: 50,
            denominator: 100,
            independent,
        };
        // 0x00000031 = 49 and 0x00000032 = 50: kept below the numerator, dropped at it.
        let kept = with_request_id("00000031-aaaa-4bbb-8ccc-dddddddddddd");
        let dropped = with_request_id("00000032-aaaa-4bbb-8ccc-dddddddddddd");
        // 0x000000c7 = 199, 199 % 100 = 99.
        let wrapped = with_request_id("000000c7-0000-0000-0000-000000000000");
        for _ in 0..50 {
            assert!(half(false).passes(&kept));
            assert!(!half(false).passes(&dropped));
            assert!(!half(false).passes(&wrapped));
        }
        assert_eq!(
            request_id_integer(&with_request_id("ffffffff")),
            Some(0xffff_ffff)
        );
        assert_eq!(request_id_integer(&with_request_id("not-a-uuid")), None);
        assert_eq!(request_id_integer(&with_request_id("abc")), None);
        assert_eq!(request_id_integer(&rec(Some(200))), None);
        let independent = (0..400).filter(|_| half(true).passes(&dropped)).count();
        assert!((100..300).contains(&independent), "{independent} of 400");
    }
}
