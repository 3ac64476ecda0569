//! A listener filter's `filter_disabled` (`ListenerFilterChainMatchPredicate`): the
//! connections it does not run on, by destination port (Istio turns its inspectors off on the
//! ports whose protocol it knows, server-first ones among them).

use proto::pb::envoy::config::listener::v3::ListenerFilterChainMatchPredicate as Predicate;
use proto::pb::envoy::config::listener::v3::listener_filter_chain_match_predicate::Rule;

use super::ConfigError;

/// When a listener filter is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterDisabled {
    /// `any_match`: always.
    Any,
    /// `or_match`: when one of them matches.
    Or(Vec<FilterDisabled>),
    /// `and_match`: when all of them match.
    And(Vec<FilterDisabled>),
    /// `not_match`.
    Not(Box<FilterDisabled>),
    /// `destination_port_range`: a destination port in `start..end`.
    DestinationPorts {
        /// The first port.
        start: i32,
        /// One past the last.
        end: i32,
    },
}

impl FilterDisabled {
    /// Compiles a predicate; errors name the field under `path`.
    pub fn compile(p: &Predicate, path: &str) -> Result<FilterDisabled, ConfigError> {
        let set = |rules: &[Predicate], name: &str| {
            if rules.len() < 2 {
                return Err(ConfigError::new(
                    format!("{path}.{name}.rules"),
                    "value must contain at least 2 item(s)",
                ));
            }
            rules
                .iter()
                .enumerate()
                .map(|(i, r)| Self::compile(r, &format!("{path}.{name}.rules[{i}]")))
                .collect()
        };
        Ok(match &p.rule {
            Some(Rule::AnyMatch(true)) => FilterDisabled::Any,
            Some(Rule::AnyMatch(false)) => {
                return Err(ConfigError::new(
                    format!("{path}.any_match"),
                    "value must equal true",
                ));
            }
            Some(Rule::OrMatch(s)) => FilterDisabled::Or(set(&s.rules, "or_match")?),
            Some(Rule::AndMatch(s)) => FilterDisabled::And(set(&s.rules, "and_match")?),
            Some(Rule::NotMatch(n)) => {
                FilterDisabled::Not(Box::new(Self::compile(n, &format!("{path}.not_match"))?))
            }
            Some(Rule::DestinationPortRange(r)) => FilterDisabled::DestinationPorts {
                start: r.start,
                end: r.end,
            },
            None => return Err(ConfigError::new(path, "rule is required")),
        })
    }

    /// Whether the filter is skipped for a connection to `port`.
    pub fn matches(&self, port: u16) -> bool {
        match self {
            FilterDisabled::Any => true,
            FilterDisabled::Or(v) => v.iter().any(|p| p.matches(port)),
            FilterDisabled::And(v) => v.iter().all(|p| p.matches(port)),
            FilterDisabled::Not(p) => !p.matches(port),
            FilterDisabled::DestinationPorts { start, end } => {
                (*start..*end).contains(&i32::from(port))
            }
        }
    }
}

/// Whether a filter with `disabled` runs on a connection to `port`.
pub fn runs(disabled: Option<&FilterDisabled>, port: u16) -> bool {
    !disabled.is_some_and(|d| d.matches(port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile(yaml: &str) -> Result<FilterDisabled, ConfigError> {
        let value = proto::Codec::parse_text(yaml, proto::Format::Yaml).unwrap();
        let p: Predicate = proto::Codec::new().decode(value, false).unwrap().message;
        FilterDisabled::compile(&p, "filter_disabled")
    }

    #[test]
    fn istios_inspector_predicates() {
        let d = compile(
            "or_match: {rules: [{destination_port_range: {start: 80, end: 81}}, \
             {destination_port_range: {start: 15006, end: 15007}}]}",
        )
        .unwrap();
        assert!(d.matches(80) && d.matches(15006));
        assert!(!d.matches(81) && !d.matches(8080));
        let not = compile("not_match: {destination_port_range: {start: 80, end: 81}}").unwrap();
        assert!(!not.matches(80) && not.matches(443));
        assert!(compile("any_match: true").unwrap().matches(1));
        assert!(runs(None, 80) && !runs(Some(&d), 80));
    }

    #[test]
    fn refuses_what_envoy_refuses() {
        let err = compile("or_match: {rules: [{any_match: true}]}").unwrap_err();
        assert_eq!(err.path, "filter_disabled.or_match.rules");
        assert!(compile("{}").is_err());
    }
}
