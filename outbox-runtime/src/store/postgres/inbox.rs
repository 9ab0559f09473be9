//! The inbox (`outbox.inbox`): one row per consumer and event id that arrived from a broker.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{micros, Query, Rows, INDEXES_ONLY};

/// A message's columns, as every inbox statement writes them.
pub(crate) struct InboxKey<'a> {
    pub(crate) consumer: &'a str,
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: &'a str,
    pub(crate) aggregate_id: &'a str,
    pub(crate) event_type: &'a str,
    pub(crate) version: i32,
}

/// Claims the message for its handler in the handler's transaction: records it handled unless
/// it was handled or died before. Returns the failed attempts before this one, or `None` for a
/// message already handled or dead (the row is locked either way, until the transaction ends,
/// so a concurrent delivery of the same message waits for this one's outcome).
pub(crate) async fn claim(
    tx: &mut PgConnection,
    key: &InboxKey<'_>,
) -> Result<Option<i32>, sqlx::Error> {
    Ok(claim_query(key).fetch_optional(tx).await?.map(|(attempts,)| attempts))
}

pub(crate) const CLAIM: &str = "INSERT INTO outbox.inbox \
     (consumer, event_id, aggregate_type, aggregate_id, event_type, event_version, handled_at) \
     VALUES ($1, $2, $3, $4, $5, $6, now()) \
     ON CONFLICT (consumer, event_id) DO UPDATE \
     SET handled_at = now(), payload = NULL, headers = NULL \
     WHERE inbox.handled_at IS NULL AND inbox.dead_at IS NULL \
     RETURNING attempts";

pub(super) fn claim_query<'q>(key: &'q InboxKey<'q>) -> Rows<'q, (i32,)> {
    bind_key(sqlx::query_as(CLAIM), key)
}

/// Whether a message [`claim`] found settled died (else it was handled). Runs in the claim's
/// transaction, which holds nothing else and is rolled back after: so it can forbid sequential
/// scans for the rest of it, and the kept plan of this lookup, made on a new (empty) inbox,
/// stays on the primary key when the inbox has grown.
pub(crate) async fn is_dead(
    tx: &mut PgConnection,
    consumer: &str,
    event_id: Uuid,
) -> Result<bool, sqlx::Error> {
    sqlx::query(INDEXES_ONLY).execute(&mut *tx).await?;
    is_dead_query(consumer, event_id).fetch_one(tx).await.map(|(dead,)| dead)
}

pub(crate) const IS_DEAD: &str =
    "SELECT dead_at IS NOT NULL FROM outbox.inbox WHERE consumer = $1 AND event_id = $2";

pub(super) fn is_dead_query(consumer: &str, event_id: Uuid) -> Rows<'_, (bool,)> {
    sqlx::query_as(IS_DEAD).bind(consumer).bind(event_id)
}

/// A failed handler call, to record after its transaction rolled back.
pub(crate) struct InboxFailure<'a> {
    pub(crate) error: &'a str,
    /// The handler rejected the message: it dies whatever its attempts.
    pub(crate) rejected: bool,
    pub(crate) max_attempts: i32,
    pub(crate) payload: &'a str,
    pub(crate) headers: &'a serde_json::Value,
}

/// Counts a failed attempt and keeps the message; returns `(attempts, dead)`, or `None` if the
/// message was handled (by a concurrent delivery) or died meanwhile.
pub(crate) async fn fail(
    pool: &PgPool,
    key: &InboxKey<'_>,
    failure: &InboxFailure<'_>,
) -> Result<Option<(i32, bool)>, sqlx::Error> {
    fail_query(key, failure).fetch_optional(pool).await
}

pub(crate) const FAIL: &str = "INSERT INTO outbox.inbox \
     (consumer, event_id, aggregate_type, aggregate_id, event_type, event_version, \
      attempts, last_error, dead_at, payload, headers) \
     VALUES ($1, $2, $3, $4, $5, $6, 1, $7, CASE WHEN $8 OR 1 >= $9 THEN now() END, $10, $11) \
     ON CONFLICT (consumer, event_id) DO UPDATE \
     SET attempts = inbox.attempts + 1, last_error = EXCLUDED.last_error, \
         dead_at = CASE WHEN $8 OR inbox.attempts + 1 >= $9 THEN now() END, \
         payload = EXCLUDED.payload, headers = EXCLUDED.headers \
     WHERE inbox.handled_at IS NULL AND inbox.dead_at IS NULL \
     RETURNING attempts, dead_at IS NOT NULL";

pub(super) fn fail_query<'q>(
    key: &'q InboxKey<'q>,
    failure: &'q InboxFailure<'q>,
) -> Rows<'q, (i32, bool)> {
    bind_key(sqlx::query_as(FAIL), key)
        .bind(failure.error)
        .bind(failure.rejected)
        .bind(failure.max_attempts)
        .bind(failure.payload)
        .bind(failure.headers)
}

/// Deletes up to `limit` of a consumer's handled rows older than `older_than`, oldest first;
/// returns how many it deleted. In an [`indexes_only`](super::indexes_only) transaction, as the
/// operations' statements: it reads the handled rows' index, whatever the statistics say.
pub(crate) async fn purge_handled(
    pool: &PgPool,
    consumer: &str,
    older_than: std::time::Duration,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let done = on_indexes!(pool, execute, purge_handled_query(consumer, older_than, limit));
    Ok(done.rows_affected())
}

pub(crate) const PURGE_HANDLED: &str = "DELETE FROM outbox.inbox WHERE (consumer, event_id) IN \
     (SELECT consumer, event_id FROM outbox.inbox \
      WHERE consumer = $1 AND handled_at IS NOT NULL \
        AND handled_at < now() - make_interval(secs => $2::float8 / 1e6) \
      ORDER BY handled_at LIMIT $3)";

pub(super) fn purge_handled_query(
    consumer: &str,
    older_than: std::time::Duration,
    limit: i64,
) -> Query<'_> {
    sqlx::query(PURGE_HANDLED).bind(consumer).bind(micros(older_than)).bind(limit)
}

/// Binds `$1` to `$6`, the message's columns.
fn bind_key<'q, T>(query: Rows<'q, T>, key: &'q InboxKey<'q>) -> Rows<'q, T> {
    query
        .bind(key.consumer)
        .bind(key.event_id)
        .bind(key.aggregate_type)
        .bind(key.aggregate_id)
        .bind(key.event_type)
        .bind(key.version)
}

/// A dead (or failing) message's row: `(event_id, aggregate_type, aggregate_id, event_type,
/// event_version, payload, headers, received_at, dead_at, attempts, last_error)`.
pub(crate) type InboxDeadRow = (
    Uuid,
    String,
    String,
    String,
    i32,
    Option<String>,
    Option<serde_json::Value>,
    chrono::DateTime<chrono::Utc>,
    Option<chrono::DateTime<chrono::Utc>>,
    i32,
    Option<String>,
);

/// Up to `limit` of a consumer's dead messages, the longest dead first.
pub(crate) async fn dead(
    pool: &PgPool,
    consumer: &str,
    limit: i64,
) -> Result<Vec<InboxDeadRow>, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_all, dead_query(consumer, limit)))
}

pub(crate) const DEAD: &str = "SELECT event_id, aggregate_type, aggregate_id, event_type, \
     event_version, payload, headers, received_at, dead_at, attempts, last_error \
     FROM outbox.inbox WHERE consumer = $1 AND dead_at IS NOT NULL \
     ORDER BY dead_at, event_id LIMIT $2";

pub(super) fn dead_query(consumer: &str, limit: i64) -> Rows<'_, InboxDeadRow> {
    sqlx::query_as(DEAD).bind(consumer).bind(limit)
}

/// How many of a consumer's messages are dead.
pub(crate) async fn count_dead(pool: &PgPool, consumer: &str) -> Result<i64, sqlx::Error> {
    let (count,) = on_indexes!(pool, fetch_one, count_dead_query(consumer));
    Ok(count)
}

pub(crate) const COUNT_DEAD: &str =
    "SELECT count(*) FROM outbox.inbox WHERE consumer = $1 AND dead_at IS NOT NULL";

pub(super) fn count_dead_query(consumer: &str) -> Rows<'_, (i64,)> {
    sqlx::query_as(COUNT_DEAD).bind(consumer)
}

/// Deletes a dead message; returns whether it was there (and dead).
pub(crate) async fn discard(
    pool: &PgPool,
    consumer: &str,
    event_id: Uuid,
) -> Result<bool, sqlx::Error> {
    let done = on_indexes!(pool, execute, discard_query(consumer, event_id));
    Ok(done.rows_affected() == 1)
}

pub(crate) const DISCARD: &str =
    "DELETE FROM outbox.inbox WHERE consumer = $1 AND event_id = $2 AND dead_at IS NOT NULL";

pub(super) fn discard_query(consumer: &str, event_id: Uuid) -> Query<'_> {
    sqlx::query(DISCARD).bind(consumer).bind(event_id)
}

/// Brings a message back from the dead (or a failing one, whose broker stopped delivering it)
/// with `attempts` failures counted, so that the next failure decides again; returns its row,
/// or `None` if it is not there, or handled.
pub(crate) async fn revive(
    pool: &PgPool,
    consumer: &str,
    event_id: Uuid,
    attempts: i32,
) -> Result<Option<InboxDeadRow>, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_optional, revive_query(consumer, event_id, attempts)))
}

pub(crate) const REVIVE: &str = "UPDATE outbox.inbox SET dead_at = NULL, attempts = $3 \
     WHERE consumer = $1 AND event_id = $2 AND handled_at IS NULL AND payload IS NOT NULL \
     RETURNING event_id, aggregate_type, aggregate_id, event_type, event_version, payload, \
               headers, received_at, dead_at, attempts, last_error";

pub(super) fn revive_query(
    consumer: &str,
    event_id: Uuid,
    attempts: i32,
) -> Rows<'_, InboxDeadRow> {
    sqlx::query_as(REVIVE).bind(consumer).bind(event_id).bind(attempts)
}
