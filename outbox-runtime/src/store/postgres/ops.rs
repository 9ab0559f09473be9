//! Operations: health figures, dead letters, retention.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{indexes_only, micros, Query, Rows, Scalar, NOTIFY_CHANNEL};

/// A dead row as stored; the public [`crate::dead_letters::DeadEvent`] is made from it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DeadRow {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) event_version: i32,
    pub(crate) payload: serde_json::Value,
    pub(crate) headers: serde_json::Value,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) dead_at: DateTime<Utc>,
    pub(crate) attempts: i32,
    pub(crate) expired_leases: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) subscriber: String,
    pub(crate) source_event_id: Option<Uuid>,
}

/// Per `(aggregate_type, event_type, event_version)`: `pending`, `dead`, and the oldest pending
/// event's `created_at` as `oldest_pending`. Pending and dead rows are read through their partial
/// indexes, never the published history; each pending row's heap row is visited, so the cost
/// grows with the backlog.
macro_rules! counts_by_type {
    () => {
        "SELECT aggregate_type, event_type, event_version, \
                count(*) FILTER (WHERE NOT dead) AS pending, \
                count(*) FILTER (WHERE dead) AS dead, \
                min(created_at) FILTER (WHERE NOT dead) AS oldest_pending \
         FROM ( \
             SELECT aggregate_type, event_type, event_version, created_at, false AS dead \
             FROM outbox.events WHERE published_at IS NULL AND dead_at IS NULL \
             UNION ALL \
             SELECT aggregate_type, event_type, event_version, created_at, true \
             FROM outbox.events WHERE dead_at IS NOT NULL \
         ) AS unpublished \
         GROUP BY aggregate_type, event_type, event_version"
    };
}

/// Counts pending and dead rows per type and version now (see [`counts_by_type!`]).
pub(crate) async fn stats_by_type(pool: &PgPool) -> Result<Vec<TypeCounts>, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_all, stats_query()))
}

/// `(aggregate_type, event_type, event_version, pending, dead, age of the oldest pending in
/// seconds)`.
pub(crate) type TypeCounts = (String, String, i32, i64, i64, Option<f64>);

/// Pending and dead rows per type and version, with their oldest pending row's age.
pub(crate) const STATS: &str = concat!(
    "SELECT aggregate_type, event_type, event_version, pending, dead, \
            extract(epoch FROM now() - oldest_pending)::float8 \
     FROM (",
    counts_by_type!(),
    ") AS counts ORDER BY aggregate_type, event_type, event_version"
);

pub(super) fn stats_query<'q>() -> Rows<'q, TypeCounts> {
    sqlx::query_as(STATS)
}

/// One type's counts as a stored reading keeps them (the row of [`counts_by_type!`]).
#[derive(Debug, serde::Deserialize)]
pub(super) struct StoredCounts {
    aggregate_type: String,
    event_type: String,
    event_version: i32,
    pending: i64,
    dead: i64,
    oldest_pending: Option<DateTime<Utc>>,
}

/// A stored reading, and the database's clock when it was read, which the ages count to.
pub(super) type Reading = (sqlx::types::Json<Vec<StoredCounts>>, DateTime<Utc>);

/// [`stats_by_type`] as every relay of the database shares it: the reading in
/// `outbox.stats_reading` if it is younger than `max_age`; else one caller counts and stores a
/// new one, under a transaction-scoped advisory lock, while the others get `None` (keep what
/// they had) rather than count too. So the pending rows are counted about once per `max_age`,
/// whatever the number of relays.
pub(crate) async fn shared_stats_by_type(
    pool: &PgPool,
    max_age: Duration,
) -> Result<Option<Vec<TypeCounts>>, sqlx::Error> {
    if let Some(reading) = fresh_reading_query(max_age).fetch_optional(pool).await? {
        return Ok(Some(ages(reading)));
    }
    let mut tx = pool.begin().await?;
    if !count_lock_query().fetch_one(&mut *tx).await? {
        return Ok(None); // another relay is counting
    }
    // Another relay may have stored a reading between the first look and the lock.
    let reading = match fresh_reading_query(max_age).fetch_optional(&mut *tx).await? {
        Some(reading) => reading,
        None => take_reading_query().fetch_one(&mut *tx).await?,
    };
    tx.commit().await?;
    Ok(Some(ages(reading)))
}

fn ages((sqlx::types::Json(by_type), now): Reading) -> Vec<TypeCounts> {
    by_type
        .into_iter()
        .map(|c| {
            let age =
                c.oldest_pending.map(|at| (now - at).num_microseconds().unwrap_or(0) as f64 / 1e6);
            (c.aggregate_type, c.event_type, c.event_version, c.pending, c.dead, age)
        })
        .collect()
}

pub(super) fn fresh_reading_query<'q>(max_age: Duration) -> Rows<'q, Reading> {
    sqlx::query_as(
        "SELECT by_type, now() FROM outbox.stats_reading \
         WHERE read_at > now() - $1::bigint * interval '1 microsecond'",
    )
    .bind(micros(max_age))
}

/// Whether this transaction is the one that counts (the lock is the migration's key).
pub(super) fn count_lock_query<'q>() -> Scalar<'q, bool> {
    sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox.stats_reading', 0))",
    )
}

pub(super) fn take_reading_query<'q>() -> Rows<'q, Reading> {
    sqlx::query_as(concat!(
        "INSERT INTO outbox.stats_reading AS s (read_at, by_type) \
         SELECT now(), coalesce(jsonb_agg(to_jsonb(counts) \
                ORDER BY aggregate_type, event_type, event_version), '[]') \
         FROM (",
        counts_by_type!(),
        ") AS counts \
         ON CONFLICT (only_row) DO UPDATE SET read_at = excluded.read_at, by_type = excluded.by_type \
         RETURNING s.by_type, now()"
    ))
}

/// Which dead rows an operation applies to; `None` matches anything.
pub(crate) struct DeadSelection<'a> {
    pub(crate) aggregate_type: Option<&'a str>,
    pub(crate) event_type: Option<&'a str>,
    pub(crate) event_id: Option<Uuid>,
    /// Text `last_error` contains, ignoring case.
    pub(crate) error_contains: Option<&'a str>,
    /// Dead at or after this instant.
    pub(crate) dead_after: Option<DateTime<Utc>>,
    /// Dead before this instant.
    pub(crate) dead_before: Option<DateTime<Utc>>,
    /// A subscriber's copies only (empty: the events as emitted only).
    pub(crate) subscriber: Option<&'a str>,
}

/// The dead rows matching `$1..$7` (see [`DeadSelection`]), in two forms so that every plan is
/// index-driven whatever the statistics and the parameters: one event by its id (`one`, the
/// primary key), or a range of `dead_at` (`range`, the `events_dead` index, all of it when no
/// bound is given); the other fields filter what the index finds.
macro_rules! dead_rows {
    // `IS TRUE`: a test the planner cannot prove the `events_dead` index's predicate from, so
    // the one row is found by the primary key rather than by a walk of every dead letter.
    (one) => {
        concat!(
            "event_id = $3 AND (dead_at IS NOT NULL) IS TRUE \
                 AND ($5::timestamptz IS NULL OR dead_at >= $5) \
                 AND ($6::timestamptz IS NULL OR dead_at < $6) AND ",
            dead_rows!(filters)
        )
    };
    (range) => {
        concat!(
            "dead_at >= coalesce($5::timestamptz, '-infinity') \
                 AND dead_at < coalesce($6::timestamptz, 'infinity') \
                 AND $3::uuid IS NULL AND ",
            dead_rows!(filters)
        )
    };
    (filters) => {
        "($1::text IS NULL OR aggregate_type = $1) \
         AND ($2::text IS NULL OR event_type = $2) \
         AND ($4::text IS NULL OR strpos(lower(last_error), lower($4)) > 0) \
         AND ($7::text IS NULL OR subscriber = $7)"
    };
}

/// A statement on the dead rows of a selection, in both forms of [`dead_rows!`]: `[range, one]`.
macro_rules! on_dead_rows {
    ($head:expr, $tail:expr) => {
        [concat!($head, dead_rows!(range), $tail), concat!($head, dead_rows!(one), $tail)]
    };
}

impl DeadSelection<'_> {
    /// The form of a statement for this selection.
    fn form(&self, [range, one]: [&'static str; 2]) -> &'static str {
        if self.event_id.is_some() {
            one
        } else {
            range
        }
    }
}

/// Binds a [`DeadSelection`] as `$1..$7`, for [`dead_rows!`].
macro_rules! bind_selection {
    ($query:expr, $selection:expr) => {
        $query
            .bind($selection.aggregate_type)
            .bind($selection.event_type)
            .bind($selection.event_id)
            .bind($selection.error_contains)
            .bind($selection.dead_after)
            .bind($selection.dead_before)
            .bind($selection.subscriber)
    };
}

/// One page of dead rows in event id order (time order for ids made by `emit`), after `after`.
pub(crate) async fn dead(
    pool: &PgPool,
    selection: &DeadSelection<'_>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<DeadRow>, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_all, dead_query(selection, after, limit)))
}

/// One page of dead rows (`$8`: after this id, `$9`: how many). The ids of the matching rows
/// are read first, on the index of their form, and sorted; then the page's rows by the primary
/// key. (A walk of the primary key in id order would read the whole history to find a few dead
/// rows; reading whole matching rows would carry every payload into the sort.)
pub(crate) const DEAD: [&str; 2] = on_dead_rows!(
    "WITH matching AS MATERIALIZED (SELECT event_id FROM outbox.events WHERE ",
    " AND ($8::uuid IS NULL OR event_id > $8)) \
     SELECT event_id, aggregate_type, aggregate_id, event_type, event_version, payload, \
            headers, created_at, dead_at, attempts, expired_leases, last_error, subscriber, \
            source_event_id \
     FROM outbox.events \
     WHERE event_id = ANY (ARRAY(SELECT event_id FROM matching ORDER BY event_id LIMIT $9)) \
     ORDER BY event_id"
);

pub(super) fn dead_query<'q>(
    selection: &DeadSelection<'q>,
    after: Option<Uuid>,
    limit: i64,
) -> Rows<'q, DeadRow> {
    let query = sqlx::query_as(selection.form(DEAD));
    bind_selection!(query, selection).bind(after).bind(limit)
}

/// How many dead rows match.
pub(crate) async fn count_dead(
    pool: &PgPool,
    selection: &DeadSelection<'_>,
) -> Result<i64, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_one, count_dead_query(selection)))
}

/// How many dead rows match.
pub(crate) const COUNT_DEAD: [&str; 2] =
    on_dead_rows!("SELECT count(*) FROM outbox.events WHERE ", "");

pub(super) fn count_dead_query<'q>(selection: &DeadSelection<'q>) -> Scalar<'q, i64> {
    let query = sqlx::query_scalar(selection.form(COUNT_DEAD));
    bind_selection!(query, selection)
}

/// Makes dead rows pending again: attempts reset, available now, `last_error` kept. Wakes the
/// relays. Returns how many.
pub(crate) async fn requeue_dead(
    pool: &PgPool,
    selection: &DeadSelection<'_>,
) -> Result<u64, sqlx::Error> {
    run_and_wake(pool, requeue_query(selection)).await
}

/// Runs `query`, which gives relays rows to lease (requeue, resume, replay), and wakes them in
/// the same transaction if it changed any (the NOTIFY goes out at commit); returns how many.
pub(super) async fn run_and_wake(pool: &PgPool, query: Query<'_>) -> Result<u64, sqlx::Error> {
    let mut tx = indexes_only(pool).await?;
    let changed = query.execute(&mut *tx).await?.rows_affected();
    if changed > 0 {
        notify_query().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(changed)
}

/// Makes the matching dead rows pending again.
pub(crate) const REQUEUE: [&str; 2] = on_dead_rows!(
    "UPDATE outbox.events \
     SET dead_at = NULL, attempts = 0, expired_leases = 0, lease_token = NULL, \
         available_at = now() \
     WHERE ",
    ""
);

pub(super) fn requeue_query<'q>(selection: &DeadSelection<'q>) -> Query<'q> {
    let query = sqlx::query(selection.form(REQUEUE));
    bind_selection!(query, selection)
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
    Ok(on_indexes!(pool, execute, discard_query(selection)).rows_affected())
}

/// Deletes the matching dead rows.
pub(crate) const DISCARD: [&str; 2] = on_dead_rows!("DELETE FROM outbox.events WHERE ", "");

pub(super) fn discard_query<'q>(selection: &DeadSelection<'q>) -> Query<'q> {
    let query = sqlx::query(selection.form(DISCARD));
    bind_selection!(query, selection)
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
