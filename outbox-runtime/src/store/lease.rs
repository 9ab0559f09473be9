//! The relay's statements: lease, renew, and the fenced acknowledgements.
//!
//! A relay's acknowledgements and renewals run one after the other on one task: they touch
//! overlapping rows, and two statements locking many rows in different orders would deadlock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::micros;

/// A row the relay holds a lease on.
#[derive(Debug)]
pub(crate) struct LeasedEvent {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) payload: String,
    pub(crate) headers: serde_json::Value,
    pub(crate) created_at: DateTime<Utc>,
    /// Failures and expired leases so far, this lease's expiry included.
    pub(crate) attempts: i32,
    pub(crate) lease_token: Uuid,
    /// The previous lease expired and that was the last attempt: the row is now dead and must
    /// not be delivered.
    pub(crate) died: bool,
}

/// Which event types a relay leases.
pub(crate) enum LeaseFilter<'a> {
    /// Only these `(aggregate_type, event_type)` pairs.
    Only { aggregate_types: &'a [String], event_types: &'a [String] },
    /// Every event, handled or not.
    All,
}

pub(crate) struct LeaseRequest<'a> {
    pub(crate) limit: i64,
    pub(crate) lease_timeout: Duration,
    pub(crate) max_attempts: i32,
    /// Whether a dead ordered event lets the later ones of its aggregate through.
    pub(crate) skip_dead_ordered: bool,
    pub(crate) filter: LeaseFilter<'a>,
}

/// The lease statement around a `candidates` query that selects and locks the rows to lease.
///
/// The candidates are located by `ctid`, the address of the row version they locked (no other
/// statement can replace it while the lock is held): that spares a second, primary-key lookup
/// per row, and leaves the planner a single plan, so the relay can reuse it instead of
/// planning each lease anew.
///
/// The lease pushes `available_at` past the lease timeout, so the row stays invisible to every
/// other relay after this statement commits, until the lease expires. Leasing a row whose
/// previous lease expired counts that expiry as an attempt, and kills the row if it was the last.
macro_rules! lease_sql {
    ($($candidates:expr),+) => {
        concat!(
            "WITH candidates AS (",
            $($candidates,)+
            ") \
             UPDATE outbox.events e \
             SET lease_token  = $2, \
                 available_at = now() + $3::bigint * interval '1 microsecond', \
                 attempts     = e.attempts + (e.lease_token IS NOT NULL)::int, \
                 last_error   = CASE WHEN e.lease_token IS NULL THEN e.last_error \
                                ELSE 'lease expired before the relay acknowledged the event' END, \
                 dead_at      = CASE WHEN e.lease_token IS NOT NULL AND e.attempts + 1 >= $4 \
                                THEN now() END \
             WHERE e.ctid = ANY (ARRAY(SELECT ctid FROM candidates)) \
             RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.event_type, \
                       e.payload::text, e.headers, e.created_at, e.attempts, \
                       e.dead_at IS NOT NULL AS died"
        )
    };
}

/// The condition that keeps an ordered row `r` back while an earlier ordered event of its
/// aggregate is undelivered (leased, failing, delayed, or dead unless `$5` skips dead ones).
/// Gap-free because an ordered emit locks its aggregate before drawing `seq`: every earlier
/// event of the aggregate was committed, and so is visible here, before `r` could exist.
macro_rules! first_in_aggregate {
    () => {
        "(NOT r.ordered OR NOT EXISTS ( \
             SELECT 1 FROM outbox.events p \
             WHERE p.ordered AND p.published_at IS NULL \
               AND p.aggregate_type = r.aggregate_type AND p.aggregate_id = r.aggregate_id \
               AND p.seq < r.seq AND (p.dead_at IS NULL OR NOT $5)))"
    };
}

/// Selects and locks the oldest available rows of the types in `types` (a relation of
/// `aggregate_type, event_type` pairs): one short scan of the `events_pending_by_type` index
/// per type, so rows of other types cost nothing however many pile up.
macro_rules! oldest_per_type {
    ($types:expr) => {
        concat!(
            "SELECT c.ctid FROM ",
            $types,
            " AS h(aggregate_type, event_type) \
             CROSS JOIN LATERAL ( \
                 SELECT r.ctid, r.available_at, r.seq FROM outbox.events r \
                 WHERE r.aggregate_type = h.aggregate_type AND r.event_type = h.event_type \
                   AND r.published_at IS NULL AND r.dead_at IS NULL AND r.available_at <= now() \
                   AND ",
            first_in_aggregate!(),
            " \
                 ORDER BY r.available_at, r.seq \
                 LIMIT $1 \
                 FOR UPDATE SKIP LOCKED \
             ) c \
             ORDER BY c.available_at, c.seq \
             LIMIT $1"
        )
    };
}

/// Leases the oldest available rows of the handled types, `$6` and `$7` column-wise.
pub(crate) const LEASE_HANDLED: &str =
    lease_sql!(oldest_per_type!("UNNEST($6::text[], $7::text[])"));

/// Leases the oldest available rows of any type. The types with pending rows come from a
/// skip scan of the per-type index (one probe per type), not from an index of their own.
const LEASE_ANY: &str = lease_sql!(
    "WITH RECURSIVE pending_types AS ( \
         (SELECT r.aggregate_type, r.event_type FROM outbox.events r \
          WHERE r.published_at IS NULL AND r.dead_at IS NULL \
          ORDER BY r.aggregate_type, r.event_type LIMIT 1) \
         UNION ALL \
         SELECT n.aggregate_type, n.event_type FROM pending_types t CROSS JOIN LATERAL ( \
             SELECT r.aggregate_type, r.event_type FROM outbox.events r \
             WHERE r.published_at IS NULL AND r.dead_at IS NULL \
               AND (r.aggregate_type, r.event_type) > (t.aggregate_type, t.event_type) \
             ORDER BY r.aggregate_type, r.event_type LIMIT 1 \
         ) n \
     ) ",
    oldest_per_type!("pending_types")
);

/// The settings of the relay's lease connection. It plans the lease once and reuses the plan
/// (planning each lease took a fifth of its time), so that plan must stay index-driven however
/// small the table was when it was made: no sequential scans (one planned on an empty outbox
/// took 14 ms a lease once it held 10,000 rows). And no JIT, which the reused plan's cost
/// estimate, with the row limit unknown, would trigger on every lease.
pub(crate) const LEASE_SESSION: &str =
    "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET jit = off";

/// Leases up to `limit` available rows in one statement under a fresh fencing token.
pub(crate) async fn lease(
    pool: &PgPool,
    request: LeaseRequest<'_>,
) -> Result<Vec<LeasedEvent>, sqlx::Error> {
    let token = Uuid::new_v4();
    let sql = match request.filter {
        LeaseFilter::Only { .. } => LEASE_HANDLED,
        LeaseFilter::All => LEASE_ANY,
    };
    let mut query = sqlx::query(sql)
        .bind(request.limit)
        .bind(token)
        .bind(micros(request.lease_timeout))
        .bind(request.max_attempts)
        .bind(request.skip_dead_ordered);
    if let LeaseFilter::Only { aggregate_types, event_types } = request.filter {
        query = query.bind(aggregate_types).bind(event_types);
    }
    let rows = query.fetch_all(pool).await?;
    rows.iter()
        .map(|row| {
            Ok(LeasedEvent {
                event_id: row.try_get(0)?,
                aggregate_type: row.try_get(1)?,
                aggregate_id: row.try_get(2)?,
                event_type: row.try_get(3)?,
                payload: row.try_get(4)?,
                headers: row.try_get(5)?,
                created_at: row.try_get(6)?,
                attempts: row.try_get(7)?,
                died: row.try_get(8)?,
                lease_token: token,
            })
        })
        .collect()
}

/// The fencing every acknowledgement and renewal goes through: it touches a row only under the
/// lease token it names (`h`, the statement's rows of ids and tokens), and never a row that is
/// already published or dead.
macro_rules! fenced {
    () => {
        " WHERE e.event_id = h.event_id AND e.lease_token = h.lease_token \
            AND e.published_at IS NULL AND e.dead_at IS NULL"
    };
}

/// Marks delivered rows published. Returns the ids whose lease was still valid; the others
/// were re-leased by another relay after this one's lease expired, and are left untouched.
pub(crate) async fn publish(
    executor: impl sqlx::PgExecutor<'_>,
    ids: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(concat!(
        "UPDATE outbox.events e SET published_at = now() \
         FROM UNNEST($1::uuid[], $2::uuid[]) AS h(event_id, lease_token)",
        fenced!(),
        " RETURNING e.event_id"
    ))
    .bind(ids)
    .bind(tokens)
    .fetch_all(executor)
    .await
}

/// Failed deliveries, column-wise.
#[derive(Default)]
pub(crate) struct Failures {
    pub(crate) event_ids: Vec<Uuid>,
    pub(crate) tokens: Vec<Uuid>,
    pub(crate) errors: Vec<String>,
    pub(crate) retry_in_micros: Vec<i64>,
}

impl Failures {
    pub(crate) fn push(&mut self, event_id: Uuid, token: Uuid, error: String, retry_in: Duration) {
        self.event_ids.push(event_id);
        self.tokens.push(token);
        self.errors.push(error);
        self.retry_in_micros.push(micros(retry_in));
    }
}

/// A failure that the database accepted (the lease was still valid).
pub(crate) struct RecordedFailure {
    pub(crate) event_id: Uuid,
    pub(crate) dead: bool,
}

/// Records failed deliveries: counts the attempt, keeps the error, schedules the retry, and
/// kills rows that reached `max_attempts`.
pub(crate) async fn fail(
    pool: &PgPool,
    failures: &Failures,
    max_attempts: i32,
) -> Result<Vec<RecordedFailure>, sqlx::Error> {
    let rows = sqlx::query(concat!(
        "UPDATE outbox.events e \
         SET attempts     = e.attempts + 1, \
             last_error   = h.error, \
             lease_token  = NULL, \
             available_at = now() + h.retry_in * interval '1 microsecond', \
             dead_at      = CASE WHEN e.attempts + 1 >= $5 THEN now() END \
         FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::bigint[]) \
              AS h(event_id, lease_token, error, retry_in)",
        fenced!(),
        " RETURNING e.event_id, e.dead_at IS NOT NULL"
    ))
    .bind(&failures.event_ids)
    .bind(&failures.tokens)
    .bind(&failures.errors)
    .bind(&failures.retry_in_micros)
    .bind(max_attempts)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| Ok(RecordedFailure { event_id: row.try_get(0)?, dead: row.try_get(1)? }))
        .collect()
}

/// Hands leased rows back without counting an attempt, available at once to any relay.
pub(crate) async fn release(
    pool: &PgPool,
    ids: &[Uuid],
    tokens: &[Uuid],
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(concat!(
        "UPDATE outbox.events e SET lease_token = NULL, available_at = now() \
         FROM UNNEST($1::uuid[], $2::uuid[]) AS h(event_id, lease_token)",
        fenced!()
    ))
    .bind(ids)
    .bind(tokens)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Pushes the lease deadline of rows this relay still holds. Returns the renewed ids.
pub(crate) async fn renew(
    pool: &PgPool,
    ids: &[Uuid],
    tokens: &[Uuid],
    lease_timeout: Duration,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(concat!(
        "UPDATE outbox.events e SET available_at = now() + $3::bigint * interval '1 microsecond' \
         FROM UNNEST($1::uuid[], $2::uuid[]) AS h(event_id, lease_token)",
        fenced!(),
        " RETURNING e.event_id"
    ))
    .bind(ids)
    .bind(tokens)
    .bind(micros(lease_timeout))
    .fetch_all(pool)
    .await
}

/// Registers a relay as asleep until `until_micros` from now, for producers to NOTIFY it.
/// Returns false without registering if producers are inserting right now (they hold the lock
/// shared): their rows are about to commit, so the relay should look again instead of sleeping.
pub(crate) async fn register_sleeper(
    pool: &PgPool,
    relay_id: Uuid,
    event_types: Option<&[String]>,
    until: Duration,
) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let locked: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox.sleeping_relays', 0))",
    )
    .fetch_one(&mut *tx)
    .await?;
    if !locked {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO outbox.sleeping_relays (relay_id, event_types, until) \
         VALUES ($1, $2, now() + $3::bigint * interval '1 microsecond') \
         ON CONFLICT (relay_id) DO UPDATE SET event_types = $2, until = excluded.until",
    )
    .bind(relay_id)
    .bind(event_types)
    .bind(micros(until))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Withdraws a relay's registration: it is awake and looks for rows by itself.
pub(crate) async fn unregister_sleeper(pool: &PgPool, relay_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM outbox.sleeping_relays WHERE relay_id = $1")
        .bind(relay_id)
        .execute(pool)
        .await?;
    Ok(())
}
