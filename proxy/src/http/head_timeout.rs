//! The connection manager's timeouts for a request head that is not whole yet:
//! `request_headers_timeout`, and `request_timeout` when it is the shorter. Envoy arms both
//! when its codec starts a request (an HTTP/1 head's first bytes, an HTTP/2 HEADERS frame) and
//! answers 408 when the head has not come whole by then. The HTTP/1 fast path (`h1`), the
//! connections hyper serves (`envoy_errors`) and their HTTP/2 streams (`h2_head`) share it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

use super::HcmStats;
use crate::config::hcm::HcmConfig;

/// Which of the connection manager's timeouts ends a head that is too slow.
#[derive(Debug, Clone, Copy)]
pub(super) enum HeadTimeout {
    /// `request_headers_timeout`.
    Headers,
    /// `request_timeout`, when it is the shorter.
    Request,
}

impl HeadTimeout {
    /// The deadline and the timeout of a head whose first bytes just came; `None` when
    /// neither is set.
    pub(super) fn arm(cfg: &HcmConfig) -> Option<(Instant, HeadTimeout)> {
        let (limit, which) = match (cfg.request_headers_timeout, cfg.request_timeout) {
            (Some(h), Some(r)) if r < h => (r, HeadTimeout::Request),
            (Some(h), _) => (h, HeadTimeout::Headers),
            (None, Some(r)) => (r, HeadTimeout::Request),
            (None, None) => return None,
        };
        Some((Instant::now() + limit, which))
    }

    /// Counts the timeout (its counter, the request and its 408) and gives Envoy's reply
    /// text and response details for it.
    pub(super) fn fire(self, stats: &HcmStats) -> (&'static str, &'static str) {
        let answer = match self {
            HeadTimeout::Headers => {
                stats.rq_header_timeout.inc();
                ("request header timeout", "request_header_timeout")
            }
            HeadTimeout::Request => {
                stats.rq_timeout.inc();
                ("request timeout", "request_overall_timeout")
            }
        };
        stats.rq_total.inc();
        stats.response(http::StatusCode::REQUEST_TIMEOUT.as_u16());
        answer
    }
}

/// A head's timer for an I/O wrapper that sees the head arrive: armed at its first bytes,
/// disarmed once it is whole.
#[derive(Default)]
pub(super) struct HeadTimer {
    /// The running timer and which timeout it is.
    armed: Option<(Pin<Box<Sleep>>, HeadTimeout)>,
}

impl HeadTimer {
    /// Starts the timer, unless it runs already or `cfg` sets neither timeout.
    pub(super) fn start(&mut self, cfg: &HcmConfig) {
        if self.armed.is_none()
            && let Some((at, which)) = HeadTimeout::arm(cfg)
        {
            self.armed = Some((Box::pin(tokio::time::sleep_until(at)), which));
        }
    }

    /// Stops the timer (the head came whole).
    pub(super) fn stop(&mut self) {
        self.armed = None;
    }

    /// Ready with the timeout once the running timer fires (it is then stopped).
    pub(super) fn poll_fired(&mut self, cx: &mut Context<'_>) -> Poll<HeadTimeout> {
        let Some((sleep, which)) = &mut self.armed else {
            return Poll::Pending;
        };
        std::task::ready!(sleep.as_mut().poll(cx));
        let which = *which;
        self.armed = None;
        Poll::Ready(which)
    }
}
