//! Dead letters: events that exhausted their attempts or expired leases, or that their handler
//! [rejected](crate::Reject). List, inspect, requeue, discard.
//!
//! ```no_run
//! # use outbox_runtime::sqlx;
//! use outbox_runtime::dead_letters::{self, DeadFilter};
//! # async fn ops(pool: sqlx::PgPool) -> Result<(), outbox_runtime::Error> {
//! let stuck = dead_letters::list(&pool, &DeadFilter::all().event_type("order.placed"), None, 50).await?;
//! for event in &stuck {
//!     println!("{} failed {} times: {:?}", event.event_id, event.attempts, event.last_error);
//! }
//! // The downstream bug is fixed: try them again.
//! dead_letters::requeue(&pool, &DeadFilter::all().event_type("order.placed")).await?;
//! // Those that timed out in the last hour, counted first.
//! let timed_out = DeadFilter::all()
//!     .error_contains("timeout")
//!     .dead_after(chrono::Utc::now() - chrono::Duration::hours(1));
//! println!("discarding {}", dead_letters::count(&pool, &timed_out).await?);
//! dead_letters::discard(&pool, &timed_out).await?;
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::Error;
use crate::store::{self, DeadRow, DeadSelection};

/// A dead event, with what an operator needs to decide its fate.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct DeadEvent {
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
    /// The payload as stored.
    pub payload: serde_json::Value,
    /// The headers as stored.
    pub headers: serde_json::Value,
    /// When it was emitted.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub created_at: DateTime<Utc>,
    /// When it exhausted its attempts or its expired leases, or was rejected.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub dead_at: DateTime<Utc>,
    /// Failed deliveries.
    pub attempts: u32,
    /// Leases that expired before a relay acknowledged the event (counted apart).
    pub expired_leases: u32,
    /// The last failure's text (`rejected by its handler: ...` for a rejection).
    pub last_error: Option<String>,
    /// For a subscriber's copy of an event, the subscriber: the event is dead for it alone
    /// (`None` for the event as emitted). Requeuing the copy delivers it to that subscriber.
    pub subscriber: Option<String>,
    /// For a subscriber's copy, the id of the event it copies: the id its handler sees.
    pub copy_of: Option<Uuid>,
}

impl From<DeadRow> for DeadEvent {
    fn from(row: DeadRow) -> Self {
        // The relay only ever counts up from 0, and the version has a CHECK (>= 1).
        DeadEvent {
            event_id: row.event_id,
            aggregate_type: row.aggregate_type,
            aggregate_id: row.aggregate_id,
            event_type: row.event_type,
            version: u32::try_from(row.event_version).unwrap_or(1),
            payload: row.payload,
            headers: row.headers,
            created_at: row.created_at,
            dead_at: row.dead_at,
            attempts: u32::try_from(row.attempts).unwrap_or(0),
            expired_leases: u32::try_from(row.expired_leases).unwrap_or(0),
            last_error: row.last_error,
            subscriber: (!row.subscriber.is_empty()).then_some(row.subscriber),
            copy_of: row.source_event_id,
        }
    }
}

/// Which dead events an operation applies to: all of them, narrowed by the given fields.
/// There is deliberately no `Default`: acting on every dead event is spelled [`DeadFilter::all`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadFilter {
    aggregate_type: Option<String>,
    event_type: Option<String>,
    event_id: Option<Uuid>,
    error_contains: Option<String>,
    dead_after: Option<DateTime<Utc>>,
    dead_before: Option<DateTime<Utc>>,
    subscriber: Option<String>,
}

impl DeadFilter {
    /// Every dead event.
    pub fn all() -> Self {
        Self {
            aggregate_type: None,
            event_type: None,
            event_id: None,
            error_contains: None,
            dead_after: None,
            dead_before: None,
            subscriber: None,
        }
    }

    /// Only the dead event with this id.
    pub fn event(event_id: Uuid) -> Self {
        Self { event_id: Some(event_id), ..Self::all() }
    }

    /// Only events of this aggregate type.
    pub fn aggregate_type(mut self, aggregate_type: impl Into<String>) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self
    }

    /// Only events of this event type.
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only events whose last error contains this text, ignoring case.
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Only events that died at or after this instant.
    pub fn dead_after(mut self, at: DateTime<Utc>) -> Self {
        self.dead_after = Some(at);
        self
    }

    /// Only events that died before this instant.
    pub fn dead_before(mut self, at: DateTime<Utc>) -> Self {
        self.dead_before = Some(at);
        self
    }

    /// Only the copies of this subscriber (see [`DeadEvent::subscriber`]).
    pub fn subscriber(mut self, subscriber: impl Into<String>) -> Self {
        self.subscriber = Some(subscriber.into());
        self
    }

    fn selection(&self) -> DeadSelection<'_> {
        DeadSelection {
            aggregate_type: self.aggregate_type.as_deref(),
            event_type: self.event_type.as_deref(),
            event_id: self.event_id,
            error_contains: self.error_contains.as_deref(),
            dead_after: self.dead_after,
            dead_before: self.dead_before,
            subscriber: self.subscriber.as_deref(),
        }
    }
}

/// One page of dead events matching `filter`, oldest first: up to `limit` after the event id
/// `after` (pass the last id of the previous page, or `None` for the first).
pub async fn list(
    pool: &PgPool,
    filter: &DeadFilter,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<DeadEvent>, Error> {
    let rows = store::dead(pool, &filter.selection(), after, i64::from(limit)).await?;
    Ok(rows.into_iter().map(DeadEvent::from).collect())
}

/// How many dead events match `filter`: what [`requeue`] or [`discard`] would act on now, for
/// a confirmation that says so before it runs.
pub async fn count(pool: &PgPool, filter: &DeadFilter) -> Result<u64, Error> {
    let count = store::count_dead(pool, &filter.selection()).await?;
    Ok(u64::try_from(count).unwrap_or_default())
}

/// The dead event with this id, if there is one.
pub async fn get(pool: &PgPool, event_id: Uuid) -> Result<Option<DeadEvent>, Error> {
    let mut found = store::dead(pool, &DeadFilter::event(event_id).selection(), None, 1).await?;
    Ok(found.pop().map(DeadEvent::from))
}

/// Makes the matching dead events pending again: attempts reset to 0, deliverable at once,
/// `last_error` kept as history. Returns how many were requeued.
///
/// Requeuing a dead ordered event respects its aggregate's order: with the default
/// [`DeadOrderedEvents::BlockAggregate`](crate::DeadOrderedEvents) the later events waited,
/// and are delivered after it. (With `SkipPast` they went ahead, so it comes after them.)
pub async fn requeue(pool: &PgPool, filter: &DeadFilter) -> Result<u64, Error> {
    Ok(store::requeue_dead(pool, &filter.selection()).await?)
}

/// Deletes the matching dead events for good; an ordered aggregate blocked by one moves on.
/// Returns how many were deleted. [`list`] them first if you want a record.
pub async fn discard(pool: &PgPool, filter: &DeadFilter) -> Result<u64, Error> {
    Ok(store::discard_dead(pool, &filter.selection()).await?)
}
