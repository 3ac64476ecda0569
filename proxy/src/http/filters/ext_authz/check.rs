//! The `CheckRequest` of one request: its peers, HTTP attributes, the body read for it, and
//! the route's context extensions (Envoy's `CheckRequestUtils::createHttpCheck`).

use std::pin::Pin;

use bytes::Bytes;
use http::{Response, StatusCode, Version};
use http_body::Body as _;
use proto::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest, attribute_context};

use super::super::FilterRequest;
use crate::body::Body;
use crate::config::http_filter::ext_authz::{BufferSettings, ExtAuthzConfig, Service};
use crate::config::listener::address_proto;
use crate::http::buffered_body::replay_then;
use crate::http::local_reply::local_reply;

/// The body sent with a check: at most `max_request_bytes` of it.
#[derive(Debug)]
pub(super) struct CheckBody {
    data: Bytes,
    /// The bytes of the body received when the check was made.
    received: usize,
    /// Whether the request's body is longer than `data`.
    partial: bool,
    /// `pack_as_bytes`.
    as_bytes: bool,
}

/// Reads the request's body for the check as `settings` say, and puts it back for the
/// upstream. A body longer than the limit is refused (413) unless `allow_partial_message`.
pub(super) async fn read_body(
    req: &mut FilterRequest<'_>,
    settings: BufferSettings,
) -> Result<Option<CheckBody>, Response<Body>> {
    if req.body.is_end_stream() {
        return Ok(None);
    }
    let mut body = std::mem::replace(req.body, crate::body::empty());
    let mut data = Vec::new();
    let mut trailers = None;
    let mut size = 0usize;
    let mut ended = true;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let Ok(frame) = frame else {
            return Err(local_reply(StatusCode::BAD_REQUEST, ""));
        };
        match frame.into_data() {
            Ok(d) => {
                size += d.len();
                data.push(d);
            }
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
        if size > settings.max_request_bytes && !settings.allow_partial_message {
            return Err(local_reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Payload Too Large",
            ));
        }
        if settings.allow_partial_message && size >= settings.max_request_bytes {
            ended = body.is_end_stream();
            break;
        }
    }
    let whole: Bytes = data.iter().flatten().copied().collect();
    let kept = whole.len().min(settings.max_request_bytes);
    let check = CheckBody {
        data: whole.slice(..kept),
        received: size,
        partial: kept != whole.len() || !ended,
        as_bytes: settings.pack_as_bytes,
    };
    *req.body = replay_then(data, trailers, (!ended).then_some(body));
    Ok(Some(check))
}

/// The check of `req`.
pub(super) fn request(
    req: &FilterRequest<'_>,
    config: &ExtAuthzConfig,
    context_extensions: Vec<(String, String)>,
    body: Option<CheckBody>,
) -> CheckRequest {
    let conn = req.conn;
    let tls = conn.down.tls.as_deref();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut headers = std::collections::HashMap::new();
    let pseudo = [
        (":authority", req.authority),
        (":path", req.path),
        (":method", req.method.as_str()),
        (":scheme", scheme),
    ];
    // Envoy's header map holds the Host header as `:authority`.
    let regular = req
        .headers
        .iter()
        .filter(|(n, _)| *n != http::header::HOST)
        .map(|(n, v)| (n.as_str(), std::str::from_utf8(v.as_bytes()).unwrap_or("")));
    for (name, value) in pseudo.into_iter().chain(regular) {
        if !sent(config, name) {
            continue;
        }
        headers
            .entry(name.to_owned())
            .and_modify(|v: &mut String| {
                v.push(',');
                v.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    let mut http = attribute_context::HttpRequest {
        method: req.method.as_str().to_owned(),
        path: req.path.to_owned(),
        host: req.authority.to_owned(),
        scheme: scheme.to_owned(),
        protocol: protocol(req.version).to_owned(),
        ..Default::default()
    };
    if let Some(b) = body {
        headers.insert(
            "x-envoy-auth-partial-body".to_owned(),
            b.partial.to_string(),
        );
        http.size = b.received as i64;
        if b.as_bytes {
            http.raw_body = b.data.to_vec();
        } else {
            http.body = String::from_utf8_lossy(&b.data).into_owned();
        }
    }
    http.headers = headers;
    let service = req
        .headers
        .get("x-envoy-downstream-service-cluster")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let source = attribute_context::Peer {
        address: Some(address_proto(conn.down.peer)),
        service,
        principal: tls
            .and_then(|t| t.peer())
            .map(|p| p.uri_sans().next().unwrap_or(&p.subject).to_owned())
            .unwrap_or_default(),
        certificate: match tls.and_then(|t| t.chain().first()) {
            Some(der) if config.include_peer_certificate => crate::tls::x509::url_encoded_pem(der),
            _ => String::new(),
        },
        ..Default::default()
    };
    let destination = attribute_context::Peer {
        address: Some(address_proto(conn.local)),
        principal: tls
            .and_then(|t| t.local_uri_sans().first().cloned())
            .unwrap_or_default(),
        ..Default::default()
    };
    let tls_session =
        tls.filter(|_| config.include_tls_session)
            .map(|t| attribute_context::TlsSession {
                sni: t.server_name().map(|s| s.to_string()).unwrap_or_default(),
            });
    CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(source),
            destination: Some(destination),
            request: Some(attribute_context::Request {
                time: Some(now()),
                http: Some(http),
            }),
            context_extensions: context_extensions.into_iter().collect(),
            tls_session,
            ..Default::default()
        }),
    }
}

/// The request headers an HTTP service is always sent.
const HTTP_ALWAYS_SENT: [&str; 4] = ["authorization", ":method", ":path", ":authority"];

/// Whether header `name` goes to the service: `allowed_headers` (for an HTTP service, the
/// ones it is always sent, and its `authorization_request.allowed_headers` when the filter
/// sets none), less `disallowed_headers`.
fn sent(config: &ExtAuthzConfig, name: &str) -> bool {
    let allowed = match (&config.service, &config.allowed_headers) {
        (Service::Http(h), allowed) => {
            HTTP_ALWAYS_SENT.contains(&name)
                || allowed
                    .as_deref()
                    .unwrap_or(&h.allowed_headers)
                    .iter()
                    .any(|m| m.matches(name))
        }
        (Service::Grpc(_), allowed) => allowed
            .as_ref()
            .is_none_or(|a| a.iter().any(|m| m.matches(name))),
    };
    allowed && !config.disallowed_headers.iter().any(|m| m.matches(name))
}

fn protocol(v: Version) -> &'static str {
    match v {
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

fn now() -> proto::pb::google::protobuf::Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    proto::pb::google::protobuf::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}
