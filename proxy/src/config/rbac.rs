//! `envoy.config.rbac.v3.RBAC` -> [`Rules`], the network RBAC filter's config ->
//! [`NetworkRbacConfig`], and the HTTP RBAC filter's (and its `RBACPerRoute`) ->
//! [`HttpRbacConfig`]. Every rule kind revoy cannot evaluate is a [`ConfigError`] naming
//! its field, so an RBAC filter never allows what Envoy would deny.

#![allow(deprecated)] // `metadata` and `source_ip` are deprecated and still honoured.

pub mod rules;

use std::sync::Arc;
use std::time::Duration;

use proto::pb::envoy::config::rbac::v3 as pb;
use proto::pb::envoy::extensions::filters::http::rbac::v3::{Rbac as HttpRbacProto, RbacPerRoute};
use proto::pb::envoy::extensions::filters::network::rbac::v3::{
    Rbac as NetworkRbacProto, rbac::EnforcementType,
};
use proto::pb::envoy::r#type::matcher::v3 as m;

use crate::route::metadata::matcher::MetadataMatcher;

use super::filter_chain_match::Cidr;
use super::metadata_matcher::metadata_matcher;
use super::route::matchers::{header_matcher, string_matcher};
use super::{ConfigError, Context, Warnings};
use rules::{Action, Engines, Permission, Policy, Principal, Rules};

/// The dynamic metadata namespaces Envoy's RBAC filters write themselves (shadow results,
/// the LOG action's flag), which revoy does not record: a matcher on them is refused.
const RBAC_OWN_NAMESPACES: &[&str] = &[
    "envoy.filters.http.rbac",
    "envoy.filters.network.rbac",
    "envoy.common",
];

/// A compiled `envoy.filters.network.rbac`.
#[derive(Debug, Clone)]
pub struct NetworkRbacConfig {
    /// `stat_prefix`: the stats are `<stat_prefix>rbac.*`.
    pub stat_prefix: String,
    /// `shadow_rules_stat_prefix`.
    pub shadow_rules_stat_prefix: String,
    /// `rules` and `shadow_rules`.
    pub engines: Engines,
    /// `delay_deny`: how long a denied connection is held (reading nothing) before it closes.
    pub delay_deny: Option<Duration>,
}

/// Compiles a network RBAC filter's config.
pub fn compile_network(
    ctx: &Context<'_>,
    p: &NetworkRbacProto,
    warnings: &mut Warnings,
) -> Result<NetworkRbacConfig, ConfigError> {
    if p.stat_prefix.is_empty() {
        return Err(ConfigError::new(
            "stat_prefix",
            "value length must be at least 1 characters",
        ));
    }
    refuse_matcher_trees(p.matcher.is_some(), p.shadow_matcher.is_some())?;
    if p.enforcement_type == EnforcementType::Continuous as i32 {
        warnings.note(
            "enforcement_type",
            "CONTINUOUS: the decision depends only on the connection, so revoy decides once and \
             counts once, at the first bytes (Envoy counts again at every read)",
        );
    }
    Ok(NetworkRbacConfig {
        stat_prefix: p.stat_prefix.clone(),
        shadow_rules_stat_prefix: p.shadow_rules_stat_prefix.clone(),
        engines: engines(
            ctx,
            p.rules.as_ref(),
            p.shadow_rules.as_ref(),
            true,
            warnings,
        )?,
        delay_deny: p
            .delay_deny
            .as_ref()
            .map(|d| Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
            .filter(|d| !d.is_zero()),
    })
}

/// A compiled `envoy.filters.http.rbac`, or a route's `RBACPerRoute` replacing it.
#[derive(Debug, Clone)]
pub struct HttpRbacConfig {
    /// `rules_stat_prefix`: the enforced counters are `http.<hcm>.rbac.<prefix>allowed`.
    pub rules_stat_prefix: String,
    /// `shadow_rules_stat_prefix`.
    pub shadow_rules_stat_prefix: String,
    /// `rules` and `shadow_rules` (both absent in an `RBACPerRoute` without `rbac`: the
    /// filter is off on that route).
    pub engines: Engines,
    /// Whether the enforced rules read dynamic metadata or filter state.
    pub reads_metadata: bool,
    /// The keys its decisions are written under in the request's dynamic metadata.
    pub metadata_keys: DecisionKeys,
}

/// Envoy's dynamic metadata keys (namespace `envoy.filters.http.rbac`) for an RBAC filter's
/// decisions: each engine's first matching policy and its result (`allowed` / `denied`),
/// after the engine's stat prefix (Istio's CUSTOM authorization reads
/// `istio_ext_authz_shadow_effective_policy_id`).
#[derive(Debug, Clone, Default)]
pub struct DecisionKeys {
    /// `<shadow_rules_stat_prefix>shadow_effective_policy_id`.
    pub shadow_policy: String,
    /// `<shadow_rules_stat_prefix>shadow_engine_result`.
    pub shadow_result: String,
    /// `<rules_stat_prefix>enforced_effective_policy_id`.
    pub enforced_policy: String,
    /// `<rules_stat_prefix>enforced_engine_result`.
    pub enforced_result: String,
}

impl DecisionKeys {
    fn new(rules_prefix: &str, shadow_prefix: &str) -> DecisionKeys {
        DecisionKeys {
            shadow_policy: format!("{shadow_prefix}shadow_effective_policy_id"),
            shadow_result: format!("{shadow_prefix}shadow_engine_result"),
            enforced_policy: format!("{rules_prefix}enforced_effective_policy_id"),
            enforced_result: format!("{rules_prefix}enforced_engine_result"),
        }
    }
}

/// Compiles an HTTP RBAC filter's config.
pub fn compile_http(
    ctx: &Context<'_>,
    p: &HttpRbacProto,
    warnings: &mut Warnings,
) -> Result<HttpRbacConfig, ConfigError> {
    refuse_matcher_trees(p.matcher.is_some(), p.shadow_matcher.is_some())?;
    if p.track_per_rule_stats {
        warnings.skipped(
            "track_per_rule_stats",
            "per-policy RBAC counters are not implemented by revoy; the filter's own are kept",
        );
    }
    let engines = engines(
        ctx,
        p.rules.as_ref(),
        p.shadow_rules.as_ref(),
        false,
        warnings,
    )?;
    Ok(HttpRbacConfig {
        rules_stat_prefix: p.rules_stat_prefix.clone(),
        shadow_rules_stat_prefix: p.shadow_rules_stat_prefix.clone(),
        reads_metadata: engines.enforced_reads_metadata(),
        metadata_keys: DecisionKeys::new(&p.rules_stat_prefix, &p.shadow_rules_stat_prefix),
        engines,
    })
}

/// Compiles an `RBACPerRoute`: its `rbac`, or no engines at all without one.
pub fn compile_per_route(
    ctx: &Context<'_>,
    p: &RbacPerRoute,
    warnings: &mut Warnings,
) -> Result<HttpRbacConfig, ConfigError> {
    match &p.rbac {
        Some(rbac) => at(warnings, "rbac", |w| compile_http(ctx, rbac, w)),
        None => Ok(HttpRbacConfig {
            rules_stat_prefix: String::new(),
            shadow_rules_stat_prefix: String::new(),
            engines: Engines::default(),
            reads_metadata: false,
            metadata_keys: DecisionKeys::default(),
        }),
    }
}

/// Why an RBAC filter whose enforced rules read dynamic metadata or filter state must deny
/// everything: `skipped`, a filter before it that revoy does not run (or whose metadata it
/// does not keep: jwt_authn's), may set them in Envoy (so a DENY rule on them could let
/// through what Envoy stops).
pub fn unknown_metadata(skipped: &str) -> String {
    format!(
        "its rules match dynamic metadata or filter state, which filter '{skipped}' (earlier \
         in the chain) may set in Envoy and does not in revoy"
    )
}

/// `matcher` / `shadow_matcher` (xDS matcher trees) are refused.
pub fn refuse_matcher_trees(matcher: bool, shadow_matcher: bool) -> Result<(), ConfigError> {
    for (set, field) in [(matcher, "matcher"), (shadow_matcher, "shadow_matcher")] {
        if set {
            return Err(ConfigError::new(
                field,
                "RBAC matcher trees are not implemented by revoy (use rules)",
            ));
        }
    }
    Ok(())
}

/// Compiles the `rules` and `shadow_rules` of an RBAC filter (`network`: the network
/// filter's, where header rules are refused as Envoy refuses them).
pub fn engines(
    ctx: &Context<'_>,
    rules: Option<&pb::Rbac>,
    shadow: Option<&pb::Rbac>,
    network: bool,
    warnings: &mut Warnings,
) -> Result<Engines, ConfigError> {
    let mut one = |r: Option<&pb::Rbac>, field: &str| -> Result<Option<Rules>, ConfigError> {
        r.map(|r| at(warnings, field, |w| compile_rules(ctx, r, network, w)))
            .transpose()
    };
    Ok(Engines {
        enforced: one(rules, "rules")?,
        shadow: one(shadow, "shadow_rules")?,
    })
}

/// Compiles one `RBAC`: its action and its policies, sorted by name (`network`: for the
/// network filter, which refuses header rules).
pub fn compile_rules(
    ctx: &Context<'_>,
    r: &pb::Rbac,
    network: bool,
    warnings: &mut Warnings,
) -> Result<Rules, ConfigError> {
    let action = match pb::rbac::Action::try_from(r.action) {
        Ok(pb::rbac::Action::Allow) => Action::Allow,
        Ok(pb::rbac::Action::Deny) => Action::Deny,
        Ok(pb::rbac::Action::Log) => Action::Log,
        Err(_) => {
            return Err(ConfigError::new(
                "action",
                format!(
                    "value must be one of the defined enum values, got {}",
                    r.action
                ),
            ));
        }
    };
    if r.audit_logging_options
        .as_ref()
        .is_some_and(|a| !a.logger_configs.is_empty())
    {
        warnings.skipped(
            "audit_logging_options",
            "RBAC audit loggers are not implemented by revoy; decisions are not audit-logged",
        );
    }
    let mut names: Vec<&String> = r.policies.keys().collect();
    names.sort();
    let policies = names
        .into_iter()
        .map(|name| {
            let path = format!("policies[\"{name}\"]");
            let p = at(warnings, &path, |w| {
                policy(ctx, &r.policies[name], network, w)
            })?;
            Ok((Arc::from(name.as_str()), p))
        })
        .collect::<Result<_, ConfigError>>()?;
    Ok(Rules { action, policies })
}

fn policy(
    ctx: &Context<'_>,
    p: &pb::Policy,
    network: bool,
    warnings: &mut Warnings,
) -> Result<Policy, ConfigError> {
    for (set, field) in [
        (p.condition.is_some(), "condition"),
        (p.checked_condition.is_some(), "checked_condition"),
    ] {
        if set {
            return Err(ConfigError::new(
                field,
                "CEL conditions are not implemented by revoy",
            ));
        }
    }
    for (empty, field) in [
        (p.permissions.is_empty(), "permissions"),
        (p.principals.is_empty(), "principals"),
    ] {
        if empty {
            return Err(ConfigError::new(
                field,
                "value must contain at least 1 item(s)",
            ));
        }
    }
    let permissions = p
        .permissions
        .iter()
        .enumerate()
        .map(|(i, x)| {
            at(warnings, &format!("permissions[{i}]"), |w| {
                permission(ctx, x, network, w)
            })
        })
        .collect::<Result<_, _>>()?;
    let principals = p
        .principals
        .iter()
        .enumerate()
        .map(|(i, x)| {
            at(warnings, &format!("principals[{i}]"), |w| {
                principal(ctx, x, network, w)
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Policy {
        permissions,
        principals,
    })
}

fn permissions(
    ctx: &Context<'_>,
    set: &[pb::Permission],
    field: &str,
    network: bool,
    warnings: &mut Warnings,
) -> Result<Vec<Permission>, ConfigError> {
    set.iter()
        .enumerate()
        .map(|(i, x)| {
            at(warnings, &format!("{field}.rules[{i}]"), |w| {
                permission(ctx, x, network, w)
            })
        })
        .collect()
}

fn permission(
    ctx: &Context<'_>,
    p: &pb::Permission,
    network: bool,
    warnings: &mut Warnings,
) -> Result<Permission, ConfigError> {
    use pb::permission::Rule as R;
    Ok(match &p.rule {
        None => return Err(ConfigError::new("rule", "value is required")),
        Some(R::Any(true)) => Permission::Any,
        Some(R::Any(false)) => return Err(ConfigError::new("any", "value must equal true")),
        Some(R::AndRules(s)) => {
            Permission::And(permissions(ctx, &s.rules, "and_rules", network, warnings)?)
        }
        Some(R::OrRules(s)) => {
            Permission::Or(permissions(ctx, &s.rules, "or_rules", network, warnings)?)
        }
        Some(R::NotRule(n)) => Permission::Not(Box::new(at(warnings, "not_rule", |w| {
            permission(ctx, n, network, w)
        })?)),
        Some(R::Header(_)) if network => return Err(network_header()),
        Some(R::Header(h)) => {
            Permission::Header(header_matcher(ctx, h).map_err(|e| e.within("header"))?)
        }
        Some(R::UrlPath(u)) => {
            Permission::Path(path_matcher(ctx, u).map_err(|e| e.within("url_path"))?)
        }
        Some(R::DestinationIp(c)) => Permission::DestinationIp(Cidr::compile(c, "destination_ip")?),
        Some(R::DestinationPort(port)) => {
            if *port > 65535 {
                return Err(ConfigError::new(
                    "destination_port",
                    "value must be less than or equal to 65535",
                ));
            }
            Permission::DestinationPort(*port)
        }
        Some(R::DestinationPortRange(r)) => {
            let bounded = |v: i32, which: &str| {
                if (0..=65536).contains(&v) {
                    Ok(v as u32)
                } else {
                    Err(ConfigError::new(
                        "destination_port_range",
                        format!("range {which} {v} is out of bounds"),
                    ))
                }
            };
            let (start, end) = (bounded(r.start, "start")?, bounded(r.end, "end")?);
            if start >= end {
                return Err(ConfigError::new(
                    "destination_port_range",
                    format!("range start {start} cannot be greater or equal than range end {end}"),
                ));
            }
            Permission::DestinationPortRange(start, end)
        }
        Some(R::RequestedServerName(s)) => Permission::RequestedServerName(
            string_matcher(ctx, s).map_err(|e| e.within("requested_server_name"))?,
        ),
        Some(R::Metadata(md)) => {
            Permission::Metadata(metadata(ctx, md, "metadata", network, warnings)?)
        }
        Some(R::SourcedMetadata(s)) => {
            Permission::Metadata(sourced_metadata(ctx, s, network, warnings)?)
        }
        Some(R::UriTemplate(ext)) => Permission::UriTemplate(Box::new(uri_template(ext)?)),
        Some(R::Matcher(ext)) => {
            return Err(ConfigError::new(
                "matcher",
                format!(
                    "RBAC permission extension '{}' is not implemented by revoy",
                    ext.name
                ),
            ));
        }
    })
}

fn principals(
    ctx: &Context<'_>,
    set: &[pb::Principal],
    field: &str,
    network: bool,
    warnings: &mut Warnings,
) -> Result<Vec<Principal>, ConfigError> {
    set.iter()
        .enumerate()
        .map(|(i, x)| {
            at(warnings, &format!("{field}.ids[{i}]"), |w| {
                principal(ctx, x, network, w)
            })
        })
        .collect()
}

fn principal(
    ctx: &Context<'_>,
    p: &pb::Principal,
    network: bool,
    warnings: &mut Warnings,
) -> Result<Principal, ConfigError> {
    use pb::principal::Identifier as I;
    Ok(match &p.identifier {
        None => return Err(ConfigError::new("identifier", "value is required")),
        Some(I::Any(true)) => Principal::Any,
        Some(I::Any(false)) => return Err(ConfigError::new("any", "value must equal true")),
        Some(I::AndIds(s)) => {
            Principal::And(principals(ctx, &s.ids, "and_ids", network, warnings)?)
        }
        Some(I::OrIds(s)) => Principal::Or(principals(ctx, &s.ids, "or_ids", network, warnings)?),
        Some(I::NotId(n)) => Principal::Not(Box::new(at(warnings, "not_id", |w| {
            principal(ctx, n, network, w)
        })?)),
        Some(I::Authenticated(a)) => Principal::Authenticated(
            a.principal_name
                .as_ref()
                .map(|s| string_matcher(ctx, s))
                .transpose()
                .map_err(|e| e.within("authenticated.principal_name"))?,
        ),
        Some(I::SourceIp(c)) => Principal::SourceIp(Cidr::compile(c, "source_ip")?),
        Some(I::DirectRemoteIp(c)) => {
            Principal::DirectRemoteIp(Cidr::compile(c, "direct_remote_ip")?)
        }
        Some(I::RemoteIp(c)) => Principal::RemoteIp(Cidr::compile(c, "remote_ip")?),
        Some(I::Header(_)) if network => return Err(network_header()),
        Some(I::Header(h)) => {
            Principal::Header(header_matcher(ctx, h).map_err(|e| e.within("header"))?)
        }
        Some(I::UrlPath(u)) => {
            Principal::Path(path_matcher(ctx, u).map_err(|e| e.within("url_path"))?)
        }
        Some(I::Metadata(md)) => {
            Principal::Metadata(metadata(ctx, md, "metadata", network, warnings)?)
        }
        Some(I::SourcedMetadata(s)) => {
            Principal::Metadata(sourced_metadata(ctx, s, network, warnings)?)
        }
        Some(I::FilterState(f)) => {
            filter_state(ctx, f, warnings).map_err(|e| e.within("filter_state"))?
        }
        Some(I::Custom(ext)) => {
            return Err(ConfigError::new(
                "custom",
                format!(
                    "RBAC principal extension '{}' is not implemented by revoy",
                    ext.name
                ),
            ));
        }
    })
}

/// A header rule in a network RBAC filter, which Envoy refuses.
fn network_header() -> ConfigError {
    ConfigError::new(
        "header",
        "header rules are not supported by the RBAC network filter",
    )
}

/// Runs a compile of the field at `path`: its errors and the warnings it adds name that path.
fn at<T>(
    warnings: &mut Warnings,
    path: &str,
    compile: impl FnOnce(&mut Warnings) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    let before = warnings.len();
    let result = compile(warnings).map_err(|e| e.within(path));
    warnings.prefix_since(before, path);
    result
}

/// A `PathMatcher`: its string matcher (applied to the path without query).
fn path_matcher(
    ctx: &Context<'_>,
    p: &m::PathMatcher,
) -> Result<crate::route::matcher::StringMatcher, ConfigError> {
    match &p.rule {
        Some(m::path_matcher::Rule::Path(s)) => {
            string_matcher(ctx, s).map_err(|e| e.within("path"))
        }
        None => Err(ConfigError::new("rule", "value is required")),
    }
}

/// A `uri_template` extension: Envoy's `uri_template_matcher`, compiled to its regex.
fn uri_template(
    ext: &proto::pb::envoy::config::core::v3::TypedExtensionConfig,
) -> Result<regex::Regex, ConfigError> {
    use proto::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
    let template = ext
        .typed_config
        .as_ref()
        .and_then(|any| proto::unpack::<UriTemplateMatchConfig>(any).ok())
        .map(|c| c.path_template)
        .ok_or_else(|| {
            ConfigError::new(
                "uri_template",
                format!(
                    "'{}': only envoy.path.match.uri_template.uri_template_matcher is supported",
                    ext.name
                ),
            )
        })?;
    crate::route::matcher::template_regex(&template).map_err(|msg| {
        ConfigError::new(
            "uri_template",
            format!("path_template {template} is invalid: {msg}"),
        )
    })
}

/// A metadata matcher (`field`) on the request's dynamic metadata. Matchers on the RBAC
/// filters' own metadata, which Envoy writes and revoy does not, are refused; on a connection
/// (`network`) no filter revoy runs sets any, which is noted.
fn metadata(
    ctx: &Context<'_>,
    md: &m::MetadataMatcher,
    field: &str,
    network: bool,
    warnings: &mut Warnings,
) -> Result<MetadataMatcher, ConfigError> {
    let compiled = metadata_matcher(ctx, md).map_err(|e| e.within(field))?;
    if RBAC_OWN_NAMESPACES.contains(&md.filter.as_str()) {
        return Err(ConfigError::new(
            format!("{field}.filter"),
            format!(
                "dynamic metadata of '{}' is not recorded by revoy, so it cannot be matched",
                md.filter
            ),
        ));
    }
    if network {
        warnings.note(
            field,
            format!(
                "no network filter revoy runs sets dynamic metadata, so '{}' is always absent \
                 here (as in Envoy when no filter sets it): the matcher {}",
                md.filter,
                if md.invert {
                    "always matches (invert)"
                } else {
                    "never matches"
                }
            ),
        );
    }
    Ok(compiled)
}

/// `sourced_metadata`: dynamic metadata as [`metadata`]; route metadata is refused.
fn sourced_metadata(
    ctx: &Context<'_>,
    s: &pb::SourcedMetadata,
    network: bool,
    warnings: &mut Warnings,
) -> Result<MetadataMatcher, ConfigError> {
    if s.metadata_source == pb::MetadataSource::Route as i32 {
        return Err(ConfigError::new(
            "sourced_metadata.metadata_source",
            "matching route metadata is not implemented by revoy",
        ));
    }
    let md = s.metadata_matcher.as_ref().ok_or_else(|| {
        ConfigError::new("sourced_metadata.metadata_matcher", "value is required")
    })?;
    metadata(
        ctx,
        md,
        "sourced_metadata.metadata_matcher",
        network,
        warnings,
    )
}

/// `filter_state`: the keys Istio's `istio_authn` sets (`io.istio.peer_principal`,
/// `io.istio.local_principal`) matched as strings; any other key is never there in revoy
/// (as in Envoy when no filter sets it), nor is an address matcher's object.
fn filter_state(
    ctx: &Context,
    f: &m::FilterStateMatcher,
    warnings: &mut Warnings,
) -> Result<Principal, ConfigError> {
    use m::filter_state_matcher::Matcher;
    if f.key.is_empty() {
        return Err(ConfigError::new(
            "key",
            "value length must be at least 1 characters",
        ));
    }
    let matcher = match &f.matcher {
        None => return Err(ConfigError::new("matcher", "value is required")),
        Some(Matcher::StringMatch(s)) => {
            string_matcher(ctx, s).map_err(|e| e.within("string_match"))?
        }
        Some(Matcher::AddressMatch(_)) => {
            warnings.note(
                "filter_state.address_match",
                format!(
                    "revoy has no address filter state, so '{}' is always absent: the matcher never matches",
                    f.key
                ),
            );
            return Ok(Principal::AbsentFilterState);
        }
    };
    if !super::istio::authn::sets(&f.key) {
        warnings.note(
            "filter_state",
            format!(
                "no filter of revoy's sets '{}', so it is always absent (as in Envoy when no \
                 filter sets it): the matcher never matches",
                f.key
            ),
        );
        return Ok(Principal::AbsentFilterState);
    }
    Ok(Principal::FilterState {
        key: f.key.as_str().into(),
        matcher,
    })
}

#[cfg(test)]
mod tests;
