//! Compiles `RouteMatch`, `HeaderMatcher`, `StringMatcher` and regexes.

#![allow(deprecated)] // Envoy still honours the deprecated fields read here.

use proto::pb::envoy::config::route::v3 as pb;
use proto::pb::envoy::r#type::matcher::v3 as m;
use proto::pb::envoy::r#type::v3 as ty;

use crate::config::{ConfigError, Context};
use crate::route::RouteMatch;
use crate::route::action::MoreConditions;
use crate::route::matcher::{
    FractionalPercent, HeaderMatcher, HeaderValueMatch, PathMatch, QueryParameterMatcher,
    RuntimeFraction, StringMatcher, UriTemplate, template_regex,
};

/// Compiles an RE2-style regex. `anchored`: the regex must match the whole input (RE2
/// `FullMatch`), as Envoy's matchers require. [`Context::regex`] shares the result within one
/// compile.
pub fn compile_regex(re: &str, anchored: bool) -> Result<regex::Regex, ConfigError> {
    if anchored {
        regex::Regex::new(&format!("^(?:{re})$"))
    } else {
        regex::Regex::new(re)
    }
    .map_err(|e| {
        let detail = match &e {
            regex::Error::Syntax(s) => s.lines().last().unwrap_or(s).trim().to_owned(),
            other => other.to_string(),
        };
        ConfigError::new("regex", format!("Invalid regex '{re}': {detail}"))
    })
}

fn regex_matcher(ctx: &Context<'_>, r: &m::RegexMatcher) -> Result<regex::Regex, ConfigError> {
    ctx.regex(&r.regex, true)
}

/// RE2 substitution (`\1`, `\\`) -> regex crate replacement (`${1}`, `$$` for `$`).
pub fn substitution(sub: &str) -> String {
    let mut out = String::with_capacity(sub.len());
    let mut chars = sub.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(d) if d.is_ascii_digit() => {
                    out.push_str("${");
                    out.push(d);
                    out.push('}');
                }
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            '$' => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out
}

/// Compiles a `RegexMatchAndSubstitute` (unanchored: every match is replaced).
pub fn regex_substitute(
    ctx: &Context<'_>,
    r: &m::RegexMatchAndSubstitute,
) -> Result<(regex::Regex, String), ConfigError> {
    let p = r
        .pattern
        .as_ref()
        .ok_or_else(|| ConfigError::new("pattern", "value is required"))?;
    Ok((ctx.regex(&p.regex, false)?, substitution(&r.substitution)))
}

/// Compiles a `StringMatcher`.
pub fn string_matcher(
    ctx: &Context<'_>,
    s: &m::StringMatcher,
) -> Result<StringMatcher, ConfigError> {
    use m::string_matcher::MatchPattern as P;
    let ic = s.ignore_case;
    Ok(match &s.match_pattern {
        Some(P::Exact(v)) => StringMatcher::Exact(v.clone(), ic),
        Some(P::Prefix(v)) => StringMatcher::Prefix(v.clone(), ic),
        Some(P::Suffix(v)) => StringMatcher::Suffix(v.clone(), ic),
        Some(P::Contains(v)) => StringMatcher::Contains(v.clone(), ic),
        Some(P::SafeRegex(r)) => {
            StringMatcher::Regex(regex_matcher(ctx, r).map_err(|e| e.within("safe_regex"))?)
        }
        Some(P::Custom(_)) => {
            return Err(ConfigError::new(
                "custom",
                "custom string matchers are not supported by revoy",
            ));
        }
        None => return Err(ConfigError::new("match_pattern", "value is required")),
    })
}

/// Compiles one `HeaderMatcher`.
pub fn header_matcher(
    ctx: &Context<'_>,
    h: &pb::HeaderMatcher,
) -> Result<HeaderMatcher, ConfigError> {
    use pb::header_matcher::HeaderMatchSpecifier as S;
    let value = match &h.header_match_specifier {
        None => HeaderValueMatch::Present(true),
        Some(S::PresentMatch(p)) => HeaderValueMatch::Present(*p),
        Some(S::ExactMatch(v)) => HeaderValueMatch::String(StringMatcher::Exact(v.clone(), false)),
        Some(S::PrefixMatch(v)) => {
            HeaderValueMatch::String(StringMatcher::Prefix(v.clone(), false))
        }
        Some(S::SuffixMatch(v)) => {
            HeaderValueMatch::String(StringMatcher::Suffix(v.clone(), false))
        }
        Some(S::ContainsMatch(v)) => {
            HeaderValueMatch::String(StringMatcher::Contains(v.clone(), false))
        }
        Some(S::SafeRegexMatch(r)) => HeaderValueMatch::String(StringMatcher::Regex(
            regex_matcher(ctx, r).map_err(|e| e.within("safe_regex_match"))?,
        )),
        Some(S::RangeMatch(ty::Int64Range { start, end })) => HeaderValueMatch::Range(*start, *end),
        Some(S::StringMatch(s)) => {
            HeaderValueMatch::String(string_matcher(ctx, s).map_err(|e| e.within("string_match"))?)
        }
    };
    Ok(HeaderMatcher {
        name: h.name.to_ascii_lowercase(),
        value,
        invert: h.invert_match,
        missing_as_empty: h.treat_missing_header_as_empty,
    })
}

/// Compiles a list of header matchers.
pub fn header_matchers(
    ctx: &Context<'_>,
    hs: &[pb::HeaderMatcher],
) -> Result<Vec<HeaderMatcher>, ConfigError> {
    hs.iter()
        .enumerate()
        .map(|(i, h)| header_matcher(ctx, h).map_err(|e| e.within(&format!("headers[{i}]"))))
        .collect()
}

/// Converts a `FractionalPercent`.
pub fn fractional(f: &ty::FractionalPercent) -> FractionalPercent {
    use ty::fractional_percent::DenominatorType as D;
    let denominator = match D::try_from(f.denominator).unwrap_or(D::Hundred) {
        D::Hundred => 100,
        D::TenThousand => 10_000,
        D::Million => 1_000_000,
    };
    FractionalPercent {
        numerator: f.numerator.min(denominator),
        denominator,
    }
}

/// Converts a `RuntimeFractionalPercent`.
pub fn runtime_fraction(
    r: &proto::pb::envoy::config::core::v3::RuntimeFractionalPercent,
) -> RuntimeFraction {
    RuntimeFraction {
        key: r.runtime_key.clone(),
        default: r.default_value.as_ref().map_or(
            FractionalPercent {
                numerator: 0,
                denominator: 100,
            },
            fractional,
        ),
    }
}

/// Compiles a `RouteMatch`.
pub fn route_match(ctx: &Context<'_>, rm: &pb::RouteMatch) -> Result<RouteMatch, ConfigError> {
    use pb::route_match::PathSpecifier as P;
    let path = match &rm.path_specifier {
        Some(P::Prefix(p)) => PathMatch::Prefix(p.clone()),
        Some(P::Path(p)) => PathMatch::Exact(p.clone()),
        Some(P::SafeRegex(r)) => PathMatch::Regex(Box::new(
            regex_matcher(ctx, r).map_err(|e| e.within("safe_regex"))?,
        )),
        Some(P::PathSeparatedPrefix(p)) => {
            if p.contains(['?', '#']) || p.ends_with('/') {
                return Err(ConfigError::new(
                    "path_separated_prefix",
                    "value does not match regex pattern \"^[^?#]+[^?#/]$\"",
                ));
            }
            PathMatch::SeparatedPrefix(p.clone())
        }
        Some(P::ConnectMatcher(_)) => PathMatch::Connect,
        Some(P::PathMatchPolicy(ext)) => {
            let template = ext
                .typed_config
                .as_ref()
                .and_then(|any| {
                    proto::unpack::<proto::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig>(any).ok()
                })
                .map(|c| c.path_template)
                .ok_or_else(|| {
                    ConfigError::new("path_match_policy", "only envoy.path.match.uri_template.uri_template_matcher is supported")
                })?;
            if !(1..=256).contains(&template.chars().count()) {
                return Err(ConfigError::new(
                    "path_match_policy.path_template",
                    "value must have between 1 and 256 characters inclusive",
                ));
            }
            let re = template_regex(&template).map_err(|m| {
                ConfigError::new(
                    "path_match_policy",
                    format!("path_match_policy.path_template {template} is invalid: {m}"),
                )
            })?;
            PathMatch::Template(Box::new(UriTemplate {
                template,
                regex: re,
            }))
        }
        None => return Err(ConfigError::new("path_specifier", "value is required")),
    };
    let dynamic_metadata = rm
        .dynamic_metadata
        .iter()
        .enumerate()
        .map(|(i, m)| {
            crate::config::metadata_matcher::metadata_matcher(ctx, m)
                .map_err(|e| e.within(&format!("dynamic_metadata[{i}]")))
        })
        .collect::<Result<_, _>>()?;
    if !rm.filter_state.is_empty() {
        return Err(ConfigError::new(
            "filter_state",
            "filter_state matching is not supported by revoy",
        ));
    }
    let query_parameters = rm
        .query_parameters
        .iter()
        .enumerate()
        .map(|(i, q)| {
            use pb::query_parameter_matcher::QueryParameterMatchSpecifier as Q;
            let value = match &q.query_parameter_match_specifier {
                Some(Q::StringMatch(s)) => Some(
                    string_matcher(ctx, s)
                        .map_err(|e| e.within(&format!("query_parameters[{i}].string_match")))?,
                ),
                Some(Q::PresentMatch(_)) | None => None,
            };
            Ok(QueryParameterMatcher {
                name: q.name.clone(),
                value,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let cookies = rm
        .cookies
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let sm = c.string_match.as_ref().ok_or_else(|| {
                ConfigError::new(format!("cookies[{i}].string_match"), "value is required")
            })?;
            Ok((c.name.clone(), string_matcher(ctx, sm)?, c.invert_match))
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok(RouteMatch {
        path,
        case_sensitive: rm.case_sensitive.is_none_or(|b| b.value),
        grpc: rm.grpc.is_some(),
        headers: header_matchers(ctx, &rm.headers)?.into_boxed_slice(),
        more: MoreConditions {
            query_parameters,
            runtime_fraction: rm.runtime_fraction.as_ref().map(runtime_fraction),
            tls_context: rm
                .tls_context
                .as_ref()
                .map(|t| (t.presented.map(|b| b.value), t.validated.map(|b| b.value))),
            cookies,
            dynamic_metadata,
        }
        .boxed(),
    })
}
