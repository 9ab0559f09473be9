//! What operators read of the outbox on MySQL.

use std::time::Duration;

use sqlx::MySqlPool;

use crate::stats::OutboxStats;

/// Pending and dead rows, and how long ago the oldest pending row was created, in microseconds
/// of the server's clock.
pub(crate) const STATS: &str = "\
    SELECT (SELECT count(*) FROM outbox_events FORCE INDEX (outbox_events_pending_by_type) \
            WHERE published_at IS NULL AND dead_at IS NULL), \
           (SELECT count(*) FROM outbox_events FORCE INDEX (outbox_events_dead) \
            WHERE dead_at IS NOT NULL), \
           (SELECT TIMESTAMPDIFF(MICROSECOND, min(created_at), UTC_TIMESTAMP(6)) \
            FROM outbox_events FORCE INDEX (outbox_events_pending_by_type) \
            WHERE published_at IS NULL AND dead_at IS NULL)";

pub(super) async fn stats(pool: &MySqlPool) -> Result<OutboxStats, sqlx::Error> {
    let (pending, dead, age): (i64, i64, Option<i64>) =
        sqlx::query_as(STATS).fetch_one(pool).await?;
    let oldest_pending_age = age.map(|micros| Duration::from_micros(micros.max(0).unsigned_abs()));
    Ok(OutboxStats { pending, dead, oldest_pending_age })
}
