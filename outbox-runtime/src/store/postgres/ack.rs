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
//!
//! The outcomes of a held transaction (`LeaseMode::HeldTransaction`, the `HELD_*` statements)
//! need no fence and take no lock: the transaction holds the rows' locks already. Delivered
//! rows are found by their address, failed and snoozed ones by primary key.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{micros, Query, RowAddress, Rows, Scalar};
use crate::store::outcomes::{Failure, Failures, Snoozes};

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

/// What a failure writes, given the failures by id (`$values`, as [`FAIL`] takes them).
///
/// Times are the statement's (`statement_timestamp()`), not the transaction's (`now()`): in a
/// held transaction (`update_held!`) `now()` is when the batch was locked, before its handlers
/// ran, and a retry due "1 s after the failure" would be due already when a slow batch commits.
/// In an autocommitted statement the two are one.
macro_rules! fail_set {
    ($values:literal) => {
        concat!(
            "attempts     = e.attempts + 1, \
             last_error   = ",
            $values,
            "::jsonb -> e.event_id::text ->> 0, \
             lease_token  = NULL, \
             available_at = statement_timestamp() + (",
            $values,
            "::jsonb -> e.event_id::text ->> 1)::bigint \
                            * interval '1 microsecond', \
             dead_at      = CASE WHEN e.attempts + 1 >= (",
            $values,
            "::jsonb -> e.event_id::text ->> 2)::int \
                                 THEN statement_timestamp() END"
        )
    };
}

/// What a snooze writes, given the delays by id (`$values`, as [`SNOOZE`] takes them).
macro_rules! snooze_set {
    ($values:literal) => {
        concat!(
            "lease_token  = NULL, \
             available_at = statement_timestamp() + (",
            $values,
            "::jsonb ->> e.event_id::text)::bigint \
                            * interval '1 microsecond'"
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

/// What a fanned-out event `f` (of the statement's `fanned` rows) leaves for its subscribers,
/// given each one's outcome by event and subscriber (`$values`, as [`FAN_OUT`] takes them): a copy
/// for each subscriber named there that did not take it (JSON `null`), with its outcome, and one
/// due now for each other subscriber registered for its type (run by other relays). One copy per
/// event and subscriber: a replayed event re-arms its published copies as new deliveries, and
/// leaves a pending or dead copy as it is.
macro_rules! copies {
    ($values:literal) => {
        concat!(
            "INSERT INTO outbox.events (source_event_id, subscriber, aggregate_type, aggregate_id, \
                                        event_type, event_version, payload, headers, created_at, \
                                        ordered, available_at, attempts, last_error, dead_at) \
             SELECT f.event_id, s.subscriber, f.aggregate_type, f.aggregate_id, f.event_type, \
                    f.event_version, f.payload, f.headers, f.created_at, f.ordered, \
                    statement_timestamp() + coalesce((s.outcome ->> 1)::bigint, 0) \
                                            * interval '1 microsecond', \
                    coalesce((s.outcome ->> 2)::int, 0), s.outcome ->> 0, \
                    CASE WHEN (s.outcome ->> 3)::boolean THEN statement_timestamp() END \
             FROM fanned f \
             CROSS JOIN LATERAL ( \
                 SELECT o.key AS subscriber, o.value AS outcome \
                 FROM jsonb_each(",
            $values,
            "::jsonb -> f.event_id::text) AS o \
                 WHERE o.value <> 'null'::jsonb \
                 UNION ALL \
                 SELECT r.subscriber, NULL::jsonb FROM outbox.subscribers r \
                 WHERE r.aggregate_type = f.aggregate_type AND r.event_type = f.event_type \
                   AND NOT (",
            $values,
            "::jsonb -> f.event_id::text) ? r.subscriber \
             ) s \
             ON CONFLICT (source_event_id, subscriber) WHERE source_event_id IS NOT NULL \
             DO UPDATE SET published_at = NULL, lease_token = NULL, \
                 available_at = EXCLUDED.available_at, attempts = EXCLUDED.attempts, \
                 expired_leases = 0, last_error = EXCLUDED.last_error, \
                 dead_at = EXCLUDED.dead_at \
             WHERE outbox.events.published_at IS NOT NULL"
        )
    };
}

/// The columns of a fanned-out event its copies take.
macro_rules! fanned_columns {
    () => {
        "e.event_id, e.aggregate_type, e.aggregate_id, e.event_type, e.event_version, e.payload, \
         e.headers, e.created_at, e.ordered"
    };
}

/// Acknowledges events delivered to a relay's subscribers: marks them published and writes a copy
/// for each subscriber that still needs one (see [`copies!`]), in one statement. `$1` ids, `$2`
/// tokens, `$3` each event's outcomes by subscriber: `{"<id>": {"<subscriber>": null}}` for
/// one that took it, `[error, delay in microseconds, attempts, dead]` for one that did not
/// (error null, attempts 0 when it did not fail: snoozed, or held back behind an earlier event).
pub(crate) const FAN_OUT: &str = concat!(
    fenced_rows!(),
    ", fanned AS (UPDATE outbox.events e SET published_at = now() \
       WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM mine)) RETURNING ",
    fanned_columns!(),
    "), copies AS (",
    copies!("$3"),
    ") SELECT f.event_id FROM fanned f"
);

/// [`FAN_OUT`] deleting the events instead ([`OnPublish::Delete`]): their copies keep the
/// payload.
pub(crate) const FAN_OUT_DELETE: &str = concat!(
    fenced_rows!(),
    ", fanned AS (DELETE FROM outbox.events e \
       WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM mine)) RETURNING ",
    fanned_columns!(),
    "), copies AS (",
    copies!("$3"),
    ") SELECT f.event_id FROM fanned f"
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

/// Records failed deliveries; `$1` ids, `$2` tokens, `$3` each id's error text, retry delay in
/// microseconds and most attempts (`{"<id>": ["error", 1000, 10]}`; 0 attempts: dead now). A
/// jsonb object rather than more arrays: its keys are looked up by binary search, while
/// matching array positions would take a join (whose order a stale plan could get wrong) or a
/// linear search per row.
pub(crate) const FAIL: &str = update_fenced!(fail_set!("$3"), "e.event_id, e.dead_at IS NOT NULL");

/// Hands rows back without counting an attempt, available at once; `$1` ids, `$2` tokens.
pub(crate) const RELEASE: &str =
    update_fenced!("lease_token = NULL, available_at = now()", "e.event_id");

/// Hands snoozed rows back without counting an attempt; `$1` ids, `$2` tokens, `$3` each id's
/// delay in microseconds (`{"<id>": 1000}`, a jsonb object for the reason given at [`FAIL`]).
pub(crate) const SNOOZE: &str = update_fenced!(snooze_set!("$3"), "e.event_id");

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

/// An update of rows the relay's held transaction locked (`LeaseMode::HeldTransaction`), `$1`
/// their ids: the locks are the fence, so no token is checked; the lease token an earlier,
/// expired lease left is cleared, so that lease's late acknowledgement finds nothing.
macro_rules! update_held {
    ($set:expr, $returning:expr) => {
        concat!(
            "UPDATE outbox.events e SET ",
            $set,
            " WHERE e.event_id = ANY ($1::uuid[]) RETURNING ",
            $returning
        )
    };
}

/// Marks delivered held rows published; `$1` their addresses (`store::RowAddress`).
pub(crate) const HELD_PUBLISH: &str = "UPDATE outbox.events e \
     SET published_at = statement_timestamp(), lease_token = NULL \
     WHERE e.ctid = ANY ($1::text[]::tid[])";

/// Deletes delivered held rows instead; `$1` their addresses.
pub(crate) const HELD_PUBLISH_DELETE: &str =
    "DELETE FROM outbox.events e WHERE e.ctid = ANY ($1::text[]::tid[])";

/// Records failed deliveries of held rows; `$1` ids, `$2` as [`FAIL`]'s `$3`.
pub(crate) const HELD_FAIL: &str =
    update_held!(fail_set!("$2"), "e.event_id, e.dead_at IS NOT NULL");

/// Hands snoozed held rows back; `$1` ids, `$2` as [`SNOOZE`]'s `$3`.
pub(crate) const HELD_SNOOZE: &str = update_held!(snooze_set!("$2"), "e.event_id");

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

/// Rows to hand back with a value each, for one statement: the ids and tokens, and
/// `{"<event id>": value}`.
#[derive(Default, Clone)]
pub(crate) struct ByRow {
    event_ids: Vec<Uuid>,
    tokens: Vec<Uuid>,
    values: serde_json::Map<String, serde_json::Value>,
}

impl ByRow {
    fn push(&mut self, event_id: Uuid, token: Uuid, value: serde_json::Value) {
        self.event_ids.push(event_id);
        self.tokens.push(token);
        self.values.insert(event_id.to_string(), value);
    }

    fn query<O>(self, sql: &'static str) -> Rows<'static, O>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        sqlx::query_as(sql)
            .bind(self.event_ids)
            .bind(self.tokens)
            .bind(sqlx::types::Json(self.values))
    }

    /// The statement for rows of a held transaction: the ids and the values, no tokens.
    fn held_query<O>(self, sql: &'static str) -> Rows<'static, O>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        sqlx::query_as(sql).bind(self.event_ids).bind(sqlx::types::Json(self.values))
    }
}

/// Events delivered to subscribers, for one [`fan_out`] statement.
#[derive(Default)]
pub(crate) struct FanOuts(ByRow);

/// What one subscriber made of an event delivered to it, for [`FanOuts::push`].
pub(crate) enum Copy<'a> {
    /// It took the event: no copy.
    Taken,
    /// A copy due after `delay`, with `attempts` failed deliveries (0 or 1), the last one's
    /// `error`, dead already if `dead`.
    Due { delay: Duration, attempts: i32, error: Option<&'a str>, dead: bool },
}

impl FanOuts {
    /// An event and its subscribers' outcomes; registered subscribers not named get a copy due
    /// now.
    pub(crate) fn push<'a>(
        &mut self,
        event_id: Uuid,
        token: Uuid,
        outcomes: impl IntoIterator<Item = (&'a str, Copy<'a>)>,
    ) {
        let by_subscriber = outcomes
            .into_iter()
            .map(|(subscriber, copy)| {
                let value = match copy {
                    Copy::Taken => serde_json::Value::Null,
                    Copy::Due { delay, attempts, error, dead } => {
                        serde_json::json!([error, micros(delay), attempts, dead])
                    }
                };
                (subscriber.to_owned(), value)
            })
            .collect();
        self.0.push(event_id, token, serde_json::Value::Object(by_subscriber));
    }
}

/// Acknowledges events delivered to subscribers (see [`FAN_OUT`]). Returns the ids done.
pub(crate) async fn fan_out(
    pool: &PgPool,
    fan_outs: &FanOuts,
    on_publish: OnPublish,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let rows: Vec<(Uuid,)> = fan_out_query(fan_outs, on_publish).fetch_all(pool).await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

pub(super) fn fan_out_query(fan_outs: &FanOuts, on_publish: OnPublish) -> Rows<'static, (Uuid,)> {
    fan_outs.0.clone().query(match on_publish {
        OnPublish::Mark => FAN_OUT,
        OnPublish::Delete => FAN_OUT_DELETE,
    })
}

/// Records failed deliveries: counts the attempt, keeps the error, schedules the retry, and
/// kills rows that reached their most attempts. Returns the ids done, each with whether it died.
pub(crate) async fn fail(
    pool: &PgPool,
    failures: &Failures,
) -> Result<Vec<(Uuid, bool)>, sqlx::Error> {
    fail_query(failures).fetch_all(pool).await
}

pub(super) fn fail_query(failures: &Failures) -> Rows<'static, (Uuid, bool)> {
    failed(failures).query(FAIL)
}

/// Each failure's error, retry delay and most attempts, by row.
fn failed(failures: &Failures) -> ByRow {
    let mut by_row = ByRow::default();
    for failure in &failures.0 {
        let Failure { event_id, token, error, retry_in, max_attempts } = failure;
        by_row.push(*event_id, *token, serde_json::json!([error, micros(*retry_in), max_attempts]));
    }
    by_row
}

/// Each snooze's delay, by row.
fn snoozed(snoozes: &Snoozes) -> ByRow {
    let mut by_row = ByRow::default();
    for &(event_id, token, delay) in &snoozes.0 {
        by_row.push(event_id, token, micros(delay).into());
    }
    by_row
}

/// Hands snoozed rows back, due after their delays, without counting an attempt. Returns the
/// ids done.
pub(crate) async fn snooze(pool: &PgPool, snoozes: &Snoozes) -> Result<Vec<Uuid>, sqlx::Error> {
    let rows: Vec<(Uuid,)> = snooze_query(snoozes).fetch_all(pool).await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

pub(super) fn snooze_query(snoozes: &Snoozes) -> Rows<'static, (Uuid,)> {
    snoozed(snoozes).query(SNOOZE)
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

/// Marks delivered rows of the held transaction `tx` published, or deletes them, by their
/// addresses (the transaction holds their locks, so they are all there).
pub(crate) async fn publish_held(
    tx: &mut PgConnection,
    rows: &[&RowAddress],
    on_publish: OnPublish,
) -> Result<(), sqlx::Error> {
    let addresses: Vec<&str> = rows.iter().map(|row| row.0.as_str()).collect();
    publish_held_query(&addresses, on_publish).execute(tx).await?;
    Ok(())
}

pub(super) fn publish_held_query<'q>(addresses: &'q [&'q str], on_publish: OnPublish) -> Query<'q> {
    let sql = match on_publish {
        OnPublish::Mark => HELD_PUBLISH,
        OnPublish::Delete => HELD_PUBLISH_DELETE,
    };
    sqlx::query(sql).bind(addresses)
}

/// [`fail`] for rows of the held transaction `tx` (their tokens are not read).
pub(crate) async fn fail_held(
    tx: &mut PgConnection,
    failures: &Failures,
) -> Result<Vec<(Uuid, bool)>, sqlx::Error> {
    fail_held_query(failures).fetch_all(tx).await
}

pub(super) fn fail_held_query(failures: &Failures) -> Rows<'static, (Uuid, bool)> {
    failed(failures).held_query(HELD_FAIL)
}

/// [`snooze`] for rows of the held transaction `tx` (their tokens are not read).
pub(crate) async fn snooze_held(
    tx: &mut PgConnection,
    snoozes: &Snoozes,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let rows: Vec<(Uuid,)> = snooze_held_query(snoozes).fetch_all(tx).await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

pub(super) fn snooze_held_query(snoozes: &Snoozes) -> Rows<'static, (Uuid,)> {
    snoozed(snoozes).held_query(HELD_SNOOZE)
}
