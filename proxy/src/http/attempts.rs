//! Sends a request to a cluster under the router's timeouts and retry policy: one attempt when
//! the route has no retry policy (the body streams through), else as many as Envoy would make
//! (the body replayed from memory), with per-try timeouts and jittered back-off in between.
//! The cluster's `max_stream_duration` limits each attempt too: one reaching it before its
//! response head is reset (retried as a reset) and answered with Envoy's `UMSDR` reply.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::header::HeaderName;
use http::{Request, Response, StatusCode};
use tokio::time::{Instant, timeout_at};

use super::access_log::Pending;
use super::body_activity::BodyActivity;
use super::buffered_body::Replay;
use super::local_reply::UPSTREAM_TIMEOUT;
use super::retry::{Failure, RetryState, Verdict};
use super::timeouts::Timeouts;
use super::trace::AttemptEnd;
use crate::access_log::ResponseFlag;
use crate::body::Body;
use crate::upstream::{Cluster, LbContext, UpstreamBody, UpstreamError};

static ATTEMPT_COUNT: HeaderName = HeaderName::from_static("x-envoy-attempt-count");

/// The request body of an exchange.
pub enum RequestBody {
    /// Streamed once: a single attempt.
    Once(Body),
    /// In memory: replayed on every attempt.
    Replay(Replay),
}

/// A failure the router answers itself.
pub struct LocalFailure {
    /// Status of the answer.
    pub status: StatusCode,
    /// Body of the answer.
    pub body: String,
    /// The cluster's `max_requests` breaker was full: Envoy marks the answer
    /// `x-envoy-overloaded: true`.
    pub overloaded: bool,
    /// Why, for access logs: the response flag and `%RESPONSE_CODE_DETAILS%`.
    pub why: Why,
}

/// What access logs say about a failure.
#[derive(Debug, Clone)]
pub struct Why {
    /// The response flag.
    pub flag: ResponseFlag,
    /// `%RESPONSE_CODE_DETAILS%`.
    pub details: String,
    /// The host the failed attempt went to.
    pub host: Option<std::net::SocketAddr>,
    /// `%UPSTREAM_TRANSPORT_FAILURE_REASON%`.
    pub transport_failure: Option<String>,
}

impl Why {
    /// Envoy's facts for an attempt that failed with `e`.
    fn of(e: &UpstreamError) -> Why {
        let transport_failure = e.transport_failure_reason();
        let details = match (e, e.reset_reason()) {
            (UpstreamError::NoHealthyUpstream, _) => "no_healthy_upstream".to_owned(),
            (UpstreamError::RequestBody { .. }, _) => "downstream_protocol_error".to_owned(),
            (_, Some(r)) => {
                let mut d = format!("upstream_reset_before_response_started{{{r}");
                if let Some(t) = &transport_failure {
                    d.push('|');
                    d.push_str(t);
                }
                d.push('}');
                d.replace(' ', "_")
            }
            (_, None) => "upstream_reset_before_response_started".to_owned(),
        };
        Why {
            flag: ResponseFlag::from_short(e.response_flag())
                .unwrap_or(ResponseFlag::UpstreamConnectionFailure),
            details,
            host: e.host(),
            transport_failure,
        }
    }
}

impl LocalFailure {
    /// Envoy's answer when the route's timeout (or the last per-try timeout) passed.
    fn timeout() -> Self {
        LocalFailure {
            status: StatusCode::GATEWAY_TIMEOUT,
            body: UPSTREAM_TIMEOUT.to_owned(),
            overloaded: false,
            why: Why {
                flag: ResponseFlag::UpstreamRequestTimeout,
                details: "response_timeout".to_owned(),
                host: None,
                transport_failure: None,
            },
        }
    }

    /// Envoy's answer when an attempt reached the cluster's `max_stream_duration` before its
    /// response head: 408 while the request body was still arriving, else 504.
    fn max_stream_duration(request_ended: bool) -> Self {
        LocalFailure {
            status: if request_ended {
                StatusCode::GATEWAY_TIMEOUT
            } else {
                StatusCode::REQUEST_TIMEOUT
            },
            body: "upstream max stream duration reached".to_owned(),
            overloaded: false,
            why: Why {
                flag: ResponseFlag::UpstreamMaxStreamDurationReached,
                details: "upstream_max_stream_duration_reached".to_owned(),
                host: None,
                transport_failure: None,
            },
        }
    }

    /// Envoy's answer when attempt number `attempt` fails with `e` (it says so when earlier
    /// ones were retried).
    pub fn of(e: &UpstreamError, attempt: u32) -> Self {
        let body = match e.reset_reason() {
            Some(r) if attempt > 1 => format!(
                "upstream connect error or disconnect/reset before headers. retried and the latest reset reason: {r}"
            ),
            _ => e.local_reply_body(),
        };
        LocalFailure {
            status: e.local_reply_status(),
            body,
            overloaded: matches!(e, UpstreamError::Overflow),
            why: Why::of(e),
        }
    }
}

/// How an exchange ended.
pub enum Outcome {
    /// The upstream's response head (its body still streaming).
    Response(Response<UpstreamBody>),
    /// A failure answered locally.
    Local(LocalFailure),
    /// The first attempt could not start: the cluster had no healthy host, or its
    /// `max_requests` breaker was full. Envoy decides both while routing, from the head alone.
    NotSent(LocalFailure),
    /// The downstream broke its own request (its body failed): answered like Envoy's codec
    /// (see `router::body_failed`); not charged to the cluster.
    DownstreamBodyFailed,
}

/// One request's trip to a cluster.
pub struct Exchange<'a> {
    /// The cluster.
    pub cluster: &'a Cluster,
    /// Load-balancer inputs (`avoid` grows with `previous_hosts`).
    pub lb: LbContext,
    /// Timeouts in force.
    pub timeouts: Timeouts,
    /// Retry state, when the request may be retried.
    pub retry: Option<RetryState<'a>>,
    /// Send `x-envoy-attempt-count` upstream.
    pub send_attempt_count: bool,
    /// Send `x-envoy-expected-rq-timeout-ms` upstream again on retries (the router sets the
    /// first attempt's).
    pub send_expected_timeout: bool,
    /// Set when a retriable outcome was handed on because `num_retries` was used up (the
    /// `URX` response flag).
    pub retries_exhausted: bool,
    /// How long after the first attempt the latest one started (its timeout headers tell
    /// what was left then).
    pub last_attempt_at: Duration,
    /// The request's record and trace, told of each attempt (its upstream span).
    pub pending: Option<&'a mut Pending>,
    /// The request body's activity, when it was still arriving as the exchange began.
    pub request_body: Option<BodyActivity>,
}

/// Which deadline of an attempt passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    /// The route's timeout (per try, or global).
    Timeout,
    /// The cluster's `max_stream_duration`.
    MaxStreamDuration,
}

/// What one attempt's send came to: a deadline passed, or the cluster's answer.
type Sent = Result<Result<Response<UpstreamBody>, UpstreamError>, Expired>;

impl Exchange<'_> {
    /// Runs the exchange; returns the outcome and the number of attempts made. Borrows the
    /// exchange, which stays in the caller's state, so the future does not hold it twice.
    pub async fn run(&mut self, head: http::request::Parts, body: RequestBody) -> (Outcome, u32) {
        let start = Instant::now();
        let global = self.timeouts.global.map(|t| start + t);
        let (head, replay) = match body {
            RequestBody::Once(b) => {
                self.retry = None;
                // A body already complete cannot fail: most requests pay nothing for the watch.
                let (b, failed) = if http_body::Body::is_end_stream(&b) {
                    (b, crate::body::Failed::default())
                } else {
                    crate::body::watched(b)
                };
                let mut req = Request::from_parts(head, b);
                self.attempt_started(req.headers_mut(), 1);
                return (self.attempt_once(req, start, global, &failed).await, 1);
            }
            RequestBody::Replay(r) => (head, r),
        };
        let mut retrying: Option<RetryHold> = None;
        let mut attempt = 1u32;
        loop {
            let mut req = Request::new(replay.body());
            *req.method_mut() = head.method.clone();
            *req.uri_mut() = head.uri.clone();
            *req.version_mut() = head.version;
            *req.headers_mut() = head.headers.clone();
            self.last_attempt_at = start.elapsed();
            self.attempt_started(req.headers_mut(), attempt);
            let result = self.send(req, attempt, self.last_attempt_at, global).await;
            let mut end = attempt_end(&result);
            let (retriable, failed_host, outcome) = match result {
                Err(Expired::MaxStreamDuration) => {
                    let r = self
                        .retry
                        .as_ref()
                        .is_some_and(|s| s.retriable_failure(Failure::Reset));
                    (r, None, Ok(self.max_stream_duration()))
                }
                Err(_) if global.is_some_and(|g| Instant::now() >= g) => {
                    self.attempt_ended(end);
                    return (self.global_timeout(), attempt);
                }
                Err(_) => {
                    self.cluster.stats().upstream_rq_per_try_timeout().inc();
                    let r = self
                        .retry
                        .as_ref()
                        .is_some_and(|s| s.retriable_failure(Failure::PerTryTimeout));
                    (r, None, Err(()))
                }
                Ok(Err(e)) => {
                    let r = match (Failure::of(&e), &self.retry) {
                        (Some(f), Some(s)) => s.retriable_failure(f),
                        _ => false,
                    };
                    (r, e.host(), Ok(failure(&e, attempt)))
                }
                Ok(Ok(resp)) => {
                    let r = self
                        .retry
                        .as_ref()
                        .is_some_and(|s| s.retriable_response(resp.status(), resp.headers()));
                    (r, None, Ok(Outcome::Response(resp)))
                }
            };
            let stats = self.cluster.stats();
            let Some(state) = self.retry.as_mut() else {
                self.attempt_ended(end);
                return (self.finish(outcome, start), attempt);
            };
            drop(retrying.take());
            let in_flight = &stats.retries_in_flight;
            let limit = self.cluster.config().circuit_breakers[0].retry_limit(
                stats.upstream_rq_active().value(),
                stats.upstream_rq_pending_active().value(),
            );
            let overflow = retriable && u64::from(in_flight.load(Ordering::Relaxed)) >= limit;
            let back_off = match state.decide(retriable, overflow, stats) {
                Verdict::RetryAfter(back_off) => back_off,
                Verdict::LimitExceeded => {
                    self.retries_exhausted = true;
                    self.attempt_ended(end);
                    return (self.finish(outcome, start), attempt);
                }
                Verdict::No => {
                    self.attempt_ended(end);
                    return (self.finish(outcome, start), attempt);
                }
            };
            if let (Some(host), true) = (failed_host, state.avoids_previous_hosts()) {
                self.lb.avoid.push(host);
            }
            end.retried = true;
            self.attempt_ended(end);
            retrying.replace(RetryHold::new(in_flight));
            if let Ok(Outcome::Response(resp)) = &outcome {
                stats.charge_retried(resp.status().as_u16());
            }
            drop(outcome);
            let wait = tokio::time::sleep(back_off);
            if let Some(g) = global {
                if timeout_at(g, wait).await.is_err() {
                    return (self.global_timeout(), attempt);
                }
            } else {
                wait.await;
            }
            attempt += 1;
        }
    }

    /// Sends one attempt, started `elapsed` after the first: attempt-count and
    /// expected-timeout headers, then the request under the per-try (or global) deadline.
    /// `Err` means the deadline passed.
    async fn send(
        &self,
        mut req: Request<Body>,
        attempt: u32,
        elapsed: Duration,
        global: Option<Instant>,
    ) -> Sent {
        if self.send_attempt_count {
            req.headers_mut().insert(
                &ATTEMPT_COUNT,
                super::int_value::int_value(u64::from(attempt)),
            );
        }
        // The first attempt's headers (nothing elapsed) were set by the router before mirrors
        // copied the request; like Envoy, a retry sets them again with what is left.
        if attempt > 1 {
            self.timeouts
                .set_headers(req.headers_mut(), elapsed, self.send_expected_timeout);
        }
        let route = self.per_try_deadline(global).or(global);
        let stream = self
            .cluster
            .config()
            .max_stream_duration
            .map(|d| Instant::now() + d);
        let (deadline, expired) = match (route, stream) {
            (Some(r), Some(s)) if s < r => (Some(s), Expired::MaxStreamDuration),
            (None, Some(s)) => (Some(s), Expired::MaxStreamDuration),
            (r, _) => (r, Expired::Timeout),
        };
        match deadline {
            Some(d) => timeout_at(d, self.cluster.attempt(req, &self.lb))
                .await
                .map_err(|_| expired),
            None => Ok(self.cluster.attempt(req, &self.lb).await),
        }
    }

    async fn attempt_once(
        &mut self,
        req: Request<Body>,
        start: Instant,
        global: Option<Instant>,
        body_failed: &crate::body::Failed,
    ) -> Outcome {
        let result = self.send(req, 1, Duration::ZERO, global).await;
        self.attempt_ended(attempt_end(&result));
        let outcome = match result {
            Err(Expired::MaxStreamDuration) => return self.max_stream_duration(),
            Err(_) if global.is_some_and(|g| Instant::now() >= g) => return self.global_timeout(),
            Err(_) => {
                self.cluster.stats().upstream_rq_per_try_timeout().inc();
                Err(())
            }
            // The request's own body broke: whatever the upstream then reported, the fault is
            // the client's (an HTTP/2 upstream sees it as a reset stream).
            Ok(Err(_)) if body_failed.get() => return Outcome::DownstreamBodyFailed,
            Ok(Err(e)) => Ok(failure(&e, 1)),
            Ok(Ok(resp)) => Ok(Outcome::Response(resp)),
        };
        self.finish(outcome, start)
    }

    /// Tells the request's trace an attempt is about to be sent with `headers`.
    fn attempt_started(&mut self, headers: &mut http::HeaderMap, attempt: u32) {
        if let Some(t) = self.pending.as_deref_mut().and_then(Pending::trace) {
            t.attempt_started(headers, attempt);
        }
    }

    /// Tells the request's trace how the current attempt ended.
    fn attempt_ended(&mut self, end: AttemptEnd) {
        if let Some(t) = self.pending.as_deref_mut().and_then(Pending::trace) {
            t.attempt_ended(end);
        }
    }

    /// The per-try deadline from now, when it comes before the global one.
    fn per_try_deadline(&self, global: Option<Instant>) -> Option<Instant> {
        let per_try = [self.timeouts.per_try, self.timeouts.per_try_idle]
            .into_iter()
            .flatten()
            .min()?;
        let d = Instant::now() + per_try;
        global.is_none_or(|g| d < g).then_some(d)
    }

    /// The outcome handed downstream, its status charged to the cluster (a response records
    /// its `upstream_rq_time`, since `start`, when its body ends); `Err` is a per-try
    /// timeout (Envoy answers 504). A local outcome is an upstream failure: Envoy charges 503.
    fn finish(&self, mut outcome: Result<Outcome, ()>, start: Instant) -> Outcome {
        let stats = self.cluster.stats();
        let status = match &mut outcome {
            Ok(Outcome::Local(f))
                if f.why.flag == ResponseFlag::UpstreamMaxStreamDurationReached =>
            {
                return outcome.unwrap_or_else(|()| Outcome::Local(LocalFailure::timeout()));
            }
            Ok(Outcome::Response(resp)) => {
                resp.body_mut()
                    .time(stats, start.into_std(), self.lb.internal);
                resp.status().as_u16()
            }
            Ok(Outcome::Local(..) | Outcome::NotSent(..) | Outcome::DownstreamBodyFailed) => 503,
            Err(()) => 504,
        };
        stats.charge_status(status, self.lb.internal);
        outcome.unwrap_or_else(|()| Outcome::Local(LocalFailure::timeout()))
    }

    /// An attempt reached the cluster's `max_stream_duration` before its response head:
    /// counted in `upstream_rq_max_duration_reached`; Envoy answers without charging a status
    /// to the cluster.
    fn max_stream_duration(&self) -> Outcome {
        self.cluster
            .stats()
            .upstream_rq_max_duration_reached()
            .inc();
        let ended = self.request_body.as_ref().is_none_or(BodyActivity::ended);
        Outcome::Local(LocalFailure::max_stream_duration(ended))
    }

    fn global_timeout(&self) -> Outcome {
        let stats = self.cluster.stats();
        stats.upstream_rq_timeout().inc();
        stats.charge_status(504, self.lb.internal);
        Outcome::Local(LocalFailure::timeout())
    }
}

/// Counts one retry in flight on its cluster until dropped (the `max_retries` breaker).
struct RetryHold<'a>(&'a AtomicU32);

impl<'a> RetryHold<'a> {
    fn new(in_flight: &'a AtomicU32) -> Self {
        in_flight.fetch_add(1, Ordering::Relaxed);
        RetryHold(in_flight)
    }
}

impl Drop for RetryHold<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How an attempt that came to `sent` ended, for its span (not yet known: whether it is
/// retried).
fn attempt_end(sent: &Sent) -> AttemptEnd {
    match sent {
        Err(expired) => AttemptEnd {
            flag: Some(match expired {
                Expired::Timeout => ResponseFlag::UpstreamRequestTimeout,
                Expired::MaxStreamDuration => ResponseFlag::UpstreamMaxStreamDurationReached,
            }),
            ..AttemptEnd::default()
        },
        Ok(Err(e)) => AttemptEnd {
            host: e.host(),
            flag: Some(Why::of(e).flag),
            not_sent: e.not_started(),
            ..AttemptEnd::default()
        },
        Ok(Ok(resp)) => AttemptEnd {
            answer: Some((resp.status().as_u16(), resp.version())),
            host: resp
                .extensions()
                .get::<crate::upstream::UpstreamHost>()
                .map(|h| h.host),
            ..AttemptEnd::default()
        },
    }
}

/// The outcome of attempt number `attempt` failing with `e`.
fn failure(e: &UpstreamError, attempt: u32) -> Outcome {
    let failure = LocalFailure::of(e, attempt);
    if attempt == 1 && e.not_started() {
        Outcome::NotSent(failure)
    } else {
        Outcome::Local(failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::ResetReason;

    #[test]
    fn only_a_first_attempt_that_could_not_start_is_not_sent() {
        for e in [UpstreamError::NoHealthyUpstream, UpstreamError::Overflow] {
            assert!(
                matches!(failure(&e, 1), Outcome::NotSent(f) if f.status == 503),
                "{e}"
            );
            assert!(
                matches!(failure(&e, 2), Outcome::Local(f) if f.status == 503),
                "{e}"
            );
        }
        let reset = UpstreamError::Reset {
            host: "127.0.0.1:1".parse().unwrap(),
            reason: ResetReason::ConnectionTermination,
            detail: String::new(),
        };
        assert!(matches!(failure(&reset, 1), Outcome::Local(..)));
    }
}
