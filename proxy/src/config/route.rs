//! `RouteConfiguration` -> [`RouteTable`]: validation (Envoy's messages where Envoy has them),
//! regex compilation, domain indexing, and resolution of inherited settings (retry policy,
//! mirror policies, buffer limits) so the data path never walks parent levels.

#![allow(deprecated)] // Envoy still honours the deprecated fields read here.

mod action;
pub(crate) mod matchers;
pub(crate) mod rate_limits;

use std::sync::Arc;
use std::time::Duration;

use proto::pb::envoy::config::core::v3 as core;
use proto::pb::envoy::config::route::v3 as pb;
use proto::pb::google::protobuf as gpb;

use super::{ConfigError, Context, Warnings};
use crate::route::domain::{DomainConflict, DomainIndex};
use crate::route::format::Template;
use crate::route::headers::{AppendAction, HeaderAdd, HeaderMutations, HeaderRules};
use crate::route::{
    Action, Redirect, RedirectPath, Route, RouteTable, TlsRequirement, VirtualCluster, VirtualHost,
};

pub use matchers::{compile_regex, header_matcher};

/// Cluster-existence check: returns whether a cluster with this name exists.
pub type ClusterCheck<'a> = &'a dyn Fn(&str) -> bool;

/// Compiles a `request_mirror_policies` list (route configuration or virtual host level).
fn mirror_policies(
    policies: &[proto::pb::envoy::config::route::v3::route_action::RequestMirrorPolicy],
) -> Result<Arc<[crate::route::policy::MirrorPolicy]>, ConfigError> {
    policies
        .iter()
        .enumerate()
        .map(|(i, m)| {
            action::mirror(m).map_err(|e| e.within(&format!("request_mirror_policies[{i}]")))
        })
        .collect()
}

/// Compiles a route configuration, with `ctx`'s I/O and regex cache. When `clusters` is given (static and inline route configs,
/// unless `validate_clusters` is false), every fixed cluster a route names must exist.
/// What revoy leaves out is added to `warnings`, with paths relative to the configuration.
pub fn compile_route_config(
    ctx: &Context<'_>,
    rc: &pb::RouteConfiguration,
    clusters: Option<ClusterCheck<'_>>,
    warnings: &mut Warnings,
) -> Result<RouteTable, ConfigError> {
    let clusters = match rc.validate_clusters {
        Some(gpb::BoolValue { value: false }) => None,
        _ => clusters,
    };
    let table_mirrors = mirror_policies(&rc.request_mirror_policies)?;
    let retries = action::RetryPolicies::default();
    let inherited = action::Inherited {
        ctx,
        mirrors: &table_mirrors,
        retries: &retries,
        max_body: rc
            .max_direct_response_body_size_bytes
            .map_or(4096, |v| v.value) as usize,
    };
    let mut domains =
        DomainIndex::with_capacity(rc.virtual_hosts.iter().map(|vh| vh.domains.len()).sum());
    let mut virtual_hosts = Vec::with_capacity(rc.virtual_hosts.len());
    for (i, vh) in rc.virtual_hosts.iter().enumerate() {
        let at = format!("virtual_hosts[{i}]");
        let before = warnings.len();
        let compiled = compile_virtual_host(vh, &inherited, clusters, warnings);
        warnings.prefix_since(before, &at);
        let compiled = compiled.map_err(|e| e.within(&at))?;
        for (slot, d) in compiled.domains.iter().enumerate() {
            domains.insert(d, i, slot).map_err(|c| {
                let message = match c {
                    DomainConflict::Duplicate => format!(
                        "Only unique values for domains are permitted. Duplicate entry of domain {d} in route {}",
                        rc.name
                    ),
                    DomainConflict::SecondWildcard => {
                        format!("Only a single wildcard domain is permitted in route {}", rc.name)
                    }
                };
                ConfigError::new(format!("virtual_hosts[{i}].domains[{slot}]"), message)
            })?;
        }
        virtual_hosts.push(compiled);
    }
    Ok(RouteTable {
        name: rc.name.clone(),
        virtual_hosts,
        domains,
        vhost_header: (!rc.vhost_header.is_empty()).then(|| rc.vhost_header.to_ascii_lowercase()),
        ignore_port_in_host_matching: rc.ignore_port_in_host_matching,
        ignore_path_parameters: rc.ignore_path_parameters_in_path_matching,
        headers: header_rules(
            ctx,
            &rc.request_headers_to_add,
            &rc.request_headers_to_remove,
            &rc.response_headers_to_add,
            &rc.response_headers_to_remove,
        )?,
        most_specific_header_mutations_wins: rc.most_specific_header_mutations_wins,
        internal_only_headers: rc
            .internal_only_headers
            .iter()
            .enumerate()
            .map(|(i, h)| {
                header_name(h).map_err(|e| e.within(&format!("internal_only_headers[{i}]")))
            })
            .collect::<Result<_, _>>()?,
        tls_redirect: tls_redirect_route(),
        per_filter: super::http_filter::compile_per_filter(ctx, &rc.typed_per_filter_config)?,
    })
}

fn compile_virtual_host<'p>(
    vh: &'p pb::VirtualHost,
    inherited: &action::Inherited<'_, 'p>,
    clusters: Option<ClusterCheck<'_>>,
    warnings: &mut Warnings,
) -> Result<VirtualHost, ConfigError> {
    if vh.name.is_empty() {
        return Err(ConfigError::new(
            "name",
            "value length must be at least 1 characters",
        ));
    }
    if vh.domains.is_empty() {
        return Err(ConfigError::new(
            "domains",
            "value must contain at least 1 item(s)",
        ));
    }
    if vh.matcher.is_some() {
        return Err(ConfigError::new(
            "matcher",
            "the generic matcher API is not supported by revoy",
        ));
    }
    let mirrors = mirror_policies(&vh.request_mirror_policies)?;
    let retry = vh
        .retry_policy
        .as_ref()
        .map(|r| {
            inherited
                .retries
                .get(inherited.ctx, r)
                .map_err(|e| e.within("retry_policy"))
        })
        .transpose()?;
    let vh_ctx = action::VhostDefaults {
        ctx: inherited.ctx,
        retry: retry.as_ref(),
        mirrors: if mirrors.is_empty() {
            inherited.mirrors
        } else {
            &mirrors
        },
        buffer_limit: vh.per_request_buffer_limit_bytes.map(|v| v.value),
        max_body: inherited.max_body,
        retries: inherited.retries,
    };
    let mut routes = Vec::with_capacity(vh.routes.len());
    for (i, r) in vh.routes.iter().enumerate() {
        let at = format!("routes[{i}]");
        let before = warnings.len();
        let compiled = compile_route(r, &vh_ctx, clusters, warnings);
        warnings.prefix_since(before, &at);
        routes.push(compiled.map_err(|e| e.within(&at))?);
    }
    let virtual_clusters = vh
        .virtual_clusters
        .iter()
        .enumerate()
        .map(|(i, vc)| {
            Ok(VirtualCluster {
                name: vc.name.clone(),
                headers: matchers::header_matchers(inherited.ctx, &vc.headers)
                    .map_err(|e: ConfigError| e.within(&format!("virtual_clusters[{i}]")))?,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let require_tls = match pb::virtual_host::TlsRequirementType::try_from(vh.require_tls) {
        Ok(pb::virtual_host::TlsRequirementType::ExternalOnly) => TlsRequirement::ExternalOnly,
        Ok(pb::virtual_host::TlsRequirementType::All) => TlsRequirement::All,
        _ => TlsRequirement::None,
    };
    Ok(VirtualHost {
        name: vh.name.clone(),
        domains: vh
            .domains
            .iter()
            .map(|d| {
                if d.bytes().any(|b| b.is_ascii_uppercase()) {
                    Arc::from(d.to_ascii_lowercase())
                } else {
                    Arc::from(d.as_str())
                }
            })
            .collect(),
        routes,
        require_tls,
        virtual_clusters,
        rate_limits: rate_limits::compile_rate_limits(inherited.ctx, &vh.rate_limits)
            .map_err(|e| e.within("rate_limits"))?,
        headers: header_rules(
            inherited.ctx,
            &vh.request_headers_to_add,
            &vh.request_headers_to_remove,
            &vh.response_headers_to_add,
            &vh.response_headers_to_remove,
        )?,
        include_request_attempt_count: vh.include_request_attempt_count,
        include_attempt_count_in_response: vh.include_attempt_count_in_response,
        per_filter: super::http_filter::compile_per_filter(
            inherited.ctx,
            &vh.typed_per_filter_config,
        )?,
    })
}

fn tls_redirect_route() -> Route {
    Route {
        name: String::new(),
        matcher: crate::route::RouteMatch {
            path: crate::route::matcher::PathMatch::Prefix(String::new()),
            case_sensitive: true,
            grpc: false,
            headers: Box::default(),
            more: None,
        },
        action: Action::Redirect(Box::new(Redirect {
            scheme: Some("https".to_owned()),
            host: None,
            port: None,
            path: RedirectPath::Keep,
            strip_query: false,
            status: http::StatusCode::MOVED_PERMANENTLY,
        })),
        headers: None,
        metadata: None,
        tracing: None,
        per_filter: None,
    }
}

fn compile_route<'p>(
    r: &'p pb::Route,
    vh: &action::VhostDefaults<'_, 'p>,
    clusters: Option<ClusterCheck<'_>>,
    warnings: &mut Warnings,
) -> Result<Route, ConfigError> {
    let m = r
        .r#match
        .as_ref()
        .ok_or_else(|| ConfigError::new("match", "value is required"))?;
    let matcher = matchers::route_match(vh.ctx, m).map_err(|e| e.within("match"))?;
    let act = match &r.action {
        Some(pb::route::Action::Route(ra)) => action::forward(
            ra,
            &matcher,
            vh,
            r.per_request_buffer_limit_bytes.map(|v| v.value),
            clusters,
        )
        .map_err(|e| e.within("route"))?,
        Some(pb::route::Action::Redirect(ra)) => {
            action::redirect(vh.ctx, ra, &matcher).map_err(|e| e.within("redirect"))?
        }
        Some(pb::route::Action::DirectResponse(d)) => {
            action::direct_response(vh.ctx, d, vh.max_body)
                .map_err(|e| e.within("direct_response"))?
        }
        Some(pb::route::Action::NonForwardingAction(_)) => Action::NonForwarding,
        Some(pb::route::Action::FilterAction(_)) => {
            return Err(ConfigError::new(
                "filter_action",
                "filter_action is not supported by revoy",
            ));
        }
        None => return Err(ConfigError::new("action", "value is required")),
    };
    let tracing = super::tracing::compile_route_tracing(
        vh.ctx,
        r.decorator.as_ref(),
        r.tracing.as_ref(),
        warnings,
    )?
    .map(Box::new);
    Ok(Route {
        tracing,
        per_filter: super::http_filter::compile_per_filter(vh.ctx, &r.typed_per_filter_config)?,
        name: r.name.clone(),
        matcher,
        action: act,
        headers: header_rules(
            vh.ctx,
            &r.request_headers_to_add,
            &r.request_headers_to_remove,
            &r.response_headers_to_add,
            &r.response_headers_to_remove,
        )?,
        metadata: r
            .metadata
            .as_ref()
            .filter(|md| !md.filter_metadata.is_empty())
            .map(|md| {
                Box::new(
                    md.filter_metadata
                        .iter()
                        .map(|(k, v)| (k.clone(), struct_to_json(v)))
                        .collect(),
                )
            }),
    })
}

/// A `google.protobuf.Struct` as JSON.
pub fn struct_to_json(s: &gpb::Struct) -> serde_json::Value {
    serde_json::Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn value_to_json(v: &gpb::Value) -> serde_json::Value {
    use gpb::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::json!(n),
        Some(Kind::StringValue(s)) => serde_json::Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => serde_json::Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => {
            serde_json::Value::Array(l.values.iter().map(value_to_json).collect())
        }
    }
}

/// Converts a proto Duration.
pub fn duration(d: &gpb::Duration) -> Duration {
    Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32)
}

/// An optional proto Duration where 0 means "none" (Envoy's disabled timeouts and limits).
pub(crate) fn nonzero(d: Option<&gpb::Duration>) -> Option<Duration> {
    d.map(duration).filter(|d| !d.is_zero())
}

pub(crate) fn header_name(name: &str) -> Result<http::HeaderName, ConfigError> {
    http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
        .map_err(|_| ConfigError::new("", format!("invalid header name {name:?}")))
}

fn mutable_header(name: &str) -> Result<http::HeaderName, ConfigError> {
    if name.starts_with(':') || name.eq_ignore_ascii_case("host") {
        return Err(ConfigError::new(
            "",
            "Invalid header configuration. ':-prefixed' or host headers may not be modified",
        ));
    }
    header_name(name)
}

/// Compiles one direction of header mutations.
pub(crate) fn header_mutations(
    ctx: &Context<'_>,
    add: &[core::HeaderValueOption],
    remove: &[String],
) -> Result<HeaderMutations, ConfigError> {
    let remove = remove
        .iter()
        .map(|h| mutable_header(h))
        .collect::<Result<Vec<_>, _>>()?;
    let add = add
        .iter()
        .map(|o| {
            let h = o
                .header
                .as_ref()
                .ok_or_else(|| ConfigError::new("header", "value is required"))?;
            let name = mutable_header(&h.key)?;
            let raw = if h.raw_value.is_empty() {
                h.value.clone()
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            };
            let value =
                Template::parse(&raw, ctx).map_err(|m| ConfigError::new("header.value", m))?;
            use core::header_value_option::HeaderAppendAction as A;
            let action = match o.append {
                Some(gpb::BoolValue { value: true }) => AppendAction::AppendIfExistsOrAdd,
                Some(gpb::BoolValue { value: false }) => AppendAction::OverwriteIfExistsOrAdd,
                None => match A::try_from(o.append_action).unwrap_or(A::AppendIfExistsOrAdd) {
                    A::AppendIfExistsOrAdd => AppendAction::AppendIfExistsOrAdd,
                    A::AddIfAbsent => AppendAction::AddIfAbsent,
                    A::OverwriteIfExistsOrAdd => AppendAction::OverwriteIfExistsOrAdd,
                    A::OverwriteIfExists => AppendAction::OverwriteIfExists,
                },
            };
            Ok(HeaderAdd {
                name,
                value,
                action,
                keep_empty_value: o.keep_empty_value,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok(HeaderMutations {
        remove: remove.into(),
        add: add.into(),
    })
}

pub(crate) fn header_rules(
    ctx: &Context<'_>,
    req_add: &[core::HeaderValueOption],
    req_remove: &[String],
    resp_add: &[core::HeaderValueOption],
    resp_remove: &[String],
) -> Result<Option<Box<HeaderRules>>, ConfigError> {
    if req_add.is_empty() && req_remove.is_empty() && resp_add.is_empty() && resp_remove.is_empty()
    {
        // Most routes and virtual hosts have none.
        return Ok(None);
    }
    Ok(Some(Box::new(HeaderRules {
        request: header_mutations(ctx, req_add, req_remove)
            .map_err(|e| e.within("request_headers_to_add"))?,
        response: header_mutations(ctx, resp_add, resp_remove)
            .map_err(|e| e.within("response_headers_to_add"))?,
    })))
}

#[cfg(test)]
pub(crate) mod tests;
