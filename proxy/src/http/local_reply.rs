//! Responses the proxy writes itself (Envoy's local replies): status, `text/plain` body,
//! rewritten by the connection manager's `local_reply_config` ([`map`]) before a gRPC request's
//! reply takes its gRPC shape ([`grpc_local_reply`]), in Envoy's order.

use http::{HeaderValue, Response, StatusCode, header};

use crate::access_log::Record;
use crate::body::{self, Body};
use crate::config::local_reply::LocalReplyConfig;
use crate::route::FormatContext;

/// Envoy's body for a request whose cluster has no healthy host.
pub const NO_HEALTHY_UPSTREAM: &str = "no healthy upstream";
/// Envoy's body for a route timeout.
pub const UPSTREAM_TIMEOUT: &str = "upstream request timeout";

/// Marks a response the proxy wrote itself, keeping what gRPC conversion needs.
#[derive(Debug, Clone)]
pub struct LocalReply {
    /// The body text (`grpc-message`).
    pub text: String,
    /// The `grpc-status` when Envoy names one, instead of mapping the HTTP status.
    pub grpc_status: Option<u16>,
}

/// Envoy's `grpc-status` DEADLINE_EXCEEDED.
pub const GRPC_DEADLINE_EXCEEDED: u16 = 4;

/// A local reply like [`local_reply`] that a gRPC request gets as `grpc_status`.
pub fn local_reply_with_grpc_status(
    status: StatusCode,
    text: &str,
    grpc_status: u16,
) -> Response<Body> {
    let mut resp = local_reply(status, text);
    if let Some(local) = resp.extensions_mut().get_mut::<LocalReply>() {
        local.grpc_status = Some(grpc_status);
    }
    resp
}

/// A local reply with `status` and, when non-empty, a `text/plain` body.
pub fn local_reply(status: StatusCode, text: &str) -> Response<Body> {
    let mut resp = Response::new(if text.is_empty() {
        body::empty()
    } else {
        body::full(text.to_owned())
    });
    *resp.status_mut() = status;
    resp.extensions_mut().insert(LocalReply {
        text: text.to_owned(),
        grpc_status: None,
    });
    // Envoy's order: content-length, then content-type. An empty reply has neither: over
    // HTTP/1.1 the codec writes `content-length: 0`, over HTTP/2 the headers end the stream.
    if !text.is_empty() {
        let h = resp.headers_mut();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(text.len()));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    }
    resp
}

/// Rewrites a local reply as `config` says (the first mapper whose filter passes on `rec`,
/// then the body format), with Envoy's content headers: `content-length` and the format's
/// `content-type` for a non-empty body (one a mapper added stays; one the reply had, such as a
/// route's, stays unless the body changed), neither for an empty one. Other responses pass
/// unchanged.
pub fn map(config: &LocalReplyConfig, resp: Response<Body>, rec: &mut Record) -> Response<Body> {
    let Some(local) = resp.extensions().get::<LocalReply>().cloned() else {
        return resp;
    };
    let (mut parts, _) = resp.into_parts();
    // The reply's content headers are decided below, from the rewritten body; the default
    // `text/plain` is one Envoy adds only then.
    parts.headers.remove(header::CONTENT_LENGTH);
    if parts.headers.get(header::CONTENT_TYPE) == Some(&HeaderValue::from_static("text/plain")) {
        parts.headers.remove(header::CONTENT_TYPE);
    }
    let before = parts.headers.get(header::CONTENT_TYPE).cloned();
    let mut status = parts.status;
    let mut text = local.text.clone();
    let mut format = config.body_format.as_ref();
    rec.response_code = Some(status.as_u16());
    if let Some(m) = config.mappers.iter().find(|m| m.filter.passes(rec)) {
        if let Some(b) = &m.body {
            text.clone_from(b);
        }
        let fmt = FormatContext {
            request_headers: rec.request.as_ref().map(|r| &r.headers),
            response_code: Some(status.as_u16()),
            response_status: Some(status.as_u16()),
            ..Default::default()
        };
        m.headers.apply_response(&mut parts.headers, &fmt);
        if let Some(s) = m.status {
            status = s;
            rec.response_code = Some(s.as_u16());
        }
        if m.body_format.is_some() {
            format = m.body_format.as_ref();
        }
    }
    let content_type = match format {
        Some(f) => {
            rec.local_reply_body = Some(std::mem::take(&mut text));
            rec.response_headers = Some(parts.headers.clone());
            text = f.format.render(rec);
            rec.local_reply_body = None;
            &*f.content_type
        }
        None => "text/plain",
    };
    parts.status = status;
    let after = parts.headers.get(header::CONTENT_TYPE);
    let keep_type = after.is_some() && (after != before.as_ref() || text == local.text);
    if text.is_empty() {
        parts.headers.remove(header::CONTENT_TYPE);
    } else {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(text.len()));
        if !keep_type && let Ok(v) = HeaderValue::from_str(content_type) {
            parts.headers.insert(header::CONTENT_TYPE, v);
        }
    }
    parts.extensions.insert(LocalReply {
        text: text.clone(),
        grpc_status: local.grpc_status,
    });
    let body = if text.is_empty() {
        body::empty()
    } else {
        body::full(text)
    };
    Response::from_parts(parts, body)
}

/// Whether a request is gRPC (`content-type: application/grpc[+proto|;...]`).
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|ct| ct.strip_prefix("application/grpc"))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('+') || rest.starts_with(';'))
}

/// Envoy's HTTP-status-to-gRPC-status mapping (`Grpc::Utility::httpToGrpcStatus`), for local
/// replies and the gRPC-Web filter.
pub fn grpc_status(status: StatusCode) -> u16 {
    match status.as_u16() {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => 14,
        _ => 2,
    }
}

/// Turns a local reply to a gRPC request into a trailers-only gRPC response (HTTP 200,
/// `grpc-status`, `grpc-message`), as Envoy does. Other responses pass unchanged.
pub fn grpc_local_reply(resp: Response<Body>) -> Response<Body> {
    let Some(LocalReply {
        text,
        grpc_status: named,
    }) = resp.extensions().get::<LocalReply>().cloned()
    else {
        return resp;
    };
    let (mut parts, _) = resp.into_parts();
    let code = named.unwrap_or_else(|| grpc_status(parts.status));
    parts.status = StatusCode::OK;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    parts.headers.insert("grpc-status", HeaderValue::from(code));
    let message = percent_encoded(text.strip_suffix('\n').unwrap_or(&text));
    if !message.is_empty()
        && let Ok(v) = HeaderValue::from_str(&message)
    {
        parts.headers.insert("grpc-message", v);
    }
    Response::from_parts(parts, body::empty())
}

/// `grpc-message`'s percent-encoding (Envoy's, per the gRPC HTTP/2 protocol): bytes below
/// a space, from `~` up, and `%` become `%XX`.
fn percent_encoded(text: &str) -> std::borrow::Cow<'_, str> {
    let escaped = |b: u8| !(b' '..b'~').contains(&b) || b == b'%';
    if !text.bytes().any(escaped) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for b in text.bytes() {
        if escaped(b) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(char::from(b));
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_requests_get_grpc_status() {
        let mut h = http::HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&h));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpcx"),
        );
        assert!(!is_grpc(&h));
        let r = grpc_local_reply(local_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "no healthy upstream",
        ));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["grpc-status"], "14");
        assert_eq!(r.headers()["grpc-message"], "no healthy upstream");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/grpc");
        let not_local = Response::new(body::empty());
        assert_eq!(grpc_local_reply(not_local).status(), StatusCode::OK);
        assert_eq!(grpc_status(StatusCode::NOT_FOUND), 12);
        assert_eq!(percent_encoded("a b~100%\n\u{e9}"), "a b%7E100%25%0A%C3%A9");
    }
}
