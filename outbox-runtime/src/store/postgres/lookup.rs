//! Reading events whatever their state: one by its id, or an aggregate's in order.

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
    Ok(on_indexes!(pool, fetch_optional, event_query(event_id)))
}

/// The columns of an [`EventRow`].
macro_rules! event_columns {
    () => {
        "SELECT event_id, aggregate_type, aggregate_id, event_type, event_version, ordered, \
                idempotency_key, payload, headers, created_at, available_at, attempts, \
                expired_leases, last_error, published_at, dead_at, \
                lease_token IS NOT NULL AND available_at > now() AS leased, \
                available_at > now() AS later \
         FROM outbox.events "
    };
}

/// The event with id `$1`, by the primary key.
pub(crate) const EVENT: &str = concat!(event_columns!(), "WHERE event_id = $1");

/// The undelivered ordered events of aggregate `$1`/`$2` in their order, up to `$3`, on the
/// `events_ordered_undelivered` index: what holds an ordered aggregate back.
pub(crate) const AGGREGATE_UNDELIVERED: &str = concat!(
    event_columns!(),
    "WHERE ordered AND published_at IS NULL AND aggregate_type = $1 AND aggregate_id = $2 \
     ORDER BY seq LIMIT $3"
);

/// Every event of aggregate `$1`/`$2` in emit order, up to `$3`, on the optional index
/// [`AGGREGATE_INDEX`].
pub(crate) const AGGREGATE_ALL: &str = concat!(
    event_columns!(),
    "WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY seq LIMIT $3"
);

/// The index an operator creates for [`AGGREGATE_ALL`]: not made by the migrations, since
/// every emit would pay for it.
pub(crate) const AGGREGATE_INDEX: &str = "events_by_aggregate";

/// An aggregate's events, in order: every event if the database has [`AGGREGATE_INDEX`], else
/// its undelivered ordered events; with which it was.
pub(crate) async fn aggregate_events(
    pool: &PgPool,
    aggregate_type: &str,
    aggregate_id: &str,
    limit: i64,
) -> Result<(Vec<EventRow>, bool), sqlx::Error> {
    let mut tx = indexes_only(pool).await?;
    let indexed: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT FROM pg_indexes WHERE schemaname = 'outbox' AND indexname = $1)",
    )
    .bind(AGGREGATE_INDEX)
    .fetch_one(&mut *tx)
    .await?;
    let sql = if indexed { AGGREGATE_ALL } else { AGGREGATE_UNDELIVERED };
    let rows =
        aggregate_query(sql, aggregate_type, aggregate_id, limit).fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok((rows, indexed))
}

pub(super) fn aggregate_query<'q>(
    sql: &'static str,
    aggregate_type: &'q str,
    aggregate_id: &'q str,
    limit: i64,
) -> Rows<'q, EventRow> {
    sqlx::query_as(sql).bind(aggregate_type).bind(aggregate_id).bind(limit)
}

pub(super) fn event_query<'q>(event_id: Uuid) -> Rows<'q, EventRow> {
    sqlx::query_as(EVENT).bind(event_id)
}
