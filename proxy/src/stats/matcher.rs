//! The bootstrap's `stats_config.stats_matcher`: which stats exist for the admin API. Envoy
//! never instantiates the others; revoy keeps them (its stats live in per-prefix blocks) but
//! leaves them out of `/stats` in every format, so what operators and scrapers see is Envoy's.

use crate::route::matcher::StringMatcher;

/// A compiled `StatsMatcher`.
#[derive(Debug, Clone)]
pub enum StatsMatcher {
    /// `reject_all: true`: no stat.
    RejectAll,
    /// `exclusion_list`: every stat but those matching one pattern.
    Exclude(Vec<StringMatcher>),
    /// `inclusion_list`: only the stats matching one pattern.
    Include(Vec<StringMatcher>),
}

impl StatsMatcher {
    /// Whether the stat `name` (its full name, tags included) is kept.
    pub fn keeps(&self, name: &str) -> bool {
        match self {
            StatsMatcher::RejectAll => false,
            StatsMatcher::Exclude(patterns) => !patterns.iter().any(|p| p.matches(name)),
            StatsMatcher::Include(patterns) => patterns.iter().any(|p| p.matches(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(p: &str) -> StringMatcher {
        StringMatcher::Prefix(p.into(), false)
    }

    #[test]
    fn inclusion_exclusion_and_reject_all() {
        let include = StatsMatcher::Include(vec![prefix("server."), prefix("istio")]);
        assert!(include.keeps("server.live"));
        assert!(include.keeps("istiocustom.istio_requests_total.reporter.source"));
        assert!(!include.keeps("http.inbound.downstream_rq_total"));
        let exclude = StatsMatcher::Exclude(vec![prefix("cluster.")]);
        assert!(!exclude.keeps("cluster.a.upstream_rq_total"));
        assert!(exclude.keeps("cluster_manager.active_clusters"));
        assert!(!StatsMatcher::RejectAll.keeps("server.live"));
    }
}
