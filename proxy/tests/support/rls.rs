//! A fake rate limit service (`envoy.service.ratelimit.v3.RateLimitService`, tonic) on
//! 127.0.0.1, serving from a runtime of its own, for the HTTP `ratelimit` filter's tests. It
//! records every request it gets (domain and descriptors, as text) and answers by the value
//! of a `verdict` entry in the request's descriptors:
//! - `over`: `OVER_LIMIT`, with the response header `x-rls: over` and the body `rls says no`;
//! - `error`: the gRPC status UNAVAILABLE;
//! - anything else (or none): `OK`, with the response header `x-rls: ok` and the request
//!   header `x-rls-request: ok`.
//!
//! `OK` and `OVER_LIMIT` answers carry descriptor statuses, in the order of the descriptors:
//! 10 a minute named `first` (3 remaining, reset in 30 s), 1000 an hour (999 remaining, reset
//! in 1800 s), then statuses without a limit.

use std::sync::{Arc, Mutex};

use proto::pb::envoy::config::core::v3::HeaderValue;
use proto::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use proto::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use proto::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// The running service.
pub struct Rls {
    /// Its port.
    pub port: u16,
    /// What it was asked, one line per request: `domain [k=v,k=v] [k=v]`.
    pub seen: Arc<Mutex<Vec<String>>>,
    _runtime: tokio::runtime::Runtime,
}

struct Service {
    seen: Arc<Mutex<Vec<String>>>,
}

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value: value.to_owned(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let r = request.into_inner();
        let mut line = r.domain.clone();
        let mut verdict = String::new();
        for d in &r.descriptors {
            let entries: Vec<String> = d
                .entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect();
            line += &format!(" [{}]", entries.join(","));
            if let Some(e) = d.entries.iter().find(|e| e.key == "verdict") {
                verdict = e.value.clone();
            }
        }
        if r.hits_addend != 0 {
            line += &format!(" hits_addend={}", r.hits_addend);
        }
        self.seen.lock().unwrap().push(line);
        let statuses: Vec<DescriptorStatus> = (0..r.descriptors.len())
            .map(|i| {
                let (limit, unit, name, remaining, reset) = match i {
                    0 => (10, Unit::Minute, "first", 3, 30),
                    1 => (1000, Unit::Hour, "", 999, 1800),
                    _ => return DescriptorStatus::default(),
                };
                DescriptorStatus {
                    code: Code::Ok as i32,
                    current_limit: Some(RateLimit {
                        name: name.to_owned(),
                        requests_per_unit: limit,
                        unit: unit as i32,
                    }),
                    limit_remaining: remaining,
                    duration_until_reset: Some(proto::pb::google::protobuf::Duration {
                        seconds: reset,
                        nanos: 0,
                    }),
                    ..Default::default()
                }
            })
            .collect();
        match verdict.as_str() {
            "error" => Err(tonic::Status::unavailable("told to fail")),
            "over" => Ok(tonic::Response::new(RateLimitResponse {
                overall_code: Code::OverLimit as i32,
                response_headers_to_add: vec![header("x-rls", "over")],
                raw_body: b"rls says no".to_vec(),
                statuses,
                ..Default::default()
            })),
            _ => Ok(tonic::Response::new(RateLimitResponse {
                overall_code: Code::Ok as i32,
                response_headers_to_add: vec![header("x-rls", "ok")],
                request_headers_to_add: vec![header("x-rls-request", "ok")],
                statuses,
                ..Default::default()
            })),
        }
    }
}

impl Rls {
    /// Starts the service on a port of its own.
    pub fn start() -> Rls {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("RLS runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("RLS binds");
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let service = Service { seen: seen.clone() };
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(service))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Rls {
            port,
            seen,
            _runtime: runtime,
        }
    }

    /// What it was asked so far, and forgets it.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}
