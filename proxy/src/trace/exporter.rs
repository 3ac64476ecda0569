//! Batching spans off the request path: a request hands its finished spans to the tracer's
//! queue (a short lock, never I/O) and a flushing task exports them when `min_flush_spans`
//! are waiting or the flush interval passes. A collector that is slow or gone costs the
//! flushing task only; spans beyond the queue's bound are dropped and counted.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::span::Span;
use crate::config::tracing::{Flush, Provider};
use crate::stats::{Counter, Store};
use crate::upstream::ClusterManager;

/// Spans a queue holds at most (OpenTelemetry's default `max_cache_size`).
const MAX_QUEUED: usize = 1024;

/// A tracer's counters, under `tracing.opentelemetry.` or `tracing.zipkin.` (an export's
/// own request is counted by its cluster, as any request is).
#[derive(Debug, Clone)]
struct Stats {
    /// `spans_sent`: spans handed to an export.
    spans_sent: Counter,
    /// `timer_flushed`: flushes the interval timer caused.
    timer_flushed: Counter,
    /// Zipkin's report outcomes (OpenTelemetry counts none).
    reports: Option<Reports>,
}

/// Zipkin's `reports_*` counters.
#[derive(Debug, Clone)]
struct Reports {
    /// `reports_sent`: the collector answered 202.
    sent: Counter,
    /// `reports_dropped`: it answered something else, or was not reached (Envoy's async
    /// client then answers with its router's 503 or 504).
    dropped: Counter,
    /// `reports_failed`: the answer was cut off.
    failed: Counter,
    /// `reports_skipped_no_cluster`: the collector cluster does not exist.
    skipped_no_cluster: Counter,
}

/// Why a batch did not reach the collector, as Envoy counts it.
#[derive(Debug)]
pub enum Failure {
    /// The collector cluster does not exist (`reports_skipped_no_cluster`).
    NoCluster,
    /// The collector answered other than 202, or the status Envoy's router gives a request
    /// it could not send (`reports_dropped`).
    Rejected(u16),
    /// The request failed otherwise: an answer cut off, or one that could not be built
    /// (`reports_failed`).
    Failed(String),
}

/// A running tracer: its queue and the task that flushes it.
#[derive(Debug)]
pub struct Exporter {
    queue: Mutex<Vec<Span>>,
    wake: Notify,
    min_spans: usize,
    /// Spans the full queue refused (OpenTelemetry's `spans_dropped`).
    dropped: Option<Counter>,
}

impl Exporter {
    /// Starts the tracer `provider` on the current tokio runtime.
    pub fn start(
        provider: &Provider,
        flush: Flush,
        clusters: ClusterManager,
        store: &Store,
        local: &super::LocalInfo,
    ) -> Arc<Exporter> {
        let stats = match provider {
            Provider::OpenTelemetry(_) => Stats {
                spans_sent: store.counter("tracing.opentelemetry.spans_sent"),
                timer_flushed: store.counter("tracing.opentelemetry.timer_flushed"),
                reports: None,
            },
            Provider::Zipkin(_) => Stats {
                spans_sent: store.counter("tracing.zipkin.spans_sent"),
                timer_flushed: store.counter("tracing.zipkin.timer_flushed"),
                reports: Some(Reports {
                    sent: store.counter("tracing.zipkin.reports_sent"),
                    dropped: store.counter("tracing.zipkin.reports_dropped"),
                    failed: store.counter("tracing.zipkin.reports_failed"),
                    skipped_no_cluster: store.counter("tracing.zipkin.reports_skipped_no_cluster"),
                }),
            },
        };
        // Zipkin has no counter for spans a full queue refuses.
        let dropped = match provider {
            Provider::OpenTelemetry(_) => {
                Some(store.counter("tracing.opentelemetry.spans_dropped"))
            }
            Provider::Zipkin(_) => None,
        };
        let exporter = Arc::new(Exporter {
            queue: Mutex::new(Vec::new()),
            wake: Notify::new(),
            min_spans: flush.min_spans.max(1),
            dropped,
        });
        let sink = match provider {
            Provider::OpenTelemetry(p) => Sink::Otel(super::otel::Client::new(p.clone())),
            Provider::Zipkin(p) => Sink::Zipkin(super::zipkin::Client::new(p.clone(), local)),
        };
        tokio::spawn(flushing(
            Arc::downgrade(&exporter),
            sink,
            flush,
            clusters,
            stats,
        ));
        exporter
    }

    /// Queues a finished span (reported only when sampled).
    pub fn submit(&self, span: Span) {
        if !span.sampled {
            return;
        }
        let full = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() >= MAX_QUEUED {
                drop(q);
                if let Some(d) = &self.dropped {
                    d.inc();
                }
                return;
            }
            q.push(span);
            q.len() >= self.min_spans
        };
        if full {
            self.wake.notify_one();
        }
    }

    /// The next batch: `min_flush_spans` of them when the count triggered the flush (as
    /// Envoy flushes each time its buffer reaches the count), all of them on the timer.
    fn take(&self, all: bool) -> Vec<Span> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if all || q.len() <= self.min_spans {
            return std::mem::take(&mut *q);
        }
        let rest = q.split_off(self.min_spans);
        std::mem::replace(&mut *q, rest)
    }

    /// Whether a full batch is waiting.
    fn full(&self) -> bool {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).len() >= self.min_spans
    }
}

/// Where a tracer's batches go.
enum Sink {
    Otel(super::otel::Client),
    Zipkin(super::zipkin::Client),
}

/// The flushing task: exports a batch when told the queue is full or when the interval
/// passes; ends with the tracer.
async fn flushing(
    exporter: std::sync::Weak<Exporter>,
    mut sink: Sink,
    flush: Flush,
    clusters: ClusterManager,
    stats: Stats,
) {
    loop {
        let batch = {
            let Some(e) = exporter.upgrade() else { return };
            let timer = tokio::time::sleep(flush.interval);
            let all = if e.full() {
                false
            } else {
                tokio::select! {
                    () = e.wake.notified() => false,
                    () = timer => {
                        stats.timer_flushed.inc();
                        true
                    }
                }
            };
            e.take(all)
        };
        if batch.is_empty() {
            continue;
        }
        stats.spans_sent.add(batch.len() as u64);
        let result = match &mut sink {
            Sink::Otel(c) => c.export(&clusters, &batch).await.map_err(Failure::Failed),
            Sink::Zipkin(c) => c.export(&clusters, &batch).await,
        };
        let Some(r) = &stats.reports else {
            if let Err(why) = result {
                tracing::debug!(error = ?why, spans = batch.len(), "span export failed");
            }
            continue;
        };
        match result {
            Ok(()) => r.sent.inc(),
            Err(Failure::Rejected(status)) => {
                r.dropped.inc();
                tracing::debug!(status, spans = batch.len(), "collector refused spans");
            }
            Err(Failure::NoCluster) => r.skipped_no_cluster.inc(),
            Err(Failure::Failed(why)) => {
                r.failed.inc();
                tracing::debug!(error = %why, spans = batch.len(), "span export failed");
            }
        }
    }
}
