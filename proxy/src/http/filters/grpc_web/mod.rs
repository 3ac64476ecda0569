//! `envoy.filters.http.grpc_web`: gRPC-Web clients to gRPC upstreams. A request with a
//! gRPC-Web content type goes on as gRPC (a `-text` body base64-decoded as it streams); its
//! response goes back as gRPC-Web (trailers as the last frame, base64 frame by frame when the
//! client accepts text), and a response that is not gRPC becomes `grpc-status` and
//! `grpc-message` headers.

mod request_body;
mod response_body;

use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use http_body::Body as _;

use super::{Encoder, Encoders, FilterRequest};
use crate::body::Body;
use crate::http::local_reply::{grpc_status, is_grpc, local_reply};
use request_body::BadBase64;

const GRPC_WEB: &str = "application/grpc-web";
const GRPC_WEB_PROTO: &str = "application/grpc-web+proto";
const GRPC_WEB_TEXT: &str = "application/grpc-web-text";
const GRPC_WEB_TEXT_PROTO: &str = "application/grpc-web-text+proto";
/// How much of a response that is not gRPC becomes its `grpc-message` (Envoy's
/// `MAX_BUFFERED_PLAINTEXT_LENGTH`).
const MAX_MESSAGE: usize = 16384;
/// Envoy's answer to a `-text` body that is not base64.
const BAD_BASE64: &str = "Bad gRPC-web request, invalid base64 data.";

/// A gRPC-Web request's state, acting on its response.
#[derive(Debug)]
pub(super) struct Answer {
    /// The client accepts `application/grpc-web-text`.
    text: bool,
    /// Set when the request body turned out not to be base64 after it was handed on.
    bad_body: Arc<OnceLock<BadBase64>>,
}

/// Turns a gRPC-Web request into a gRPC one; other requests pass untouched. A `-text` body
/// found not to be base64 fails as it goes upstream, and the response is then Envoy's 400.
pub(super) fn decode(req: &mut FilterRequest<'_>, encoders: &mut Encoders) {
    let Some(content_type) = req.headers.get(header::CONTENT_TYPE) else {
        return;
    };
    let text_request = match content_type.as_bytes() {
        b if b == GRPC_WEB.as_bytes() || b == GRPC_WEB_PROTO.as_bytes() => false,
        b if b == GRPC_WEB_TEXT.as_bytes() || b == GRPC_WEB_TEXT_PROTO.as_bytes() => true,
        _ => return,
    };
    let h = &mut *req.headers;
    h.remove(header::CONTENT_LENGTH);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    let text = h
        .get(header::ACCEPT)
        .is_some_and(|a| a == GRPC_WEB_TEXT || a == GRPC_WEB_TEXT_PROTO);
    h.insert(header::TE, HeaderValue::from_static("trailers"));
    if !h.contains_key("grpc-accept-encoding") {
        h.insert("grpc-accept-encoding", HeaderValue::from_static("identity"));
    }
    let bad_body = Arc::new(OnceLock::new());
    encoders.0.push(Encoder::GrpcWeb(Answer {
        text,
        bad_body: bad_body.clone(),
    }));
    let inner = std::mem::replace(req.body, crate::body::empty());
    *req.body = if text_request {
        request_body::decoding(inner, bad_body)
    } else {
        crate::body::without_length(inner)
    };
}

impl Answer {
    /// Turns the response into gRPC-Web: its content type, its body framed (or, when it is
    /// neither gRPC nor proto-encoded gRPC-Web, its body read into `grpc-message`).
    pub(super) async fn encode(&self, resp: &mut Response<Body>) {
        if let Some(bad) = self.bad_body.get() {
            tracing::debug!(details = %bad, "gRPC-Web request body is not base64");
            let close = resp.headers_mut().remove(header::CONNECTION);
            *resp = local_reply(StatusCode::BAD_REQUEST, BAD_BASE64);
            if let Some(close) = close {
                resp.headers_mut().insert(header::CONNECTION, close);
            }
        }
        let end = resp.body().is_end_stream();
        let transform = !is_grpc_response(resp, end) && !is_grpc_web_proto_response(resp);
        let content_type = if self.text {
            GRPC_WEB_TEXT_PROTO
        } else {
            GRPC_WEB_PROTO
        };
        let status = resp.status();
        let headers = resp.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        if end {
            return;
        }
        headers.remove(header::CONTENT_LENGTH);
        let body = std::mem::replace(resp.body_mut(), crate::body::empty());
        if !transform {
            *resp.body_mut() = response_body::grpc_web(body, self.text);
            return;
        }
        let message = first_bytes(body).await;
        let headers = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&percent_encode(&message)) {
            headers.insert("grpc-message", v);
        }
        headers.insert("grpc-status", HeaderValue::from(grpc_status(status)));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
    }
}

/// Whether `resp` is gRPC: a trailers-only answer (`end`) with `grpc-status`, or a 200 with a
/// gRPC content type.
fn is_grpc_response(resp: &Response<Body>, end: bool) -> bool {
    if end {
        resp.headers().contains_key("grpc-status")
    } else {
        resp.status() == StatusCode::OK && is_grpc(resp.headers())
    }
}

/// Whether `resp` is a 200 with a proto-encoded gRPC-Web content type (parameters ignored).
fn is_grpc_web_proto_response(resp: &Response<Body>) -> bool {
    resp.status() == StatusCode::OK && has_grpc_web_proto_type(resp.headers())
}

/// Whether the content type is `application/grpc-web(+proto)`, any case, parameters ignored.
fn has_grpc_web_proto_type(headers: &HeaderMap) -> bool {
    let Some(v) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let bytes = v.as_bytes();
    let media = bytes.split(|b| *b == b';').next().unwrap_or_default();
    let media = media.trim_ascii_end();
    media.eq_ignore_ascii_case(GRPC_WEB_PROTO.as_bytes())
        || media.eq_ignore_ascii_case(GRPC_WEB.as_bytes())
}

/// What of a body that is not gRPC becomes `grpc-message`, as Envoy buffers it: a body of
/// one chunk whole, else its first [`MAX_MESSAGE`] bytes.
async fn first_bytes(mut body: Body) -> Bytes {
    let mut chunks = Vec::new();
    let mut kept = 0;
    let mut trailers = false;
    while let Some(Ok(frame)) = http_body_util::BodyExt::frame(&mut body).await {
        match frame.into_data() {
            Ok(data) if kept < MAX_MESSAGE || chunks.is_empty() => {
                kept += data.len();
                chunks.push(data);
            }
            Ok(_) => {}
            Err(_) => trailers = true,
        }
    }
    if chunks.len() == 1 && !trailers {
        return chunks.pop().unwrap_or_default();
    }
    let mut all = BytesMut::with_capacity(kept.min(MAX_MESSAGE));
    for c in chunks {
        all.extend_from_slice(&c);
    }
    all.truncate(MAX_MESSAGE);
    all.freeze()
}

/// Envoy's `PercentEncoding::encode` for `grpc-message`: bytes below a space, from `~` up, and
/// `%` become `%XX`.
fn percent_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len());
    for &b in data {
        if !(b' '..b'~').contains(&b) || b == b'%' {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_message_is_percent_encoded_as_envoy() {
        assert_eq!(
            percent_encode(b"no healthy upstream"),
            "no healthy upstream"
        );
        assert_eq!(
            percent_encode(b"<b>50%</b>\n~\xc3"),
            "<b>50%25</b>%0A%7E%C3"
        );
    }

    #[test]
    fn grpc_web_content_types_ignore_case_and_parameters() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            "Application/GRPC-Web+Proto ; x=1".parse().unwrap(),
        );
        assert!(has_grpc_web_proto_type(&h));
        h.insert(header::CONTENT_TYPE, GRPC_WEB_TEXT.parse().unwrap());
        assert!(!has_grpc_web_proto_type(&h));
    }
}
