//! `envoy.filters.http.grpc_stats`: per-call gRPC stats in the route's cluster, as Envoy's
//! gRPC context names them: `cluster.<cluster>.grpc.<service>.<method>.` (or
//! `cluster.<cluster>.grpc.` for calls without their own names) followed by the
//! `grpc-status` value as it comes (any value), `success` (`0`) or `failure`, and `total`, charged for each
//! `grpc-status` in the response's headers or trailers; `request_message_count` and
//! `response_message_count` as gRPC frames start in the bodies; `upstream_rq_time` when the
//! response ends (with `enable_upstream_stats`).
//!
//! Only routes to a fixed cluster are counted: with a header or weighted clusters the filter
//! does not know which cluster the router will pick, and counts nothing. Under
//! `emit_filter_state` every gRPC call's message counts are left for the filters after it
//! ([`MessageCounts`], Envoy's `GrpcStatsObject`), from its first message on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use http::{HeaderMap, Response};
use http_body_util::BodyExt;

use super::{Encoder, Encoders, FilterRequest};
use crate::body::Body;
use crate::config::http_filter::grpc_stats::{GrpcStatsConfig, PerMethod};
use crate::http::local_reply::is_grpc;
use crate::route::action::ClusterSpecifier;
use crate::stats::keyed::Keyed;
use crate::stats::{Counter, Histogram, Store};

/// The filter's runtime.
#[derive(Debug)]
pub(super) struct GrpcStats {
    config: Arc<GrpcStatsConfig>,
    store: Store,
    /// The stats of each prefix calls have had, so that a call formats one name (its
    /// prefix) and its counters are neither named again nor looked up in the store.
    prefixes: Keyed<Arc<PrefixStats>>,
}

/// The stats under one prefix, each made when first charged (as Envoy's are).
#[derive(Debug)]
struct PrefixStats {
    store: Store,
    /// `cluster.<cluster>.grpc.` with `<service>.<method>.` when the call has its own names.
    prefix: Box<str>,
    counters: Keyed<Counter>,
    upstream_rq_time: std::sync::OnceLock<Histogram>,
}

/// One counted call: its stats (when it has them), and when it started.
#[derive(Debug)]
pub(super) struct Call {
    stats: Option<Arc<PrefixStats>>,
    started: Instant,
    upstream_stats: bool,
    /// Its message counts, when the filter emits them (`emit_filter_state`).
    emitted: Option<Arc<MessageCounts>>,
}

/// A call's message counts as `emit_filter_state` leaves them for the filters after
/// grpc_stats (Envoy's `GrpcStatsObject` filter state): read by Istio's `istio.stats`.
#[derive(Debug, Default)]
pub struct MessageCounts {
    /// Whether a grpc_stats filter counts into it.
    pub emitted: AtomicBool,
    /// The request's messages so far.
    pub request: AtomicU64,
    /// The response's.
    pub response: AtomicU64,
}

impl GrpcStats {
    /// The runtime of `config`, charging stats in `store`.
    pub(super) fn new(config: &Arc<GrpcStatsConfig>, store: &Store) -> Self {
        GrpcStats {
            config: config.clone(),
            store: store.clone(),
            prefixes: Keyed::default(),
        }
    }

    /// Starts counting a gRPC call: its stats when it goes to a fixed cluster and its path
    /// names a service and method, its messages for the filters after this one under
    /// `emit_filter_state`; its request messages now, its response when it comes.
    pub(super) fn decode(&self, req: &mut FilterRequest<'_>, encoders: &mut Encoders) {
        if !is_grpc(req.headers) {
            return;
        }
        let stats = self.call_stats(req);
        let emitted = self
            .config
            .emit_filter_state
            .then(|| req.grpc_messages.get_or_insert_with(Arc::default).clone());
        if stats.is_none() && emitted.is_none() {
            return;
        }
        let call = Arc::new(Call {
            stats,
            started: Instant::now(),
            upstream_stats: self.config.upstream_stats,
            emitted,
        });
        let body = std::mem::replace(req.body, crate::body::empty());
        let emitted = call.emitted.clone();
        *req.body = counted(
            body,
            FrameCounter::default(),
            call.counter("request_message_count"),
            move |n| emit(emitted.as_deref(), |c| &c.request, n),
            None,
        );
        encoders.0.push(Encoder::GrpcStats(call));
    }

    /// The stats of a call to a fixed cluster whose path names a service and method.
    fn call_stats(&self, req: &FilterRequest<'_>) -> Option<Arc<PrefixStats>> {
        let cluster = req
            .route
            .and_then(|r| r.route.forward())
            .and_then(|f| match &f.cluster {
                ClusterSpecifier::Name(n) => Some(n.as_str()),
                _ => None,
            })?;
        let (service, method) = service_and_method(req.path)?;
        let names = match &self.config.methods {
            PerMethod::All if self.config.replace_dots => {
                Some((service.replace('.', "_"), method.to_owned()))
            }
            PerMethod::All => Some((service.to_owned(), method.to_owned())),
            PerMethod::Allowlist(list) => {
                let key = (service.to_owned(), method.to_owned());
                list.contains(&key).then_some(key)
            }
        };
        let prefix = match names {
            Some((s, m)) => format!("cluster.{cluster}.grpc.{s}.{m}."),
            None => format!("cluster.{cluster}.grpc."),
        };
        Some(self.prefixes.get(&prefix, || {
            Arc::new(PrefixStats {
                store: self.store.clone(),
                prefix: prefix.as_str().into(),
                counters: Keyed::default(),
                upstream_rq_time: std::sync::OnceLock::new(),
            })
        }))
    }
}

/// Adds `n` messages to the side `side` picks of `counts`, which are emitted from the first
/// message on (as Envoy writes its filter state).
fn emit(counts: Option<&MessageCounts>, side: fn(&MessageCounts) -> &AtomicU64, n: u64) {
    if let Some(c) = counts {
        side(c).fetch_add(n, Ordering::Relaxed);
        c.emitted.store(true, Ordering::Relaxed);
    }
}

impl PrefixStats {
    fn counter(&self, name: &str) -> Counter {
        self.counters.get(name, || {
            self.store.counter(&format!("{}{name}", self.prefix))
        })
    }
}

impl Call {
    /// Its counter `name`, when the call has stats.
    fn counter(&self, name: &str) -> Option<Counter> {
        self.stats.as_ref().map(|s| s.counter(name))
    }

    /// Charges a `grpc-status` found in `headers`: its own counter, `success` or `failure`,
    /// and `total`.
    fn charge_status(&self, headers: &HeaderMap) {
        let (Some(stats), Some(status)) = (&self.stats, headers.get("grpc-status")) else {
            return;
        };
        let status = String::from_utf8_lossy(status.as_bytes());
        stats.counter(&status).inc();
        stats
            .counter(if status == "0" { "success" } else { "failure" })
            .inc();
        stats.counter("total").inc();
    }

    /// Records `upstream_rq_time` when asked to.
    fn ended(&self) {
        if let Some(stats) = self.stats.as_ref().filter(|_| self.upstream_stats) {
            let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            stats
                .upstream_rq_time
                .get_or_init(|| {
                    stats
                        .store
                        .histogram(&format!("{}upstream_rq_time", stats.prefix))
                })
                .record(ms);
        }
    }

    /// Charges the response's status (headers, then trailers) and counts its messages.
    pub(super) fn encode(self: &Arc<Self>, resp: &mut Response<Body>) {
        self.charge_status(resp.headers());
        if http_body::Body::is_end_stream(resp.body()) {
            self.ended();
            return;
        }
        let grpc = resp.status() == http::StatusCode::OK && is_grpc(resp.headers());
        let body = std::mem::replace(resp.body_mut(), crate::body::empty());
        let frames = FrameCounter {
            disabled: !grpc,
            ..FrameCounter::default()
        };
        let messages = self.counter("response_message_count");
        let emitted = self.emitted.clone();
        let also = move |n| emit(emitted.as_deref(), |c| &c.response, n);
        *resp.body_mut() = counted(body, frames, messages, also, Some(self.clone()));
    }
}

/// `/<service>/<method>` (empty segments skipped, query dropped), as Envoy resolves a gRPC
/// path.
fn service_and_method(path: &str) -> Option<(&str, &str)> {
    let path = path.split('?').next().unwrap_or_default();
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    let (service, method) = (parts.next()?, parts.next()?);
    parts.next().is_none().then_some((service, method))
}

/// Counts gRPC frames as they start in a stream of bytes (a 5-byte prefix, then the length
/// it gives).
#[derive(Debug, Default)]
struct FrameCounter {
    /// Bytes of the current frame still to come (prefix and message).
    remaining: u64,
    /// The prefix bytes read so far of the frame being started.
    prefix: Vec<u8>,
    /// Set for a body that is not gRPC.
    disabled: bool,
}

impl FrameCounter {
    /// Reads `data`; answers how many frames started in it.
    fn inspect(&mut self, mut data: &[u8]) -> u64 {
        let mut started = 0;
        while !self.disabled && !data.is_empty() {
            if self.remaining > 0 {
                let n = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.remaining -= n as u64;
                data = &data[n..];
                continue;
            }
            if self.prefix.is_empty() {
                started += 1;
            }
            let n = (5 - self.prefix.len()).min(data.len());
            self.prefix.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.prefix.len() == 5 {
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]);
                self.remaining = u64::from(len);
                self.prefix.clear();
            }
        }
        started
    }
}

/// `body` with its gRPC messages counted in `messages` (when the call has stats) and told to
/// `also`; a response's (with its `call`) also charges its trailers' status and ends the call.
fn counted(
    body: Body,
    mut frames: FrameCounter,
    messages: Option<Counter>,
    also: impl Fn(u64) + Send + 'static,
    call: Option<Arc<Call>>,
) -> Body {
    body.map_frame(move |frame| {
        if let Some(data) = frame.data_ref() {
            let n = frames.inspect(data);
            if n > 0 {
                if let Some(m) = &messages {
                    m.add(n);
                }
                also(n);
            }
        } else if let (Some(trailers), Some(call)) = (frame.trailers_ref(), &call) {
            call.charge_status(trailers);
            call.ended();
        }
        frame
    })
    .boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_counted_as_they_start() {
        let mut c = FrameCounter::default();
        assert_eq!(c.inspect(&[0, 0, 0, 0, 2, 1]), 1);
        assert_eq!(c.inspect(&[1, 0, 0, 0, 0, 0, 0]), 2);
        assert_eq!(c.inspect(&[0, 0, 0, 1]), 0);
        assert_eq!(c.inspect(&[9, 0]), 1);
    }

    #[test]
    fn paths_name_service_and_method() {
        assert_eq!(service_and_method("/a.B/C?x"), Some(("a.B", "C")));
        assert_eq!(service_and_method("/a/b/c"), None);
        assert_eq!(service_and_method("/a"), None);
    }
}
