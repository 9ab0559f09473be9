//! Reading one event, whatever its state, by its id.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{indexes_only, Rows};

/// An event's row as stored, with whether its lease or delay runs past now (database clock).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EventRow {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) event_version: i32,
    pub(crate) ordered: bool,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) payload: serde_json::Value,
    pub(crate) headers: serde_json::Value,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) available_at: DateTime<Utc>,
    pub(crate) attempts: i32,
    pub(crate) expired_leases: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) published_at: Option<DateTime<Utc>>,
    pub(crate) dead_at: Option<DateTime<Utc>>,
    pub(crate) leased: bool,
    pub(crate) later: bool,
}

/// The event with this id, by its primary key.
pub(crate) async fn event(pool: &PgPool, event_id: Uuid) -> Result<Option<EventRow>, sqlx::Error> {
    let mut tx = indexes_only(pool).await?;
    let event = event_query(event_id).fetch_optional(&mut *tx).await?;
    tx.commit().await?;
    Ok(event)
}

/// The event with id `$1`, by the primary key.
pub(crate) const EVENT: &str =
    "SELECT event_id, aggregate_type, aggregate_id, event_type, event_version, ordered, \
            idempotency_key, payload, headers, created_at, available_at, attempts, \
            expired_leases, last_error, published_at, dead_at, \
            lease_token IS NOT NULL AND available_at > now() AS leased, \
            available_at > now() AS later \
     FROM outbox.events WHERE event_id = $1";

pub(super) fn event_query<'q>(event_id: Uuid) -> Rows<'q, EventRow> {
    sqlx::query_as(EVENT).bind(event_id)
}
