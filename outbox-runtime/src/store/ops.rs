//! Operations: health figures, dead letters, retention.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{micros, Query, Rows, NOTIFY_CHANNEL};

/// A dead event, with what an operator needs to decide its fate.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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
    pub event_version: i32,
    /// The payload as stored.
    pub payload: serde_json::Value,
    /// The headers as stored.
    pub headers: serde_json::Value,
    /// When it was emitted.
    pub created_at: DateTime<Utc>,
    /// When it exhausted its attempts or its expired leases.
    pub dead_at: DateTime<Utc>,
    /// Failed deliveries.
    pub attempts: i32,
    /// Leases that expired before a relay acknowledged the event (counted apart).
    pub expired_leases: i32,
    /// The last failure's text.
    pub last_error: Option<String>,
}

/// Per `(aggregate_type, event_type)`: pending, dead, and age of the oldest pending event.
/// Pending and dead rows are read through their partial indexes, never the published history.
pub(crate) async fn stats_by_type(pool: &PgPool) -> Result<Vec<TypeCounts>, sqlx::Error> {
    stats_query().fetch_all(pool).await
}

/// `(aggregate_type, event_type, event_version, pending, dead, age of the oldest pending in
/// seconds)`.
pub(crate) type TypeCounts = (String, String, i32, i64, i64, Option<f64>);

pub(super) fn stats_query<'q>() -> Rows<'q, TypeCounts> {
    sqlx::query_as(
        "SELECT aggregate_type, event_type, event_version, \
                count(*) FILTER (WHERE NOT dead), \
                count(*) FILTER (WHERE dead), \
                extract(epoch FROM now() - min(created_at) FILTER (WHERE NOT dead))::float8 \
         FROM ( \
             SELECT aggregate_type, event_type, event_version, created_at, false AS dead \
             FROM outbox.events WHERE published_at IS NULL AND dead_at IS NULL \
             UNION ALL \
             SELECT aggregate_type, event_type, event_version, created_at, true \
             FROM outbox.events WHERE dead_at IS NOT NULL \
         ) AS unpublished \
         GROUP BY aggregate_type, event_type, event_version \
         ORDER BY aggregate_type, event_type, event_version",
    )
}

/// Which dead rows an operation applies to; `None` matches anything.
pub(crate) struct DeadSelection<'a> {
    pub(crate) aggregate_type: Option<&'a str>,
    pub(crate) event_type: Option<&'a str>,
    pub(crate) event_id: Option<Uuid>,
}

/// The dead rows matching `$1..$3` (see [`DeadSelection`]).
macro_rules! dead_rows {
    () => {
        "dead_at IS NOT NULL \
         AND ($1::text IS NULL OR aggregate_type = $1) \
         AND ($2::text IS NULL OR event_type = $2) \
         AND ($3::uuid IS NULL OR event_id = $3)"
    };
}

/// One page of dead rows in event id order (time order for ids made by `emit`), after `after`.
pub(crate) async fn dead(
    pool: &PgPool,
    selection: &DeadSelection<'_>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<DeadEvent>, sqlx::Error> {
    dead_query(selection, after, limit).fetch_all(pool).await
}

pub(super) fn dead_query<'q>(
    selection: &DeadSelection<'q>,
    after: Option<Uuid>,
    limit: i64,
) -> Rows<'q, DeadEvent> {
    sqlx::query_as(concat!(
        "SELECT event_id, aggregate_type, aggregate_id, event_type, event_version, payload, \
                headers, created_at, dead_at, attempts, expired_leases, last_error \
         FROM outbox.events WHERE ",
        dead_rows!(),
        " AND ($4::uuid IS NULL OR event_id > $4) ORDER BY event_id LIMIT $5"
    ))
    .bind(selection.aggregate_type)
    .bind(selection.event_type)
    .bind(selection.event_id)
    .bind(after)
    .bind(limit)
}

/// Makes dead rows pending again: attempts reset, available now, `last_error` kept. Wakes the
/// relays. Returns how many.
pub(crate) async fn requeue_dead(
    pool: &PgPool,
    selection: &DeadSelection<'_>,
) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let requeued = requeue_query(selection).execute(&mut *tx).await?.rows_affected();
    if requeued > 0 {
        notify_query().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(requeued)
}

pub(super) fn requeue_query<'q>(selection: &DeadSelection<'q>) -> Query<'q> {
    sqlx::query(concat!(
        "UPDATE outbox.events \
         SET dead_at = NULL, attempts = 0, expired_leases = 0, lease_token = NULL, \
             available_at = now() \
         WHERE ",
        dead_rows!()
    ))
    .bind(selection.aggregate_type)
    .bind(selection.event_type)
    .bind(selection.event_id)
}

/// Wakes the relays asleep on LISTEN.
pub(super) fn notify_query<'q>() -> Query<'q> {
    sqlx::query("SELECT pg_notify($1, '')").bind(NOTIFY_CHANNEL)
}

/// Deletes dead rows. Returns how many.
pub(crate) async fn discard_dead(
    pool: &PgPool,
    selection: &DeadSelection<'_>,
) -> Result<u64, sqlx::Error> {
    Ok(discard_query(selection).execute(pool).await?.rows_affected())
}

pub(super) fn discard_query<'q>(selection: &DeadSelection<'q>) -> Query<'q> {
    sqlx::query(concat!("DELETE FROM outbox.events WHERE ", dead_rows!()))
        .bind(selection.aggregate_type)
        .bind(selection.event_type)
        .bind(selection.event_id)
}

/// Deletes up to `$2` rows published more than `$1` microseconds ago.
pub(crate) const PURGE_PUBLISHED: &str = "DELETE FROM outbox.events WHERE ctid = ANY (ARRAY( \
         SELECT ctid FROM outbox.events \
         WHERE published_at < now() - $1::bigint * interval '1 microsecond' \
         ORDER BY published_at LIMIT $2 \
         FOR UPDATE SKIP LOCKED))";

/// Deletes up to `limit` rows published more than `older_than` ago, oldest first; returns how many.
/// Short and index-driven, so it never holds many row locks for long: the rows are found on the
/// `published_at` index and deleted by `ctid`, which leaves no join for a stale plan to get wrong.
pub(crate) async fn purge_published(
    pool: &PgPool,
    older_than: Duration,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    Ok(purge_query(older_than, limit).execute(pool).await?.rows_affected())
}

pub(super) fn purge_query<'q>(older_than: Duration, limit: i64) -> Query<'q> {
    sqlx::query(PURGE_PUBLISHED).bind(micros(older_than)).bind(limit)
}
