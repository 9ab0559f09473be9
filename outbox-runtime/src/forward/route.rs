//! The relay's route to a sink: maps each leased row to a message, and gathers the messages of
//! deliveries running at once into one batch, so a batch is published with its confirmations
//! awaited together rather than one round trip per message.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};
use tokio::task::{AbortHandle, JoinSet};

use crate::error::BoxError;
use crate::forward::{
    Forward, OutboundMessage, Sink, SinkError, SinkErrorKind, SinkHealth, Template, CONFIRM_TIMEOUT,
};
use crate::relay::RowMeta;

/// Most messages published in one batch.
const MAX_BATCH: usize = 500;

type Pending = (OutboundMessage, oneshot::Sender<Result<(), SinkError>>);

pub(crate) struct ForwardRoute {
    forward: Forward,
    /// The forward's destination, checked by the relay's `build`.
    destination: Template,
    health: Arc<SinkHealth>,
    /// The batcher's inbox, started with the first delivery (on the relay's runtime), and the
    /// batcher itself, stopped with the route (when the relay's run ends), its publishes with it.
    batcher: OnceLock<(mpsc::UnboundedSender<Pending>, AbortHandle)>,
}

impl Drop for ForwardRoute {
    fn drop(&mut self) {
        if let Some((_, batcher)) = self.batcher.get() {
            batcher.abort();
        }
    }
}

impl ForwardRoute {
    pub(crate) fn new(forward: Forward, destination: Template, health: Arc<SinkHealth>) -> Self {
        ForwardRoute { forward, destination, health, batcher: OnceLock::new() }
    }

    fn batcher(&self) -> &mpsc::UnboundedSender<Pending> {
        let (inbox, _) = self.batcher.get_or_init(|| {
            let (sender, inbox) = mpsc::unbounded_channel();
            let batcher = tokio::spawn(batch(self.forward.sink.clone(), inbox));
            (sender, batcher.abort_handle())
        });
        inbox
    }

    /// The message for a row (see the mapping in the module docs).
    fn message(&self, meta: &RowMeta, payload: &str) -> OutboundMessage {
        let (aggregate_type, event_type) = (meta.aggregate_type.as_str(), meta.event_type.as_str());
        let created_at = meta.created_at.to_rfc3339();
        let destination = self.destination.render(aggregate_type, event_type, &meta.aggregate_id);
        let mut headers: Vec<(String, String)> = if self.forward.cloudevents {
            vec![
                ("ce-id".into(), meta.event_id.to_string()),
                ("ce-type".into(), event_type.into()),
                ("ce-source".into(), format!("/{aggregate_type}")),
                ("ce-subject".into(), meta.aggregate_id.clone()),
                ("ce-time".into(), created_at),
                ("ce-specversion".into(), "1.0".into()),
                ("ce-eventversion".into(), meta.version.to_string()),
            ]
        } else {
            vec![
                ("outbox-event-id".into(), meta.event_id.to_string()),
                ("outbox-event-type".into(), event_type.into()),
                ("outbox-aggregate-type".into(), aggregate_type.into()),
                ("outbox-aggregate-id".into(), meta.aggregate_id.clone()),
                ("outbox-created-at".into(), created_at),
                ("outbox-event-version".into(), meta.version.to_string()),
            ]
        };
        if let Some(emitted) = meta.headers.as_object() {
            headers.extend(emitted.iter().map(|(name, value)| {
                let value = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
                (name.clone(), value)
            }));
        }
        OutboundMessage {
            destination,
            id: meta.event_id,
            key: meta.aggregate_id.clone(),
            headers,
            content_type: "application/json",
            payload: payload.as_bytes().to_vec(),
        }
    }
}

/// How forwarding one row ended.
pub(crate) enum Forwarded {
    /// The broker confirmed the message.
    Confirmed,
    /// The broker was unavailable (why): not the event's failure.
    Unavailable(String),
    /// The broker refused the message (or the batcher lost it): a failed attempt.
    Failed(BoxError),
}

impl ForwardRoute {
    /// Sends the message for a row whose payload is `payload` (as stored); resolves with how
    /// that ended. Nothing is sent while the sink is unavailable.
    pub(crate) fn forward(
        &self,
        meta: &RowMeta,
        payload: &str,
    ) -> impl Future<Output = Forwarded> + Send + 'static {
        let sent = self.health.is_available().then(|| {
            let (done, outcome) = oneshot::channel();
            (self.batcher().send((self.message(meta, payload), done)), outcome)
        });
        let health = self.health.clone();
        async move {
            // Queued before the sink went down: back to pending untried.
            let Some((sent, outcome)) = sent else {
                return Forwarded::Unavailable("the sink is unavailable".to_owned());
            };
            if sent.is_err() {
                return Forwarded::Failed("the forwarding batcher stopped".into());
            }
            match outcome.await {
                Ok(Ok(())) => Forwarded::Confirmed,
                Ok(Err(error)) if error.kind() == SinkErrorKind::Unavailable => {
                    health.went_down(&error);
                    Forwarded::Unavailable(error.to_string())
                }
                Ok(Err(refused)) => Forwarded::Failed(refused.into()),
                // The publishing task died (a sink that panicked): counted, so it cannot repeat
                // forever.
                Err(_) => Forwarded::Failed("the broker's confirmation was lost".into()),
            }
        }
    }
}

/// Publishes what the deliveries sent as batches, each in a task of its own, so the next
/// batch gathers while the broker confirms the last. A batch is whatever is waiting when the
/// previous one went out: no timer holds a message back (under load batches grow by
/// themselves; a linger of 1 ms kept every delivery in lockstep with the slowest).
async fn batch(sink: Arc<dyn Sink>, mut inbox: mpsc::UnboundedReceiver<Pending>) {
    // Aborted with the batcher.
    let mut publishing = JoinSet::new();
    while let Some(first) = inbox.recv().await {
        while publishing.try_join_next().is_some() {}
        let mut pending = vec![first];
        while pending.len() < MAX_BATCH {
            match inbox.try_recv() {
                Ok(next) => pending.push(next),
                Err(_) => break,
            }
        }
        let sink = sink.clone();
        publishing.spawn(async move {
            let (messages, senders): (Vec<_>, Vec<_>) = pending.into_iter().unzip();
            let published = tokio::time::timeout(CONFIRM_TIMEOUT, sink.send(&messages)).await;
            let timed_out = published.is_err();
            let mut outcomes = published.unwrap_or_default().into_iter();
            for (message, sender) in messages.iter().zip(senders) {
                let outcome = outcomes.next().unwrap_or_else(|| {
                    let unknown = if timed_out {
                        "no confirmation from the broker within the publish timeout"
                    } else {
                        "the sink reported no outcome for this message"
                    };
                    // Not the message's fault, and it may have arrived: sent again later
                    // under the same message id.
                    Err(SinkError::unavailable(&message.destination, unknown))
                });
                let _ = sender.send(outcome);
            }
        });
    }
}
