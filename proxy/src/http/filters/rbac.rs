//! `envoy.filters.http.rbac`: each request is checked against the shadow rules, then the
//! enforced ones (a route's `RBACPerRoute` replacing both), counted under
//! `http.<stat_prefix>.rbac.`; a denied request gets Envoy's 403 `RBAC: access denied` with the
//! response details `rbac_access_denied_matched_policy[<policy or none>]`. Rules that read
//! dynamic metadata or filter state behind a filter revoy skips (which might set them in
//! Envoy) fail closed instead: 403 for every request, counted in `downstream_rq_fail_closed`.

use std::sync::Arc;

use http::{Response, StatusCode};

use super::FilterRequest;
use crate::body::Body;
use crate::config::rbac::{DecisionKeys, HttpRbacConfig};
use crate::http::local_reply::local_reply;
use crate::rbac::{Facts, Stats, Verdict};
use crate::route::metadata::string_value;

/// The dynamic metadata namespace of the filter's decisions.
const NAMESPACE: &str = "envoy.filters.http.rbac";
use crate::stats::{Counter, Store};

/// The RBAC filter of one connection manager.
#[derive(Debug)]
pub(super) struct Rbac {
    config: Arc<HttpRbacConfig>,
    stats: Stats,
    /// When a filter revoy skips runs before this one: why rules reading dynamic metadata
    /// or filter state deny every request, and `downstream_rq_fail_closed`.
    unknown_metadata: Option<(String, Counter)>,
}

impl Rbac {
    /// The filter with `config`, its stats under `http.<stat_prefix>.rbac.` (the per-route
    /// rules count there too, as in Envoy).
    pub(super) fn new(
        config: &Arc<HttpRbacConfig>,
        after_skipped: Option<&str>,
        store: &Store,
        stat_prefix: &str,
    ) -> Rbac {
        let base = format!("http.{stat_prefix}.rbac.");
        Rbac {
            unknown_metadata: after_skipped.map(|s| {
                (
                    format!(
                        "access denied: envoy.filters.http.rbac: {}",
                        crate::config::rbac::unknown_metadata(s)
                    ),
                    store.counter(&format!("http.{stat_prefix}.downstream_rq_fail_closed")),
                )
            }),
            stats: Stats::new(
                store,
                &base,
                &config.rules_stat_prefix,
                &config.shadow_rules_stat_prefix,
            ),
            config: config.clone(),
        }
    }

    /// Checks `req` against the route's rules (`route_rules`), else the filter's; `Some` is
    /// the 403 of a denied request.
    pub(super) fn decode(
        &self,
        req: &mut FilterRequest<'_>,
        route_rules: Option<&HttpRbacConfig>,
    ) -> Option<Response<Body>> {
        let config = route_rules.unwrap_or(&self.config);
        if let Some((why, counter)) = self
            .unknown_metadata
            .as_ref()
            .filter(|_| config.reads_metadata)
        {
            counter.inc();
            tracing::debug!(reason = %why, "request denied: fail closed");
            return Some(local_reply(StatusCode::FORBIDDEN, why));
        }
        let conn = req.conn;
        let tls = conn.down.tls.as_deref();
        // `:scheme` is the connection's, as Envoy's codec sets it (not `x-forwarded-proto`).
        let mut request = req.route_request();
        request.https = tls.is_some();
        let facts = Facts {
            request: Some(&request),
            local: conn.local,
            source: conn.down.peer.ip(),
            direct_remote: conn.down.peer.ip(),
            remote: req.remote,
            tls,
            server_name: tls.and_then(|t| t.server_name()).map_or("", |s| &**s),
            metadata: Some(&*req.metadata),
        };
        let verdict = config.engines.decide(&facts);
        self.stats.record(&verdict);
        write_metadata(req, &config.metadata_keys, &verdict);
        let denied = verdict.enforced.filter(|d| !d.allowed)?;
        let policy = denied.policy.as_deref().unwrap_or("none");
        tracing::debug!(policy, "rbac: request denied");
        if let Some(r) = req.record.as_deref_mut() {
            r.details = Some(response_detail(policy));
        }
        Some(local_reply(StatusCode::FORBIDDEN, "RBAC: access denied"))
    }
}

/// Writes each engine's decision into the request's dynamic metadata, as Envoy does (the
/// policy only when one matched).
fn write_metadata(req: &mut FilterRequest<'_>, keys: &DecisionKeys, verdict: &Verdict) {
    let decisions = [
        (&verdict.shadow, &keys.shadow_policy, &keys.shadow_result),
        (
            &verdict.enforced,
            &keys.enforced_policy,
            &keys.enforced_result,
        ),
    ];
    for (decision, policy_key, result_key) in decisions {
        let Some(d) = decision else { continue };
        if let Some(policy) = &d.policy {
            req.metadata
                .insert(NAMESPACE, policy_key, string_value(&**policy));
        }
        let result = if d.allowed { "allowed" } else { "denied" };
        req.metadata
            .insert(NAMESPACE, result_key, string_value(result));
    }
}

/// Envoy's response details for a denial by `policy`, whitespace in its name made `_`.
fn response_detail(policy: &str) -> String {
    let sanitized: String = policy
        .chars()
        .map(|c| {
            if c.is_ascii_whitespace() || c == '\x0b' {
                '_'
            } else {
                c
            }
        })
        .collect();
    format!("rbac_access_denied_matched_policy[{sanitized}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_details_name_the_policy_without_whitespace() {
        assert_eq!(
            response_detail("ns[foo]-policy[a b]\trule"),
            "rbac_access_denied_matched_policy[ns[foo]-policy[a_b]_rule]"
        );
        assert_eq!(
            response_detail("none"),
            "rbac_access_denied_matched_policy[none]"
        );
    }
}
