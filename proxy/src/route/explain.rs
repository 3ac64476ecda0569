//! What `/routes` shows: every compiled table, and for one request the decision and why the
//! routes before the winner did not match.

use serde::Serialize;
use serde_json::{Value, json};

use super::{Action, ClusterSpecifier, DomainKind, Route, RouteRequest, RouteTable};

/// All tables as JSON: virtual hosts, domains, routes in match order, actions and weights.
pub fn tables_json(tables: &[&RouteTable]) -> Value {
    Value::Array(tables.iter().map(|t| table_json(t)).collect())
}

fn table_json(t: &RouteTable) -> Value {
    json!({
        "name": t.name(),
        "virtual_hosts": t.virtual_hosts().iter().map(|vh| json!({
            "name": vh.name,
            "domains": vh.domains.iter().map(|d| &**d).collect::<Vec<&str>>(),
            "require_tls": vh.require_tls,
            "routes": vh.routes.iter().enumerate().map(|(i, r)| route_json(i, r)).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn route_json(index: usize, r: &Route) -> Value {
    let m = &r.matcher;
    let mut conditions = vec![m.path.describe()];
    conditions.extend(m.headers.iter().map(|h| h.describe()));
    let more = m.more.as_deref();
    conditions.extend(
        more.iter()
            .flat_map(|c| &c.query_parameters)
            .map(|q| format!("query parameter {:?}", q.name)),
    );
    if m.grpc {
        conditions.push("grpc".to_owned());
    }
    if let Some(f) = more.and_then(|c| c.runtime_fraction.as_ref()) {
        conditions.push(format!(
            "runtime_fraction {:?} {}/{}",
            f.key, f.default.numerator, f.default.denominator
        ));
    }
    json!({
        "index": index,
        "name": r.name,
        "match": conditions,
        "case_sensitive": m.case_sensitive,
        "action": action_json(&r.action),
    })
}

fn action_json(a: &Action) -> Value {
    match a {
        Action::Forward(f) => {
            let cluster = match &f.cluster {
                ClusterSpecifier::Name(n) => json!({ "cluster": n }),
                ClusterSpecifier::Header(h) => json!({ "cluster_header": h }),
                ClusterSpecifier::Weighted(w) => json!({
                    "weighted_clusters": w.clusters.iter().map(|c| json!({
                        "name": c.name,
                        "cluster_header": c.cluster_header,
                        "weight": c.weight,
                    })).collect::<Vec<_>>(),
                    "total_weight": w.total_weight,
                }),
            };
            json!({
                "type": "route",
                "target": cluster,
                "timeout_ms": f.timeout.map(|t| t.as_millis() as u64),
                "prefix_rewrite": match f.path_rewrite.as_deref() { Some(super::PathRewrite::Prefix(p)) => Some(p.as_str()), _ => None },
                "regex_rewrite": match f.path_rewrite.as_deref() { Some(super::PathRewrite::Regex(r, s)) => Some(json!({"pattern": r.as_str(), "substitution": s})), _ => None },
                "path_template_rewrite": match f.path_rewrite.as_deref() { Some(super::PathRewrite::Template(t)) => Some(t.template.as_str()), _ => None },
                "retry_on": f.retry_policy.as_ref().map(|r| r.retry_on.join(",")),
            })
        }
        Action::Redirect(r) => json!({
            "type": "redirect",
            "status": r.status.as_u16(),
            "scheme": r.scheme,
            "host": r.host,
            "port": r.port,
            "strip_query": r.strip_query,
        }),
        Action::DirectResponse(d) => json!({
            "type": "direct_response",
            "status": d.status.as_u16(),
            "body_bytes": d.body.len(),
        }),
        Action::NonForwarding => json!({ "type": "non_forwarding" }),
    }
}

/// A route that was tried before the winner and did not match.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Skipped {
    /// Index in the virtual host.
    pub index: usize,
    /// Route name.
    pub name: String,
    /// The first condition that failed.
    pub reason: String,
}

/// The routing decision for one request, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Explanation {
    /// Route configuration name.
    pub route_config: String,
    /// Virtual host chosen, if any.
    pub virtual_host: Option<String>,
    /// Domain pattern that matched.
    pub domain: Option<String>,
    /// Kind of domain pattern.
    pub domain_kind: Option<DomainKind>,
    /// Index of the chosen route (`None` for a `require_tls` redirect or no match).
    pub route_index: Option<usize>,
    /// Name of the chosen route.
    pub route_name: Option<String>,
    /// `route`, `redirect`, `direct_response`, `non_forwarding`, `tls_redirect`; `None` = 404.
    pub action: Option<String>,
    /// Cluster picked for the request.
    pub cluster: Option<String>,
    /// Path sent upstream when rewritten.
    pub rewritten_path: Option<String>,
    /// Host sent upstream when rewritten.
    pub rewritten_host: Option<String>,
    /// Redirect location.
    pub location: Option<String>,
    /// Status of a redirect or direct response.
    pub status: Option<u16>,
    /// Routes tried before the winner (or all routes, when none matched).
    pub skipped: Vec<Skipped>,
    /// What Envoy's access log carries for a request the decision answers without an
    /// upstream (no route, a missing cluster, a cluster without hosts, a direct response or
    /// redirect); `None` when the request goes upstream.
    pub access_log: Option<LoggedOutcome>,
}

/// A request's status, response flag and `%RESPONSE_CODE_DETAILS%` as Envoy logs them.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LoggedOutcome {
    /// `%RESPONSE_CODE%`.
    pub response_code: u16,
    /// `%RESPONSE_FLAGS%` (`None`: `-`).
    pub response_flags: Option<&'static str>,
    /// `%RESPONSE_FLAGS_LONG%` (`None`: `-`).
    pub response_flags_long: Option<&'static str>,
    /// `%RESPONSE_CODE_DETAILS%`.
    pub response_code_details: &'static str,
}

impl LoggedOutcome {
    /// `NR`, `route_not_found`, 404.
    const NO_ROUTE: LoggedOutcome = LoggedOutcome {
        response_code: 404,
        response_flags: Some("NR"),
        response_flags_long: Some("NoRouteFound"),
        response_code_details: "route_not_found",
    };

    /// `NC`, `cluster_not_found`, with the route's `cluster_not_found_response_code`.
    fn no_cluster(code: u16) -> LoggedOutcome {
        LoggedOutcome {
            response_code: code,
            response_flags: Some("NC"),
            response_flags_long: Some("NoClusterFound"),
            response_code_details: "cluster_not_found",
        }
    }

    /// A direct response or redirect with `code`: no flag, `direct_response`.
    fn direct(code: u16) -> LoggedOutcome {
        LoggedOutcome {
            response_code: code,
            response_flags: None,
            response_flags_long: None,
            response_code_details: "direct_response",
        }
    }
}

/// What the cluster manager knows of a cluster a decision names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    /// No cluster of that name.
    Missing,
    /// The cluster has no hosts to pick (Envoy: `UH`, `no_healthy_upstream`).
    NoHosts,
    /// The request would be sent to one of its hosts.
    Ready,
}

/// Explains how `table` routes `req`, asking `cluster` what the cluster manager knows of the
/// cluster picked.
pub fn explain(
    table: &RouteTable,
    req: &RouteRequest<'_>,
    cluster: impl Fn(&str) -> ClusterState,
) -> Explanation {
    let mut e = Explanation {
        route_config: table.name().to_owned(),
        virtual_host: None,
        domain: None,
        domain_kind: None,
        route_index: None,
        route_name: None,
        action: None,
        cluster: None,
        rewritten_path: None,
        rewritten_host: None,
        location: None,
        status: None,
        skipped: Vec::new(),
        access_log: Some(LoggedOutcome::NO_ROUTE),
    };
    let Some((vh, domain, kind)) = table.find_virtual_host(req) else {
        return e;
    };
    e.virtual_host = Some(vh.name.clone());
    e.domain = Some(domain.to_owned());
    e.domain_kind = Some(kind);
    let selected = table.select(req);
    let path = table.match_path(req.path);
    let tried = selected
        .and_then(|s| s.route_index)
        .unwrap_or(if selected.is_some() {
            0
        } else {
            vh.routes.len()
        });
    for (index, r) in vh.routes.iter().enumerate().take(tried) {
        let reason = r
            .mismatch(req, &path)
            .map_or_else(|| "matched".to_owned(), |m| m.0);
        e.skipped.push(Skipped {
            index,
            name: r.name.clone(),
            reason,
        });
    }
    let Some(sel) = selected else {
        return e;
    };
    e.route_index = sel.route_index;
    e.route_name = Some(sel.route.name.clone());
    e.action = Some(
        match (&sel.route.action, sel.route_index) {
            (Action::Redirect(_), None) => "tls_redirect",
            (Action::Forward(_), _) => "route",
            (Action::Redirect(_), _) => "redirect",
            (Action::DirectResponse(_), _) => "direct_response",
            (Action::NonForwarding, _) => "non_forwarding",
        }
        .to_owned(),
    );
    match &sel.route.action {
        Action::Forward(f) => {
            let picked = f.pick_cluster(req);
            e.cluster = picked.as_ref().map(|p| p.name.clone().into_owned());
            e.rewritten_path = sel.rewritten_path(req);
            e.rewritten_host = sel
                .rewritten_host(req, picked.as_ref().and_then(|p| p.weighted))
                .map(|h| h.into_owned());
            let not_found = LoggedOutcome::no_cluster(f.cluster_not_found_response_code.as_u16());
            e.access_log = match e.cluster.as_deref().map(cluster) {
                None | Some(ClusterState::Missing) => Some(not_found),
                Some(ClusterState::NoHosts) => Some(LoggedOutcome {
                    response_code: 503,
                    response_flags: Some("UH"),
                    response_flags_long: Some("NoHealthyUpstream"),
                    response_code_details: "no_healthy_upstream",
                }),
                Some(ClusterState::Ready) => None,
            };
        }
        Action::Redirect(r) => {
            e.location = sel.redirect_location(req);
            e.status = Some(r.status.as_u16());
            e.access_log = Some(LoggedOutcome::direct(r.status.as_u16()));
        }
        Action::DirectResponse(d) => {
            e.status = Some(d.status.as_u16());
            e.access_log = Some(LoggedOutcome::direct(d.status.as_u16()));
        }
        Action::NonForwarding => {}
    }
    e
}

impl Explanation {
    /// A readable rendering for humans.
    pub fn to_text(&self) -> String {
        let mut out = format!("route_config: {}\n", self.route_config);
        let Some(vh) = &self.virtual_host else {
            out.push_str("virtual_host: none (no domain matches) -> 404\n");
            return out;
        };
        out.push_str(&format!(
            "virtual_host: {vh} (domain {:?}, {:?} match)\n",
            self.domain.as_deref().unwrap_or(""),
            self.domain_kind.unwrap_or(DomainKind::Any)
        ));
        for s in &self.skipped {
            out.push_str(&format!(
                "  route[{}] {:?}: no: {}\n",
                s.index, s.name, s.reason
            ));
        }
        match (&self.action, self.route_index) {
            (None, _) => out.push_str("route: none matched -> 404\n"),
            (Some(a), Some(i)) => out.push_str(&format!(
                "route[{i}] {:?}: matched, action {a}\n",
                self.route_name.as_deref().unwrap_or("")
            )),
            (Some(a), None) => out.push_str(&format!("action {a} (require_tls)\n")),
        }
        for (label, v) in [
            ("cluster", &self.cluster),
            ("rewritten_path", &self.rewritten_path),
            ("rewritten_host", &self.rewritten_host),
            ("location", &self.location),
        ] {
            if let Some(v) = v {
                out.push_str(&format!("{label}: {v}\n"));
            }
        }
        if let Some(s) = self.status {
            out.push_str(&format!("status: {s}\n"));
        }
        if let Some(o) = &self.access_log {
            out.push_str(&format!(
                "access log: {} {} {}\n",
                o.response_code,
                o.response_flags.unwrap_or("-"),
                o.response_code_details
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, Method};

    use super::*;

    fn table() -> RouteTable {
        let rc = crate::config::route::tests::decode(
            "name: rc\nvirtual_hosts:\n- name: web\n  domains: ['*.example.com']\n  routes:\n  - name: api\n    match: {prefix: /api, headers: [{name: x-canary, string_match: {exact: 'yes'}}]}\n    route: {cluster: canary}\n  - name: exact\n    match: {path: /exact}\n    route: {cluster: e}\n  - name: rest\n    match: {prefix: /}\n    route: {cluster: web, prefix_rewrite: /v2/}\n",
        );
        crate::config::route::compile_route_config(
            &crate::config::Context::new(&crate::config::FakeIo::new()),
            &rc,
            None,
            &mut crate::config::Warnings::new(),
        )
        .unwrap()
    }

    #[test]
    fn explains_decision_and_skipped_routes() {
        let t = table();
        let h = HeaderMap::new();
        let req = RouteRequest::new(&Method::GET, "www.example.com", "/api/x", &h);
        let e = explain(&t, &req, |_| ClusterState::Ready);
        assert_eq!(e.access_log, None);
        assert_eq!(e.virtual_host.as_deref(), Some("web"));
        assert_eq!(e.domain.as_deref(), Some("*.example.com"));
        assert_eq!(e.domain_kind, Some(DomainKind::Suffix));
        assert_eq!(e.route_index, Some(2));
        assert_eq!(e.cluster.as_deref(), Some("web"));
        assert_eq!(e.rewritten_path.as_deref(), Some("/v2/api/x"));
        assert_eq!(e.skipped.len(), 2);
        assert_eq!(
            e.skipped[0].reason,
            "header x-canary exact \"yes\" does not match"
        );
        assert_eq!(e.skipped[1].reason, "path \"/exact\" does not match");
        let text = e.to_text();
        assert!(
            text.contains("route[0] \"api\": no: header x-canary"),
            "{text}"
        );
        assert!(
            text.contains("route[2] \"rest\": matched, action route"),
            "{text}"
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["cluster"], "web");
    }

    #[test]
    fn explains_no_virtual_host() {
        let t = table();
        let h = HeaderMap::new();
        let e = explain(
            &t,
            &RouteRequest::new(&Method::GET, "other.org", "/", &h),
            |_| ClusterState::Ready,
        );
        assert_eq!(e.virtual_host, None);
        assert!(e.to_text().contains("404"));
        assert_eq!(e.access_log, Some(LoggedOutcome::NO_ROUTE));
    }

    #[test]
    fn explains_what_the_access_log_carries() {
        let t = table();
        let h = HeaderMap::new();
        let req = RouteRequest::new(&Method::GET, "www.example.com", "/exact", &h);
        let missing = explain(&t, &req, |_| ClusterState::Missing);
        assert_eq!(missing.access_log, Some(LoggedOutcome::no_cluster(503)));
        let empty = explain(&t, &req, |_| ClusterState::NoHosts);
        let o = empty.access_log.clone().unwrap();
        assert_eq!(
            (o.response_code, o.response_flags, o.response_code_details),
            (503, Some("UH"), "no_healthy_upstream")
        );
        assert!(
            empty
                .to_text()
                .contains("access log: 503 UH no_healthy_upstream\n"),
            "{}",
            empty.to_text()
        );
    }

    #[test]
    fn tables_listing() {
        let t = table();
        let j = tables_json(&[&t]);
        assert_eq!(j[0]["name"], "rc");
        let routes = &j[0]["virtual_hosts"][0]["routes"];
        assert_eq!(routes[0]["name"], "api");
        assert_eq!(routes[0]["action"]["target"]["cluster"], "canary");
        assert_eq!(routes[2]["action"]["prefix_rewrite"], "/v2/");
        assert_eq!(routes[2]["action"]["timeout_ms"], 15000);
    }
}
