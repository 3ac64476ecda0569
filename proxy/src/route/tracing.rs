//! The tracing settings a route carries (its `decorator` and `tracing`), and the sampling rates
//! and custom tags they share with the connection manager's `tracing` block, as compiled by
//! `config::tracing`.

/// A sampling rate: a request is in when `random % denominator < numerator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fraction {
    /// Requests in, out of `denominator`.
    pub numerator: u32,
    /// 100, 10 000 or 1 000 000.
    pub denominator: u32,
}

impl Fraction {
    /// Every request (100 %).
    pub const ALL: Fraction = Fraction {
        numerator: 100,
        denominator: 100,
    };

    /// Whether the request drawing `random` is in.
    pub fn enabled(self, random: u64) -> bool {
        random % u64::from(self.denominator) < u64::from(self.numerator)
    }
}

/// The three sampling rates a request's trace decision uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampling {
    /// `client_sampling`: requests with `x-client-trace-id` that are traced.
    pub client: Fraction,
    /// `random_sampling`: other requests that are traced.
    pub random: Fraction,
    /// `overall_sampling`: the cap on both.
    pub overall: Fraction,
}

/// Where a custom tag's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagValue {
    /// A fixed value (a `literal`, or an `environment` variable read at compile time).
    Literal(String),
    /// A request header, or `default` when the request has none.
    RequestHeader {
        /// The header.
        name: http::HeaderName,
        /// Its stand-in.
        default: String,
    },
}

/// A `custom_tags` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomTag {
    /// The tag's name.
    pub tag: String,
    /// Its value.
    pub value: TagValue,
}

/// A route's `decorator` and `tracing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTracing {
    /// `decorator.operation`: the span's name.
    pub operation: Option<String>,
    /// `decorator.propagate` (default true).
    pub propagate: bool,
    /// `tracing`'s sampling, replacing the connection manager's.
    pub sampling: Option<Sampling>,
    /// `tracing.custom_tags`, added to the connection manager's.
    pub custom_tags: Vec<CustomTag>,
}
