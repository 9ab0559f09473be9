//! What an inbox handler gets beside its event: the message's ids and headers, and the
//! transaction that records the message handled.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::InboundMessage;

/// The context of an inbox handler: the message's ids and headers, earlier failed attempts, the
/// inbox's state, and the transaction the message is recorded handled in.
///
/// ```no_run
/// # use outbox_runtime::sqlx;
/// # use outbox_runtime::inbox::InboxContext;
/// # use outbox_runtime::OutboxEvent;
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, OutboxEvent)]
/// # #[outbox(aggregate = "order", event_type = "order.placed")]
/// # struct OrderPlaced { #[outbox(id)] order_id: i64, total_cents: i64 }
/// async fn bill(mut ctx: InboxContext, event: OrderPlaced) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
///         .bind(event.order_id)
///         .bind(event.total_cents)
///         .execute(&mut **ctx.tx())
///         .await?;
///     Ok(())
/// }
/// ```
pub struct InboxContext<S = ()> {
    state: S,
    message: Meta,
    attempts: u32,
    /// `Some` until dropped: then it goes back to the inbox, to commit.
    tx: Option<Transaction<'static, Postgres>>,
    back: Option<oneshot::Sender<Transaction<'static, Postgres>>>,
}

/// The message's fields a handler reads, without its payload.
pub(crate) struct Meta {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) version: u32,
    pub(crate) created_at: Option<DateTime<Utc>>,
    pub(crate) headers: serde_json::Value,
}

impl From<&InboundMessage> for Meta {
    fn from(message: &InboundMessage) -> Self {
        Meta {
            event_id: message.event_id,
            aggregate_type: message.aggregate_type.clone(),
            aggregate_id: message.aggregate_id.clone(),
            event_type: message.event_type.clone(),
            version: message.version,
            created_at: message.created_at,
            headers: message.headers.clone(),
        }
    }
}

impl<S> InboxContext<S> {
    pub(crate) fn new(
        state: S,
        message: Meta,
        attempts: u32,
        tx: Transaction<'static, Postgres>,
        back: oneshot::Sender<Transaction<'static, Postgres>>,
    ) -> Self {
        InboxContext { state, message, attempts, tx: Some(tx), back: Some(back) }
    }

    /// The transaction that records the message handled. Write through it (`&mut **ctx.tx()`
    /// is an executor) and emit follow-up events with it: they commit with the record, or not
    /// at all, so a redelivered message finds them done. Do not commit it yourself.
    pub fn tx(&mut self) -> &mut Transaction<'static, Postgres> {
        self.tx.as_mut().expect("the transaction is only taken when the context is dropped")
    }

    /// The inbox's shared state (see [`InboxBuilder::state`](super::InboxBuilder::state)).
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The event's id, as the producer's `emit` returned it.
    pub fn event_id(&self) -> Uuid {
        self.message.event_id
    }

    /// The aggregate type the event was emitted with.
    pub fn aggregate_type(&self) -> &str {
        &self.message.aggregate_type
    }

    /// The aggregate id the event was emitted with.
    pub fn aggregate_id(&self) -> &str {
        &self.message.aggregate_id
    }

    /// The event type (one of an enum family's, say which).
    pub fn event_type(&self) -> &str {
        &self.message.event_type
    }

    /// The version the payload was written at, before any upcasting to the handler's type.
    pub fn version(&self) -> u32 {
        self.message.version
    }

    /// When the event was emitted, if the message says.
    pub fn created_at(&self) -> Option<DateTime<Utc>> {
        self.message.created_at
    }

    /// The message's headers other than the outbox's own, a JSON object of strings.
    pub fn headers(&self) -> &serde_json::Value {
        &self.message.headers
    }

    /// One of those headers.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.message.headers.get(name).and_then(serde_json::Value::as_str)
    }

    /// Failed handler calls for this message before this one.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

impl<S> Drop for InboxContext<S> {
    fn drop(&mut self) {
        if let (Some(tx), Some(back)) = (self.tx.take(), self.back.take()) {
            // If the inbox stopped waiting, dropping the transaction rolls it back.
            let _ = back.send(tx);
        }
    }
}
