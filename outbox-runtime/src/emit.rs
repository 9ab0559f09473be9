//! Writing events into the outbox inside the caller's transaction.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use sqlx::Transaction;
use uuid::Uuid;

use crate::backend::Backend;
use crate::error::{Error, InvalidEvent};
use crate::event::OutboxEvent;
use crate::store::Available;
use crate::{json, store};

/// Writes `event` into the outbox as part of `tx` and returns its event id.
///
/// The event exists only if `tx` commits: it is written and published atomically with the
/// state change it describes. `emit` takes nothing but an open transaction, so an event cannot
/// be written outside of one by mistake.
///
/// The handler's type receives the payload exactly as emitted, every finite float included, but
/// `-0.0` comes back as `0.0` (`jsonb` numbers have no negative zero; equal by `==`), and a whole
/// float from 1e16 up held in a `serde_json::Value` comes back as an integer `Number`.
///
/// With the `opentelemetry` feature, every emit stores the OpenTelemetry context of the current
/// `tracing` span (bridged by `tracing-opentelemetry`) as the W3C headers `traceparent` and
/// `tracestate`, unless [`EmitOptions::header`] set either; the relay's delivery span continues
/// that trace.
///
/// ```no_run
/// # use outbox_runtime::sqlx;
/// # use outbox_runtime::OutboxEvent;
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, OutboxEvent)]
/// # #[outbox(aggregate = "order", event_type = "order.placed")]
/// # struct OrderPlaced { #[outbox(id)] order_id: i64 }
/// # async fn place(pool: sqlx::PgPool) -> Result<(), outbox_runtime::Error> {
/// let mut tx = pool.begin().await?;
/// sqlx::query("UPDATE orders SET state = 'placed' WHERE id = $1").bind(7_i64).execute(&mut *tx).await?;
/// outbox_runtime::emit(&mut tx, &OrderPlaced { order_id: 7 }).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidEvent`] when the event cannot be stored faithfully (see [`InvalidEvent`]);
/// nothing is written and `tx` stays usable. [`Error::Database`] when the insert fails.
pub async fn emit<E: OutboxEvent>(
    tx: &mut Transaction<'_, impl Backend>,
    event: &E,
) -> Result<Uuid, Error> {
    emit_with(tx, event, EmitOptions::new()).await
}

/// [`emit`] with headers or a delay; see [`EmitOptions`].
pub async fn emit_with<E: OutboxEvent>(
    tx: &mut Transaction<'_, impl Backend>,
    event: &E,
    options: EmitOptions,
) -> Result<Uuid, Error> {
    let ids = emit_all_with(tx, [event], options).await?;
    // One event in, one id out (see `emit_all_with`).
    ids.into_iter().next().ok_or(Error::Database(sqlx::Error::RowNotFound))
}

/// Writes many events of one Rust type (of one aggregate type, and of several event types for
/// an enum family) in a single statement, in iteration order; returns their ids in the same
/// order.
pub async fn emit_all<'e, E: OutboxEvent + 'e>(
    tx: &mut Transaction<'_, impl Backend>,
    events: impl IntoIterator<Item = &'e E>,
) -> Result<Vec<Uuid>, Error> {
    emit_all_with(tx, events, EmitOptions::new()).await
}

/// [`emit_all`] with the same headers and delay applied to every event.
pub async fn emit_all_with<'e, E: OutboxEvent + 'e>(
    tx: &mut Transaction<'_, impl Backend>,
    events: impl IntoIterator<Item = &'e E>,
    options: EmitOptions,
) -> Result<Vec<Uuid>, Error> {
    write(tx, events, options, None).await
}

/// Writes `event` as part of `tx` unless an event of the same aggregate type was stored under
/// `key` before (a retried request, a replayed command), and says which happened.
///
/// Keys are scoped per aggregate type and live as long as the event's row. Two transactions
/// racing on one key end with one event: the second waits for the first to commit or roll back,
/// then finds its event (commit) or writes its own (rollback). Within one transaction a repeated
/// key finds the event written earlier in it.
///
/// ```no_run
/// # use outbox_runtime::sqlx;
/// # use outbox_runtime::{EmitOptions, Emitted, OutboxEvent};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, OutboxEvent)]
/// # #[outbox(aggregate = "order", event_type = "order.placed")]
/// # struct OrderPlaced { #[outbox(id)] order_id: i64 }
/// # async fn place(pool: sqlx::PgPool, request_id: &str) -> Result<(), outbox_runtime::Error> {
/// let mut tx = pool.begin().await?;
/// let placed = OrderPlaced { order_id: 7 };
/// match outbox_runtime::emit_idempotent(&mut tx, &placed, request_id, EmitOptions::new()).await? {
///     Emitted::Written(_) => { /* the first time: change the state along with it */ }
///     Emitted::Found(_) => { /* a retry: the first request did all of it */ }
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`emit`]; [`InvalidEvent::NulCharacter`] for a key holding a NUL character.
pub async fn emit_idempotent<E: OutboxEvent>(
    tx: &mut Transaction<'_, impl Backend>,
    event: &E,
    key: &str,
    options: EmitOptions,
) -> Result<Emitted, Error> {
    let written = write(tx, [event], options, Some(key)).await?;
    if let [event_id] = written[..] {
        return Ok(Emitted::Written(event_id));
    }
    // The key was stored already (by an earlier emit, or a concurrent one that committed while
    // this insert waited on it): that event stands for this one. It committed before the insert
    // gave up on it, so it is visible.
    let found = event_for_key(tx, E::AGGREGATE_TYPE, key).await?;
    Ok(Emitted::Found(found.ok_or(sqlx::Error::RowNotFound)?))
}

/// What [`emit_idempotent`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub enum Emitted {
    /// No event was stored under the key: this one was written, with this id, and is delivered
    /// once the transaction commits.
    Written(Uuid),
    /// An event was stored under the key before: nothing was written; this is that event's id.
    Found(Uuid),
}

impl Emitted {
    /// The id of the event that stands for the emit: the one written or the one found.
    pub fn event_id(self) -> Uuid {
        match self {
            Emitted::Written(id) | Emitted::Found(id) => id,
        }
    }

    /// Whether this emit wrote its event.
    pub fn is_written(self) -> bool {
        matches!(self, Emitted::Written(_))
    }
}

/// The event stored under `key`, on `tx`'s backend.
async fn event_for_key<DB: Backend>(
    tx: &mut Transaction<'_, DB>,
    aggregate_type: &str,
    key: &str,
) -> Result<Option<Uuid>, sqlx::Error> {
    DB::event_for_key(tx, aggregate_type, key).await
}

/// Writes `events` in one statement; returns the ids written, in order. Under `key` (one event),
/// none if the key was stored already.
async fn write<'e, DB: Backend, E: OutboxEvent + 'e>(
    tx: &mut Transaction<'_, DB>,
    events: impl IntoIterator<Item = &'e E>,
    options: EmitOptions,
    key: Option<&str>,
) -> Result<Vec<Uuid>, Error> {
    // Read here, in the caller's span, before anything is awaited.
    #[cfg(feature = "opentelemetry")]
    let options = {
        let mut options = options;
        crate::otel::store_current_context(&mut options.headers);
        options
    };
    let mut headers = None;
    let mut rows = store::NewEvents::default();
    for event in events {
        let event_type = event.event_type();
        let invalid = |reason| Error::InvalidEvent { event_type: event_type.name(), reason };
        // Checked with the first event, so an error names an event type.
        if headers.is_none() {
            headers = Some(json::to_json(&options.headers, "a header").map_err(invalid)?);
            if let Some(key) = key {
                if key.contains('\0') {
                    return Err(invalid(InvalidEvent::NulCharacter("the idempotency key")));
                }
                check_length::<DB>("the idempotency key", key).map_err(invalid)?;
            }
        }
        let aggregate_id = event.aggregate_id();
        if aggregate_id.contains('\0') {
            return Err(invalid(InvalidEvent::NulCharacter("the aggregate id")));
        }
        check_length::<DB>("the aggregate id", &aggregate_id).map_err(invalid)?;
        let payload = event.__payload().map_err(invalid)?;
        rows.push(Uuid::now_v7(), event_type, aggregate_id, payload);
    }
    let Some(headers) = headers else {
        return Ok(Vec::new());
    };
    let shared = store::InsertShared {
        aggregate_type: E::AGGREGATE_TYPE,
        headers: &headers,
        available: options.available,
        idempotency_key: key,
    };
    let inserted = DB::insert_events(tx, shared, &rows).await?;
    Ok(if key.is_some() { inserted } else { rows.event_ids })
}

/// Refuses `value` when it is longer than the backend's schema holds.
fn check_length<DB: Backend>(what: &'static str, value: &str) -> Result<(), InvalidEvent> {
    // Counting characters is only worth it where bytes could exceed the limit.
    if value.len() <= DB::MAX_ID_CHARS {
        return Ok(());
    }
    match value.chars().count() {
        length if length > DB::MAX_ID_CHARS => {
            Err(InvalidEvent::TooLong { what, length, limit: DB::MAX_ID_CHARS })
        }
        _ => Ok(()),
    }
}

/// Per-emit settings: correlation headers and when the event becomes deliverable.
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::EmitOptions;
///
/// let options = EmitOptions::new()
///     .header("request_id", "req-42")
///     .header("tenant", "acme")
///     .delay(Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, Default)]
pub struct EmitOptions {
    headers: Map<String, Value>,
    available: Available,
}

impl EmitOptions {
    /// No headers, deliverable at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a header (request id, tenant, trace context...), stored in the `headers` column and
    /// handed to handlers in `EventContext`. A later value for the same name replaces the earlier.
    /// A `traceparent` or `tracestate` set here replaces the trace context that the
    /// `opentelemetry` feature would store.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Delays delivery by `delay` after the emitting transaction started (database clock).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.available = Available::After(delay);
        self
    }

    /// Makes the event deliverable no earlier than `at`.
    pub fn available_at(mut self, at: DateTime<Utc>) -> Self {
        self.available = Available::At(at);
        self
    }
}
