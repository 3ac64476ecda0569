//! Compiles route actions (`route`, `redirect`, `direct_response`) and their policies.

#![allow(deprecated)] // Envoy still honours the deprecated fields read here.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use proto::pb::envoy::config::core::v3 as core;
use proto::pb::envoy::config::route::v3 as pb;

use super::matchers::{regex_substitute, runtime_fraction};
use super::{ClusterCheck, duration, header_rules, nonzero};
use crate::config::{ConfigError, Context};
use crate::route::action::{
    MoreSettings, StreamDuration, StreamTimeouts, TemplateRewrite, UpgradeSetting,
};
use crate::route::matcher::PathMatch;
use crate::route::policy::{HashKind, HashPolicy, MirrorPolicy, RetryPolicy};
use crate::route::{
    Action, ClusterSpecifier, DirectResponse, Forward, HostRewrite, PathRewrite, Redirect,
    RedirectPath, RouteMatch, WeightedCluster, WeightedClusters,
};

/// Settings a virtual host inherits from the route configuration.
pub(super) struct Inherited<'a, 'p> {
    pub ctx: &'a Context<'a>,
    pub mirrors: &'a Arc<[MirrorPolicy]>,
    pub max_body: usize,
    pub retries: &'a RetryPolicies<'p>,
}

/// Settings a route inherits from its virtual host.
pub(super) struct VhostDefaults<'a, 'p> {
    pub ctx: &'a Context<'a>,
    pub retry: Option<&'a Arc<RetryPolicy>>,
    pub mirrors: &'a Arc<[MirrorPolicy]>,
    pub buffer_limit: Option<u32>,
    pub max_body: usize,
    pub retries: &'a RetryPolicies<'p>,
}

/// The retry policies compiled for one route table, so that routes and virtual hosts with
/// the same `retry_policy` share one compiled copy. Istio gives every route the same policy;
/// compiled, with its lists, it was the largest part of such a route.
#[derive(Default)]
pub(super) struct RetryPolicies<'a> {
    /// The most recently compiled distinct policies, newest last.
    recent: RefCell<Vec<(&'a pb::RetryPolicy, Arc<RetryPolicy>)>>,
}

impl<'a> RetryPolicies<'a> {
    /// How many distinct policies are remembered: enough for a table that alternates between
    /// a few, without a long scan for one where every route has its own.
    const REMEMBERED: usize = 4;

    /// `r` compiled, shared with an equal policy compiled before.
    pub fn get(
        &self,
        ctx: &Context<'_>,
        r: &'a pb::RetryPolicy,
    ) -> Result<Arc<RetryPolicy>, ConfigError> {
        let hit = self
            .recent
            .borrow()
            .iter()
            .rev()
            .find_map(|(seen, compiled)| {
                (std::ptr::eq(*seen, r) || *seen == r).then(|| Arc::clone(compiled))
            });
        if let Some(hit) = hit {
            return Ok(hit);
        }
        let compiled = Arc::new(retry_policy(ctx, r)?);
        let mut recent = self.recent.borrow_mut();
        if recent.len() == Self::REMEMBERED {
            recent.remove(0);
        }
        recent.push((r, Arc::clone(&compiled)));
        Ok(compiled)
    }
}

/// Envoy's default upstream timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

pub(super) fn forward<'p>(
    ra: &'p pb::RouteAction,
    matcher: &RouteMatch,
    vh: &VhostDefaults<'_, 'p>,
    route_buffer_limit: Option<u32>,
    clusters: Option<ClusterCheck<'_>>,
) -> Result<Action, ConfigError> {
    use pb::route_action::ClusterSpecifier as C;
    let check = |name: &str, what: &str| -> Result<(), ConfigError> {
        match clusters {
            Some(exists) if !exists(name) => Err(ConfigError::new(
                "",
                format!("route: unknown {what}cluster '{name}'"),
            )),
            _ => Ok(()),
        }
    };
    let cluster = match &ra.cluster_specifier {
        Some(C::Cluster(n)) => {
            if n.is_empty() {
                return Err(ConfigError::new(
                    "cluster",
                    "value length must be at least 1 characters",
                ));
            }
            check(n, "").map_err(|e| e.within("cluster"))?;
            ClusterSpecifier::Name(n.clone())
        }
        Some(C::ClusterHeader(h)) => ClusterSpecifier::Header(h.to_ascii_lowercase()),
        Some(C::WeightedClusters(w)) => {
            let mut clusters_out = Vec::with_capacity(w.clusters.len());
            let mut sum = 0u64;
            for (i, c) in w.clusters.iter().enumerate() {
                let at = format!("weighted_clusters.clusters[{i}]");
                if c.name.is_empty() == c.cluster_header.is_empty() {
                    return Err(ConfigError::new(
                        at,
                        "exactly one of name or cluster_header must be set",
                    ));
                }
                if !c.name.is_empty() {
                    check(&c.name, "weighted ").map_err(|e| e.within(&at))?;
                }
                let weight = c.weight.map_or(0, |w| w.value);
                sum += u64::from(weight);
                clusters_out.push(WeightedCluster {
                    name: c.name.clone(),
                    cluster_header: (!c.cluster_header.is_empty()).then(|| c.cluster_header.to_ascii_lowercase()),
                    weight,
                    headers: header_rules(
                        vh.ctx,
                        &c.request_headers_to_add,
                        &c.request_headers_to_remove,
                        &c.response_headers_to_add,
                        &c.response_headers_to_remove,
                    )
                    .map_err(|e| e.within(&at))?,
                    host_rewrite_literal: c.host_rewrite_specifier.as_ref().map(|s| match s {
                        pb::weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(h) => h.clone(),
                    }),
                });
            }
            if clusters_out.is_empty() {
                return Err(ConfigError::new(
                    "weighted_clusters.clusters",
                    "value must contain at least 1 item(s)",
                ));
            }
            if let Some(total) = w
                .total_weight
                .map(|t| u64::from(t.value))
                .filter(|t| *t > 0)
                && total != sum
            {
                return Err(ConfigError::new(
                    "weighted_clusters",
                    format!("Sum of weights in the weighted_cluster should add up to {total}"),
                ));
            }
            if sum == 0 {
                return Err(ConfigError::new(
                    "weighted_clusters",
                    "Sum of weights in the weighted_cluster must be greater than 0.",
                ));
            }
            let random_value_header = match &w.random_value_specifier {
                Some(pb::weighted_cluster::RandomValueSpecifier::HeaderName(h)) => {
                    Some(h.to_ascii_lowercase())
                }
                _ => None,
            };
            ClusterSpecifier::Weighted(Box::new(WeightedClusters {
                clusters: clusters_out,
                total_weight: sum,
                random_value_header,
            }))
        }
        Some(C::ClusterSpecifierPlugin(_)) | Some(C::InlineClusterSpecifierPlugin(_)) => {
            return Err(ConfigError::new(
                "cluster_specifier_plugin",
                "cluster specifier plugins are not supported by revoy",
            ));
        }
        None => return Err(ConfigError::new("cluster_specifier", "value is required")),
    };
    let path_rewrite = path_rewrite(vh.ctx, ra, matcher)?;
    use pb::route_action::HostRewriteSpecifier as H;
    let host_rewrite = match &ra.host_rewrite_specifier {
        Some(H::HostRewriteLiteral(h)) | Some(H::HostRewrite(h)) => {
            Some(HostRewrite::Literal(h.clone()))
        }
        Some(H::AutoHostRewrite(b)) if b.value => Some(HostRewrite::Auto),
        Some(H::AutoHostRewrite(_)) => None,
        Some(H::HostRewriteHeader(h)) => Some(HostRewrite::Header(h.to_ascii_lowercase())),
        Some(H::HostRewritePathRegex(r)) => {
            let (re, sub) =
                regex_substitute(vh.ctx, r).map_err(|e| e.within("host_rewrite_path_regex"))?;
            Some(HostRewrite::PathRegex(re, sub))
        }
        None => None,
    };
    let retry_policy = match &ra.retry_policy {
        Some(r) => Some(
            vh.retries
                .get(vh.ctx, r)
                .map_err(|e| e.within("retry_policy"))?,
        ),
        None => vh.retry.cloned(),
    };
    let mirrors = ra
        .request_mirror_policies
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("request_mirror_policies[{i}]");
            if let Some(exists) = clusters
                && !m.cluster.is_empty()
                && !exists(&m.cluster)
            {
                return Err(ConfigError::new(
                    at,
                    format!("route: unknown shadow cluster '{}'", m.cluster),
                ));
            }
            mirror(m).map_err(|e| e.within(&at))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let not_found = match pb::route_action::ClusterNotFoundResponseCode::try_from(
        ra.cluster_not_found_response_code,
    ) {
        Ok(pb::route_action::ClusterNotFoundResponseCode::NotFound) => StatusCode::NOT_FOUND,
        Ok(pb::route_action::ClusterNotFoundResponseCode::InternalServerError) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    Ok(Action::Forward(Box::new(Forward {
        cluster,
        cluster_not_found_response_code: not_found,
        path_rewrite: path_rewrite.map(Box::new),
        host_rewrite: host_rewrite.map(Box::new),
        append_x_forwarded_host: ra.append_x_forwarded_host,
        timeout: match &ra.timeout {
            Some(t) => Some(duration(t)).filter(|d| !d.is_zero()),
            None => Some(DEFAULT_TIMEOUT),
        },
        stream_timeouts: match &ra.max_stream_duration {
            Some(m) => Some(StreamTimeouts::Duration(StreamDuration {
                max: m.max_stream_duration.as_ref().map(duration),
                grpc_timeout_header_max: m.grpc_timeout_header_max.as_ref().map(duration),
                grpc_timeout_header_offset: m.grpc_timeout_header_offset.as_ref().map(duration),
            })),
            None => ra
                .max_grpc_timeout
                .as_ref()
                .map(|max| StreamTimeouts::LegacyGrpc {
                    max: duration(max),
                    offset: ra.grpc_timeout_offset.as_ref().map(duration),
                }),
        }
        .map(Box::new),
        retry_policy,
        mirror_policies: if mirrors.is_empty() {
            Arc::clone(vh.mirrors)
        } else {
            mirrors.into()
        },
        more: MoreSettings {
            idle_timeout: ra.idle_timeout.as_ref().map(duration),
            hash_policies: ra
                .hash_policy
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    hash_policy(vh.ctx, h).map_err(|e| e.within(&format!("hash_policy[{i}]")))
                })
                .collect::<Result<_, _>>()?,
            upgrades: route_upgrades(&ra.upgrade_configs)?,
            per_request_buffer_limit_bytes: route_buffer_limit.or(vh.buffer_limit),
            rate_limits: super::rate_limits::compile_rate_limits(vh.ctx, &ra.rate_limits)
                .map_err(|e| e.within("rate_limits"))?,
            include_vh_rate_limits: include_vh_rate_limits(ra),
        }
        .boxed(),
    })))
}

/// A route's `upgrade_configs`, with Envoy's checks: one entry per type (case-insensitive),
/// `connect_config` only on CONNECT.
fn route_upgrades(
    configs: &[pb::route_action::UpgradeConfig],
) -> Result<Vec<UpgradeSetting>, ConfigError> {
    let mut out: Vec<UpgradeSetting> = Vec::with_capacity(configs.len());
    for (i, u) in configs.iter().enumerate() {
        let at = format!("upgrade_configs[{i}]");
        let upgrade_type = u.upgrade_type.to_ascii_lowercase();
        if out.iter().any(|o| o.upgrade_type == upgrade_type) {
            return Err(ConfigError::new(
                at,
                format!("Duplicate upgrade {}", u.upgrade_type),
            ));
        }
        if let Some(c) = &u.connect_config {
            if upgrade_type != "connect" {
                return Err(ConfigError::new(
                    format!("{at}.connect_config"),
                    format!(
                        "Non-CONNECT upgrade type {} has ConnectConfig",
                        u.upgrade_type
                    ),
                ));
            }
            if c.proxy_protocol_config.is_some() {
                return Err(ConfigError::new(
                    format!("{at}.connect_config.proxy_protocol_config"),
                    "a PROXY protocol header on CONNECT payloads is not supported by revoy",
                ));
            }
            if c.allow_post {
                return Err(ConfigError::new(
                    format!("{at}.connect_config.allow_post"),
                    "POST payloads as raw TCP are not supported by revoy",
                ));
            }
        }
        out.push(UpgradeSetting {
            upgrade_type,
            enabled: u.enabled.is_none_or(|b| b.value),
            terminate_connect: u.connect_config.is_some(),
        });
    }
    Ok(out)
}

/// The extension `path_rewrite_policy` must name.
const URI_TEMPLATE_REWRITER: &str = "envoy.path.rewrite.uri_template.uri_template_rewriter";

/// Compiles the route's path rewrite: `prefix_rewrite`, `regex_rewrite` or a
/// `path_rewrite_policy` URI template, with Envoy's checks in Envoy's order.
fn path_rewrite(
    ctx: &Context<'_>,
    ra: &pb::RouteAction,
    matcher: &RouteMatch,
) -> Result<Option<PathRewrite>, ConfigError> {
    let template = ra
        .path_rewrite_policy
        .as_ref()
        .map(template_rewrite)
        .transpose()?;
    let prefix = (!ra.prefix_rewrite.is_empty()).then_some(&ra.prefix_rewrite);
    let configured = [
        template.is_some(),
        prefix.is_some(),
        ra.regex_rewrite.is_some(),
    ];
    if configured.into_iter().filter(|c| *c).count() > 1 {
        return Err(ConfigError::new(
            "",
            "Specify only one of prefix_rewrite, regex_rewrite or path_rewrite_policy",
        ));
    }
    if let Some(p) = prefix {
        if matches!(matcher.path, PathMatch::Template(..)) {
            return Err(ConfigError::new(
                "prefix_rewrite",
                "Cannot use prefix_rewrite with matcher extension",
            ));
        }
        return Ok(Some(PathRewrite::Prefix(p.clone())));
    }
    if let Some(r) = &ra.regex_rewrite {
        let (re, sub) = regex_substitute(ctx, r).map_err(|e| e.within("regex_rewrite"))?;
        return Ok(Some(PathRewrite::Regex(re, sub)));
    }
    let Some(template) = template else {
        return Ok(None);
    };
    let PathMatch::Template(match_template) = &matcher.path else {
        return Err(ConfigError::new(
            "path_rewrite_policy",
            format!(
                "unable to use {URI_TEMPLATE_REWRITER} extension without \
                 envoy.path.match.uri_template.uri_template_matcher extension"
            ),
        ));
    };
    if !template.variables_defined_by(&match_template.regex) {
        return Err(ConfigError::new(
            "path_rewrite_policy",
            format!(
                "mismatch between variables in path_match_policy {} and \
                 path_rewrite_policy {}",
                match_template.template, template.template
            ),
        ));
    }
    Ok(Some(PathRewrite::Template(template)))
}

/// Compiles a `path_rewrite_policy` extension (`UriTemplateRewriteConfig` only).
fn template_rewrite(ext: &core::TypedExtensionConfig) -> Result<TemplateRewrite, ConfigError> {
    use proto::pb::envoy::extensions::path::rewrite::uri_template::v3::UriTemplateRewriteConfig;
    let at = "path_rewrite_policy";
    let config = ext
        .typed_config
        .as_ref()
        .and_then(|any| proto::unpack::<UriTemplateRewriteConfig>(any).ok())
        .ok_or_else(|| {
            ConfigError::new(at, format!("only {URI_TEMPLATE_REWRITER} is supported"))
        })?;
    let template = config.path_template_rewrite;
    if !(1..=256).contains(&template.chars().count()) {
        return Err(ConfigError::new(
            "path_rewrite_policy.path_template_rewrite",
            "value must have between 1 and 256 characters inclusive",
        ));
    }
    TemplateRewrite::parse(&template).ok_or_else(|| {
        ConfigError::new(
            at,
            format!("path_rewrite_policy.path_template_rewrite {template} is invalid"),
        )
    })
}

fn hash_policy(
    ctx: &Context<'_>,
    h: &pb::route_action::HashPolicy,
) -> Result<HashPolicy, ConfigError> {
    use pb::route_action::hash_policy::PolicySpecifier as P;
    let kind = match &h.policy_specifier {
        Some(P::Header(hd)) => HashKind::Header(
            hd.header_name.to_ascii_lowercase(),
            hd.regex_rewrite
                .as_ref()
                .map(|r| regex_substitute(ctx, r))
                .transpose()?,
        ),
        Some(P::Cookie(c)) => HashKind::Cookie {
            name: c.name.clone(),
            ttl: c.ttl.as_ref().map(duration),
            path: c.path.clone(),
        },
        Some(P::ConnectionProperties(c)) if c.source_ip => HashKind::SourceIp,
        Some(P::ConnectionProperties(_)) => HashKind::FilterState(String::new()),
        Some(P::QueryParameter(q)) => HashKind::QueryParameter(q.name.clone()),
        Some(P::FilterState(f)) => HashKind::FilterState(f.key.clone()),
        None => return Err(ConfigError::new("policy_specifier", "value is required")),
    };
    Ok(HashPolicy {
        kind,
        terminal: h.terminal,
    })
}

/// Compiles a `RetryPolicy` with Envoy's defaults.
fn retry_policy(ctx: &Context<'_>, r: &pb::RetryPolicy) -> Result<RetryPolicy, ConfigError> {
    let back_off = r.retry_back_off.as_ref();
    let base = back_off
        .and_then(|b| b.base_interval.as_ref())
        .map(duration)
        .unwrap_or(Duration::from_millis(25));
    if back_off.is_some() && base.is_zero() {
        return Err(ConfigError::new(
            "retry_back_off.base_interval",
            "value must be greater than 0s",
        ));
    }
    let max = back_off
        .and_then(|b| b.max_interval.as_ref())
        .map(duration)
        .unwrap_or(base * 10);
    if max < base {
        return Err(ConfigError::new(
            "retry_back_off.max_interval",
            "max_interval must be greater than or equal to the base_interval",
        ));
    }
    Ok(RetryPolicy {
        retry_on: r
            .retry_on
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        num_retries: r.num_retries.map_or(1, |n| n.value),
        per_try_timeout: nonzero(r.per_try_timeout.as_ref()),
        per_try_idle_timeout: nonzero(r.per_try_idle_timeout.as_ref()),
        retriable_status_codes: r
            .retriable_status_codes
            .iter()
            .map(|c| u16::try_from(*c).unwrap_or(0))
            .collect(),
        back_off_base: base,
        back_off_max: max,
        host_predicates: r
            .retry_host_predicate
            .iter()
            .map(|p| p.name.clone())
            .collect(),
        host_selection_retry_max_attempts: r.host_selection_retry_max_attempts,
        retriable_headers: super::matchers::header_matchers(ctx, &r.retriable_headers)
            .map_err(|e| e.within("retriable_headers"))?,
        retriable_request_headers: super::matchers::header_matchers(
            ctx,
            &r.retriable_request_headers,
        )
        .map_err(|e| e.within("retriable_request_headers"))?,
    })
}

/// Compiles a `RequestMirrorPolicy`.
pub(super) fn mirror(
    m: &pb::route_action::RequestMirrorPolicy,
) -> Result<MirrorPolicy, ConfigError> {
    if m.cluster.is_empty() == m.cluster_header.is_empty() {
        return Err(ConfigError::new(
            "",
            "Exactly one of cluster or cluster_header in request mirror policy need to be specified",
        ));
    }
    Ok(MirrorPolicy {
        cluster: m.cluster.clone(),
        cluster_header: (!m.cluster_header.is_empty())
            .then(|| m.cluster_header.to_ascii_lowercase()),
        runtime_fraction: m.runtime_fraction.as_ref().map(runtime_fraction),
        disable_shadow_host_suffix_append: m.disable_shadow_host_suffix_append,
        host_rewrite_literal: (!m.host_rewrite_literal.is_empty())
            .then(|| m.host_rewrite_literal.clone()),
    })
}

pub(super) fn redirect(
    ctx: &Context<'_>,
    r: &pb::RedirectAction,
    matcher: &RouteMatch,
) -> Result<Action, ConfigError> {
    use pb::redirect_action::{
        PathRewriteSpecifier as P, RedirectResponseCode as R, SchemeRewriteSpecifier as S,
    };
    let scheme = match &r.scheme_rewrite_specifier {
        Some(S::HttpsRedirect(true)) => Some("https".to_owned()),
        Some(S::SchemeRedirect(s)) if !s.is_empty() => Some(s.to_ascii_lowercase()),
        _ => None,
    };
    let path = match &r.path_rewrite_specifier {
        None => RedirectPath::Keep,
        Some(P::PathRedirect(p)) => RedirectPath::Path(p.clone(), p.contains('?')),
        Some(P::PrefixRewrite(p)) => {
            if matches!(matcher.path, PathMatch::Template(..)) {
                return Err(ConfigError::new(
                    "prefix_rewrite",
                    "Cannot use prefix_rewrite with matcher extension",
                ));
            }
            RedirectPath::Prefix(p.clone())
        }
        Some(P::RegexRewrite(rr)) => {
            let (re, sub) = regex_substitute(ctx, rr).map_err(|e| e.within("regex_rewrite"))?;
            RedirectPath::Regex(re, sub)
        }
        Some(P::PathRewrite(_)) => {
            return Err(ConfigError::new(
                "path_rewrite",
                "path_rewrite is not supported by revoy",
            ));
        }
    };
    let status = match R::try_from(r.response_code).unwrap_or(R::MovedPermanently) {
        R::MovedPermanently => StatusCode::MOVED_PERMANENTLY,
        R::Found => StatusCode::FOUND,
        R::SeeOther => StatusCode::SEE_OTHER,
        R::TemporaryRedirect => StatusCode::TEMPORARY_REDIRECT,
        R::PermanentRedirect => StatusCode::PERMANENT_REDIRECT,
    };
    Ok(Action::Redirect(Box::new(Redirect {
        scheme,
        host: (!r.host_redirect.is_empty()).then(|| r.host_redirect.clone()),
        port: (r.port_redirect != 0).then_some(r.port_redirect),
        path,
        strip_query: r.strip_query,
        status,
    })))
}

pub(super) fn direct_response(
    ctx: &Context<'_>,
    d: &pb::DirectResponseAction,
    max_body: usize,
) -> Result<Action, ConfigError> {
    let status = u16::try_from(d.status)
        .ok()
        .filter(|s| (200..600).contains(s))
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| ConfigError::new("status", "value must be inside range [200, 600)"))?;
    use core::data_source::Specifier as S;
    let body: bytes::Bytes = match d.body.as_ref().and_then(|b| b.specifier.as_ref()) {
        None => bytes::Bytes::new(),
        Some(S::InlineString(s)) => bytes::Bytes::copy_from_slice(s.as_bytes()),
        Some(S::InlineBytes(b)) => bytes::Bytes::copy_from_slice(b),
        Some(S::Filename(f)) => ctx
            .io()
            .read_file(f)
            .map_err(|e| ConfigError::new("body.filename", format!("cannot read {f}: {e}")))?
            .into(),
        Some(S::EnvironmentVariable(v)) => ctx
            .io()
            .env(v)
            .ok_or_else(|| {
                ConfigError::new(
                    "body.environment_variable",
                    format!("Environment variable doesn't exist: {v}"),
                )
            })?
            .into_bytes()
            .into(),
    };
    if body.len() > max_body {
        return Err(ConfigError::new(
            "body",
            format!(
                "response body size is {} bytes; maximum is {max_body}",
                body.len()
            ),
        ));
    }
    if d.body_format.is_some() {
        return Err(ConfigError::new(
            "body_format",
            "body_format is not supported by revoy",
        ));
    }
    Ok(Action::DirectResponse(Box::new(DirectResponse {
        status,
        body,
    })))
}

/// The deprecated `include_vh_rate_limits`.
#[allow(deprecated)]
fn include_vh_rate_limits(ra: &pb::RouteAction) -> bool {
    ra.include_vh_rate_limits.is_some_and(|b| b.value)
}
