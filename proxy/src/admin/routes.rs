//! `/routes`: the compiled route tables, or the explained decision for one request.

use http::{HeaderMap, HeaderName, HeaderValue, Method};

use super::{AdminRequest, AdminResponse, json, text};
use crate::config::cluster::Discovery;
use crate::process::Process;
use crate::route::explain::ClusterState;
use crate::route::{RouteRequest, RouteTable, explain};

/// Renders `/routes` (all tables) or `/routes?host=..&path=..` (the decision, explained, for
/// every table or the one named by `route_config`).
pub fn render(process: &Process, req: &AdminRequest) -> AdminResponse {
    let tables = process.route_tables();
    let only = req.param("route_config");
    let selected: Vec<&RouteTable> = tables
        .iter()
        .map(|t| t.as_ref())
        .filter(|t| only.is_none_or(|n| t.name() == n))
        .collect();
    if only.is_some() && selected.is_empty() {
        return text(
            404,
            format!(
                "no route configuration named '{}'\n",
                only.unwrap_or_default()
            ),
        );
    }
    let Some(host) = req.param("host") else {
        return json(&explain::tables_json(&selected));
    };
    let path = req.param("path").filter(|p| !p.is_empty()).unwrap_or("/");
    let method = match Method::from_bytes(req.param("method").unwrap_or("GET").as_bytes()) {
        Ok(m) => m,
        Err(_) => return text(400, "invalid method\n"),
    };
    let mut headers = HeaderMap::new();
    for (_, h) in req.params.iter().filter(|(k, _)| k == "header") {
        let Some((name, value)) = h.split_once(':') else {
            return text(400, format!("header '{h}' is not name:value\n"));
        };
        match (
            HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes()),
            HeaderValue::from_str(value.trim()),
        ) {
            (Ok(n), Ok(v)) => {
                headers.append(n, v);
            }
            _ => return text(400, format!("invalid header '{h}'\n")),
        }
    }
    let mut route_req = RouteRequest::new(&method, host, path, &headers);
    route_req.https = headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v == "https");
    let explanations: Vec<_> = selected
        .iter()
        .map(|t| explain::explain(t, &route_req, |name| cluster_state(process, name)))
        .collect();
    if req.param("format") == Some("text") {
        text(
            200,
            explanations
                .iter()
                .map(|e| e.to_text())
                .collect::<Vec<_>>()
                .join("\n"),
        )
    } else {
        json(
            &serde_json::json!({ "request": {"host": host, "path": path, "method": method.as_str()}, "decisions": explanations }),
        )
    }
}

/// What the cluster manager knows of cluster `name`: missing, without hosts to pick (an
/// original-destination cluster always has one, the request's destination), or ready.
fn cluster_state(process: &Process, name: &str) -> ClusterState {
    match process.shared.clusters.get(name) {
        None => ClusterState::Missing,
        Some(c) if matches!(c.config().discovery, Discovery::OriginalDst { .. }) => {
            ClusterState::Ready
        }
        Some(c) if c.host_set().hosts().is_empty() => ClusterState::NoHosts,
        Some(_) => ClusterState::Ready,
    }
}
