//! Checks against an HTTP authorization service (Envoy's `RawHttpClientImpl`): the check's
//! headers (its method, path after `path_prefix`, authority, `authorization` and the allowed
//! headers) go to the service's cluster with the body read for the check; a 200 allows, a 5xx or a
//! failure is an error, anything else denies with the service's status, headers and body.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::BodyExt;
use proto::pb::envoy::service::auth::v3::CheckRequest;
use proto::pb::google::protobuf::Struct;

use super::{Action, Decision, Mutation};
use crate::config::http_filter::ext_authz::HttpTarget;
use crate::route::matcher::StringMatcher;
use crate::upstream::{ClusterManager, LbContext};

/// The header through which the service names request headers to remove.
const HEADERS_TO_REMOVE: &str = "x-envoy-auth-headers-to-remove";
/// The denial headers that always reach the client when `allowed_client_headers` is set.
const ALWAYS_TO_CLIENT: [&str; 4] = [":status", "content-length", "www-authenticate", "location"];

/// Sends the check to the service and reads its decision, with the dynamic metadata its
/// response headers give.
pub(super) async fn check(
    clusters: &ClusterManager,
    target: &HttpTarget,
    timeout: Duration,
    request: &CheckRequest,
) -> (Decision, Option<Struct>) {
    let Some(http) = request
        .attributes
        .as_ref()
        .and_then(|a| a.request.as_ref())
        .and_then(|r| r.http.as_ref())
    else {
        return (Decision::Error, None);
    };
    let Some(cluster) = clusters.get(&target.cluster) else {
        tracing::debug!(cluster = %target.cluster, "ext_authz: no such cluster");
        return (Decision::Error, None);
    };
    let body = Bytes::from(http.body.clone());
    let mut builder = http::Request::builder().header(http::header::CONTENT_LENGTH, body.len());
    let mut path = String::new();
    let mut method = "GET";
    let mut names: Vec<&String> = http.headers.keys().collect();
    names.sort();
    for name in names {
        let value = &http.headers[name];
        if name == "content-length" {
            continue;
        }
        match name.as_str() {
            ":path" if target.path_override.is_empty() => {
                path = format!("{}{value}", target.path_prefix);
            }
            ":path" => path.clone_from(&target.path_override),
            ":method" => method = value,
            ":authority" => builder = builder.header(http::header::HOST, value.as_str()),
            n if n.starts_with(':') => {}
            n => builder = builder.header(n, value.as_str()),
        }
    }
    let Ok(mut req) = builder
        .method(method)
        .uri(if path.is_empty() { "/" } else { &path })
        .body(crate::body::full(body))
    else {
        return (Decision::Error, None);
    };
    // Envoy's HTTP client marks its own requests internal, and its router tells the service
    // the call's timeout as for any routed request.
    req.headers_mut()
        .insert("x-envoy-internal", http::HeaderValue::from_static("true"));
    if !timeout.is_zero() {
        req.headers_mut().insert(
            "x-envoy-expected-rq-timeout-ms",
            http::HeaderValue::from(timeout.as_millis() as u64),
        );
    }
    for (name, value) in &target.headers_to_add {
        req.headers_mut().insert(name, value.clone());
    }
    let lb = LbContext {
        internal: true,
        ..LbContext::default()
    };
    let exchange = async {
        let sent = std::time::Instant::now();
        let mut resp = cluster.request(req, &lb).await.ok()?;
        // The router of Envoy's HTTP client adds its upstream service time to the service's
        // response, and a denial hands the response's headers to the client.
        let service_time = sent.elapsed().as_millis() as u64;
        resp.headers_mut().insert(
            &crate::http::router::UPSTREAM_SERVICE_TIME,
            http::HeaderValue::from(service_time),
        );
        let (head, body) = resp.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        Some((head, body))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Some((head, body))) => {
            let status = head.status.as_u16();
            let metadata = (!(500..600).contains(&status))
                .then(|| metadata(&head.headers, &target.dynamic_metadata_from_headers));
            (decide(target, status, head.headers, body), metadata)
        }
        _ => (Decision::Error, None),
    }
}

/// The response headers `matchers` pick (not the one naming headers to remove), as string
/// values under their names; of a repeated header, its last value.
fn metadata(headers: &HeaderMap, matchers: &[StringMatcher]) -> Struct {
    let mut fields = std::collections::HashMap::new();
    for (name, value) in headers {
        if name != HEADERS_TO_REMOVE && matchers.iter().any(|m| m.matches(name.as_str())) {
            fields.insert(
                name.as_str().to_owned(),
                crate::route::metadata::string_value(String::from_utf8_lossy(value.as_bytes())),
            );
        }
    }
    Struct { fields }
}

/// The decision of the service's response.
fn decide(target: &HttpTarget, status: u16, mut headers: HeaderMap, body: Bytes) -> Decision {
    if (500..600).contains(&status) {
        return Decision::Error;
    }
    let remove: Vec<String> = headers
        .get_all(HEADERS_TO_REMOVE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect();
    headers.remove(HEADERS_TO_REMOVE);
    if status == 200 {
        return Decision::Ok {
            upstream: [
                (&target.allowed_upstream_headers, Action::Set),
                (&target.allowed_upstream_headers_to_append, Action::Add),
            ]
            .into_iter()
            .flat_map(|(m, action)| picked(&headers, m, action))
            .collect(),
            remove,
            response: picked(
                &headers,
                &target.allowed_client_headers_on_success,
                Action::Add,
            ),
        };
    }
    let to_client: Vec<Mutation> = headers
        .iter()
        .filter(|(name, _)| match &target.allowed_client_headers {
            None => *name != http::header::HOST,
            Some(m) => {
                ALWAYS_TO_CLIENT.contains(&name.as_str())
                    || m.iter().any(|m| m.matches(name.as_str()))
            }
        })
        .map(|(name, value)| mutation(name, value, Action::Add))
        .collect();
    Decision::Denied {
        status,
        headers: to_client,
        body,
    }
}

/// The headers of `headers` that `matchers` pick, as mutations applying `action`.
fn picked(headers: &HeaderMap, matchers: &[StringMatcher], action: Action) -> Vec<Mutation> {
    headers
        .iter()
        .filter(|(name, _)| matchers.iter().any(|m| m.matches(name.as_str())))
        .map(|(name, value)| mutation(name, value, action))
        .collect()
}

fn mutation(name: &HeaderName, value: &HeaderValue, action: Action) -> Mutation {
    Mutation {
        name: name.clone(),
        value: value.clone(),
        action,
    }
}
