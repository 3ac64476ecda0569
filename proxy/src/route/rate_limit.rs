//! Rate limit policies of routes and virtual hosts (`rate_limits`): the descriptors a request
//! gives the rate limit filters, built by each policy's actions in order, as Envoy builds them.

use std::net::IpAddr;

use super::RouteRequest;
use super::matcher::{HeaderMatcher, QueryParameterMatcher, header_value, query_of, query_param};
pub use crate::limits::Descriptor;

/// The highest `stage` a policy may have.
pub const MAX_STAGE: u32 = 10;

/// One entry of `rate_limits`.
#[derive(Debug, Clone)]
pub struct RateLimitPolicy {
    /// `stage`: the filters with the same stage use it.
    pub stage: u32,
    /// `disable_key`: the local rate limit filter skips a policy that has one; the global one
    /// reads `ratelimit.<key>.http_filter_enabled` (revoy has no runtime: 100%).
    pub disable_key: String,
    /// `actions`, in order.
    pub actions: Vec<RateLimitAction>,
}

/// One descriptor entry producer.
#[derive(Debug, Clone)]
pub enum RateLimitAction {
    /// `source_cluster`: the local service cluster (`--service-cluster`).
    SourceCluster,
    /// `destination_cluster`: the cluster the route sends the request to.
    DestinationCluster,
    /// `request_headers`: a header's value under `key`.
    RequestHeaders {
        /// The header (lower case).
        name: String,
        /// The descriptor key.
        key: String,
        /// Whether a missing header leaves the entry out (else: no descriptor).
        skip_if_absent: bool,
    },
    /// `remote_address`: the trusted client address.
    RemoteAddress,
    /// `masked_remote_address`: the client address's network, as `a.b.c.d/len`.
    MaskedRemoteAddress {
        /// `v4_prefix_mask_len` (default 32).
        v4: u8,
        /// `v6_prefix_mask_len` (default 128).
        v6: u8,
    },
    /// `generic_key`: a constant value.
    GenericKey {
        /// `descriptor_key` (default `generic_key`).
        key: String,
        /// `descriptor_value`.
        value: String,
    },
    /// `dynamic_metadata` and `metadata` (dynamic source): a string value of the request's
    /// dynamic metadata (at `path` in `namespace`), else `default_value` when set; else the
    /// entry is left out (`skip_if_absent`) or there is no descriptor.
    DynamicMetadata {
        /// `descriptor_key`.
        key: String,
        /// `metadata_key.key`.
        namespace: String,
        /// `metadata_key.path`.
        path: Vec<String>,
        /// `default_value` (empty: none).
        default_value: String,
        /// `skip_if_absent` (`metadata` only).
        skip_if_absent: bool,
    },
    /// `header_value_match` and `query_parameter_value_match`: a constant value when the
    /// request matches (or does not, when `expect_match` is false).
    ValueMatch {
        /// `descriptor_key` (default `header_match` / `query_match`).
        key: String,
        /// `descriptor_value`.
        value: String,
        /// `expect_match` (default true).
        expect_match: bool,
        /// What must match.
        matchers: RequestMatchers,
    },
    /// `query_parameters`: a query parameter's value under `key`.
    QueryParameters {
        /// The parameter.
        name: String,
        /// The descriptor key.
        key: String,
        /// Whether a missing parameter leaves the entry out (else: no descriptor).
        skip_if_absent: bool,
    },
}

/// Which virtual host `rate_limits` apply besides the route's (a filter's `vh_rate_limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VhRateLimits {
    /// The virtual host's, when the route has none.
    Override,
    /// The virtual host's too.
    Include,
    /// Never the virtual host's.
    Ignore,
}

/// Where a filter takes its descriptors from.
#[derive(Debug, Clone, Copy)]
pub struct DescriptorSource<'a> {
    /// The filter's own `rate_limits`: when there are some, only they are used.
    pub own: &'a [RateLimitPolicy],
    /// The filter's `stage`: only route and virtual host policies of that stage are used.
    pub stage: u32,
    /// Which virtual host policies apply (a route's `include_vh_rate_limits` makes it
    /// [`VhRateLimits::Include`]).
    pub vh: VhRateLimits,
    /// Whether policies with a `disable_key` are left out (the local rate limit filter's rule).
    pub skip_disable_keys: bool,
}

/// The descriptors of a request routed to `route` (a forwarding route; none otherwise), made
/// by the policies `source` selects, in Envoy's order: the route's, then the virtual host's.
pub fn request_descriptors(
    source: &DescriptorSource<'_>,
    route: &super::Selected<'_>,
    facts: &DescriptorFacts<'_>,
) -> Vec<Descriptor> {
    let make = |policies: &[RateLimitPolicy], out: &mut Vec<Descriptor>| {
        out.extend(
            policies
                .iter()
                .filter(|p| p.stage == source.stage)
                .filter(|p| !source.skip_disable_keys || p.disable_key.is_empty())
                .filter_map(|p| p.descriptor(facts)),
        );
    };
    if !source.own.is_empty() {
        return source
            .own
            .iter()
            .filter_map(|p| p.descriptor(facts))
            .collect();
    }
    let super::Action::Forward(forward) = &route.route.action else {
        return Vec::new();
    };
    let (route_policies, include_vh) = forward.more.as_deref().map_or((&[][..], false), |m| {
        (&m.rate_limits[..], m.include_vh_rate_limits)
    });
    let mut out = Vec::new();
    make(route_policies, &mut out);
    let vh = if include_vh {
        VhRateLimits::Include
    } else {
        source.vh
    };
    let with_vh = match vh {
        VhRateLimits::Include => true,
        VhRateLimits::Override => route_policies.is_empty(),
        VhRateLimits::Ignore => false,
    };
    if with_vh {
        make(&route.virtual_host.rate_limits, &mut out);
    }
    out
}

/// What a [`RateLimitAction::ValueMatch`] matches.
#[derive(Debug, Clone)]
pub enum RequestMatchers {
    /// `headers`: all must match.
    Headers(Vec<HeaderMatcher>),
    /// `query_parameters`: all must match.
    QueryParameters(Vec<QueryParameterMatcher>),
}

impl RequestMatchers {
    fn match_all(&self, req: &RouteRequest<'_>) -> bool {
        match self {
            RequestMatchers::Headers(h) => h.iter().all(|m| m.matches(req)),
            RequestMatchers::QueryParameters(q) => {
                let query = query_of(req.path);
                q.iter().all(|m| m.matches(query))
            }
        }
    }
}

/// What descriptors are made of, besides the request.
#[derive(Clone, Copy)]
pub struct DescriptorFacts<'a> {
    /// The request as routing saw it.
    pub request: &'a RouteRequest<'a>,
    /// The local service cluster (`--service-cluster`).
    pub local_cluster: &'a str,
    /// The cluster the route sends the request to, when it forwards.
    pub destination_cluster: Option<&'a str>,
    /// The trusted client address.
    pub remote: Option<IpAddr>,
}

impl RateLimitPolicy {
    /// The policy's descriptor for a request, unless an action produced nothing (a missing
    /// header or parameter without `skip_if_absent`, a match that failed) or every entry was
    /// skipped.
    pub fn descriptor(&self, facts: &DescriptorFacts<'_>) -> Option<Descriptor> {
        let mut entries = Vec::with_capacity(self.actions.len());
        for action in &self.actions {
            if !action.populate(facts, &mut entries) {
                return None;
            }
        }
        (!entries.is_empty()).then_some(Descriptor(entries))
    }
}

impl RateLimitAction {
    /// Adds this action's entry; false when the descriptor must not be made.
    fn populate(&self, facts: &DescriptorFacts<'_>, entries: &mut Vec<(String, String)>) -> bool {
        let mut push = |k: &str, v: String| entries.push((k.to_owned(), v));
        match self {
            RateLimitAction::SourceCluster => push("source_cluster", facts.local_cluster.into()),
            RateLimitAction::DestinationCluster => match facts.destination_cluster {
                Some(c) => push("destination_cluster", c.into()),
                None => return false,
            },
            RateLimitAction::RequestHeaders {
                name,
                key,
                skip_if_absent,
            } => match first_header(facts.request, name) {
                Some(v) => push(key, v),
                None => return *skip_if_absent,
            },
            RateLimitAction::RemoteAddress => match facts.remote {
                Some(ip) => push("remote_address", ip.to_string()),
                None => return false,
            },
            RateLimitAction::MaskedRemoteAddress { v4, v6 } => match facts.remote {
                Some(ip) => push("masked_remote_address", masked(ip, *v4, *v6)),
                None => return false,
            },
            RateLimitAction::GenericKey { key, value } => push(key, value.clone()),
            RateLimitAction::ValueMatch {
                key,
                value,
                expect_match,
                matchers,
            } => {
                if matchers.match_all(facts.request) != *expect_match {
                    return false;
                }
                push(key, value.clone())
            }
            RateLimitAction::QueryParameters {
                name,
                key,
                skip_if_absent,
            } => match query_param(query_of(facts.request.path), name) {
                Some(v) => push(key, v.into_owned()),
                None => return *skip_if_absent,
            },
            RateLimitAction::DynamicMetadata {
                key,
                namespace,
                path,
                default_value,
                skip_if_absent,
            } => {
                let value = facts
                    .request
                    .metadata
                    .and_then(|m| m.value(namespace, path))
                    .and_then(|v| match &v.kind {
                        Some(proto::pb::google::protobuf::value::Kind::StringValue(s)) => {
                            Some(s.as_str())
                        }
                        _ => None,
                    })
                    .filter(|s| !s.is_empty());
                match value {
                    Some(v) => push(key, v.to_owned()),
                    None if !default_value.is_empty() => push(key, default_value.clone()),
                    None => return *skip_if_absent,
                }
            }
        }
        true
    }
}

/// A header's first value (a pseudo-header's value).
fn first_header(req: &RouteRequest<'_>, name: &str) -> Option<String> {
    if name.starts_with(':') || name == "host" {
        return header_value(req, name).map(|v| v.into_owned());
    }
    req.headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// `ip` with all but its first `v4` / `v6` bits cleared, as `addr/len`.
fn masked(ip: IpAddr, v4: u8, v6: u8) -> String {
    match ip {
        IpAddr::V4(a) => {
            let len = v4.min(32);
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            format!("{}/{len}", std::net::Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let len = v6.min(128);
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            format!("{}/{len}", std::net::Ipv6Addr::from(u128::from(a) & mask))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, Method};

    fn facts<'a>(req: &'a RouteRequest<'a>) -> DescriptorFacts<'a> {
        DescriptorFacts {
            request: req,
            local_cluster: "local",
            destination_cluster: Some("backend"),
            remote: Some("127.1.2.3".parse().unwrap()),
        }
    }

    fn policy(actions: Vec<RateLimitAction>) -> RateLimitPolicy {
        RateLimitPolicy {
            stage: 0,
            disable_key: String::new(),
            actions,
        }
    }

    fn entries(d: Option<Descriptor>) -> Option<Vec<String>> {
        d.map(|d| d.0.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
    }

    #[test]
    fn actions_make_entries_in_order() {
        let mut headers = HeaderMap::new();
        headers.insert("x-user", "alice".parse().unwrap());
        let req = RouteRequest::new(&Method::GET, "h", "/p?tier=gold", &headers);
        let p = policy(vec![
            RateLimitAction::SourceCluster,
            RateLimitAction::DestinationCluster,
            RateLimitAction::RequestHeaders {
                name: "x-user".into(),
                key: "user".into(),
                skip_if_absent: false,
            },
            RateLimitAction::RemoteAddress,
            RateLimitAction::MaskedRemoteAddress { v4: 16, v6: 128 },
            RateLimitAction::GenericKey {
                key: "generic_key".into(),
                value: "g".into(),
            },
            RateLimitAction::QueryParameters {
                name: "tier".into(),
                key: "tier".into(),
                skip_if_absent: false,
            },
        ]);
        assert_eq!(
            entries(p.descriptor(&facts(&req))).unwrap(),
            [
                "source_cluster=local",
                "destination_cluster=backend",
                "user=alice",
                "remote_address=127.1.2.3",
                "masked_remote_address=127.1.0.0/16",
                "generic_key=g",
                "tier=gold"
            ]
        );
    }

    #[test]
    fn a_missing_header_drops_the_descriptor_unless_skipped() {
        let headers = HeaderMap::new();
        let req = RouteRequest::new(&Method::GET, "h", "/", &headers);
        let header = |skip_if_absent| RateLimitAction::RequestHeaders {
            name: "x-user".into(),
            key: "user".into(),
            skip_if_absent,
        };
        let generic = RateLimitAction::GenericKey {
            key: "k".into(),
            value: "v".into(),
        };
        assert_eq!(
            entries(policy(vec![generic.clone(), header(false)]).descriptor(&facts(&req))),
            None
        );
        assert_eq!(
            entries(policy(vec![generic, header(true)]).descriptor(&facts(&req))).unwrap(),
            ["k=v"]
        );
        assert_eq!(
            entries(policy(vec![header(true)]).descriptor(&facts(&req))),
            None
        );
    }

    #[test]
    fn header_value_match_honours_expect_match() {
        let mut headers = HeaderMap::new();
        headers.insert("x-env", "prod".parse().unwrap());
        let req = RouteRequest::new(&Method::GET, "h", "/", &headers);
        let matcher = HeaderMatcher {
            name: "x-env".into(),
            value: super::super::matcher::HeaderValueMatch::Present(true),
            invert: false,
            missing_as_empty: false,
        };
        let action = |expect_match| {
            policy(vec![RateLimitAction::ValueMatch {
                key: "header_match".into(),
                value: "has-env".into(),
                expect_match,
                matchers: RequestMatchers::Headers(vec![matcher.clone()]),
            }])
        };
        assert_eq!(
            entries(action(true).descriptor(&facts(&req))).unwrap(),
            ["header_match=has-env"]
        );
        assert_eq!(entries(action(false).descriptor(&facts(&req))), None);
    }
}
