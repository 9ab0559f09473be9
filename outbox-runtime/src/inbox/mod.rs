//! The inbox: events that arrive from a broker, each handled once however often the broker
//! delivers it.
//!
//! A service that consumes what another service's relay forwarded has the mirror of the
//! producer's problem: the broker redelivers (after a consumer crash, an acknowledgement lost,
//! a rebalance), and the effect must happen once. [`Inbox::receive`] runs the message's typed
//! handler in a database transaction that also records the message's event id for this
//! consumer in `outbox.inbox`: the effect and the record commit together. A message whose id is
//! recorded handled is a duplicate, and its handler is not called again.
//!
//! Acknowledge the message to the broker only after `receive` returned, as [`Received`] says:
//!
//! | `receive` returned | tell the broker |
//! |---|---|
//! | `Ok(Received::Handled)`, `Ok(Received::Duplicate)`, `Ok(Received::Dead)` | acknowledge |
//! | `Ok(Received::Failed { retry_in, .. })`, `Ok(Received::Snoozed { delay })` | deliver again after that delay (a negative acknowledgement with a delay) |
//! | `Ok(Received::NoHandler)` | acknowledge, if this consumer is the only one meant to read the type |
//! | `Err(InboxError::Database(_))` | deliver again: the database failed, not the message, and no attempt was counted |
//! | `Err(InboxError::InvalidMessage(_))` (from [`InboundMessage::from_headers`]) | acknowledge or terminate, and log it: it can never be handled |
//!
//! A handler that fails has its attempt counted in the inbox (not by the broker, whose
//! redelivery counts differ): after `max_attempts` failures, or at once when it returns
//! [`Reject`](crate::Reject), the message is dead, kept with its payload, headers and last
//! error in `outbox.inbox`, and acknowledged so it no longer blocks the subscription.
//!
//! Handled rows are what make redeliveries duplicates: keep them at least as long as the
//! broker may redeliver (JetStream's `duplicate_window` and its redelivery of unacknowledged
//! messages, Kafka's retention of uncommitted offsets), then delete them with
//! [`Inbox::purge_handled`].

mod context;
pub mod dead_letters;
#[cfg(feature = "kafka")]
pub mod kafka;
mod message;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;

use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

pub use context::InboxContext;
pub use message::{InboundMessage, InvalidMessage};

use crate::decode::{read, DecodeError, JsonUpcasters};
use crate::error::{is_unavailable, BoxError, ErrorChain};
use crate::event::OutboxEvent;
use crate::relay::{json_upcasters, panic_text, Backoff, BuildError, Upcaster, Verdict};
use crate::store::inbox::{self as store, InboxFailure, InboxKey};

/// The relay's default too.
const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// Handles messages from a broker once each, for one named consumer. Cheap to clone.
///
/// ```no_run
/// # use outbox_runtime::sqlx;
/// # use outbox_runtime::inbox::{Inbox, InboxContext, InboundMessage, Received};
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
///
/// # async fn run(pool: sqlx::PgPool, headers: Vec<(String, String)>, payload: Vec<u8>) -> Result<(), Box<dyn std::error::Error>> {
/// let inbox = Inbox::builder(pool, "billing").handler(bill).build()?;
/// // For each message the broker delivers:
/// let message = InboundMessage::from_headers(headers.iter().map(|(n, v)| (n.as_str(), v.as_str())), &payload)?;
/// match inbox.receive(&message).await? {
///     Received::Failed { retry_in, .. } => { /* negative-acknowledge, redeliver after retry_in */ }
///     Received::Snoozed { delay } => { /* the same, after delay */ }
///     _ => { /* acknowledge */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Inbox<S = ()> {
    shared: Arc<Shared<S>>,
}

struct Shared<S> {
    pool: PgPool,
    consumer: String,
    state: S,
    routes: HashMap<(&'static str, &'static str), Arc<dyn Route<S>>>,
    max_attempts: u32,
    backoff: Backoff,
    upcasters: JsonUpcasters,
}

/// Builds an [`Inbox`]: its handlers, state and retry policy.
#[must_use = "a builder does nothing until `build` is called"]
pub struct InboxBuilder<S = ()> {
    pool: PgPool,
    consumer: String,
    state: S,
    handlers: Vec<Registered<S>>,
    upcasters: Vec<Upcaster>,
    max_attempts: u32,
    backoff: Backoff,
}

struct Registered<S> {
    aggregate_type: &'static str,
    event_types: &'static [crate::EventType],
    event_name: &'static str,
    route: Arc<dyn Route<S>>,
}

/// What became of a message, and so what to tell the broker (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Received {
    /// The handler ran and its transaction, with the record, committed: acknowledge.
    Handled,
    /// The message was handled before: acknowledge; the handler did not run.
    Duplicate,
    /// The message is dead (its handler rejected it or ran out of attempts, now or before):
    /// acknowledge; it waits in `outbox.inbox` with its payload and last error.
    Dead,
    /// The handler failed and has attempts left: deliver again after `retry_in`.
    Failed {
        /// Failed attempts so far, this one included.
        attempts: u32,
        /// The backoff's delay before the next attempt.
        retry_in: Duration,
    },
    /// The handler asked to be called again later ([`Snooze`](crate::Snooze)); no attempt
    /// counted: deliver again after `delay`.
    Snoozed {
        /// How long to wait.
        delay: Duration,
    },
    /// No handler takes the message's aggregate and event type; nothing was recorded.
    NoHandler,
}

impl Received {
    /// Whether to acknowledge the message to the broker now (else deliver it again later).
    pub fn acknowledge(&self) -> bool {
        !matches!(self, Received::Failed { .. } | Received::Snoozed { .. })
    }
}

/// Why [`Inbox::receive`] could not tell what became of a message. The message lost nothing:
/// deliver it again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The database failed (unavailable, or the inbox's table missing: run the migrations);
    /// no attempt was counted.
    #[error("the inbox's database failed; deliver the message again (no attempt was counted)")]
    Database(#[source] sqlx::Error),
}

impl InboxBuilder<()> {
    /// A builder for `consumer`'s inbox: the name its handled messages are recorded under, so
    /// each consumer (each service, or each subscription) has its own.
    fn new(pool: PgPool, consumer: impl Into<String>) -> Self {
        InboxBuilder {
            pool,
            consumer: consumer.into(),
            state: (),
            handlers: Vec::new(),
            upcasters: Vec::new(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
        }
    }
}

impl<S: Clone + Send + Sync + 'static> InboxBuilder<S> {
    /// Shared state every handler reads through [`InboxContext::state`]. Set it before the
    /// handlers.
    pub fn state<T: Clone + Send + Sync + 'static>(self, state: T) -> InboxBuilder<T> {
        assert!(
            self.handlers.is_empty(),
            "InboxBuilder::state must be called before the handlers are registered"
        );
        InboxBuilder {
            pool: self.pool,
            consumer: self.consumer,
            state,
            handlers: Vec::new(),
            upcasters: self.upcasters,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
        }
    }

    /// Registers `handler` for the event type of its second argument:
    /// `async fn(InboxContext<S>, E) -> Result<(), Err>`. Messages written at older versions
    /// are read through `E`'s `upcast_from` chain.
    pub fn handler<E, F, Fut, Err>(mut self, handler: F) -> Self
    where
        F: Fn(InboxContext<S>, E) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), Err>> + Send + 'static,
        Err: Into<BoxError>,
        E: OutboxEvent + Send + 'static,
    {
        self.handlers.push(Registered {
            aggregate_type: E::AGGREGATE_TYPE,
            event_types: E::EVENT_TYPES,
            event_name: std::any::type_name::<E>(),
            route: Arc::new(Typed { handler, _event: PhantomData }),
        });
        self
    }

    /// Registers a JSON upcaster for messages of `event_type` written at `from_version`, whose
    /// struct is gone: as [`RelayBuilder::upcast_json`](crate::RelayBuilder::upcast_json), which
    /// says how they chain.
    pub fn upcast_json<E, Err>(
        mut self,
        event_type: &str,
        from_version: u32,
        upcaster: impl Fn(serde_json::Value) -> Result<serde_json::Value, Err> + Send + Sync + 'static,
    ) -> Self
    where
        E: OutboxEvent,
        Err: Into<BoxError>,
    {
        self.upcasters.push(Upcaster::new::<E, Err>(event_type, from_version, upcaster));
        self
    }

    /// Failed attempts after which a message is dead (default 10, the relay's); at least 1.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The delay before a failed message is delivered again (default: the relay's).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The inbox, or why not: two handlers for one event type, an upcaster no handler runs or
    /// that leaves a gap, `max_attempts` of 0.
    pub fn build(self) -> Result<Inbox<S>, BuildError> {
        if i32::try_from(self.max_attempts).map_or(true, |attempts| attempts < 1) {
            return Err(BuildError::InvalidSetting("max_attempts must be between 1 and i32::MAX"));
        }
        let mut routes = HashMap::new();
        let mut handled = HashMap::new();
        for handler in self.handlers {
            for event_type in handler.event_types {
                let key = (handler.aggregate_type, event_type.name());
                if let Some((_, first)) = handled.insert(key, (event_type, handler.event_name)) {
                    return Err(BuildError::DuplicateHandler {
                        aggregate_type: handler.aggregate_type,
                        event_type: event_type.name(),
                        first,
                        second: handler.event_name,
                    });
                }
                routes.insert(key, handler.route.clone());
            }
        }
        let upcasters = json_upcasters(self.upcasters, &handled)?;
        Ok(Inbox {
            shared: Arc::new(Shared {
                pool: self.pool,
                consumer: self.consumer,
                state: self.state,
                routes,
                max_attempts: self.max_attempts,
                backoff: self.backoff,
                upcasters,
            }),
        })
    }
}

impl Inbox<()> {
    /// A builder for `consumer`'s inbox on `pool` (see [`InboxBuilder`]).
    pub fn builder(pool: PgPool, consumer: impl Into<String>) -> InboxBuilder<()> {
        InboxBuilder::new(pool, consumer)
    }
}

impl<S: Clone + Send + Sync + 'static> Inbox<S> {
    /// The consumer this inbox records messages under.
    pub fn consumer(&self) -> &str {
        &self.shared.consumer
    }

    /// Handles `message` unless it was handled before: its handler runs in a transaction that
    /// records the message handled, and commits with it. See [`Received`] for what to tell the
    /// broker. A concurrent delivery of the same message waits for this one's outcome.
    ///
    /// With the `metrics` feature, counts `outbox_inbox_received_total` (labels `consumer`,
    /// `event_type`, `outcome`: `handled`, `duplicate`, `dead`, `failed`, `snoozed`,
    /// `no_handler`, `database_error`) and times `outbox_inbox_receive_seconds` (`consumer`,
    /// `event_type`).
    pub async fn receive(&self, message: &InboundMessage) -> Result<Received, InboxError> {
        #[cfg(feature = "metrics")]
        let started = std::time::Instant::now();
        let received = self.receive_once(message).await;
        #[cfg(feature = "metrics")]
        {
            let outcome = match &received {
                Ok(Received::Handled) => "handled",
                Ok(Received::Duplicate) => "duplicate",
                Ok(Received::Dead) => "dead",
                Ok(Received::Failed { .. }) => "failed",
                Ok(Received::Snoozed { .. }) => "snoozed",
                Ok(Received::NoHandler) => "no_handler",
                Err(InboxError::Database(_)) => "database_error",
            };
            let (consumer, event_type) = (&self.shared.consumer, &message.event_type);
            metrics::counter!("outbox_inbox_received_total", "consumer" => consumer.clone(),
                "event_type" => event_type.clone(), "outcome" => outcome)
            .increment(1);
            metrics::histogram!("outbox_inbox_receive_seconds", "consumer" => consumer.clone(),
                "event_type" => event_type.clone())
            .record(started.elapsed());
        }
        received
    }

    async fn receive_once(&self, message: &InboundMessage) -> Result<Received, InboxError> {
        let shared = &*self.shared;
        let Some(route) =
            shared.routes.get(&(message.aggregate_type.as_str(), message.event_type.as_str()))
        else {
            tracing::debug!(
                event_id = %message.event_id,
                aggregate_type = %message.aggregate_type,
                event_type = %message.event_type,
                "no inbox handler takes this event type"
            );
            return Ok(Received::NoHandler);
        };
        let version = i32::try_from(message.version).unwrap_or(i32::MAX);
        let key = InboxKey {
            consumer: &shared.consumer,
            event_id: message.event_id,
            aggregate_type: &message.aggregate_type,
            aggregate_id: &message.aggregate_id,
            event_type: &message.event_type,
            version,
        };
        let mut tx = shared.pool.begin().await.map_err(InboxError::Database)?;
        let Some(attempts) = store::claim(&mut tx, &key).await.map_err(InboxError::Database)?
        else {
            let dead = store::is_dead(&mut tx, &shared.consumer, message.event_id)
                .await
                .map_err(InboxError::Database)?;
            tx.rollback().await.map_err(InboxError::Database)?;
            return Ok(if dead { Received::Dead } else { Received::Duplicate });
        };
        let attempts = u32::try_from(attempts).unwrap_or(0);
        let (back, returned) = oneshot::channel();
        let ctx = InboxContext::new(shared.state.clone(), message.into(), attempts, tx, back);
        // What a log line may say of a payload that does not decode: not the payload itself,
        // which its error can quote (the whole error is kept in `last_error`).
        let mut logged = None;
        let handled = match route.call(ctx, message, &shared.upcasters) {
            Ok(handling) => match AssertUnwindSafe(handling).catch_unwind().await {
                Ok(handled) => handled,
                Err(panic) => Err(format!("handler panicked: {}", panic_text(&*panic)).into()),
            },
            Err(decode) => {
                logged = Some(decode.without_payload());
                Err(decode.into())
            }
        };
        // The context is gone, returned or dropped with the handler's future: its transaction
        // is back here (unless the handler moved the context somewhere it still lives).
        let tx = returned.await.ok();
        let error = match (handled, tx) {
            (Ok(()), Some(tx)) => match tx.commit().await {
                Ok(()) => return Ok(Received::Handled),
                // Not the message's fault: deliver it again; a commit that did land makes the
                // redelivery a duplicate.
                Err(error) if is_unavailable(&error) => return Err(InboxError::Database(error)),
                // A commit the database refused (a deferred constraint the handler's writes
                // broke) is the handler's failure.
                Err(error) => BoxError::from(error),
            },
            (Ok(()), None) => {
                BoxError::from("the handler's transaction was lost before its commit")
            }
            (Err(error), tx) => {
                // Rolled back now, so that its lock on the record is gone before the failure
                // is written beside it (a dropped transaction rolls back only when its
                // connection is next used).
                if let Some(tx) = tx {
                    let _ = tx.rollback().await;
                }
                error
            }
        };
        self.failed(message, &key, &*error, logged).await
    }

    /// Records a failed handler call and says what the broker should do; `logged` is what the
    /// log line says instead of the error, if it must not quote the payload.
    async fn failed(
        &self,
        message: &InboundMessage,
        key: &InboxKey<'_>,
        error: &(dyn std::error::Error + Send + Sync + 'static),
        logged: Option<String>,
    ) -> Result<Received, InboxError> {
        let shared = &*self.shared;
        let verdict = Verdict::of(error);
        if let Verdict::Snooze(delay) = verdict {
            return Ok(Received::Snoozed { delay });
        }
        let text = ErrorChain(error).to_string();
        let failure = InboxFailure {
            error: &text,
            rejected: verdict == Verdict::Reject,
            max_attempts: i32::try_from(shared.max_attempts).unwrap_or(i32::MAX),
            payload: &message.payload,
            headers: &message.headers,
        };
        let recorded = store::fail(&shared.pool, key, &failure).await;
        let Some((attempts, dead)) = recorded.map_err(InboxError::Database)? else {
            // Handled by a concurrent delivery, or dead, meanwhile.
            return Ok(Received::Duplicate);
        };
        let attempts = u32::try_from(attempts).unwrap_or(0);
        let logged = logged.as_deref().unwrap_or(&text);
        if dead {
            tracing::warn!(
                consumer = %shared.consumer,
                event_id = %message.event_id,
                event_type = %message.event_type,
                attempts,
                error = %logged,
                "inbox message dead: its handler rejected it or ran out of attempts; it is kept \
                 in outbox.inbox with its payload and last error"
            );
            return Ok(Received::Dead);
        }
        tracing::warn!(
            consumer = %shared.consumer,
            event_id = %message.event_id,
            event_type = %message.event_type,
            attempts,
            error = %logged,
            "inbox handler failed; the message is to be delivered again after the backoff \
             (the whole error is kept in outbox.inbox's last_error)"
        );
        Ok(Received::Failed { attempts, retry_in: shared.backoff.delay(attempts) })
    }

    /// Runs a dead message's handler again now, from the payload and headers the inbox kept
    /// (the broker has long been told it is done): `Received::Handled` if it succeeds,
    /// `Received::Dead` again, with the new error, if it fails. `None` if this consumer has no
    /// such dead (or failing) message. A failing message whose broker stopped delivering it can
    /// be run again the same way.
    pub async fn requeue_dead(&self, event_id: Uuid) -> Result<Option<Received>, InboxError> {
        let shared = &*self.shared;
        // One failure short of the most: the next failure is its last.
        let attempts = i32::try_from(shared.max_attempts - 1).unwrap_or(i32::MAX);
        let revived = store::revive(&shared.pool, &shared.consumer, event_id, attempts)
            .await
            .map_err(InboxError::Database)?;
        let Some(row) = revived else { return Ok(None) };
        self.receive(&dead_letters::message_of(row)).await.map(Some)
    }

    /// Deletes this consumer's handled records older than `older_than`: see
    /// [`purge_handled`].
    pub async fn purge_handled(&self, older_than: Duration, batch: i64) -> Result<u64, InboxError> {
        purge_handled(&self.shared.pool, &self.shared.consumer, older_than, batch).await
    }
}

/// Deletes `consumer`'s handled records older than `older_than`, up to `batch` at a time (each
/// its own short transaction) until none is left; returns how many. Keep them longer than the
/// broker may redeliver a message: a redelivery after its record is gone is handled again.
/// Dead and failing messages are kept.
pub async fn purge_handled(
    pool: &PgPool,
    consumer: &str,
    older_than: Duration,
    batch: i64,
) -> Result<u64, InboxError> {
    let mut deleted = 0;
    loop {
        let done = store::purge_handled(pool, consumer, older_than, batch)
            .await
            .map_err(InboxError::Database)?;
        deleted += done;
        if done == 0 || done < u64::try_from(batch).unwrap_or(0) {
            return Ok(deleted);
        }
    }
}

type Handling = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'static>>;

/// A handler erased: decode the payload as its event, then call it.
trait Route<S>: Send + Sync {
    fn call(
        &self,
        ctx: InboxContext<S>,
        message: &InboundMessage,
        upcasters: &JsonUpcasters,
    ) -> Result<Handling, DecodeError>;
}

struct Typed<F, E> {
    handler: F,
    _event: PhantomData<fn() -> E>,
}

impl<F, Fut, E, S, Err> Route<S> for Typed<F, E>
where
    F: Fn(InboxContext<S>, E) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), Err>> + Send + 'static,
    Err: Into<BoxError>,
    E: OutboxEvent,
    S: Send + 'static,
{
    fn call(
        &self,
        ctx: InboxContext<S>,
        message: &InboundMessage,
        upcasters: &JsonUpcasters,
    ) -> Result<Handling, DecodeError> {
        let (event_type, version) = (&message.event_type, message.version);
        let event: E = read(event_type, version, &message.payload, upcasters)?;
        let handling = (self.handler)(ctx, event);
        Ok(Box::pin(async move { handling.await.map_err(Into::into) }))
    }
}
