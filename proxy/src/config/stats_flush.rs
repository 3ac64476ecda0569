//! The bootstrap's histogram settings: when stats are flushed (`stats_flush_interval`,
//! `stats_flush_on_admin`), which turns each histogram's recent values into its interval
//! view, and the bucket bounds per histogram (`stats_config.histogram_bucket_settings`).

use std::time::Duration;

use proto::pb::envoy::config::bootstrap::v3::Bootstrap;
use proto::pb::envoy::config::bootstrap::v3::bootstrap::StatsFlush as FlushProto;

use super::ConfigError;
use super::context::Context;
use crate::route::matcher::StringMatcher;

/// When histograms are merged (Envoy's stats flush).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsFlush {
    /// Every interval (`stats_flush_interval`, default 5 s).
    Interval(Duration),
    /// On each admin stats request (`stats_flush_on_admin`), never by a timer.
    OnAdmin,
}

/// `stats_flush_interval` / `stats_flush_on_admin`, checked as Envoy checks them.
pub fn stats_flush(b: &Bootstrap) -> Result<StatsFlush, ConfigError> {
    if let Some(FlushProto::StatsFlushOnAdmin(true)) = b.stats_flush {
        if b.stats_flush_interval.is_some() {
            return Err(ConfigError::new(
                "stats_flush_on_admin",
                "Only one of stats_flush_interval or stats_flush_on_admin can be set",
            ));
        }
        return Ok(StatsFlush::OnAdmin);
    }
    let Some(d) = &b.stats_flush_interval else {
        return Ok(StatsFlush::Interval(Duration::from_secs(5)));
    };
    let interval = u64::try_from(d.seconds)
        .ok()
        .zip(u32::try_from(d.nanos).ok())
        .map(|(s, n)| Duration::new(s, n))
        .filter(|i| (Duration::from_millis(1)..=Duration::from_secs(300)).contains(i))
        .ok_or_else(|| {
            ConfigError::new(
                "stats_flush_interval",
                "value must be inside range [1ms, 300s]",
            )
        })?;
    Ok(StatsFlush::Interval(interval))
}

/// `stats_config.histogram_bucket_settings`: per rule its matcher and bucket bounds (each
/// positive, no two equal; the order given does not matter).
pub fn histogram_buckets(
    ctx: &Context<'_>,
    b: &Bootstrap,
) -> Result<Vec<(StringMatcher, Vec<f64>)>, ConfigError> {
    let Some(sc) = &b.stats_config else {
        return Ok(Vec::new());
    };
    let mut rules = Vec::new();
    for (i, s) in sc.histogram_bucket_settings.iter().enumerate() {
        let path = format!("stats_config.histogram_bucket_settings[{i}]");
        let m = s
            .r#match
            .as_ref()
            .ok_or_else(|| ConfigError::new(format!("{path}.match"), "value is required"))?;
        let matcher = super::route::matchers::string_matcher(ctx, m)
            .map_err(|e| e.within(&format!("{path}.match")))?;
        if s.buckets.is_empty() {
            return Err(ConfigError::new(
                format!("{path}.buckets"),
                "value must contain at least 1 item(s)",
            ));
        }
        for (j, v) in s.buckets.iter().enumerate() {
            if v.is_nan() || *v <= 0.0 {
                return Err(ConfigError::new(
                    format!("{path}.buckets[{j}]"),
                    "value must be greater than 0",
                ));
            }
            if s.buckets[..j].contains(v) {
                return Err(ConfigError::new(
                    format!("{path}.buckets[{j}]"),
                    "repeated value must contain unique items",
                ));
            }
        }
        rules.push((matcher, s.buckets.clone()));
    }
    Ok(rules)
}

/// `stats_config.stats_matcher` (`None`: every stat).
pub fn stats_matcher(
    ctx: &Context<'_>,
    b: &Bootstrap,
) -> Result<Option<crate::stats::matcher::StatsMatcher>, ConfigError> {
    use crate::stats::matcher::StatsMatcher;
    use proto::pb::envoy::config::metrics::v3::stats_matcher::StatsMatcher as M;
    let path = "stats_config.stats_matcher";
    let Some(m) = b
        .stats_config
        .as_ref()
        .and_then(|c| c.stats_matcher.as_ref())
    else {
        return Ok(None);
    };
    let patterns = |list: &proto::pb::envoy::r#type::matcher::v3::ListStringMatcher,
                    field: &str| {
        list.patterns
            .iter()
            .enumerate()
            .map(|(i, p)| {
                super::route::matchers::string_matcher(ctx, p)
                    .map_err(|e| e.within(&format!("{path}.{field}.patterns[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()
    };
    match &m.stats_matcher {
        None => Err(ConfigError::new(
            path,
            "one of reject_all, exclusion_list, inclusion_list is required",
        )),
        Some(M::RejectAll(true)) => Ok(Some(StatsMatcher::RejectAll)),
        Some(M::RejectAll(false)) => Ok(None),
        Some(M::ExclusionList(l)) => {
            Ok(Some(StatsMatcher::Exclude(patterns(l, "exclusion_list")?)))
        }
        Some(M::InclusionList(l)) => {
            Ok(Some(StatsMatcher::Include(patterns(l, "inclusion_list")?)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::context::{Context, FakeIo};
    use proto::pb::envoy::config::metrics::v3::{HistogramBucketSettings, StatsConfig};
    use proto::pb::envoy::r#type::matcher::v3::{StringMatcher as Matcher, string_matcher};
    use proto::pb::google::protobuf::Duration as PbDuration;

    fn every(seconds: i64, nanos: i32) -> Bootstrap {
        Bootstrap {
            stats_flush_interval: Some(PbDuration { seconds, nanos }),
            ..Default::default()
        }
    }

    #[test]
    fn flush_interval_defaults_to_five_seconds_and_is_range_checked() {
        let five = StatsFlush::Interval(Duration::from_secs(5));
        assert_eq!(stats_flush(&Bootstrap::default()), Ok(five));
        assert_eq!(
            stats_flush(&every(0, 250_000_000)),
            Ok(StatsFlush::Interval(Duration::from_millis(250)))
        );
        let on_admin = Bootstrap {
            stats_flush: Some(FlushProto::StatsFlushOnAdmin(true)),
            ..Default::default()
        };
        assert_eq!(stats_flush(&on_admin), Ok(StatsFlush::OnAdmin));
        assert_eq!(
            stats_flush(&every(301, 0)).unwrap_err().path,
            "stats_flush_interval"
        );
        let both = Bootstrap {
            stats_flush_interval: Some(PbDuration {
                seconds: 1,
                nanos: 0,
            }),
            ..on_admin
        };
        assert_eq!(stats_flush(&both).unwrap_err().path, "stats_flush_on_admin");
    }

    fn with_rule(pattern: Option<string_matcher::MatchPattern>, buckets: &[f64]) -> Bootstrap {
        Bootstrap {
            stats_config: Some(StatsConfig {
                histogram_bucket_settings: vec![HistogramBucketSettings {
                    r#match: pattern.map(|p| Matcher {
                        match_pattern: Some(p),
                        ignore_case: false,
                    }),
                    buckets: buckets.to_vec(),
                    bins: None,
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn bucket_settings_compile_with_errors_naming_the_field() {
        use string_matcher::MatchPattern::{Exact, Prefix};
        let io = FakeIo::new();
        let ctx = Context::new(&io);
        let rules = histogram_buckets(
            &ctx,
            &with_rule(Some(Prefix("cluster.".into())), &[10.0, 1.0]),
        )
        .expect("compiles");
        assert_eq!(rules.len(), 1);
        assert!(rules[0].0.matches("cluster.a.upstream_rq_time"));
        assert_eq!(rules[0].1, [10.0, 1.0]);
        let path = |b: Bootstrap| histogram_buckets(&ctx, &b).unwrap_err().path;
        let prefix = "stats_config.histogram_bucket_settings[0]";
        assert_eq!(
            path(with_rule(Some(Exact("a".into())), &[1.0, 0.0])),
            format!("{prefix}.buckets[1]")
        );
        assert_eq!(
            path(with_rule(Some(Exact("a".into())), &[2.0, 2.0])),
            format!("{prefix}.buckets[1]")
        );
        assert_eq!(
            path(with_rule(Some(Exact("a".into())), &[])),
            format!("{prefix}.buckets")
        );
        assert_eq!(path(with_rule(None, &[2.0])), format!("{prefix}.match"));
    }
}
