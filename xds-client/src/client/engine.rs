//! The task that owns the ADS stream: connects, (re)subscribes, answers responses, applies
//! subscription changes, and backs off between streams.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::AbortHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::{debug, info, warn};

use super::backoff::Attempts;
use super::protocol::{Protocol, Request as _};
use super::rate_limit::TokenBucket;
use super::shared::Shared;
use super::subscriptions::{Change, Subscriptions};
use super::{Config, transport};
use crate::{Event, Handler, TypeStatus, Verdict};

/// Why a stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    /// The channel could not be connected.
    #[error("connecting to the control plane: {0}")]
    Connect(#[from] tonic::transport::Error),
    /// The RPC failed or was refused.
    #[error("ADS stream failed: {0}")]
    Rpc(#[from] tonic::Status),
    /// The server ended the stream.
    #[error("the control plane closed the ADS stream")]
    Closed,
}

/// How a session ended.
enum End {
    /// Every [`super::Client`] is gone.
    Stopped,
    /// The stream ended; `received` says whether a response arrived on it.
    Disconnected { received: bool, error: StreamError },
}

/// The requests of the current stream.
struct Outgoing<R> {
    sender: UnboundedSender<R>,
    /// No request was sent on this stream yet.
    first: bool,
}

/// The engine: one per [`super::Client`].
pub(super) struct Engine<P: Protocol> {
    protocol: P,
    config: Config,
    handler: Arc<dyn Handler>,
    changes: UnboundedReceiver<Change>,
    shared: Arc<Shared>,
    subscriptions: Subscriptions,
}

impl<P: Protocol> Engine<P> {
    /// Spawns an engine speaking `P` on the current tokio runtime.
    pub(super) fn spawn(
        config: Config,
        handler: Arc<dyn Handler>,
        changes: UnboundedReceiver<Change>,
        shared: Arc<Shared>,
    ) -> AbortHandle {
        let engine = Engine {
            protocol: P::default(),
            config,
            handler,
            changes,
            shared,
            subscriptions: Subscriptions::default(),
        };
        tokio::spawn(engine.run()).abort_handle()
    }

    /// Runs streams until every [`super::Client`] is dropped.
    async fn run(mut self) {
        let mut attempts = Attempts::new(self.config.backoff);
        let mut bucket = self.config.rate_limit.map(TokenBucket::new);
        let mut pending = BTreeSet::new();
        loop {
            let (received, error) = match self.session(&mut bucket, &mut pending).await {
                End::Stopped => break,
                End::Disconnected { received, error } => (received, error),
            };
            if received {
                attempts.reset();
            }
            pending.clear();
            self.publish(&pending);
            let delay = attempts.next_delay();
            warn!(%error, ?delay, "xDS: ADS stream down; reconnecting");
            if !self.wait(delay).await {
                break;
            }
        }
        self.shared.disconnected();
    }

    /// Waits `delay`, taking subscription changes meanwhile; `false` when stopped.
    async fn wait(&mut self, delay: std::time::Duration) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => return true,
                change = self.changes.recv() => match change {
                    None => return false,
                    Some(change) => {
                        self.subscriptions.apply(change);
                        self.publish(&BTreeSet::new());
                    }
                },
            }
        }
    }

    /// One stream, from connecting to its end.
    async fn session(
        &mut self,
        bucket: &mut Option<TokenBucket>,
        pending: &mut BTreeSet<String>,
    ) -> End {
        let channel = match transport::connect(&self.config.transport).await {
            Ok(channel) => channel,
            Err(error) => {
                return End::Disconnected {
                    received: false,
                    error: error.into(),
                };
            }
        };
        let (sender, receiver) = unbounded_channel();
        let mut outgoing = Outgoing {
            sender,
            first: true,
        };
        // Queued before the call: a server may hold its response headers until it has read
        // a request.
        for request in self.protocol.new_stream(&self.subscriptions) {
            self.send(&mut outgoing, bucket, pending, request).await;
        }
        // Changes are taken while the call opens: with nothing subscribed yet, such a server
        // answers the call only once a change sends a request.
        let open = P::open(
            channel,
            self.config.service,
            UnboundedReceiverStream::new(receiver),
        );
        tokio::pin!(open);
        let mut responses = loop {
            tokio::select! {
                opened = &mut open => match opened {
                    Ok(responses) => break responses,
                    Err(status) => {
                        return End::Disconnected {
                            received: false,
                            error: status.into(),
                        };
                    }
                },
                change = self.changes.recv() => {
                    let Some(change) = change else { return End::Stopped };
                    self.change(&mut outgoing, bucket, pending, change).await;
                }
            }
        };
        self.shared.stream_opened();
        self.publish(pending);
        info!("xDS: ADS stream up");
        self.handler.event(Event::Connected);
        let mut received = false;
        let end = loop {
            tokio::select! {
                change = self.changes.recv() => {
                    let Some(change) = change else { break End::Stopped };
                    self.change(&mut outgoing, bucket, pending, change).await;
                }
                message = responses.message() => match message {
                    Ok(Some(response)) => {
                        received = true;
                        let answer =
                            self.protocol
                                .respond(response, &self.subscriptions, &*self.handler);
                        match answer {
                            Some(answer) => {
                                let type_url = answer.push.type_url.clone();
                                log_verdict(&answer.push);
                                self.shared.record(answer.push);
                                self.send(&mut outgoing, bucket, pending, answer.request).await;
                                // An ACK or NACK expects no response.
                                pending.remove(&type_url);
                            }
                            None => warn!("xDS: ignoring a response for a type not subscribed to"),
                        }
                    }
                    Ok(None) => break End::Disconnected { received, error: StreamError::Closed },
                    Err(status) => break End::Disconnected { received, error: status.into() },
                },
            }
            self.publish(pending);
        };
        self.shared.disconnected();
        if matches!(end, End::Disconnected { .. }) {
            self.handler.event(Event::Disconnected);
        }
        end
    }

    /// Applies a subscription change on a stream: sends the request it needs, if any.
    async fn change(
        &mut self,
        outgoing: &mut Outgoing<P::Request>,
        bucket: &mut Option<TokenBucket>,
        pending: &mut BTreeSet<String>,
        change: Change,
    ) {
        if let Some(before) = self.subscriptions.apply(change)
            && let Some(now) = self.subscriptions.get(&before.type_url)
            && let Some(request) = self.protocol.changed(now, &before)
        {
            self.send(outgoing, bucket, pending, request).await;
        }
        self.publish(pending);
    }

    /// Sends a request once the rate limit allows, with the node when due.
    async fn send(
        &self,
        outgoing: &mut Outgoing<P::Request>,
        bucket: &mut Option<TokenBucket>,
        pending: &mut BTreeSet<String>,
        mut request: P::Request,
    ) {
        if let Some(bucket) = bucket {
            let mut limited = false;
            while let Err(wait) = bucket.take(Instant::now()) {
                if !limited {
                    limited = true;
                    debug!(?wait, "xDS: request rate limited");
                    self.handler.event(Event::RateLimited);
                }
                tokio::time::sleep(wait).await;
            }
        }
        if outgoing.first || !self.config.set_node_on_first_message_only {
            request.set_node(&self.config.node);
        }
        outgoing.first = false;
        pending.insert(request.type_url().to_string());
        // A closed stream shows on the response side.
        let _ = outgoing.sender.send(request);
    }

    /// Copies the per-type status where [`super::Client::status`] reads it.
    fn publish(&self, pending: &BTreeSet<String>) {
        let types = self
            .subscriptions
            .iter()
            .map(|subscription| {
                let progress = self.protocol.progress(&subscription.type_url);
                let progress = progress.cloned().unwrap_or_default();
                TypeStatus {
                    type_url: subscription.type_url.clone(),
                    wildcard: subscription.wildcard,
                    // Copied after every response: a copy of 10,000 EDS names each time made
                    // a one-endpoint update cost O(clusters).
                    names: subscription
                        .names
                        .iter()
                        .take(crate::PUSH_NAMES)
                        .cloned()
                        .collect(),
                    name_count: subscription.names.len(),
                    acked_version: progress.acked_version,
                    nonce: progress.nonce,
                    pending: pending.contains(&subscription.type_url),
                }
            })
            .collect();
        self.shared.set_types(types);
    }
}

fn log_verdict(push: &crate::Push) {
    match &push.verdict {
        Verdict::Ack => debug!(
            type_url = %push.type_url, version = %push.version, nonce = %push.nonce,
            resources = push.resources.len(), removed = push.removed.len(), "xDS: ACK"
        ),
        Verdict::Nack(reason) => warn!(
            type_url = %push.type_url, version = %push.version, nonce = %push.nonce,
            %reason, "xDS: NACK"
        ),
    }
}
