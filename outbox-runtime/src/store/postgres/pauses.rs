//! Paused event types (`outbox.paused_types`), which every lease leaves alone.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::ops::run_and_wake;
use super::{Query, Rows};

/// Pauses a type; returns whether it was running (an existing pause keeps its time and reason).
pub(crate) async fn pause(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    reason: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let paused = pause_query(aggregate_type, event_type, reason).execute(pool).await?;
    Ok(paused.rows_affected() == 1)
}

pub(super) fn pause_query<'q>(
    aggregate_type: &'q str,
    event_type: &'q str,
    reason: Option<&'q str>,
) -> Query<'q> {
    sqlx::query(
        "INSERT INTO outbox.paused_types (aggregate_type, event_type, reason) \
         VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
    )
    .bind(aggregate_type)
    .bind(event_type)
    .bind(reason)
}

/// Resumes a type and wakes the relays; returns whether it was paused.
pub(crate) async fn resume(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
) -> Result<bool, sqlx::Error> {
    Ok(run_and_wake(pool, resume_query(aggregate_type, event_type)).await? == 1)
}

pub(super) fn resume_query<'q>(aggregate_type: &'q str, event_type: &'q str) -> Query<'q> {
    sqlx::query("DELETE FROM outbox.paused_types WHERE aggregate_type = $1 AND event_type = $2")
        .bind(aggregate_type)
        .bind(event_type)
}

/// `(aggregate_type, event_type, paused_at, reason)`.
pub(crate) type PausedRow = (String, String, DateTime<Utc>, Option<String>);

/// Every paused type, the longest paused first.
pub(crate) async fn paused(pool: &PgPool) -> Result<Vec<PausedRow>, sqlx::Error> {
    paused_query().fetch_all(pool).await
}

pub(super) fn paused_query<'q>() -> Rows<'q, PausedRow> {
    sqlx::query_as(
        "SELECT aggregate_type, event_type, paused_at, reason FROM outbox.paused_types \
         ORDER BY paused_at, aggregate_type, event_type",
    )
}
