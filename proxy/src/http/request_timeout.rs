//! The connection manager's `request_timeout`: the whole request (its head, its body, and its
//! passage through the HTTP filters) must be received within it. Envoy arms it when the stream
//! begins and disarms it once the request is whole and through the filters, or once the
//! response head starts; when it fires first, the request ends with a local reply: 408
//! `request timeout` while the request body is still arriving, 504 after (a filter still
//! holding it), details `request_overall_timeout`, no response flag, counted in
//! `downstream_rq_timeout`.

use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::{Instant, sleep_until};

use super::body_activity::BodyActivity;
use super::local_reply::local_reply;
use crate::access_log::Record;
use crate::body::Body;

/// One request's `request_timeout`.
#[derive(Debug)]
pub struct RequestTimeout {
    at: Instant,
    activity: BodyActivity,
}

impl RequestTimeout {
    /// Arms `limit` (`None`: disabled) for `req`, which starts now; a body still to come is
    /// watched. A request without a body that no filter will see can never time out: `None`.
    pub fn arm(
        limit: Option<Duration>,
        req: &mut Request<Body>,
        filtered: bool,
    ) -> Option<RequestTimeout> {
        let limit = limit?;
        let activity = if http_body::Body::is_end_stream(req.body()) {
            if !filtered {
                return None;
            }
            BodyActivity::headers_only()
        } else {
            let body = std::mem::replace(req.body_mut(), crate::body::empty());
            let (watched, activity) = BodyActivity::watch(body);
            *req.body_mut() = watched;
            activity
        };
        Some(RequestTimeout {
            at: Instant::now() + limit,
            activity,
        })
    }

    /// The request's activity (its body's frames; whether it went through the filters).
    pub fn activity(&self) -> &BodyActivity {
        &self.activity
    }

    /// Completes when the timeout fires: at its deadline, unless the request was whole and
    /// through the filters by then (it never completes then). Whether the request body had
    /// ended.
    pub async fn fired(&self) -> bool {
        sleep_until(self.at).await;
        if self.activity.decoded() {
            std::future::pending::<()>().await;
        }
        self.activity.ended()
    }

    /// Envoy's local reply, and its note in the request's record.
    pub fn reply(request_ended: bool, rec: Option<&mut Record>) -> Response<Body> {
        if let Some(rec) = rec {
            rec.details = Some("request_overall_timeout".into());
        }
        let status = if request_ended {
            StatusCode::GATEWAY_TIMEOUT
        } else {
            StatusCode::REQUEST_TIMEOUT
        };
        local_reply(status, "request timeout")
    }
}
