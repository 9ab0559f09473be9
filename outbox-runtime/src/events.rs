//! Looking an event up by its id, whatever its state: what an operator does with the id from a
//! log line or a support ticket.
//!
//! ```no_run
//! # use outbox_runtime::sqlx;
//! # async fn ops(pool: sqlx::PgPool, id: uuid::Uuid) -> Result<(), outbox_runtime::Error> {
//! if let Some(event) = outbox_runtime::events::get(&pool, id).await? {
//!     println!("{:?} after {} attempts: {:?}", event.state, event.attempts, event.last_error);
//! }
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::Error;
use crate::store::{self, EventRow};

/// Where an event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum EventState {
    /// Deliverable now, waiting for a relay (or locked by a relay in the held-transaction lease
    /// mode, which writes nothing to the row).
    Pending,
    /// Leased by a relay in the written lease mode until `available_at`: being delivered.
    Leased,
    /// Not deliverable before `available_at`: delayed by its producer, waiting for its next
    /// attempt after a failure, or snoozed.
    Waiting,
    /// Delivered, at `published_at`.
    Published,
    /// A dead letter since `dead_at`: see [`dead_letters`](crate::dead_letters).
    Dead,
}

/// An event, with its state and delivery history.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct EventRecord {
    /// The event's id.
    pub event_id: Uuid,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The event type.
    pub event_type: String,
    /// The version the payload was written at.
    #[serde(rename = "event_version")]
    pub version: u32,
    /// Delivered in order within its aggregate.
    pub ordered: bool,
    /// The key it was emitted under, if any.
    pub idempotency_key: Option<String>,
    /// The payload as stored.
    pub payload: serde_json::Value,
    /// The headers as stored.
    pub headers: serde_json::Value,
    /// When it was emitted.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub created_at: DateTime<Utc>,
    /// When it is (or was) deliverable; for a leased event, when its lease runs out.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub available_at: DateTime<Utc>,
    /// Where it stands.
    pub state: EventState,
    /// Failed deliveries.
    pub attempts: u32,
    /// Leases that expired before a relay acknowledged it.
    pub expired_leases: u32,
    /// The last failure's text.
    pub last_error: Option<String>,
    /// When it was delivered.
    #[serde(serialize_with = "crate::serialize::optional_instant")]
    pub published_at: Option<DateTime<Utc>>,
    /// When it became a dead letter.
    #[serde(serialize_with = "crate::serialize::optional_instant")]
    pub dead_at: Option<DateTime<Utc>>,
}

/// The event with this id, if the table still holds it (retention, `delete_on_publish` and
/// discarding dead letters remove rows).
pub async fn get(pool: &PgPool, event_id: Uuid) -> Result<Option<EventRecord>, Error> {
    Ok(store::event(pool, event_id).await?.map(EventRecord::from))
}

/// An aggregate's events in the order they were emitted, from [`of_aggregate`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct AggregateEvents {
    /// The events, oldest first.
    pub events: Vec<EventRecord>,
    /// Every event the table holds (the database has the index [`AGGREGATE_INDEX`]); `false`:
    /// only the undelivered events of ordered types, what holds the aggregate back.
    pub complete: bool,
}

/// The name of the index that lets [`of_aggregate`] read an aggregate's whole history. The
/// migrations do not create it, since every emit would pay for it; create it with
/// [`AGGREGATE_INDEX_SQL`] if you look aggregates up.
pub const AGGREGATE_INDEX: &str = store::AGGREGATE_INDEX;

/// The statement that creates [`AGGREGATE_INDEX`], without blocking emits.
pub const AGGREGATE_INDEX_SQL: &str = "CREATE INDEX CONCURRENTLY events_by_aggregate \
     ON outbox.events (aggregate_type, aggregate_id, seq)";

/// Up to `limit` events of one aggregate in the order they were emitted: all it holds with the
/// index [`AGGREGATE_INDEX`], else its undelivered ordered events (on the index the relays
/// keep for ordering). Either way one index range, whatever the table's size.
pub async fn of_aggregate(
    pool: &PgPool,
    aggregate_type: &str,
    aggregate_id: &str,
    limit: u32,
) -> Result<AggregateEvents, Error> {
    let (rows, complete) =
        store::aggregate_events(pool, aggregate_type, aggregate_id, i64::from(limit)).await?;
    Ok(AggregateEvents { events: rows.into_iter().map(EventRecord::from).collect(), complete })
}

impl From<EventRow> for EventRecord {
    fn from(row: EventRow) -> Self {
        let state = if row.dead_at.is_some() {
            EventState::Dead
        } else if row.published_at.is_some() {
            EventState::Published
        } else if row.leased {
            EventState::Leased
        } else if row.later {
            EventState::Waiting
        } else {
            EventState::Pending
        };
        EventRecord {
            event_id: row.event_id,
            aggregate_type: row.aggregate_type,
            aggregate_id: row.aggregate_id,
            event_type: row.event_type,
            version: u32::try_from(row.event_version).unwrap_or(1),
            ordered: row.ordered,
            idempotency_key: row.idempotency_key,
            payload: row.payload,
            headers: row.headers,
            created_at: row.created_at,
            available_at: row.available_at,
            state,
            attempts: u32::try_from(row.attempts).unwrap_or(0),
            expired_leases: u32::try_from(row.expired_leases).unwrap_or(0),
            last_error: row.last_error,
            published_at: row.published_at,
            dead_at: row.dead_at,
        }
    }
}
