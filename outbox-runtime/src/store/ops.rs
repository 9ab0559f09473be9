//! Operations: health figures, dead letters, retention.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::{micros, NOTIFY_CHANNEL};
use crate::dead_letters::DeadEvent;

/// Per `(aggregate_type, event_type)`: pending, dead, and age of the oldest pending event.
/// Pending and dead rows are read through their partial indexes, never the published history.
pub(crate) async fn stats_by_type(
    pool: &PgPool,
) -> Result<Vec<(String, String, i64, i64, Option<f64>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT aggregate_type, event_type, \
                count(*) FILTER (WHERE NOT dead), \
                count(*) FILTER (WHERE dead), \
                extract(epoch FROM now() - min(created_at) FILTER (WHERE NOT dead))::float8 \
         FROM ( \
             SELECT aggregate_type, event_type, created_at, false AS dead FROM outbox.events \
             WHERE published_at IS NULL AND dead_at IS NULL \
             UNION ALL \
             SELECT aggregate_type, event_type, created_at, true FROM outbox.events \
             WHERE dead_at IS NOT NULL \
         ) AS unpublished \
         GROUP BY aggregate_type, event_type ORDER BY aggregate_type, event_type",
    )
    .fetch_all(pool)
    .await
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
    sqlx::query_as(concat!(
        "SELECT event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, \
                dead_at, attempts, expired_leases, last_error \
         FROM outbox.events WHERE ",
        dead_rows!(),
        " AND ($4::uuid IS NULL OR event_id > $4) ORDER BY event_id LIMIT $5"
    ))
    .bind(selection.aggregate_type)
    .bind(selection.event_type)
    .bind(selection.event_id)
    .bind(after)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Makes dead rows pending again: attempts reset, available now, `last_error` kept. Wakes the
/// relays. Returns how many.
pub(crate) async fn requeue_dead(
    pool: &PgPool,
    selection: &DeadSelection<'_>,
) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let requeued = sqlx::query(concat!(
        "UPDATE outbox.events \
         SET dead_at = NULL, attempts = 0, expired_leases = 0, lease_token = NULL, \
             available_at = now() \
         WHERE ",
        dead_rows!()
    ))
    .bind(selection.aggregate_type)
    .bind(selection.event_type)
    .bind(selection.event_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if requeued > 0 {
        sqlx::query("SELECT pg_notify($1, '')").bind(NOTIFY_CHANNEL).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(requeued)
}

/// Deletes dead rows. Returns how many.
pub(crate) async fn discard_dead(
    pool: &PgPool,
    selection: &DeadSelection<'_>,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(concat!("DELETE FROM outbox.events WHERE ", dead_rows!()))
        .bind(selection.aggregate_type)
        .bind(selection.event_type)
        .bind(selection.event_id)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
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
    let done =
        sqlx::query(PURGE_PUBLISHED).bind(micros(older_than)).bind(limit).execute(pool).await?;
    Ok(done.rows_affected())
}
