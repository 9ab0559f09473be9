//! What operators read of the outbox on SQLite.

use std::time::Duration;

use sqlx::SqlitePool;

use super::relay::instant;
use crate::stats::OutboxStats;

/// Pending and dead rows, and the oldest pending row's `created_at`: counts over the partial
/// indexes of pending and dead rows.
pub(crate) const STATS: &str = "\
    SELECT (SELECT count(*) FROM outbox_events WHERE published_at IS NULL AND dead_at IS NULL), \
           (SELECT count(*) FROM outbox_events WHERE dead_at IS NOT NULL), \
           (SELECT min(created_at) FROM outbox_events \
            WHERE published_at IS NULL AND dead_at IS NULL)";

pub(super) async fn stats(pool: &SqlitePool) -> Result<OutboxStats, sqlx::Error> {
    let (pending, dead, oldest): (i64, i64, Option<String>) =
        sqlx::query_as(STATS).fetch_one(pool).await?;
    // SQLite's clock is the process's.
    let age = |at: chrono::DateTime<chrono::Utc>| {
        (chrono::Utc::now() - at).to_std().unwrap_or(Duration::ZERO)
    };
    let oldest_pending_age = oldest.as_deref().map(instant).transpose()?.map(age);
    Ok(OutboxStats { pending, dead, oldest_pending_age })
}
