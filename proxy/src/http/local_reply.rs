//! Responses the proxy writes itself (Envoy's local replies): status, `text/plain` body.

use http::{HeaderValue, Response, StatusCode, header};

use crate::body::{self, Body};

/// Envoy's body for a request whose cluster has no healthy host.
pub const NO_HEALTHY_UPSTREAM: &str = "no healthy upstream";
/// Envoy's body for a route timeout.
pub const UPSTREAM_TIMEOUT: &str = "upstream request timeout";

/// A local reply with `status` and, when non-empty, a `text/plain` body.
pub fn local_reply(status: StatusCode, text: &str) -> Response<Body> {
    let mut resp = Response::new(if text.is_empty() {
        body::empty()
    } else {
        body::full(text.to_owned())
    });
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    if !text.is_empty() {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(text.len()));
    resp
}
