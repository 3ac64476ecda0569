//! `envoy.type.matcher.v3.MetadataMatcher` / `ValueMatcher` ->
//! [`crate::route::metadata::matcher`]'s compiled forms, with Envoy's proto validation.

use proto::pb::envoy::r#type::matcher::v3 as m;

use super::route::matchers::string_matcher;
use super::{ConfigError, Context};
use crate::route::metadata::matcher::{MetadataMatcher, ValueMatcher};

/// Compiles a `MetadataMatcher`.
pub fn metadata_matcher(
    ctx: &Context<'_>,
    md: &m::MetadataMatcher,
) -> Result<MetadataMatcher, ConfigError> {
    if md.filter.is_empty() {
        return Err(ConfigError::new(
            "filter",
            "value length must be at least 1 characters",
        ));
    }
    if md.path.is_empty() {
        return Err(ConfigError::new(
            "path",
            "value must contain at least 1 item(s)",
        ));
    }
    let path = md
        .path
        .iter()
        .enumerate()
        .map(|(i, p)| match &p.segment {
            Some(m::metadata_matcher::path_segment::Segment::Key(k)) if !k.is_empty() => {
                Ok(k.clone())
            }
            Some(_) => Err(ConfigError::new(
                format!("path[{i}].key"),
                "value length must be at least 1 characters",
            )),
            None => Err(ConfigError::new(
                format!("path[{i}].segment"),
                "value is required",
            )),
        })
        .collect::<Result<_, _>>()?;
    let value = md
        .value
        .as_ref()
        .ok_or_else(|| ConfigError::new("value", "value is required"))?;
    Ok(MetadataMatcher {
        namespace: md.filter.clone(),
        path,
        value: value_matcher(ctx, value).map_err(|e| e.within("value"))?,
        invert: md.invert,
    })
}

/// Compiles a `ValueMatcher`.
pub fn value_matcher(ctx: &Context<'_>, v: &m::ValueMatcher) -> Result<ValueMatcher, ConfigError> {
    use m::value_matcher::MatchPattern as P;
    Ok(match &v.match_pattern {
        None => return Err(ConfigError::new("match_pattern", "value is required")),
        Some(P::NullMatch(_)) => ValueMatcher::Null,
        Some(P::DoubleMatch(d)) => match &d.match_pattern {
            Some(m::double_matcher::MatchPattern::Range(r)) => ValueMatcher::Range(r.start, r.end),
            Some(m::double_matcher::MatchPattern::Exact(x)) => ValueMatcher::Exact(*x),
            None => {
                return Err(ConfigError::new(
                    "double_match.match_pattern",
                    "value is required",
                ));
            }
        },
        Some(P::StringMatch(s)) => {
            ValueMatcher::String(string_matcher(ctx, s).map_err(|e| e.within("string_match"))?)
        }
        Some(P::BoolMatch(b)) => ValueMatcher::Bool(*b),
        Some(P::PresentMatch(p)) => ValueMatcher::Present(*p),
        Some(P::ListMatch(l)) => match &l.match_pattern {
            Some(m::list_matcher::MatchPattern::OneOf(one)) => ValueMatcher::ListOneOf(Box::new(
                value_matcher(ctx, one).map_err(|e| e.within("list_match.one_of"))?,
            )),
            None => {
                return Err(ConfigError::new(
                    "list_match.match_pattern",
                    "value is required",
                ));
            }
        },
        Some(P::OrMatch(or)) => {
            if or.value_matchers.len() < 2 {
                return Err(ConfigError::new(
                    "or_match.value_matchers",
                    "value must contain at least 2 item(s)",
                ));
            }
            ValueMatcher::Or(
                or.value_matchers
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        value_matcher(ctx, v)
                            .map_err(|e| e.within(&format!("or_match.value_matchers[{i}]")))
                    })
                    .collect::<Result<_, _>>()?,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FakeIo;

    #[test]
    fn matchers_need_a_namespace_a_path_and_a_value() {
        let io = FakeIo::new();
        let ctx = Context::new(&io);
        let key = |k: &str| m::metadata_matcher::PathSegment {
            segment: Some(m::metadata_matcher::path_segment::Segment::Key(k.into())),
        };
        let mut md = m::MetadataMatcher::default();
        assert_eq!(metadata_matcher(&ctx, &md).unwrap_err().path, "filter");
        md.filter = "ns".into();
        assert_eq!(metadata_matcher(&ctx, &md).unwrap_err().path, "path");
        md.path = vec![key("")];
        assert_eq!(metadata_matcher(&ctx, &md).unwrap_err().path, "path[0].key");
        md.path = vec![key("a"), key("b")];
        assert_eq!(metadata_matcher(&ctx, &md).unwrap_err().path, "value");
        md.value = Some(m::ValueMatcher {
            match_pattern: Some(m::value_matcher::MatchPattern::OrMatch(m::OrMatcher {
                value_matchers: vec![m::ValueMatcher::default()],
            })),
        });
        assert_eq!(
            metadata_matcher(&ctx, &md).unwrap_err().path,
            "value.or_match.value_matchers"
        );
        md.value = Some(m::ValueMatcher {
            match_pattern: Some(m::value_matcher::MatchPattern::PresentMatch(true)),
        });
        let c = metadata_matcher(&ctx, &md).unwrap();
        assert_eq!(c.path, ["a", "b"]);
    }
}
