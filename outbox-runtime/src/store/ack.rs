//! The statements on rows a relay holds: renewals and the fenced acknowledgements.
//!
//! Each is fast whatever the table's statistics say, and never waits on a row lock:
//! - A row is found by its primary key and nothing else. The fence reads
//!   `coalesce(published_at, dead_at) IS NULL`, which is not the predicate of the partial
//!   pending index, so the planner cannot walk that index instead (with the statistics of an
//!   empty table it did: a renewal of 40 rows read 240,000 index entries). The rows to touch
//!   come from a `LATERAL ... LIMIT 1` probe per `(id, token)` pair, which the planner can
//!   neither flatten nor turn around, and are then updated by `ctid`: so no join order is left
//!   to get wrong.
//! - Rows are locked `SKIP LOCKED`: a row someone else has locked (an operator's transaction, a
//!   relay that took over an expired lease) is skipped this time and reported by
//!   [`still_leased`], instead of stalling every other acknowledgement behind it. Relays never
//!   wait on each other, so they cannot deadlock.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::{micros, Query, Rows, Scalar};

/// The `ctid`s of the rows `$1` (ids) still leased under `$2` (tokens, column-wise), locked.
/// The fence: a row is touched only under the lease token named, and never once it is
/// published or dead.
macro_rules! fenced_rows {
    () => {
        "WITH mine AS ( \
             SELECT x.ctid FROM UNNEST($1::uuid[], $2::uuid[]) AS h(event_id, lease_token) \
             CROSS JOIN LATERAL ( \
                 SELECT e.ctid FROM outbox.events e \
                 WHERE e.event_id = h.event_id AND e.lease_token = h.lease_token \
                   AND coalesce(e.published_at, e.dead_at) IS NULL \
                 LIMIT 1 FOR UPDATE SKIP LOCKED \
             ) x \
         ) "
    };
}

/// An update of the fenced rows `$1`/`$2`: `SET` clause, then what it returns.
macro_rules! update_fenced {
    ($set:expr, $returning:expr) => {
        concat!(
            fenced_rows!(),
            "UPDATE outbox.events e SET ",
            $set,
            " WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM mine)) RETURNING ",
            $returning
        )
    };
}

/// Marks delivered rows published; `$1` ids, `$2` tokens.
pub(crate) const PUBLISH: &str = update_fenced!("published_at = now()", "e.event_id");

/// Deletes delivered rows instead ([`OnPublish::Delete`]); `$1` ids, `$2` tokens.
pub(crate) const PUBLISH_DELETE: &str = concat!(
    fenced_rows!(),
    "DELETE FROM outbox.events e WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM mine)) \
     RETURNING e.event_id"
);

/// What acknowledging a delivered row does to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum OnPublish {
    /// Sets `published_at`: the row stays as history until retention purges it.
    #[default]
    Mark,
    /// Deletes the row in the acknowledging statement, for applications that keep no history
    /// (dead rows are kept either way).
    Delete,
}

/// Records failed deliveries; `$1` ids, `$2` tokens, `$3` each id's error text and retry delay
/// in microseconds (`{"<id>": ["error", 1000]}`), `$4` the most attempts. A jsonb object rather
/// than two more arrays: its keys are looked up by binary search, while matching array positions
/// would take a join (whose order a stale plan could get wrong) or a linear search per row.
pub(crate) const FAIL: &str = update_fenced!(
    "attempts     = e.attempts + 1, \
     last_error   = $3::jsonb -> e.event_id::text ->> 0, \
     lease_token  = NULL, \
     available_at = now() + ($3::jsonb -> e.event_id::text ->> 1)::bigint \
                    * interval '1 microsecond', \
     dead_at      = CASE WHEN e.attempts + 1 >= $4 THEN now() END",
    "e.event_id, e.dead_at IS NOT NULL"
);

/// Hands rows back without counting an attempt, available at once; `$1` ids, `$2` tokens.
pub(crate) const RELEASE: &str =
    update_fenced!("lease_token = NULL, available_at = now()", "e.event_id");

/// Pushes the lease deadline of held rows; `$1` ids, `$2` tokens, `$3` lease in microseconds.
pub(crate) const RENEW: &str =
    update_fenced!("available_at = now() + $3::bigint * interval '1 microsecond'", "e.event_id");

/// Which of `$1` (ids) are still leased under `$2` (tokens), without locking or waiting.
pub(crate) const STILL_LEASED: &str =
    "SELECT h.event_id FROM UNNEST($1::uuid[], $2::uuid[]) AS h(event_id, lease_token) \
     CROSS JOIN LATERAL ( \
         SELECT 1 FROM outbox.events e \
         WHERE e.event_id = h.event_id AND e.lease_token = h.lease_token \
           AND coalesce(e.published_at, e.dead_at) IS NULL \
         LIMIT 1 \
     ) x";

/// Marks one row published; `$1` id, `$2` token. Waits for the row's lock: it runs in a
/// transactional handler's transaction, where relays hold row locks only for a statement.
pub(crate) const PUBLISH_ONE: &str = "UPDATE outbox.events e SET published_at = now() \
     WHERE e.event_id = $1 AND e.lease_token = $2 \
       AND coalesce(e.published_at, e.dead_at) IS NULL";

/// Deletes one delivered row instead ([`OnPublish::Delete`]); `$1` id, `$2` token.
pub(crate) const PUBLISH_ONE_DELETE: &str = "DELETE FROM outbox.events e \
     WHERE e.event_id = $1 AND e.lease_token = $2 \
       AND coalesce(e.published_at, e.dead_at) IS NULL";

/// Marks delivered rows published, or deletes them. Returns the ids done; the others were
/// either taken over by another relay after this one's lease expired, or locked by someone else
/// (see [`still_leased`]).
pub(crate) async fn publish(
    pool: &PgPool,
    ids: &[Uuid],
    tokens: &[Uuid],
    on_publish: OnPublish,
) -> Result<Vec<Uuid>, sqlx::Error> {
    publish_query(ids, tokens, on_publish).fetch_all(pool).await
}

pub(super) fn publish_query<'q>(
    ids: &'q [Uuid],
    tokens: &'q [Uuid],
    on_publish: OnPublish,
) -> Scalar<'q, Uuid> {
    let sql = match on_publish {
        OnPublish::Mark => PUBLISH,
        OnPublish::Delete => PUBLISH_DELETE,
    };
    sqlx::query_scalar(sql).bind(ids).bind(tokens)
}

/// Marks one delivered row published inside a transactional handler's transaction (see
/// [`PUBLISH_ONE`]). Returns whether the lease was still valid.
pub(crate) async fn publish_in(
    tx: &mut sqlx::PgConnection,
    event_id: Uuid,
    token: Uuid,
    on_publish: OnPublish,
) -> Result<bool, sqlx::Error> {
    // The handler's connection has none of the relay's settings: make sure a plan made while
    // the outbox was small does not scan it now (only for the rest of this transaction).
    sqlx::query("SET LOCAL enable_seqscan = off").execute(&mut *tx).await?;
    let published = publish_one_query(event_id, token, on_publish).execute(&mut *tx).await?;
    Ok(published.rows_affected() == 1)
}

pub(super) fn publish_one_query<'q>(
    event_id: Uuid,
    token: Uuid,
    on_publish: OnPublish,
) -> Query<'q> {
    let sql = match on_publish {
        OnPublish::Mark => PUBLISH_ONE,
        OnPublish::Delete => PUBLISH_ONE_DELETE,
    };
    sqlx::query(sql).bind(event_id).bind(token)
}

/// Failed deliveries, for one [`fail`] statement.
#[derive(Default)]
pub(crate) struct Failures {
    event_ids: Vec<Uuid>,
    tokens: Vec<Uuid>,
    /// `{"<event id>": ["error", retry in microseconds]}`.
    errors: serde_json::Map<String, serde_json::Value>,
}

impl Failures {
    pub(crate) fn push(&mut self, event_id: Uuid, token: Uuid, error: String, retry_in: Duration) {
        self.event_ids.push(event_id);
        self.tokens.push(token);
        self.errors.insert(event_id.to_string(), serde_json::json!([error, micros(retry_in)]));
    }
}

/// Records failed deliveries: counts the attempt, keeps the error, schedules the retry, and
/// kills rows that reached `max_attempts`. Returns the ids done, each with whether it died.
pub(crate) async fn fail(
    pool: &PgPool,
    failures: &Failures,
    max_attempts: u32,
) -> Result<Vec<(Uuid, bool)>, sqlx::Error> {
    fail_query(failures, max_attempts).fetch_all(pool).await
}

pub(super) fn fail_query(failures: &Failures, max_attempts: u32) -> Rows<'_, (Uuid, bool)> {
    sqlx::query_as(FAIL)
        .bind(&failures.event_ids)
        .bind(&failures.tokens)
        .bind(sqlx::types::Json(&failures.errors))
        // `build()` keeps it within `i32`.
        .bind(i32::try_from(max_attempts).unwrap_or(i32::MAX))
}

/// Hands leased rows back without counting an attempt. Returns the ids done.
pub(crate) async fn release(
    pool: &PgPool,
    ids: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    release_query(ids, tokens).fetch_all(pool).await
}

pub(super) fn release_query<'q>(ids: &'q [Uuid], tokens: &'q [Uuid]) -> Scalar<'q, Uuid> {
    sqlx::query_scalar(RELEASE).bind(ids).bind(tokens)
}

/// Pushes the lease deadline of rows this relay still holds. Returns the renewed ids.
pub(crate) async fn renew(
    pool: &PgPool,
    ids: &[Uuid],
    tokens: &[Uuid],
    lease_timeout: Duration,
) -> Result<Vec<Uuid>, sqlx::Error> {
    renew_query(ids, tokens, lease_timeout).fetch_all(pool).await
}

pub(super) fn renew_query<'q>(
    ids: &'q [Uuid],
    tokens: &'q [Uuid],
    lease_timeout: Duration,
) -> Scalar<'q, Uuid> {
    sqlx::query_scalar(RENEW).bind(ids).bind(tokens).bind(micros(lease_timeout))
}

/// Which of the rows are still leased under their tokens: of those an acknowledgement did not
/// touch, the ones that were only locked by someone else, to try again.
pub(crate) async fn still_leased(
    pool: &PgPool,
    ids: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    still_leased_query(ids, tokens).fetch_all(pool).await
}

pub(super) fn still_leased_query<'q>(ids: &'q [Uuid], tokens: &'q [Uuid]) -> Scalar<'q, Uuid> {
    sqlx::query_scalar(STILL_LEASED).bind(ids).bind(tokens)
}
