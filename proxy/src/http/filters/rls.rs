//! The rate limit service client: one `ShouldRateLimit` call per request (or, for the network
//! `ratelimit` filter, per connection) through the service's cluster, and the answer as the
//! filters read it.

use http::{HeaderName, HeaderValue};
use prost::Message;
use proto::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use proto::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_response,
};

use crate::config::http_filter::ratelimit::{RateLimitServiceConfig, SHOULD_RATE_LIMIT};
use crate::route::rate_limit::Descriptor;
use crate::upstream::ClusterManager;

/// What the service said, or that the call failed.
#[derive(Debug)]
pub enum Verdict {
    /// Under the limit (or the service gave no overall code).
    Ok(Answer),
    /// Over the limit.
    OverLimit(Answer),
    /// The call failed or timed out.
    Error(String),
}

/// The headers and body the service asked for.
#[derive(Debug, Default)]
pub struct Answer {
    /// `response_headers_to_add`: added to the response (the upstream's or the 429).
    pub response_headers: Vec<(HeaderName, HeaderValue)>,
    /// `request_headers_to_add`: added to the request when it goes on.
    pub request_headers: Vec<(HeaderName, HeaderValue)>,
    /// `raw_body`: the body of the over-limit reply.
    pub body: Vec<u8>,
}

/// Where a call goes and how long it may take.
#[derive(Debug, Clone, Copy)]
pub struct Service<'a> {
    /// The service's cluster.
    pub cluster: &'a str,
    /// The `:authority` of the call.
    pub authority: &'a str,
    /// The call's timeout.
    pub timeout: std::time::Duration,
    /// Whether the answer's descriptor statuses become `x-ratelimit-*` response headers.
    pub x_ratelimit_headers: bool,
}

impl<'a> From<&'a RateLimitServiceConfig> for Service<'a> {
    fn from(c: &'a RateLimitServiceConfig) -> Self {
        Service {
            cluster: &c.cluster,
            authority: &c.authority,
            timeout: c.timeout,
            x_ratelimit_headers: c.x_ratelimit_headers,
        }
    }
}

/// Asks the service whether a request with `descriptors` is over a limit of `domain`.
pub async fn should_rate_limit(
    clusters: &ClusterManager,
    config: Service<'_>,
    domain: &str,
    descriptors: &[Descriptor],
) -> Verdict {
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(descriptor_proto).collect(),
        hits_addend: 0,
    };
    let call = crate::upstream::grpc::Call {
        cluster: config.cluster,
        path: SHOULD_RATE_LIMIT,
        authority: config.authority,
        metadata: &[],
        timeout: Some(config.timeout),
    };
    let reply = crate::upstream::grpc::unary(clusters, &call, &request)
        .await
        .map_err(|f| f.to_string())
        .and_then(|b| RateLimitResponse::decode(b).map_err(|e| e.to_string()));
    let response = match reply {
        Ok(r) => r,
        Err(e) => return Verdict::Error(e),
    };
    let mut response_headers = headers(&response.response_headers_to_add);
    if config.x_ratelimit_headers {
        response_headers.extend(x_ratelimit_headers(&response.statuses));
    }
    let answer = Answer {
        response_headers,
        request_headers: headers(&response.request_headers_to_add),
        body: response.raw_body,
    };
    if response.overall_code == rate_limit_response::Code::OverLimit as i32 {
        Verdict::OverLimit(answer)
    } else {
        Verdict::Ok(answer)
    }
}

/// The `x-ratelimit-limit`, `-remaining` and `-reset` headers of the statuses the service
/// returned: those of the status with the fewest requests remaining, the limit followed by
/// every status's quota policy (`, <limit>;w=<window seconds>[;name="<name>"]`).
fn x_ratelimit_headers(
    statuses: &[rate_limit_response::DescriptorStatus],
) -> Vec<(HeaderName, HeaderValue)> {
    let limited = statuses
        .iter()
        .filter_map(|s| Some((s, s.current_limit.as_ref()?)));
    let Some((least, least_limit)) = limited.clone().min_by_key(|(s, _)| s.limit_remaining) else {
        return Vec::new();
    };
    let mut limit = least_limit.requests_per_unit.to_string();
    for (_, l) in limited {
        let Some(window) = window_seconds(l.unit) else {
            continue;
        };
        limit += &format!(", {};w={window}", l.requests_per_unit);
        if !l.name.is_empty() {
            limit += &format!(";name=\"{}\"", l.name);
        }
    }
    let reset = least.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
    [
        ("x-ratelimit-limit", limit),
        ("x-ratelimit-remaining", least.limit_remaining.to_string()),
        ("x-ratelimit-reset", reset.to_string()),
    ]
    .into_iter()
    .filter_map(|(n, v)| Some((HeaderName::from_static(n), HeaderValue::from_str(&v).ok()?)))
    .collect()
}

/// A limit unit's length in seconds, as Envoy counts it (a month is 30 days, a year 365).
fn window_seconds(unit: i32) -> Option<u64> {
    use rate_limit_response::rate_limit::Unit;
    Some(match Unit::try_from(unit).ok()? {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3600,
        Unit::Day => 86_400,
        Unit::Week => 7 * 86_400,
        Unit::Month => 30 * 86_400,
        Unit::Year => 365 * 86_400,
        Unit::Unknown => return None,
    })
}

fn descriptor_proto(d: &Descriptor) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: d
            .0
            .iter()
            .map(|(key, value)| rate_limit_descriptor::Entry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        ..Default::default()
    }
}

/// The service's headers that are valid HTTP headers.
fn headers(
    list: &[proto::pb::envoy::config::core::v3::HeaderValue],
) -> Vec<(HeaderName, HeaderValue)> {
    list.iter()
        .filter_map(|h| {
            let value = if h.raw_value.is_empty() {
                HeaderValue::from_str(&h.value).ok()
            } else {
                HeaderValue::from_bytes(&h.raw_value).ok()
            };
            Some((HeaderName::from_bytes(h.key.as_bytes()).ok()?, value?))
        })
        .collect()
}
