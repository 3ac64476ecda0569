//! What runs an ADS stream of either variant: requests and new snapshots in, responses out.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::log::EventLog;
use super::peer::Peer;
use super::snapshot::{Snapshot, push_order};

/// One variant's stream state (SotW, Delta).
pub(crate) trait AdsStream: Send + 'static {
    /// What the client sends.
    type Request: Send + 'static;
    /// What the server sends.
    type Response: Send + 'static;

    /// A stream that has received nothing yet.
    fn new() -> Self;

    /// The stream's client.
    fn peer(&self) -> &Peer;

    /// Handles a request; answers the responses to send (none or one). `snapshot` is `None`
    /// until the server has one: the subscription is kept and answered once it comes.
    fn on_request(
        &mut self,
        request: Self::Request,
        snapshot: Option<&Snapshot>,
        log: &EventLog,
    ) -> Vec<Self::Response>;

    /// The types subscribed to on the stream.
    fn type_urls(&self) -> impl Iterator<Item = &str>;

    /// Adds the response `type_url` needs to `out`, and what it entails for other types.
    fn respond_type(&mut self, type_url: &str, snapshot: &Snapshot, out: &mut Vec<Self::Response>);

    /// Logs a response about to be sent.
    fn log_response(&self, response: &Self::Response);

    /// The response `type_url` needs after a request, once there is a snapshot.
    fn respond_to_request(
        &mut self,
        type_url: &str,
        snapshot: Option<&Snapshot>,
    ) -> Vec<Self::Response> {
        let mut out = Vec::new();
        if let Some(snapshot) = snapshot {
            self.respond_type(type_url, snapshot, &mut out);
        }
        out
    }

    /// Handles a new snapshot: a response for each subscribed type that has something new for
    /// this client, in push order.
    fn on_snapshot(&mut self, snapshot: &Snapshot) -> Vec<Self::Response> {
        let order: Vec<String> = push_order(self.type_urls())
            .into_iter()
            .map(str::to_owned)
            .collect();
        let mut out = Vec::new();
        for type_url in order {
            self.respond_type(&type_url, snapshot, &mut out);
        }
        out
    }
}

/// Runs one stream: requests in, responses out, until either side ends.
pub(crate) async fn run<S: AdsStream>(
    shared: Arc<super::Shared>,
    mut requests: tonic::Streaming<S::Request>,
    out: mpsc::Sender<Result<S::Response, tonic::Status>>,
) {
    let mut stream = S::new();
    let mut snapshots = shared.snapshot.subscribe();
    loop {
        let responses = tokio::select! {
            req = requests.message() => match req {
                Ok(Some(req)) => {
                    let snapshot = snapshots.borrow().clone();
                    stream.on_request(req, snapshot.as_deref(), &shared.log)
                }
                Ok(None) => break,
                Err(status) => {
                    let peer = stream.peer();
                    tracing::debug!(node = %peer.node_id, %status, "{} stream error",
                        peer.protocol().label());
                    break;
                }
            },
            changed = snapshots.changed() => {
                if changed.is_err() {
                    break;
                }
                let snapshot = snapshots.borrow_and_update().clone();
                match snapshot {
                    Some(s) => stream.on_snapshot(&s),
                    None => Vec::new(),
                }
            }
        };
        for response in responses {
            stream.log_response(&response);
            if out.send(Ok(response)).await.is_err() {
                return;
            }
        }
    }
    let peer = stream.peer();
    tracing::info!(node = %peer.node_id, "{} stream closed", peer.protocol().label());
}
