//! The task that owns the ADS stream: connects, (re)subscribes, answers responses, applies
//! subscription changes, and backs off between streams.

use std::collections::{BTreeSet, VecDeque};
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

/// A request waiting for the rate limit.
struct Queued<R> {
    request: R,
    /// An ACK or NACK, which expects no response.
    answer: bool,
}

/// The requests of the current stream.
struct Outgoing<R> {
    sender: UnboundedSender<R>,
    /// No request was sent on this stream yet.
    first: bool,
    /// Requests the rate limit holds back, oldest first (Envoy's request queue: responses
    /// are still read and applied meanwhile).
    queue: VecDeque<Queued<R>>,
    /// When the rate limit has a token for the oldest queued request.
    retry_at: Option<tokio::time::Instant>,
}

/// The engine: one per [`super::Client`].
pub(super) struct Engine<P: Protocol> {
    protocol: P,
    config: Config,
    handler: Arc<dyn Handler>,
    changes: UnboundedReceiver<Change>,
    shared: Arc<Shared>,
    subscriptions: Subscriptions,
    /// The rate limit's bucket, kept across streams.
    bucket: Option<TokenBucket>,
    /// Types whose request was sent and not answered yet on this stream.
    pending: BTreeSet<String>,
    /// The queue length last reported ([`Event::Queued`]).
    queued: usize,
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
            bucket: config.rate_limit.map(TokenBucket::new),
            config,
            handler,
            changes,
            shared,
            subscriptions: Subscriptions::default(),
            pending: BTreeSet::new(),
            queued: 0,
        };
        tokio::spawn(engine.run()).abort_handle()
    }

    /// Runs streams until every [`super::Client`] is dropped.
    async fn run(mut self) {
        let mut attempts = Attempts::new(self.config.backoff);
        loop {
            let end = self.session().await;
            // What was queued was for the stream that ended; a new one asks afresh.
            self.report_queued(0);
            let (received, error) = match end {
                End::Stopped => break,
                End::Disconnected { received, error } => (received, error),
            };
            if received {
                attempts.reset();
            }
            self.pending.clear();
            self.publish();
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
                    Some(Change::Forget(type_url, name)) => self.protocol.forget(&type_url, &name),
                    Some(change) => {
                        self.subscriptions.apply(change);
                        self.publish();
                    }
                },
            }
        }
    }

    /// One stream, from connecting to its end.
    async fn session(&mut self) -> End {
        let channel = match transport::connect(&self.config.transport, self.config.keep_alive).await
        {
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
            queue: VecDeque::new(),
            retry_at: None,
        };
        // Sent before the call: a server may hold its response headers until it has read
        // a request.
        for request in self.protocol.new_stream(&self.subscriptions) {
            outgoing.queue.push_back(Queued {
                request,
                answer: false,
            });
        }
        self.drain(&mut outgoing);
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
                    self.change(&mut outgoing, change);
                }
                () = token(outgoing.retry_at) => self.drain(&mut outgoing),
            }
        };
        self.shared.stream_opened();
        self.publish();
        info!("xDS: ADS stream up");
        self.handler.event(Event::Connected);
        let mut received = false;
        let end = loop {
            tokio::select! {
                change = self.changes.recv() => {
                    let Some(change) = change else { break End::Stopped };
                    self.change(&mut outgoing, change);
                }
                () = token(outgoing.retry_at) => self.drain(&mut outgoing),
                message = responses.message() => match message {
                    Ok(Some(response)) => {
                        received = true;
                        let answer =
                            self.protocol
                                .respond(response, &self.subscriptions, &*self.handler);
                        match answer {
                            Some(answer) => {
                                self.pending.remove(&answer.push.type_url);
                                log_verdict(&answer.push);
                                self.shared.record(answer.push);
                                self.send(&mut outgoing, answer.request, true);
                            }
                            None => warn!("xDS: ignoring a response for a type not subscribed to"),
                        }
                    }
                    Ok(None) => break End::Disconnected { received, error: StreamError::Closed },
                    Err(status) => break End::Disconnected { received, error: status.into() },
                },
            }
            self.publish();
        };
        self.shared.disconnected();
        if matches!(end, End::Disconnected { .. }) {
            self.handler.event(Event::Disconnected);
        }
        end
    }

    /// Applies a subscription change on a stream: sends the request it needs, if any.
    fn change(&mut self, outgoing: &mut Outgoing<P::Request>, change: Change) {
        if let Change::Forget(type_url, name) = &change {
            self.protocol.forget(type_url, name);
            return;
        }
        if let Some(before) = self.subscriptions.apply(change)
            && let Some(now) = self.subscriptions.get(&before.type_url)
            && let Some(request) = self.protocol.changed(now, &before)
        {
            self.send(outgoing, request, false);
        }
        self.publish();
    }

    /// Queues a request (`answer`: an ACK or NACK) and sends what the rate limit allows.
    fn send(&mut self, outgoing: &mut Outgoing<P::Request>, request: P::Request, answer: bool) {
        outgoing.queue.push_back(Queued { request, answer });
        self.drain(outgoing);
    }

    /// Sends queued requests, oldest first, while the rate limit has tokens; when it holds one
    /// back, counts that and notes when to try again.
    fn drain(&mut self, outgoing: &mut Outgoing<P::Request>) {
        outgoing.retry_at = None;
        while let Some(Queued {
            mut request,
            answer,
        }) = outgoing.queue.pop_front()
        {
            if let Some(bucket) = &mut self.bucket
                && let Err(wait) = bucket.take(Instant::now())
            {
                outgoing.queue.push_front(Queued { request, answer });
                debug!(
                    ?wait,
                    queued = outgoing.queue.len(),
                    "xDS: request rate limited"
                );
                self.handler.event(Event::RateLimited);
                outgoing.retry_at = Some(tokio::time::Instant::now() + wait);
                break;
            }
            if outgoing.first || !self.config.set_node_on_first_message_only {
                request.set_node(&self.config.node);
            }
            outgoing.first = false;
            if !answer {
                self.pending.insert(request.type_url().to_string());
            }
            // A closed stream shows on the response side.
            let _ = outgoing.sender.send(request);
        }
        self.report_queued(outgoing.queue.len());
    }

    /// Tells the handler how many requests wait for the rate limit, when that changed.
    fn report_queued(&mut self, queued: usize) {
        if queued != self.queued {
            self.queued = queued;
            self.handler.event(Event::Queued(queued));
        }
    }

    /// Copies the per-type status where [`super::Client::status`] reads it.
    fn publish(&self) {
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
                    pending: self.pending.contains(&subscription.type_url),
                }
            })
            .collect();
        self.shared.set_types(types);
    }
}

/// Resolves at `at`, when the rate limit has a token for the oldest queued request; never
/// without one.
async fn token(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn log_verdict(push: &crate::Push) {
    match &push.verdict {
        Verdict::Ack => debug!(
            type_url = %push.type_url, version = %push.version, nonce = %push.nonce,
            resources = push.resources.count, added = push.added.count,
            changed = push.changed.count, removed = push.removed.count, "xDS: ACK"
        ),
        Verdict::Nack(reason) => warn!(
            type_url = %push.type_url, version = %push.version, nonce = %push.nonce,
            %reason, "xDS: NACK"
        ),
    }
}
