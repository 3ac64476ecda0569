//! `envoy.filters.http.header_to_metadata` (`Config`, the filter's and a route's) ->
//! [`HeaderToMetadataConfig`], with Envoy 1.40's validation and error texts.

use http::HeaderName;
use proto::pb::envoy::extensions::filters::http::header_to_metadata::v3::{Config, config};

use crate::config::route::matchers::regex_substitute;
use crate::config::{ConfigError, Context, Warnings};

/// The namespace a rule writes to when it names none.
pub const DEFAULT_NAMESPACE: &str = "envoy.filters.http.header_to_metadata";

/// A compiled `Config`: the rules for requests and for responses.
#[derive(Debug, Clone, Default)]
pub struct HeaderToMetadataConfig {
    /// `request_rules`, in order.
    pub request_rules: Vec<Rule>,
    /// `response_rules`, in order.
    pub response_rules: Vec<Rule>,
}

/// One `Rule`.
#[derive(Debug, Clone)]
pub struct Rule {
    /// What it reads.
    pub source: Source,
    /// `on_header_present`.
    pub on_present: Option<Pair>,
    /// `on_header_missing` (its value is never empty).
    pub on_missing: Option<Pair>,
    /// `remove`: the header is removed once read (headers only).
    pub remove: bool,
}

/// Where a rule's value comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// `header`, lower-cased (`None`: a name no message can carry, so always missing).
    Header(Option<HeaderName>),
    /// `cookie`: the named cookie of the `cookie` headers.
    Cookie(String),
}

/// A `KeyValuePair`: what a rule writes.
#[derive(Debug, Clone)]
pub struct Pair {
    /// `metadata_namespace`, or the filter's when empty.
    pub namespace: String,
    /// `key`.
    pub key: String,
    /// `value`: written instead of the header's (empty: the header's).
    pub value: String,
    /// `regex_value_rewrite`: every match in the header's value replaced (regex crate
    /// replacement syntax).
    pub rewrite: Option<(regex::Regex, String)>,
    /// `type`.
    pub kind: ValueKind,
    /// `encode: BASE64`: the value is base64, decoded before it is typed.
    pub base64: bool,
}

/// `ValueType`: what the (decoded) value becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// `STRING`.
    String,
    /// `NUMBER`: a double.
    Number,
    /// `PROTOBUF_VALUE`: a serialized `google.protobuf.Value`.
    ProtobufValue,
}

/// Compiles the filter's `Config` (`per_route`: a route's, which needs some rule); a
/// `stat_prefix` is noted in `warnings`, as revoy emits none of its stats.
pub fn compile(
    ctx: &Context<'_>,
    c: &Config,
    per_route: bool,
    warnings: &mut Warnings,
) -> Result<HeaderToMetadataConfig, ConfigError> {
    // Envoy validates the whole message first, then builds the rules.
    for (field, rules) in [
        ("request_rules", &c.request_rules),
        ("response_rules", &c.response_rules),
    ] {
        for (i, r) in rules.iter().enumerate() {
            validate(r).map_err(|e| e.within(&format!("{field}[{i}]")))?;
        }
    }
    let compiled = HeaderToMetadataConfig {
        request_rules: rules(ctx, "request_rules", &c.request_rules)?,
        response_rules: rules(ctx, "response_rules", &c.response_rules)?,
    };
    if per_route && compiled.request_rules.is_empty() && compiled.response_rules.is_empty() {
        return Err(ConfigError::new(
            "",
            "header_to_metadata_filter: Per filter configs must at least specify either request or response rules",
        ));
    }
    if !c.stat_prefix.is_empty() {
        warnings.note(
            "stat_prefix",
            "revoy does not emit the header_to_metadata statistics; the rules apply without them",
        );
    }
    Ok(compiled)
}

/// The proto constraints of a rule's pairs (Envoy's proto validation).
fn validate(r: &config::Rule) -> Result<(), ConfigError> {
    for (field, pair) in [
        ("on_header_present", &r.on_header_present),
        ("on_header_missing", &r.on_header_missing),
    ] {
        let Some(p) = pair else { continue };
        if p.key.is_empty() {
            return Err(ConfigError::new(
                format!("{field}.key"),
                "value length must be at least 1 characters",
            ));
        }
        if config::ValueType::try_from(p.r#type).is_err() {
            return Err(ConfigError::new(
                format!("{field}.type"),
                "value must be one of the defined enum values",
            ));
        }
    }
    Ok(())
}

fn rules(ctx: &Context<'_>, field: &str, rules: &[config::Rule]) -> Result<Vec<Rule>, ConfigError> {
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| rule(ctx, r).map_err(|e| e.within(&format!("{field}[{i}]"))))
        .collect()
}

/// One rule, checked in Envoy's order with its messages.
fn rule(ctx: &Context<'_>, r: &config::Rule) -> Result<Rule, ConfigError> {
    let error = |message: &str| Err(ConfigError::new("", message));
    if !r.cookie.is_empty() && !r.header.is_empty() {
        return error("Cannot specify both header and cookie in the same rule");
    }
    let (source, described) = if !r.header.is_empty() {
        (
            Source::Header(HeaderName::from_bytes(r.header.to_ascii_lowercase().as_bytes()).ok()),
            format!("header '{}'", r.header),
        )
    } else if !r.cookie.is_empty() {
        (
            Source::Cookie(r.cookie.clone()),
            format!("cookie '{}'", r.cookie),
        )
    } else {
        return error("One of Cookie or Header option needs to be specified");
    };
    if r.on_header_present.is_none() && r.on_header_missing.is_none() {
        return error(&format!(
            "header to metadata filter: rule for {described} has neither `on_header_present` nor `on_header_missing` set"
        ));
    }
    if r.on_header_present
        .as_ref()
        .is_some_and(|p| !p.value.is_empty() && p.regex_value_rewrite.is_some())
    {
        return error("Cannot specify both value and regex_value_rewrite");
    }
    if !r.cookie.is_empty() && r.remove {
        return error("Cannot specify remove for cookie");
    }
    if r.on_header_missing
        .as_ref()
        .is_some_and(|p| p.value.is_empty())
    {
        return error("Cannot specify on_header_missing rule with an empty value");
    }
    let on_present = r
        .on_header_present
        .as_ref()
        .map(|p| pair(p, Some(ctx)))
        .transpose()
        .map_err(|e| e.within("on_header_present"))?;
    let on_missing = r
        .on_header_missing
        .as_ref()
        .map(|p| pair(p, None))
        .transpose()?;
    Ok(Rule {
        source,
        on_present,
        on_missing,
        remove: r.remove,
    })
}

/// A pair; its regex rewrite compiled only with `ctx` (Envoy uses it only when the header is
/// present).
fn pair(p: &config::KeyValuePair, ctx: Option<&Context<'_>>) -> Result<Pair, ConfigError> {
    let rewrite = match (ctx, &p.regex_value_rewrite) {
        (Some(ctx), Some(r)) => {
            Some(regex_substitute(ctx, r).map_err(|e| e.within("regex_value_rewrite"))?)
        }
        _ => None,
    };
    Ok(Pair {
        namespace: if p.metadata_namespace.is_empty() {
            DEFAULT_NAMESPACE.to_owned()
        } else {
            p.metadata_namespace.clone()
        },
        key: p.key.clone(),
        value: p.value.clone(),
        rewrite,
        kind: match config::ValueType::try_from(p.r#type) {
            Ok(config::ValueType::Number) => ValueKind::Number,
            Ok(config::ValueType::ProtobufValue) => ValueKind::ProtobufValue,
            _ => ValueKind::String,
        },
        base64: p.encode == config::ValueEncode::Base64 as i32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FakeIo;

    fn present(key: &str) -> Option<config::KeyValuePair> {
        Some(config::KeyValuePair {
            key: key.into(),
            ..Default::default()
        })
    }

    /// The error compiling `rules` as request rules, as (path, message).
    fn error(rules: Vec<config::Rule>, per_route: bool) -> (String, String) {
        let io = FakeIo::new();
        let ctx = Context::new(&io);
        let c = Config {
            request_rules: rules,
            ..Default::default()
        };
        let e = compile(&ctx, &c, per_route, &mut Warnings::new()).unwrap_err();
        (e.path, e.message)
    }

    #[test]
    fn rules_are_refused_with_envoys_messages() {
        let header = |h: &str| config::Rule {
            header: h.into(),
            on_header_present: present("k"),
            ..Default::default()
        };
        let both = config::Rule {
            cookie: "c".into(),
            ..header("x")
        };
        assert_eq!(
            error(vec![header("a"), both], false),
            (
                "request_rules[1]".into(),
                "Cannot specify both header and cookie in the same rule".into()
            )
        );
        assert_eq!(
            error(vec![header("")], false).1,
            "One of Cookie or Header option needs to be specified"
        );
        let neither = config::Rule {
            cookie: "c".into(),
            ..Default::default()
        };
        assert_eq!(
            error(vec![neither], false).1,
            "header to metadata filter: rule for cookie 'c' has neither `on_header_present` nor `on_header_missing` set"
        );
        let mut mixed = header("x");
        if let Some(p) = mixed.on_header_present.as_mut() {
            p.value = "v".into();
            p.regex_value_rewrite = Some(Default::default());
        }
        assert_eq!(
            error(vec![mixed], false).1,
            "Cannot specify both value and regex_value_rewrite"
        );
        let removed_cookie = config::Rule {
            header: String::new(),
            cookie: "c".into(),
            remove: true,
            ..header("")
        };
        assert_eq!(
            error(vec![removed_cookie], false).1,
            "Cannot specify remove for cookie"
        );
        let empty_missing = config::Rule {
            on_header_missing: present("k"),
            ..header("x")
        };
        assert_eq!(
            error(vec![empty_missing], false).1,
            "Cannot specify on_header_missing rule with an empty value"
        );
        let no_key = config::Rule {
            on_header_present: present(""),
            ..header("x")
        };
        assert_eq!(
            error(vec![no_key], false),
            (
                "request_rules[0].on_header_present.key".into(),
                "value length must be at least 1 characters".into()
            )
        );
        assert_eq!(
            error(vec![], true).1,
            "header_to_metadata_filter: Per filter configs must at least specify either request or response rules"
        );
    }

    #[test]
    fn an_empty_filter_config_and_defaults_compile() {
        let io = FakeIo::new();
        let ctx = Context::new(&io);
        let c = compile(&ctx, &Config::default(), false, &mut Warnings::new()).unwrap();
        assert!(c.request_rules.is_empty() && c.response_rules.is_empty());
        let rule = config::Rule {
            header: "X-Up".into(),
            on_header_present: present("k"),
            ..Default::default()
        };
        let c = Config {
            response_rules: vec![rule],
            ..Default::default()
        };
        let c = compile(&ctx, &c, true, &mut Warnings::new()).unwrap();
        let r = &c.response_rules[0];
        assert!(matches!(&r.source, Source::Header(Some(h)) if h == "x-up"));
        let p = r.on_present.as_ref().unwrap();
        assert_eq!(
            (p.namespace.as_str(), p.kind, p.base64),
            (DEFAULT_NAMESPACE, ValueKind::String, false)
        );
    }
}
