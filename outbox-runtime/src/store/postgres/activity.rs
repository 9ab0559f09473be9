//! `outbox.activity`: the relays' deliveries and the outbox's readings, minute by minute.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{Query, Rows, Scalar};

/// Adds `delivered` to the current minute's row; returns whether the minute still lacks its
/// reading (the caller then takes it).
pub(crate) async fn add_delivered(pool: &PgPool, delivered: u64) -> Result<bool, sqlx::Error> {
    add_delivered_query(delivered).fetch_one(pool).await
}

pub(super) fn add_delivered_query<'q>(delivered: u64) -> Scalar<'q, bool> {
    sqlx::query_scalar(
        "INSERT INTO outbox.activity AS a (minute, delivered) \
         VALUES (date_trunc('minute', now()), $1) \
         ON CONFLICT (minute) DO UPDATE SET delivered = a.delivered + excluded.delivered \
         RETURNING NOT a.read",
    )
    .bind(i64::try_from(delivered).unwrap_or(i64::MAX))
}

/// Stores the current minute's reading, unless another relay did, and deletes the rows older
/// than a day (by the primary key).
pub(crate) async fn record_reading(
    pool: &PgPool,
    pending: i64,
    dead: i64,
    oldest_pending_age_secs: Option<f64>,
) -> Result<(), sqlx::Error> {
    record_reading_query(pending, dead, oldest_pending_age_secs).execute(pool).await?;
    Ok(())
}

pub(super) fn record_reading_query<'q>(
    pending: i64,
    dead: i64,
    oldest_pending_age_secs: Option<f64>,
) -> Query<'q> {
    sqlx::query(
        "WITH reading AS ( \
             UPDATE outbox.activity \
             SET pending = $1, dead = $2, oldest_pending_age_secs = $3, read = true \
             WHERE minute = date_trunc('minute', now()) AND NOT read) \
         DELETE FROM outbox.activity WHERE minute < now() - interval '1 day'",
    )
    .bind(pending)
    .bind(dead)
    .bind(oldest_pending_age_secs)
}

/// One minute of `outbox.activity`.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ActivityRow {
    pub(crate) minute: DateTime<Utc>,
    pub(crate) delivered: i64,
    pub(crate) pending: Option<i64>,
    pub(crate) dead: Option<i64>,
    pub(crate) oldest_pending_age_secs: Option<f64>,
}

/// The minutes since `since`, oldest first (a range of the primary key).
#[cfg_attr(not(feature = "console"), allow(dead_code))]
pub(crate) async fn activity(
    pool: &PgPool,
    since: DateTime<Utc>,
) -> Result<Vec<ActivityRow>, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_all, activity_query(since)))
}

/// The minutes since `$1`.
pub(crate) const ACTIVITY: &str =
    "SELECT minute, delivered, pending, dead, oldest_pending_age_secs \
     FROM outbox.activity WHERE minute >= $1 ORDER BY minute";

pub(super) fn activity_query<'q>(since: DateTime<Utc>) -> Rows<'q, ActivityRow> {
    sqlx::query_as(ACTIVITY).bind(since)
}
