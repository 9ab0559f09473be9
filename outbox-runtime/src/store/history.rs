//! What the relays delivered over time, read from the published rows the table keeps.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Rows;

/// Published rows per minute since `$1`, on the `published_at` index (an index-only range scan:
/// a busy hour is read without visiting the table). Minutes without one are absent.
pub(crate) async fn published_per_minute(
    pool: &PgPool,
    since: DateTime<Utc>,
) -> Result<Vec<(DateTime<Utc>, i64)>, sqlx::Error> {
    published_per_minute_query(since).fetch_all(pool).await
}

pub(super) fn published_per_minute_query<'q>(
    since: DateTime<Utc>,
) -> Rows<'q, (DateTime<Utc>, i64)> {
    sqlx::query_as(
        "SELECT date_trunc('minute', published_at), count(*) FROM outbox.events \
         WHERE published_at >= $1 GROUP BY 1 ORDER BY 1",
    )
    .bind(since)
}
