//! `envoy.filters.http.jwt_authn` (`JwtAuthentication`, `PerRouteConfig`) ->
//! [`JwtAuthnConfig`], [`JwtAuthnPerRoute`]: providers (where tokens are found, which keys
//! verify them, what is forwarded), and the requirement each request must meet (picked by the
//! first matching rule, or by a route's `requirement_name`).
//!
//! What revoy lacks is refused or noted here: `filter_state_rules` and
//! `extract_only_without_validation` are refused; `jwt_cache_config` (no token cache),
//! `remote_jwks.async_fetch` and `retry_policy` (fetched on first use, once) are noted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use pb::jwt_requirement::RequiresType;
use proto::pb::envoy::extensions::filters::http::jwt_authn::v3 as pb;

use crate::config::route::matchers::{route_match, string_matcher};
use crate::config::tls::source::data;
use crate::config::{ConfigError, Context, Warnings};
use crate::jwt::Audiences;
use crate::jwt::jwks::Jwks;
use crate::route::action::RouteMatch;
use crate::route::matcher::StringMatcher;

/// Envoy's default `clock_skew_seconds`.
const DEFAULT_CLOCK_SKEW: u64 = 60;
/// Envoy's default `remote_jwks.cache_duration`.
const DEFAULT_CACHE_DURATION: Duration = Duration::from_secs(600);

/// A compiled `JwtAuthentication`.
#[derive(Debug)]
pub struct JwtAuthnConfig {
    /// `providers`, sorted by name; requirements name them by index.
    pub providers: Vec<Provider>,
    /// `rules`: the first whose match holds picks the requirement (`None`: no requirement).
    pub rules: Vec<(RouteMatch, Option<Arc<Requirement>>)>,
    /// `requirement_map`, for routes' `requirement_name`.
    pub requirement_map: HashMap<String, Arc<Requirement>>,
    /// The names of `requirement_map`, sorted and joined with `,` (for Envoy's error text).
    pub requirement_names: String,
    /// `bypass_cors_preflight`.
    pub bypass_cors_preflight: bool,
    /// `strip_failure_response`: denials have no body and no `www-authenticate`.
    pub strip_failure_response: bool,
    /// `stat_prefix`: the stats are `http.<prefix>.jwt_authn.[<stat_prefix>.]*`.
    pub stat_prefix: String,
}

/// One `JwtProvider`.
#[derive(Debug)]
pub struct Provider {
    /// Its name in `providers`.
    pub name: String,
    /// `issuer` (empty: any).
    pub issuer: String,
    /// `audiences`.
    pub audiences: Audiences,
    /// `subjects`.
    pub subjects: Option<StringMatcher>,
    /// The longest remaining lifetime a token may have (`max_lifetime`, or unbounded with
    /// `require_expiration`); `None`: tokens need no `exp`.
    pub max_lifetime: Option<Duration>,
    /// Where its keys come from.
    pub jwks: JwksSource,
    /// `forward`: keep the token in the request.
    pub forward: bool,
    /// Where its tokens are looked for.
    pub locations: Locations,
    /// `forward_payload_header`.
    pub forward_payload_header: Option<HeaderName>,
    /// `pad_forward_payload_header`.
    pub pad_forward_payload_header: bool,
    /// `claim_to_headers`: (header, claim path).
    pub claim_to_headers: Vec<(HeaderName, Vec<String>)>,
    /// `clock_skew_seconds` (60 unless set).
    pub clock_skew: u64,
    /// `clear_route_cache`: the route is chosen again after a token of it is verified (by the
    /// router, after the whole chain).
    pub clear_route_cache: bool,
    /// `payload_in_metadata`: the key of the verified payload under
    /// `envoy.filters.http.jwt_authn` (empty: not written).
    pub payload_in_metadata: String,
    /// `header_in_metadata`: the key of the verified token's header (empty: not written).
    pub header_in_metadata: String,
    /// `failed_status_in_metadata`: the key of a failure's `{code, message}` (empty: not
    /// written).
    pub failed_status_in_metadata: String,
    /// `normalize_payload_in_metadata.space_delimited_claims`: claims whose string value is
    /// written as the list of its space-separated words.
    pub space_delimited_claims: Vec<String>,
}

/// Where a provider's keys come from.
#[derive(Debug)]
pub enum JwksSource {
    /// `local_jwks`: its keys.
    Local(Arc<Jwks>),
    /// `remote_jwks`.
    Remote(RemoteJwks),
}

/// A `RemoteJwks`.
#[derive(Debug)]
pub struct RemoteJwks {
    /// `http_uri.uri`.
    pub uri: http::Uri,
    /// `http_uri.cluster`.
    pub cluster: String,
    /// `http_uri.timeout`.
    pub timeout: Duration,
    /// `cache_duration` (10 minutes unless set).
    pub cache_duration: Duration,
}

/// Where a provider looks for tokens: `from_headers`, `from_params`, `from_cookies`, or
/// (none set) `authorization: Bearer` and the `access_token` parameter.
#[derive(Debug, Clone, Default)]
pub struct Locations {
    /// (header, value prefix).
    pub headers: Vec<(HeaderName, String)>,
    /// Query parameters.
    pub params: Vec<String>,
    /// Cookies.
    pub cookies: Vec<String>,
}

/// A compiled `JwtRequirement`.
#[derive(Debug)]
pub enum Requirement {
    /// `provider_name` / `provider_and_audiences`: a valid token of that provider (index in
    /// `providers`), its audiences checked against these when set.
    Provider(usize, Option<Audiences>),
    /// `requires_any`.
    Any(Vec<Requirement>),
    /// `requires_all`.
    All(Vec<Requirement>),
    /// `allow_missing` (`failed: false`) or `allow_missing_or_failed`: tokens of these
    /// providers (the siblings in a `requires_any`, else all) are verified if present.
    Allow {
        /// The providers whose locations are searched.
        providers: Vec<usize>,
        /// Whether failed tokens are allowed too.
        failed: bool,
    },
    /// No requirement set: every request passes.
    AllowAll,
}

/// A compiled `PerRouteConfig`.
#[derive(Debug, Clone)]
pub enum JwtAuthnPerRoute {
    /// `disabled`.
    Disabled,
    /// `requirement_name`.
    RequirementName(String),
}

/// Compiles a `JwtAuthentication`.
pub fn compile(
    ctx: &Context<'_>,
    c: &pb::JwtAuthentication,
    warnings: &mut Warnings,
) -> Result<JwtAuthnConfig, ConfigError> {
    if c.filter_state_rules.is_some() {
        return Err(ConfigError::new(
            "filter_state_rules",
            "not implemented by revoy: it keeps no filter state",
        ));
    }
    let mut names: Vec<&String> = c.providers.keys().collect();
    names.sort();
    let providers = names
        .iter()
        .map(|name| {
            let p = &c.providers[*name];
            provider(ctx, name, p, warnings).map_err(|e| e.within(&format!("providers[{name}]")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let index: HashMap<&str, usize> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    let mut requirement_map = HashMap::new();
    let mut map_names: Vec<&String> = c.requirement_map.keys().collect();
    map_names.sort();
    for name in &map_names {
        let r = requirement(&c.requirement_map[*name], &index, &[])
            .map_err(|e| e.within(&format!("requirement_map[{name}]")))?;
        requirement_map.insert((*name).clone(), Arc::new(r));
    }
    let requirement_names = map_names
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let rules = c
        .rules
        .iter()
        .enumerate()
        .map(|(i, rule)| {
            let at = format!("rules[{i}]");
            let m = rule
                .r#match
                .as_ref()
                .ok_or_else(|| ConfigError::new(format!("{at}.match"), "value is required"))?;
            let m = route_match(ctx, m).map_err(|e| e.within(&format!("{at}.match")))?;
            let req = match &rule.requirement_type {
                Some(pb::requirement_rule::RequirementType::Requires(r)) => Some(Arc::new(
                    requirement(r, &index, &[]).map_err(|e| e.within(&format!("{at}.requires")))?,
                )),
                Some(pb::requirement_rule::RequirementType::RequirementName(n)) => {
                    Some(requirement_map.get(n).cloned().ok_or_else(|| {
                        ConfigError::new(
                            format!("{at}.requirement_name"),
                            format!(
                                "Wrong requirement_name: {n}. It should be one of [{requirement_names}]"
                            ),
                        )
                    })?)
                }
                None => None,
            };
            Ok((m, req))
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok(JwtAuthnConfig {
        providers,
        rules,
        requirement_map,
        requirement_names,
        bypass_cors_preflight: c.bypass_cors_preflight,
        strip_failure_response: c.strip_failure_response,
        stat_prefix: c.stat_prefix.clone(),
    })
}

/// Compiles a `PerRouteConfig`.
pub fn compile_per_route(r: &pb::PerRouteConfig) -> Result<JwtAuthnPerRoute, ConfigError> {
    use pb::per_route_config::RequirementSpecifier as S;
    match &r.requirement_specifier {
        Some(S::Disabled(true)) => Ok(JwtAuthnPerRoute::Disabled),
        Some(S::Disabled(false)) => Err(ConfigError::new("disabled", "value must equal true")),
        Some(S::RequirementName(n)) if n.is_empty() => Err(ConfigError::new(
            "requirement_name",
            "value length must be at least 1 characters",
        )),
        Some(S::RequirementName(n)) => Ok(JwtAuthnPerRoute::RequirementName(n.clone())),
        None => Err(ConfigError::new(
            "requirement_specifier",
            "value is required",
        )),
    }
}

/// The error for a requirement naming a provider that is not configured (Envoy's text).
fn unknown_provider(name: &str) -> ConfigError {
    ConfigError::new(
        "",
        format!("Required provider ['{name}'] is not configured."),
    )
}

/// Compiles a `JwtRequirement`; `siblings` are the providers an `allow_missing*` in a
/// `requires_any` searches.
fn requirement(
    r: &pb::JwtRequirement,
    index: &HashMap<&str, usize>,
    siblings: &[usize],
) -> Result<Requirement, ConfigError> {
    let provider = |name: &str| {
        index
            .get(name)
            .copied()
            .ok_or_else(|| unknown_provider(name))
    };
    Ok(match &r.requires_type {
        None => Requirement::AllowAll,
        Some(RequiresType::ProviderName(n)) => Requirement::Provider(provider(n)?, None),
        Some(RequiresType::ProviderAndAudiences(p)) => Requirement::Provider(
            provider(&p.provider_name)?,
            (!p.audiences.is_empty()).then(|| Audiences::new(&p.audiences)),
        ),
        Some(RequiresType::AllowMissing(_)) => Requirement::Allow {
            providers: searched(siblings, index.len()),
            failed: false,
        },
        Some(RequiresType::AllowMissingOrFailed(_)) => Requirement::Allow {
            providers: searched(siblings, index.len()),
            failed: true,
        },
        Some(RequiresType::RequiresAll(list)) => {
            min_two(list.requirements.len(), "requires_all")?;
            Requirement::All(
                list.requirements
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        requirement(r, index, &[])
                            .map_err(|e| e.within(&format!("requires_all[{i}]")))
                    })
                    .collect::<Result<_, _>>()?,
            )
        }
        Some(RequiresType::RequiresAny(list)) => {
            min_two(list.requirements.len(), "requires_any")?;
            // As Envoy: the regular requirements in order, then one allow_missing* (the
            // last allow_missing_or_failed, else the first allow_missing) searching the
            // providers the others name.
            let mut used = Vec::new();
            let mut regular = Vec::new();
            let mut bypass: Option<&pb::JwtRequirement> = None;
            for (i, r) in list.requirements.iter().enumerate() {
                match &r.requires_type {
                    Some(RequiresType::AllowMissing(_) | RequiresType::AllowMissingOrFailed(_)) => {
                        if bypass.is_none_or(|b| {
                            matches!(b.requires_type, Some(RequiresType::AllowMissing(_)))
                        }) {
                            bypass = Some(r);
                        }
                        continue;
                    }
                    Some(RequiresType::ProviderName(n)) => used.push(provider(n)?),
                    Some(RequiresType::ProviderAndAudiences(p)) => {
                        used.push(provider(&p.provider_name)?)
                    }
                    _ => {}
                }
                regular.push(
                    requirement(r, index, &[])
                        .map_err(|e| e.within(&format!("requires_any[{i}]")))?,
                );
            }
            if let Some(b) = bypass {
                regular.push(requirement(b, index, &used)?);
            }
            Requirement::Any(regular)
        }
        Some(RequiresType::ExtractOnlyWithoutValidation(_)) => {
            return Err(ConfigError::new(
                "extract_only_without_validation",
                "not implemented by revoy",
            ));
        }
    })
}

/// The providers an `allow_missing*` searches: its siblings' in a `requires_any`, else (as
/// Envoy 1.40) all `count` of them.
fn searched(siblings: &[usize], count: usize) -> Vec<usize> {
    if siblings.is_empty() {
        (0..count).collect()
    } else {
        siblings.to_vec()
    }
}

/// The error for a requirement list shorter than two (the proto's validation).
fn min_two(len: usize, field: &str) -> Result<(), ConfigError> {
    if len < 2 {
        return Err(ConfigError::new(
            format!("{field}.requirements"),
            "value must contain at least 2 item(s)",
        ));
    }
    Ok(())
}

/// Compiles one provider.
fn provider(
    ctx: &Context<'_>,
    name: &str,
    p: &pb::JwtProvider,
    warnings: &mut Warnings,
) -> Result<Provider, ConfigError> {
    let header = |field: &str, n: &str| {
        HeaderName::try_from(n.to_ascii_lowercase())
            .map_err(|_| ConfigError::new(field, format!("invalid header name '{n}'")))
    };
    let jwks = match &p.jwks_source_specifier {
        Some(pb::jwt_provider::JwksSourceSpecifier::LocalJwks(source)) => {
            let text = data(ctx, Some(source), "local_jwks")?;
            let jwks = Jwks::parse(&text).map_err(|status| {
                ConfigError::new(
                    "local_jwks",
                    format!(
                        "Provider '{name}' in jwt_authn config has invalid local jwks: {}",
                        status.message()
                    ),
                )
            })?;
            JwksSource::Local(Arc::new(jwks))
        }
        Some(pb::jwt_provider::JwksSourceSpecifier::RemoteJwks(r)) => {
            JwksSource::Remote(remote(name, r, warnings).map_err(|e| e.within("remote_jwks"))?)
        }
        None => {
            return Err(ConfigError::new(
                "jwks_source_specifier",
                "value is required",
            ));
        }
    };
    if p.jwt_cache_config.is_some() {
        warnings.note(
            "jwt_cache_config",
            "revoy keeps no token cache: every token is verified (jwt_cache_hit stays 0)",
        );
    }
    let mut locations = Locations::default();
    for (i, h) in p.from_headers.iter().enumerate() {
        if h.name.is_empty() {
            return Err(ConfigError::new(
                format!("from_headers[{i}].name"),
                "value length must be at least 1 characters",
            ));
        }
        locations.headers.push((
            header(&format!("from_headers[{i}].name"), &h.name)?,
            h.value_prefix.clone(),
        ));
    }
    locations.params.clone_from(&p.from_params);
    locations.cookies.clone_from(&p.from_cookies);
    if locations.headers.is_empty() && locations.params.is_empty() && locations.cookies.is_empty() {
        locations
            .headers
            .push((http::header::AUTHORIZATION, "Bearer ".into()));
        locations.params.push("access_token".into());
    }
    let claim_to_headers = p
        .claim_to_headers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let path = if c.claim_path.is_empty() {
                c.claim_name.split('.').map(str::to_owned).collect()
            } else {
                c.claim_path.iter().map(|s| s.key.clone()).collect()
            };
            Ok((
                header(
                    &format!("claim_to_headers[{i}].header_name"),
                    &c.header_name,
                )?,
                path,
            ))
        })
        .collect::<Result<_, ConfigError>>()?;
    let max_lifetime = match &p.max_lifetime {
        Some(d) => Some(crate::config::route::duration(d)),
        None => p.require_expiration.then_some(Duration::MAX),
    };
    Ok(Provider {
        name: name.to_owned(),
        issuer: p.issuer.clone(),
        audiences: Audiences::new(&p.audiences),
        subjects: p
            .subjects
            .as_ref()
            .map(|s| string_matcher(ctx, s).map_err(|e| e.within("subjects")))
            .transpose()?,
        max_lifetime,
        jwks,
        forward: p.forward,
        locations,
        forward_payload_header: match p.forward_payload_header.as_str() {
            "" => None,
            n => Some(header("forward_payload_header", n)?),
        },
        pad_forward_payload_header: p.pad_forward_payload_header,
        claim_to_headers,
        clock_skew: match p.clock_skew_seconds {
            0 => DEFAULT_CLOCK_SKEW,
            s => u64::from(s),
        },
        clear_route_cache: p.clear_route_cache,
        payload_in_metadata: p.payload_in_metadata.clone(),
        header_in_metadata: p.header_in_metadata.clone(),
        failed_status_in_metadata: p.failed_status_in_metadata.clone(),
        space_delimited_claims: p
            .normalize_payload_in_metadata
            .as_ref()
            .map(|n| n.space_delimited_claims.clone())
            .unwrap_or_default(),
    })
}

/// Compiles a `RemoteJwks`.
fn remote(
    name: &str,
    r: &pb::RemoteJwks,
    warnings: &mut Warnings,
) -> Result<RemoteJwks, ConfigError> {
    let h = r
        .http_uri
        .as_ref()
        .ok_or_else(|| ConfigError::new("http_uri", "value is required"))?;
    let (cluster, timeout) = super::http_uri_target(h).map_err(|e| e.within("http_uri"))?;
    let uri = h
        .uri
        .parse::<http::Uri>()
        .ok()
        .filter(|u| u.authority().is_some() && u.scheme().is_some())
        .ok_or_else(|| {
            ConfigError::new(
                "http_uri.uri",
                format!("Provider '{name}' has an invalid URI: '{}'", h.uri),
            )
        })?;
    if r.async_fetch.is_some() {
        warnings.note(
            "async_fetch",
            "revoy fetches the JWKS when a request first needs it, not ahead",
        );
    }
    if r.retry_policy.is_some() {
        warnings.note("retry_policy", "revoy does not retry a failed JWKS fetch");
    }
    Ok(RemoteJwks {
        uri,
        cluster,
        timeout,
        cache_duration: r
            .cache_duration
            .as_ref()
            .map_or(DEFAULT_CACHE_DURATION, crate::config::route::duration),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};

    fn provider(issuer: &str) -> pb::JwtProvider {
        pb::JwtProvider {
            issuer: issuer.into(),
            jwks_source_specifier: Some(pb::jwt_provider::JwksSourceSpecifier::LocalJwks(
                DataSource {
                    specifier: Some(Specifier::InlineString(
                        r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#.into(),
                    )),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }
    }

    fn named(name: &str) -> pb::JwtRequirement {
        pb::JwtRequirement {
            requires_type: Some(RequiresType::ProviderName(name.into())),
        }
    }

    fn compile_err(c: &pb::JwtAuthentication) -> String {
        let io = crate::config::context::FakeIo::new();
        compile(&Context::new(&io), c, &mut Warnings::new())
            .unwrap_err()
            .to_string()
    }

    fn rule(r: pb::requirement_rule::RequirementType) -> pb::RequirementRule {
        pb::RequirementRule {
            r#match: Some(proto::pb::envoy::config::route::v3::RouteMatch {
                path_specifier: Some(
                    proto::pb::envoy::config::route::v3::route_match::PathSpecifier::Prefix(
                        "/".into(),
                    ),
                ),
                ..Default::default()
            }),
            requirement_type: Some(r),
        }
    }

    #[test]
    fn unknown_providers_and_requirement_names_are_envoys_errors() {
        let mut c = pb::JwtAuthentication {
            providers: [("p1".to_owned(), provider("i1"))].into(),
            rules: vec![rule(pb::requirement_rule::RequirementType::Requires(
                named("nope"),
            ))],
            ..Default::default()
        };
        let e = compile_err(&c);
        assert!(
            e.contains("Required provider ['nope'] is not configured."),
            "{e}"
        );
        c.rules = vec![rule(
            pb::requirement_rule::RequirementType::RequirementName("r9".into()),
        )];
        c.requirement_map = [
            ("r1".to_owned(), named("p1")),
            ("r0".to_owned(), named("p1")),
        ]
        .into();
        let e = compile_err(&c);
        assert!(
            e.contains("Wrong requirement_name: r9. It should be one of [r0,r1]"),
            "{e}"
        );
    }

    #[test]
    fn short_lists_and_unsupported_fields_are_refused() {
        let any = pb::JwtRequirement {
            requires_type: Some(RequiresType::RequiresAny(pb::JwtRequirementOrList {
                requirements: vec![named("p1")],
            })),
        };
        let c = pb::JwtAuthentication {
            providers: [("p1".to_owned(), provider("i1"))].into(),
            requirement_map: [("r".to_owned(), any)].into(),
            ..Default::default()
        };
        assert!(compile_err(&c).contains("at least 2 item(s)"));
        let c = pb::JwtAuthentication {
            filter_state_rules: Some(Default::default()),
            ..Default::default()
        };
        assert!(compile_err(&c).contains("filter_state_rules"));
    }

    #[test]
    fn requires_any_searches_its_providers_for_allow_missing() {
        let io = crate::config::context::FakeIo::new();
        let allow = pb::JwtRequirement {
            requires_type: Some(RequiresType::AllowMissing(Default::default())),
        };
        let any = pb::JwtRequirement {
            requires_type: Some(RequiresType::RequiresAny(pb::JwtRequirementOrList {
                requirements: vec![allow, named("b"), named("a")],
            })),
        };
        let c = pb::JwtAuthentication {
            providers: [
                ("a".to_owned(), provider("ia")),
                ("b".to_owned(), provider("ib")),
            ]
            .into(),
            requirement_map: [("r".to_owned(), any)].into(),
            ..Default::default()
        };
        let compiled = compile(&Context::new(&io), &c, &mut Warnings::new()).unwrap();
        let Requirement::Any(list) = &*compiled.requirement_map["r"] else {
            panic!("not requires_any");
        };
        assert!(matches!(
            list.as_slice(),
            [
                Requirement::Provider(1, None),
                Requirement::Provider(0, None),
                Requirement::Allow { providers, failed: false }
            ] if providers == &[1, 0]
        ));
    }
}
