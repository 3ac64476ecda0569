//! Checks against a gRPC authorization service (`envoy.service.auth.v3.Authorization/Check`),
//! and what its `CheckResponse` decides (Envoy's `GrpcClientImpl::onSuccess`).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use prost::Message;
use proto::pb::envoy::config::core::v3::{HeaderValueOption, header_value_option};
use proto::pb::envoy::service::auth::v3::{CheckRequest, CheckResponse, check_response};
use proto::pb::google::protobuf::Struct;

use super::{Action, Decision, Mutation};
use crate::config::http_filter::ext_authz::GrpcTarget;
use crate::upstream::{ClusterManager, grpc};

const CHECK: &str = "/envoy.service.auth.v3.Authorization/Check";

/// Sends `request` to the service and reads its decision, with the dynamic metadata the
/// answer carries; any failure is an error.
pub(super) async fn check(
    clusters: &ClusterManager,
    target: &GrpcTarget,
    timeout: Duration,
    request: &CheckRequest,
) -> (Decision, Option<Struct>) {
    let call = grpc::Call {
        cluster: &target.cluster,
        path: CHECK,
        authority: &target.authority,
        metadata: &target.initial_metadata,
        timeout: Some(timeout),
    };
    let reply = grpc::unary(clusters, &call, request).await.and_then(|b| {
        CheckResponse::decode(b).map_err(|e| grpc::Failure {
            status: grpc::UNAVAILABLE,
            message: e.to_string(),
        })
    });
    match reply {
        Ok(mut r) => {
            let metadata = r.dynamic_metadata.take();
            (decide(r), metadata)
        }
        Err(f) => {
            tracing::debug!(failure = %f, "ext_authz: check failed");
            (Decision::Error, None)
        }
    }
}

/// The decision a `CheckResponse` carries: status OK allows (unless it changes query
/// parameters, which revoy cannot); an `error_response` is an error; anything else denies
/// (403 unless the denial names a status).
fn decide(r: CheckResponse) -> Decision {
    use check_response::HttpResponse;
    let ok = r.status.as_ref().is_none_or(|s| s.code == 0);
    match r.http_response {
        _ if ok => match r.http_response {
            // revoy cannot change the path the route was chosen by: an answer it cannot
            // apply in full is a failed check, never a partial allow.
            Some(HttpResponse::OkResponse(o))
                if !(o.query_parameters_to_set.is_empty()
                    && o.query_parameters_to_remove.is_empty()) =>
            {
                tracing::debug!("ext_authz: query parameter changes are not implemented");
                Decision::Error
            }
            Some(HttpResponse::OkResponse(o)) => Decision::Ok {
                upstream: mutations(&o.headers, false),
                remove: o.headers_to_remove,
                response: mutations(&o.response_headers_to_add, true),
            },
            _ => Decision::Ok {
                upstream: Vec::new(),
                remove: Vec::new(),
                response: Vec::new(),
            },
        },
        Some(HttpResponse::ErrorResponse(_)) => Decision::Error,
        Some(HttpResponse::DeniedResponse(d)) => Decision::Denied {
            status: d
                .status
                .map(|s| s.code)
                .filter(|c| *c > 0)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(403),
            headers: mutations(&d.headers, true),
            body: Bytes::from(d.body),
        },
        _ => Decision::Denied {
            status: 403,
            headers: Vec::new(),
            body: Bytes::new(),
        },
    }
}

/// The header changes of `options` (invalid names or values are left out). The deprecated
/// `append` means add on a response and append on a request, as in Envoy.
#[allow(deprecated)]
fn mutations(options: &[HeaderValueOption], response: bool) -> Vec<Mutation> {
    use header_value_option::HeaderAppendAction as A;
    options
        .iter()
        .filter_map(|o| {
            let h = o.header.as_ref()?;
            let action = match o.append.as_ref().map(|a| a.value) {
                Some(true) if response => Action::Add,
                Some(true) => Action::Append,
                Some(false) => Action::Set,
                // Envoy 1.40 sets a request header whose action is left at its default.
                None => match A::try_from(o.append_action) {
                    Ok(A::AppendIfExistsOrAdd) if !response => Action::Set,
                    Ok(A::AppendIfExistsOrAdd) => Action::Add,
                    Ok(A::AddIfAbsent) => Action::AddIfAbsent,
                    Ok(A::OverwriteIfExists) => Action::OverwriteIfExists,
                    Ok(A::OverwriteIfExistsOrAdd) | Err(_) => Action::Set,
                },
            };
            let value = if h.raw_value.is_empty() {
                HeaderValue::from_str(&h.value).ok()?
            } else {
                HeaderValue::from_bytes(&h.raw_value).ok()?
            };
            Some(Mutation {
                name: HeaderName::from_bytes(h.key.to_ascii_lowercase().as_bytes()).ok()?,
                value,
                action,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::pb::envoy::config::core::v3::QueryParameter;
    use proto::pb::envoy::service::auth::v3::OkHttpResponse;
    use proto::pb::google::rpc::Status;

    fn status(code: i32) -> Option<Status> {
        Some(Status {
            code,
            ..Default::default()
        })
    }

    #[test]
    fn an_answer_changing_query_parameters_is_a_failed_check() {
        let r = CheckResponse {
            status: status(0),
            http_response: Some(check_response::HttpResponse::OkResponse(OkHttpResponse {
                query_parameters_to_set: vec![QueryParameter {
                    key: "k".into(),
                    value: "v".into(),
                }],
                ..Default::default()
            })),
            ..Default::default()
        };
        assert!(matches!(decide(r), Decision::Error));
    }

    #[test]
    fn a_denial_without_a_response_is_403() {
        let r = CheckResponse {
            status: status(7),
            ..Default::default()
        };
        assert!(matches!(decide(r), Decision::Denied { status: 403, .. }));
    }
}
