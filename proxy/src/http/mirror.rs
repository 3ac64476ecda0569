//! `request_mirror_policies`: fire-and-forget copies of a request to shadow clusters, with the
//! authority suffixed `-shadow`. The shadow's response is read and thrown away; it never
//! delays or fails the main request.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Request, header};
use http_body_util::BodyExt;

use super::buffered_body::Replay;
use crate::route::RouteRequest;
use crate::route::policy::MirrorPolicy;
use crate::upstream::{ClusterManager, LbContext};

static INTERNAL: HeaderName = HeaderName::from_static("x-envoy-internal");
static ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-envoy-attempt-count");

/// Where and how shadows are sent.
pub struct Shadowing<'a> {
    /// Clusters to look the shadow cluster up in.
    pub clusters: &'a ClusterManager,
    /// The main request's load-balancer inputs.
    pub lb: &'a LbContext,
    /// The route timeout, which bounds each shadow.
    pub timeout: Option<Duration>,
    /// Send `x-envoy-attempt-count: 1` (the virtual host's `include_request_attempt_count`).
    pub attempt_count: bool,
}

/// Starts one shadow request per policy that admits `route_req` and names an existing cluster.
/// `head` is the request as it goes upstream. Like Envoy's, shadows are internal requests.
pub fn spawn(
    policies: &[MirrorPolicy],
    route_req: &RouteRequest<'_>,
    head: &http::request::Parts,
    body: &Replay,
    how: &Shadowing<'_>,
) {
    let Shadowing {
        clusters,
        lb,
        timeout,
        attempt_count,
    } = *how;
    for policy in policies {
        let req_for_fraction = RouteRequest {
            random_value: rand::random(),
            ..*route_req
        };
        let Some(name) = policy.shadow_cluster(&req_for_fraction) else {
            continue;
        };
        let Some(cluster) = clusters.get(&name) else {
            tracing::debug!(cluster = %name, "shadow cluster not found");
            continue;
        };
        let mut req = Request::new(body.body());
        *req.method_mut() = head.method.clone();
        *req.uri_mut() = head.uri.clone();
        *req.version_mut() = head.version;
        *req.headers_mut() = head.headers.clone();
        let authority = head
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if let Ok(v) = HeaderValue::from_str(&policy.shadow_host(authority)) {
            req.headers_mut().insert(header::HOST, v);
        }
        req.headers_mut()
            .insert(&INTERNAL, HeaderValue::from_static("true"));
        if attempt_count {
            req.headers_mut()
                .insert(&ATTEMPT_COUNT, HeaderValue::from_static("1"));
        }
        let lb = LbContext {
            avoid: Vec::new(),
            target: None,
            ..lb.clone()
        };
        tokio::spawn(async move {
            let exchange = async {
                if let Ok(resp) = cluster.request(req, &lb).await {
                    let _ = resp.into_body().collect().await;
                }
            };
            match timeout {
                Some(t) => {
                    let _ = tokio::time::timeout(t, exchange).await;
                }
                None => exchange.await,
            }
        });
    }
}
