//! `envoy.filters.http.buffer`: the whole request body is read before the request goes on.

use http::{HeaderValue, Response, StatusCode, header};

use super::FilterRequest;
use crate::body::Body;
use crate::config::http_filter::buffer::BufferConfig;
use crate::http::buffered_body::{self, Buffered};
use crate::http::local_reply::local_reply;

/// Reads `req`'s body whole (up to the limit: 413 beyond it), then hands it on with a
/// `content-length` when it had none.
pub(super) async fn decode(
    config: BufferConfig,
    req: &mut FilterRequest<'_>,
) -> Option<Response<Body>> {
    if http_body::Body::is_end_stream(req.body) {
        return None;
    }
    let body = std::mem::replace(req.body, crate::body::empty());
    match buffered_body::buffer(body, config.max_request_bytes as usize).await {
        Ok(Buffered::Complete(replay)) => {
            if !req.headers.contains_key(header::CONTENT_LENGTH) {
                req.headers
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(replay.len()));
            }
            *req.body = replay.body();
            None
        }
        Ok(Buffered::TooLarge(_)) => {
            if let Some(r) = req.record.as_deref_mut() {
                r.details = Some("request_payload_too_large".into());
            }
            Some(local_reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Payload Too Large",
            ))
        }
        Err(e) => {
            tracing::debug!(error = %e, "downstream request body failed while buffered");
            let mut resp = local_reply(StatusCode::BAD_REQUEST, "Bad Request");
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Some(resp)
        }
    }
}
