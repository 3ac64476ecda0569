//! `envoy.extensions.common.matching.v3.ExtensionWithMatcher` around an HTTP filter: the
//! wrapped filter's config and its `xds_matcher` -> [`Matcher`] (evaluated per request in
//! `crate::route::filter_matcher`).
//!
//! What revoy implements of the matching API: `matcher_list` (single predicates with a
//! `value_match`, `or_matcher`, `and_matcher`, `not_matcher`) and `matcher_tree`
//! (`exact_match_map`, `prefix_match_map`), nested matchers, `on_no_match`; the inputs
//! `HttpRequestHeaderMatchInput`, `HttpRequestQueryParamMatchInput`, and the connection's
//! `SourceIPInput`, `DirectSourceIPInput`, `DestinationIPInput`, `DestinationPortInput`; the action
//! `SkipFilter`. Anything else (other inputs and actions, custom matchers, `keep_matching`,
//! the deprecated `matcher` field) is a configuration error naming it.

use std::collections::HashMap;

use proto::pb::envoy::extensions::common::matching::v3::ExtensionWithMatcher;
use proto::pb::envoy::r#type::matcher::v3 as envoy_matcher;
use proto::pb::google::protobuf::Any;
use proto::pb::xds::core::v3::TypedExtensionConfig;
use proto::pb::xds::r#type::matcher::v3 as xds;

use crate::config::{ConfigError, Context};
use crate::route::filter_matcher::{Input, Map, Matcher, OnMatch, Predicate};

/// Type name of `ExtensionWithMatcher`.
pub const EXTENSION_WITH_MATCHER: &str = "envoy.extensions.common.matching.v3.ExtensionWithMatcher";
/// Type name of `ExtensionWithMatcherPerRoute` (refused: revoy lacks it).
pub const EXTENSION_WITH_MATCHER_PER_ROUTE: &str =
    "envoy.extensions.common.matching.v3.ExtensionWithMatcherPerRoute";
/// Type name of the skip action.
const SKIP_FILTER: &str = "envoy.extensions.filters.common.matcher.action.v3.SkipFilter";
const HEADER_INPUT: &str = "envoy.type.matcher.v3.HttpRequestHeaderMatchInput";
const QUERY_PARAM_INPUT: &str = "envoy.type.matcher.v3.HttpRequestQueryParamMatchInput";
/// The connection inputs revoy reads, by type name.
const CONNECTION_INPUTS: [(&str, Input); 4] = [
    (
        "envoy.extensions.matching.common_inputs.network.v3.SourceIPInput",
        Input::SourceIp,
    ),
    (
        "envoy.extensions.matching.common_inputs.network.v3.DirectSourceIPInput",
        Input::DirectSourceIp,
    ),
    (
        "envoy.extensions.matching.common_inputs.network.v3.DestinationIPInput",
        Input::DestinationIp,
    ),
    (
        "envoy.extensions.matching.common_inputs.network.v3.DestinationPortInput",
        Input::DestinationPort,
    ),
];

/// How deep matchers may nest (Envoy's limit on recursive config is far above real use).
const MAX_DEPTH: usize = 16;

/// Compiles an `ExtensionWithMatcher`: the wrapped filter's `typed_config` and the matcher
/// that skips it. Errors name fields relative to the message.
pub fn compile<'a>(
    ctx: &Context<'_>,
    p: &'a ExtensionWithMatcher,
) -> Result<(&'a Any, Matcher), ConfigError> {
    #[allow(deprecated)]
    if p.matcher.is_some() {
        return Err(ConfigError::unimplemented(
            "matcher",
            "the deprecated matcher field (use xds_matcher)",
        ));
    }
    let extension = p
        .extension_config
        .as_ref()
        .ok_or_else(|| ConfigError::new("extension_config", "value is required"))?;
    let any = extension
        .typed_config
        .as_ref()
        .ok_or_else(|| ConfigError::new("extension_config.typed_config", "value is required"))?;
    if proto::type_name_of(&any.type_url) == EXTENSION_WITH_MATCHER {
        return Err(ConfigError::unimplemented(
            "extension_config.typed_config",
            "an ExtensionWithMatcher wrapping another",
        ));
    }
    let matcher = p
        .xds_matcher
        .as_ref()
        .ok_or_else(|| ConfigError::new("xds_matcher", "value is required"))?;
    let matcher = compile_matcher(ctx, matcher, 0).map_err(|e| e.within("xds_matcher"))?;
    Ok((any, matcher))
}

fn compile_matcher(
    ctx: &Context<'_>,
    m: &xds::Matcher,
    depth: usize,
) -> Result<Matcher, ConfigError> {
    use xds::matcher::MatcherType;
    use xds::matcher::matcher_tree::TreeType;
    if depth > MAX_DEPTH {
        return Err(ConfigError::new(
            "",
            format!("matchers nested more than {MAX_DEPTH} deep"),
        ));
    }
    let on_no_match = m
        .on_no_match
        .as_ref()
        .map(|o| compile_on_match(ctx, o, depth).map(Box::new))
        .transpose()
        .map_err(|e| e.within("on_no_match"))?;
    match &m.matcher_type {
        Some(MatcherType::MatcherList(list)) => {
            if list.matchers.is_empty() {
                return Err(ConfigError::new(
                    "matcher_list.matchers",
                    "value must contain at least 1 item(s)",
                ));
            }
            let matchers = list
                .matchers
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let at = format!("matcher_list.matchers[{i}]");
                    let predicate = f.predicate.as_ref().ok_or_else(|| {
                        ConfigError::new(format!("{at}.predicate"), "value is required")
                    })?;
                    let predicate = compile_predicate(ctx, predicate, depth)
                        .map_err(|e| e.within(&format!("{at}.predicate")))?;
                    let on_match = f.on_match.as_ref().ok_or_else(|| {
                        ConfigError::new(format!("{at}.on_match"), "value is required")
                    })?;
                    let on_match = compile_on_match(ctx, on_match, depth)
                        .map_err(|e| e.within(&format!("{at}.on_match")))?;
                    Ok((predicate, on_match))
                })
                .collect::<Result<_, ConfigError>>()?;
            Ok(Matcher::List {
                matchers,
                on_no_match,
            })
        }
        Some(MatcherType::MatcherTree(tree)) => {
            let input = tree
                .input
                .as_ref()
                .ok_or_else(|| ConfigError::new("matcher_tree.input", "value is required"))?;
            let input = compile_input(input).map_err(|e| e.within("matcher_tree.input"))?;
            let entries = |map: &xds::matcher::matcher_tree::MatchMap, field: &str| {
                let mut keys: Vec<&String> = map.map.keys().collect();
                keys.sort();
                keys.into_iter()
                    .map(|k| {
                        let at = format!("matcher_tree.{field}.map[{k}]");
                        compile_on_match(ctx, &map.map[k], depth)
                            .map(|o| (k.clone(), o))
                            .map_err(|e| e.within(&at))
                    })
                    .collect::<Result<Vec<_>, ConfigError>>()
            };
            let map = match &tree.tree_type {
                Some(TreeType::ExactMatchMap(m)) => Map::Exact(
                    entries(m, "exact_match_map")?
                        .into_iter()
                        .collect::<HashMap<_, _>>(),
                ),
                Some(TreeType::PrefixMatchMap(m)) => {
                    let mut prefixes = entries(m, "prefix_match_map")?;
                    prefixes.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
                    Map::Prefix(prefixes)
                }
                Some(TreeType::CustomMatch(c)) => {
                    return Err(ConfigError::unimplemented(
                        "matcher_tree.custom_match",
                        &format!("the custom tree matcher '{}'", extension_name(c)),
                    ));
                }
                None => {
                    return Err(ConfigError::new(
                        "matcher_tree.tree_type",
                        "value is required",
                    ));
                }
            };
            Ok(Matcher::Tree {
                input,
                map,
                on_no_match,
            })
        }
        None => Err(ConfigError::new("matcher_type", "value is required")),
    }
}

fn compile_on_match(
    ctx: &Context<'_>,
    o: &xds::matcher::OnMatch,
    depth: usize,
) -> Result<OnMatch, ConfigError> {
    use xds::matcher::on_match::OnMatch as O;
    if o.keep_matching {
        return Err(ConfigError::unimplemented("keep_matching", "keep_matching"));
    }
    match &o.on_match {
        Some(O::Matcher(m)) => Ok(OnMatch::Matcher(Box::new(
            compile_matcher(ctx, m, depth + 1).map_err(|e| e.within("matcher"))?,
        ))),
        Some(O::Action(a)) => {
            let ty = a
                .typed_config
                .as_ref()
                .map_or("", |t| proto::type_name_of(&t.type_url));
            if ty != SKIP_FILTER {
                return Err(ConfigError::unimplemented(
                    "action",
                    &format!("the matching action '{}' ({ty})", a.name),
                ));
            }
            Ok(OnMatch::Skip)
        }
        None => Err(ConfigError::new("on_match", "value is required")),
    }
}

fn compile_predicate(
    ctx: &Context<'_>,
    p: &xds::matcher::matcher_list::Predicate,
    depth: usize,
) -> Result<Predicate, ConfigError> {
    use xds::matcher::matcher_list::predicate::MatchType;
    use xds::matcher::matcher_list::predicate::single_predicate::Matcher as Value;
    let list = |ps: &xds::matcher::matcher_list::predicate::PredicateList, field: &str| {
        if ps.predicate.len() < 2 {
            return Err(ConfigError::new(
                format!("{field}.predicate"),
                "value must contain at least 2 item(s)",
            ));
        }
        ps.predicate
            .iter()
            .enumerate()
            .map(|(i, p)| {
                compile_predicate(ctx, p, depth + 1)
                    .map_err(|e| e.within(&format!("{field}.predicate[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()
    };
    if depth > MAX_DEPTH {
        return Err(ConfigError::new(
            "",
            format!("predicates nested more than {MAX_DEPTH} deep"),
        ));
    }
    match &p.match_type {
        Some(MatchType::SinglePredicate(s)) => {
            let input = s
                .input
                .as_ref()
                .ok_or_else(|| ConfigError::new("single_predicate.input", "value is required"))?;
            let input = compile_input(input).map_err(|e| e.within("single_predicate.input"))?;
            let value = match &s.matcher {
                Some(Value::ValueMatch(v)) => {
                    string_matcher(ctx, v).map_err(|e| e.within("single_predicate.value_match"))?
                }
                Some(Value::CustomMatch(c)) => {
                    return Err(ConfigError::unimplemented(
                        "single_predicate.custom_match",
                        &format!("the custom input matcher '{}'", extension_name(c)),
                    ));
                }
                None => {
                    return Err(ConfigError::new(
                        "single_predicate.matcher",
                        "value is required",
                    ));
                }
            };
            Ok(Predicate::Single(input, value))
        }
        Some(MatchType::OrMatcher(ps)) => Ok(Predicate::Or(list(ps, "or_matcher")?)),
        Some(MatchType::AndMatcher(ps)) => Ok(Predicate::And(list(ps, "and_matcher")?)),
        Some(MatchType::NotMatcher(p)) => Ok(Predicate::Not(Box::new(
            compile_predicate(ctx, p, depth + 1).map_err(|e| e.within("not_matcher"))?,
        ))),
        None => Err(ConfigError::new("match_type", "value is required")),
    }
}

fn compile_input(input: &TypedExtensionConfig) -> Result<Input, ConfigError> {
    let any = input
        .typed_config
        .as_ref()
        .ok_or_else(|| ConfigError::new("typed_config", "value is required"))?;
    let bad = |e: proto::UnpackError| ConfigError::new("typed_config", e.to_string());
    match proto::type_name_of(&any.type_url) {
        HEADER_INPUT => {
            let h: envoy_matcher::HttpRequestHeaderMatchInput = proto::unpack(any).map_err(bad)?;
            let name = h.header_name.to_ascii_lowercase();
            let bare = name.strip_prefix(':').unwrap_or(&name);
            if bare.is_empty() || http::HeaderName::from_bytes(bare.as_bytes()).is_err() {
                return Err(ConfigError::new(
                    "typed_config.header_name",
                    format!("invalid header name {:?}", h.header_name),
                ));
            }
            Ok(Input::Header(name))
        }
        QUERY_PARAM_INPUT => {
            let q: envoy_matcher::HttpRequestQueryParamMatchInput =
                proto::unpack(any).map_err(bad)?;
            if q.query_param.is_empty() {
                return Err(ConfigError::new(
                    "typed_config.query_param",
                    "value length must be at least 1 characters",
                ));
            }
            Ok(Input::QueryParam(q.query_param))
        }
        other => CONNECTION_INPUTS
            .iter()
            .find(|(name, _)| *name == other)
            .map(|(_, input)| input.clone())
            .ok_or_else(|| {
                ConfigError::unimplemented(
                    "typed_config",
                    &format!("the matching input '{}' ({other})", input.name),
                )
            }),
    }
}

/// An xDS `StringMatcher`, compiled as the Envoy one of the same shape.
fn string_matcher(
    ctx: &Context<'_>,
    s: &xds::StringMatcher,
) -> Result<crate::route::matcher::StringMatcher, ConfigError> {
    use envoy_matcher::string_matcher::MatchPattern as E;
    use xds::string_matcher::MatchPattern as X;
    let match_pattern = match &s.match_pattern {
        Some(X::Exact(v)) => Some(E::Exact(v.clone())),
        Some(X::Prefix(v)) => Some(E::Prefix(v.clone())),
        Some(X::Suffix(v)) => Some(E::Suffix(v.clone())),
        Some(X::Contains(v)) => Some(E::Contains(v.clone())),
        Some(X::SafeRegex(r)) => Some(E::SafeRegex(envoy_matcher::RegexMatcher {
            regex: r.regex.clone(),
            ..Default::default()
        })),
        Some(X::Custom(c)) => {
            return Err(ConfigError::unimplemented(
                "custom",
                &format!("the custom string matcher '{}'", extension_name(c)),
            ));
        }
        None => None,
    };
    let envoy = envoy_matcher::StringMatcher {
        ignore_case: s.ignore_case,
        match_pattern,
    };
    crate::config::route::matchers::string_matcher(ctx, &envoy)
}

fn extension_name(c: &TypedExtensionConfig) -> String {
    let ty = c
        .typed_config
        .as_ref()
        .map_or("", |t| proto::type_name_of(&t.type_url));
    format!("{} ({ty})", c.name)
}

#[cfg(test)]
mod tests;
