//! `envoy.filters.http.csrf` (`CsrfPolicy`, the filter's and a route's) -> [`CsrfConfig`].

use proto::pb::envoy::extensions::filters::http::csrf::v3::CsrfPolicy;

use crate::config::route::matchers::{runtime_fraction, string_matcher};
use crate::config::{ConfigError, Context};
use crate::route::matcher::{RuntimeFraction, StringMatcher};

/// One CSRF policy (the filter's, or a route's replacing it).
#[derive(Debug, Clone)]
pub struct CsrfConfig {
    /// `filter_enabled`: on what share of requests invalid ones are refused.
    pub filter_enabled: RuntimeFraction,
    /// `shadow_enabled`: on what share of requests they are only counted (`None`: none).
    pub shadow_enabled: Option<RuntimeFraction>,
    /// `additional_origins`: source origins accepted besides the destination's.
    pub additional_origins: Vec<StringMatcher>,
}

/// Compiles a `CsrfPolicy`; `filter_enabled` and its `default_value` are required, as in
/// Envoy's proto validation.
pub fn compile(ctx: &Context<'_>, p: &CsrfPolicy) -> Result<CsrfConfig, ConfigError> {
    let filter_enabled = p
        .filter_enabled
        .as_ref()
        .ok_or_else(|| ConfigError::new("filter_enabled", "value is required"))?;
    for (field, f) in [
        ("filter_enabled", Some(filter_enabled)),
        ("shadow_enabled", p.shadow_enabled.as_ref()),
    ] {
        if f.is_some_and(|f| f.default_value.is_none()) {
            return Err(ConfigError::new(
                format!("{field}.default_value"),
                "value is required",
            ));
        }
    }
    Ok(CsrfConfig {
        filter_enabled: runtime_fraction(filter_enabled),
        shadow_enabled: p.shadow_enabled.as_ref().map(runtime_fraction),
        additional_origins: p
            .additional_origins
            .iter()
            .enumerate()
            .map(|(i, m)| {
                string_matcher(ctx, m).map_err(|e| e.within(&format!("additional_origins[{i}]")))
            })
            .collect::<Result<_, _>>()?,
    })
}

#[cfg(test)]
mod tests {
    use proto::pb::envoy::config::core::v3::RuntimeFractionalPercent;
    use proto::pb::envoy::r#type::v3::FractionalPercent;

    use super::*;
    use crate::config::FakeIo;

    #[test]
    fn filter_enabled_and_its_default_are_required() {
        let io = FakeIo::new();
        let ctx = Context::new(&io);
        let e = compile(&ctx, &CsrfPolicy::default()).unwrap_err();
        assert_eq!(e.path, "filter_enabled");
        let policy = CsrfPolicy {
            filter_enabled: Some(RuntimeFractionalPercent::default()),
            ..Default::default()
        };
        let e = compile(&ctx, &policy).unwrap_err();
        assert_eq!(e.path, "filter_enabled.default_value");
        let policy = CsrfPolicy {
            filter_enabled: Some(RuntimeFractionalPercent {
                default_value: Some(FractionalPercent {
                    numerator: 25,
                    denominator: 0,
                }),
                runtime_key: "csrf.on".into(),
            }),
            ..Default::default()
        };
        let c = compile(&ctx, &policy).unwrap();
        assert_eq!(c.filter_enabled.default.numerator, 25);
        assert!(c.shadow_enabled.is_none());
    }
}
