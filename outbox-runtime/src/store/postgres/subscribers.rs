//! The subscribers' registry, and what the fan-out of an ordered event reads.

use sqlx::PgPool;

use super::Scalar;

/// Registers subscribers, `$1` to `$3` (aggregate types, event types, names) column-wise; those
/// registered already keep their registration.
pub(crate) const REGISTER: &str =
    "INSERT INTO outbox.subscribers (aggregate_type, event_type, subscriber) \
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[]) \
     ON CONFLICT (aggregate_type, event_type, subscriber) DO NOTHING";

/// The subscribers with an undelivered copy of an ordered event of the aggregate `$1`, `$2`
/// (dead ones too, unless `$3` skips dead events): a later event of the aggregate waits for them,
/// so it is not delivered to them at once but copied behind. Every such copy is of an earlier
/// event: an event is copied when it is acknowledged, which the later events wait for.
pub(crate) const BEHIND: &str = "SELECT DISTINCT p.subscriber FROM outbox.events p \
     WHERE p.ordered AND p.published_at IS NULL \
       AND p.aggregate_type = $1 AND p.aggregate_id = $2 \
       AND p.subscriber <> '' AND (p.dead_at IS NULL OR NOT $3)";

/// Registers `(aggregate_type, event_type, subscriber)` keys, column-wise.
pub(crate) async fn register(
    pool: &PgPool,
    aggregate_types: &[&str],
    event_types: &[&str],
    subscribers: &[&str],
) -> Result<(), sqlx::Error> {
    register_query(aggregate_types, event_types, subscribers).execute(pool).await?;
    Ok(())
}

pub(super) fn register_query<'q>(
    aggregate_types: &'q [&'q str],
    event_types: &'q [&'q str],
    subscribers: &'q [&'q str],
) -> super::Query<'q> {
    sqlx::query(REGISTER).bind(aggregate_types).bind(event_types).bind(subscribers)
}

/// The subscribers an ordered event of the aggregate waits for (see [`BEHIND`]).
pub(crate) async fn behind(
    pool: &PgPool,
    aggregate_type: &str,
    aggregate_id: &str,
    skip_dead: bool,
) -> Result<Vec<String>, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_all, behind_query(aggregate_type, aggregate_id, skip_dead)))
}

pub(super) fn behind_query<'q>(
    aggregate_type: &'q str,
    aggregate_id: &'q str,
    skip_dead: bool,
) -> Scalar<'q, String> {
    sqlx::query_scalar(BEHIND).bind(aggregate_type).bind(aggregate_id).bind(skip_dead)
}

/// Where a registration `s`'s pending copies `r` lie: its range of the pending index. The
/// comparison on the index's next columns gives that index the most conditions, so no plan made
/// on an empty outbox prefers another index on the aggregate type (`events_by_aggregate`), which
/// would read the type's whole history.
macro_rules! pending_copies {
    () => {
        "r.aggregate_type = s.aggregate_type AND r.event_type = s.event_type \
         AND r.subscriber = s.subscriber AND (r.available_at, r.seq) > ('-infinity', 0) \
         AND r.published_at IS NULL AND r.dead_at IS NULL"
    };
}

/// Each registered subscriber with its pending copies (how many, the oldest event's
/// `created_at`) and dead ones: the pending ones on the pending index (per registration, its
/// range), the dead ones in one pass over the dead index (a range of `dead_at`, for the same
/// reason as [`pending_copies!`]; grouped by the subscriber first, an order no index on the
/// aggregate type could hand over presorted).
pub(crate) const LIST: &str = concat!(
    "WITH dead AS MATERIALIZED ( \
         SELECT aggregate_type, event_type, subscriber, count(*) AS dead FROM outbox.events \
         WHERE dead_at >= '-infinity' AND subscriber <> '' \
         GROUP BY subscriber, aggregate_type, event_type) \
     SELECT s.aggregate_type, s.event_type, s.subscriber, s.registered_at, \
            p.pending, p.oldest_pending, coalesce(d.dead, 0) AS dead \
     FROM outbox.subscribers s \
     CROSS JOIN LATERAL ( \
         SELECT count(*) AS pending, min(r.created_at) AS oldest_pending FROM outbox.events r \
         WHERE ",
    pending_copies!(),
    ") p \
     LEFT JOIN dead d ON d.aggregate_type = s.aggregate_type AND d.event_type = s.event_type \
                     AND d.subscriber = s.subscriber \
     ORDER BY s.subscriber, s.aggregate_type, s.event_type"
);

/// A registered subscriber, as [`LIST`] reads it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SubscriberRow {
    pub(crate) aggregate_type: String,
    pub(crate) event_type: String,
    pub(crate) subscriber: String,
    pub(crate) registered_at: chrono::DateTime<chrono::Utc>,
    pub(crate) pending: i64,
    pub(crate) oldest_pending: Option<chrono::DateTime<chrono::Utc>>,
    pub(crate) dead: i64,
}

/// Every registered subscriber (see [`LIST`]).
pub(crate) async fn list(pool: &PgPool) -> Result<Vec<SubscriberRow>, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_all, list_query()))
}

pub(super) fn list_query<'q>() -> super::Rows<'q, SubscriberRow> {
    sqlx::query_as(LIST)
}

/// Removes the subscriber `$1`: its registrations, then its pending copies (found through them,
/// on the pending index) and its dead ones (on the dead index). Returns how many of each.
/// Published copies stay as history, for retention.
pub(crate) const REMOVE: &str = concat!(
    "WITH gone AS ( \
         DELETE FROM outbox.subscribers WHERE subscriber = $1 \
         RETURNING aggregate_type, event_type, subscriber), \
     pending AS ( \
         DELETE FROM outbox.events e WHERE e.ctid = ANY (ARRAY( \
             SELECT r.ctid FROM gone s CROSS JOIN LATERAL ( \
                 SELECT r.ctid FROM outbox.events r WHERE ",
    pending_copies!(),
    ") r)) \
         RETURNING 1), \
     dead AS ( \
         DELETE FROM outbox.events e WHERE e.dead_at >= '-infinity' AND e.subscriber = $1 \
         RETURNING 1) \
     SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM pending), \
            (SELECT count(*) FROM dead)"
);

/// Removes a subscriber (see [`REMOVE`]): `(registrations, pending copies, dead copies)`.
pub(crate) async fn remove(
    pool: &PgPool,
    subscriber: &str,
) -> Result<(i64, i64, i64), sqlx::Error> {
    Ok(on_indexes!(pool, fetch_one, remove_query(subscriber)))
}

pub(super) fn remove_query(subscriber: &str) -> super::Rows<'_, (i64, i64, i64)> {
    sqlx::query_as(REMOVE).bind(subscriber)
}
