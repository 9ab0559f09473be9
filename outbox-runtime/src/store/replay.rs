//! Replaying published events: their rows made pending again.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::ops::run_and_wake;
use super::{indexes_only, Query, Scalar};

/// The published rows of one type published in `[$3, $4)`, on the `published_at` index.
macro_rules! published_rows {
    () => {
        "published_at >= $3 AND published_at < $4 \
         AND aggregate_type = $1 AND event_type = $2"
    };
}

/// The rows [`replay`] would make pending.
pub(crate) async fn count_published(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<i64, sqlx::Error> {
    let mut tx = indexes_only(pool).await?;
    let count = count_query(aggregate_type, event_type, from, until).fetch_one(&mut *tx).await?;
    tx.commit().await?;
    Ok(count)
}

/// How many published rows [`replay`] would make pending.
pub(crate) const COUNT_PUBLISHED: &str =
    concat!("SELECT count(*) FROM outbox.events WHERE ", published_rows!());

pub(super) fn count_query<'q>(
    aggregate_type: &'q str,
    event_type: &'q str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Scalar<'q, i64> {
    sqlx::query_scalar(COUNT_PUBLISHED).bind(aggregate_type).bind(event_type).bind(from).bind(until)
}

/// Makes those rows pending again (attempts reset, available now, `last_error` kept) and wakes
/// the relays; returns how many.
pub(crate) async fn replay(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    run_and_wake(pool, replay_query(aggregate_type, event_type, from, until)).await
}

pub(super) fn replay_query<'q>(
    aggregate_type: &'q str,
    event_type: &'q str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Query<'q> {
    sqlx::query(concat!(
        "UPDATE outbox.events \
         SET published_at = NULL, attempts = 0, expired_leases = 0, lease_token = NULL, \
             available_at = now() \
         WHERE ",
        published_rows!()
    ))
    .bind(aggregate_type)
    .bind(event_type)
    .bind(from)
    .bind(until)
}
