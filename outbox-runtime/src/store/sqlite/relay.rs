//! The relay's statements on SQLite: the lease and the fenced acknowledgements.
//!
//! SQLite writes one transaction at a time, so what PostgreSQL needs row locks and
//! `SKIP LOCKED` for is a transaction that takes the write lock first (`BEGIN IMMEDIATE`):
//! while one relay leases, no other statement writes, and the rows it reads are the rows it
//! updates. Each statement reaches its rows by rowid, by the unique `event_id` (a batch of
//! acknowledgements is one statement, the batch a JSON array joined by it), or by a range of the
//! partial `outbox_events_pending_by_type` index, so no statistics can turn them into scans
//! (`tests/relay_backends.rs` checks each plan).
//!
//! A lease scans each type from the head of that index every time: SQLite removes an index
//! entry with its row, so unlike PostgreSQL the head holds no dead entries to step over, and the
//! scan's starting position (`Scan::From`) is not needed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection, SqlitePool};
use uuid::Uuid;

use super::{delay_modifier, INSTANT};
use crate::store::{
    micros, Failures, LeaseKey, LeasePlan, LeaseTypes, LeasedEvent, OnPublish, Scan, Snoozes,
};

/// Now, as the schema stores instants.
macro_rules! now {
    () => {
        "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    };
}

/// The rows of one lease key (`?1` aggregate type, `?2` event type, `?3` subscriber) a relay
/// may lease: available, up to `?4` (the newest version it reads), and for an ordered row,
/// first among its aggregate's undelivered ordered rows (dead ones too, unless `?5` skips
/// them). The oldest `?6` first, on the pending index.
pub(crate) const CANDIDATES: &str = concat!(
    "SELECT r.seq, r.event_id, r.lease_token, r.available_at FROM outbox_events r \
     WHERE r.aggregate_type = ?1 AND r.event_type = ?2 AND r.subscriber = ?3 \
       AND r.published_at IS NULL AND r.dead_at IS NULL AND r.available_at <= ",
    now!(),
    " AND r.event_version <= ?4 \
       AND (r.ordered = 0 OR NOT EXISTS ( \
           SELECT 1 FROM outbox_events p \
           WHERE p.ordered = 1 AND p.published_at IS NULL \
             AND p.aggregate_type = r.aggregate_type AND p.aggregate_id = r.aggregate_id \
             AND p.seq < r.seq AND p.subscriber IN ('', r.subscriber) \
             AND (p.dead_at IS NULL OR NOT ?5))) \
     ORDER BY r.available_at, r.seq LIMIT ?6"
);

/// The first type with pending rows after `(?1, ?2)`: one probe of the pending index per type,
/// for a relay that leases every type.
pub(crate) const NEXT_PENDING_TYPE: &str = "\
    SELECT aggregate_type, event_type FROM outbox_events \
    WHERE published_at IS NULL AND dead_at IS NULL AND (aggregate_type, event_type) > (?1, ?2) \
    ORDER BY aggregate_type, event_type LIMIT 1";

/// What the lease returns of each row, in the order `leased_event` reads it.
macro_rules! leased_columns {
    () => {
        " RETURNING event_id, aggregate_type, aggregate_id, event_type, payload, headers, \
         created_at, attempts, expired_leases, dead_at IS NOT NULL, event_version, seq, ordered, \
         subscriber, source_event_id"
    };
}

/// Leases the rows `?3` (their `seq`s, a JSON array) under the token `?1` for `?2` (a
/// `strftime` modifier).
pub(crate) const LEASE: &str = concat!(
    "UPDATE outbox_events SET lease_token = ?1, available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?2) \
     WHERE seq IN (SELECT value FROM json_each(?3))",
    leased_columns!()
);

/// [`LEASE`] for rows whose previous lease expired: counts the expiry, and kills the row at
/// `?4` expiries.
pub(crate) const LEASE_EXPIRED: &str = concat!(
    "UPDATE outbox_events SET lease_token = ?1, available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?2), \
         expired_leases = expired_leases + 1, \
         last_error = CASE WHEN expired_leases + 1 >= ?4 \
                      THEN format('its lease expired %d times before a relay acknowledged it', \
                                  expired_leases + 1) \
                      ELSE last_error END, \
         dead_at = CASE WHEN expired_leases + 1 >= ?4 THEN ",
    now!(),
    " END \
     WHERE seq IN (SELECT value FROM json_each(?3))",
    leased_columns!()
);

/// The batch `?1`, a JSON array of `[id, token, ...]` (ids and tokens in hex), as the relation
/// `h` of `event_id`, `lease_token` and `$columns` (more of each element), joined to the rows
/// `e` it names that are still leased under the token named, neither published nor dead: one
/// probe of the unique `event_id` index per element. The fence reads
/// `coalesce(published_at, dead_at) IS NULL`, not the pending index's predicate: with it the
/// planner scanned that whole index and probed the batch for each entry (`tests/relay_backends.rs`
/// caught it).
macro_rules! fenced {
    ($columns:literal) => {
        concat!(
            " FROM (SELECT unhex(j.value ->> 0) AS event_id, unhex(j.value ->> 1) AS lease_token",
            $columns,
            " FROM json_each(?1) AS j) AS h \
             WHERE e.event_id = h.event_id AND e.lease_token = h.lease_token \
               AND coalesce(e.published_at, e.dead_at) IS NULL"
        )
    };
}

/// An update of the fenced rows of the batch: `SET` clause, `h`'s further columns, what it
/// returns.
macro_rules! update_fenced {
    ($set:expr, $columns:literal, $returning:literal) => {
        concat!(
            "UPDATE outbox_events AS e SET ",
            $set,
            fenced!($columns),
            " RETURNING ",
            $returning
        )
    };
}

pub(crate) const PUBLISH: &str = update_fenced!(concat!("published_at = ", now!()), "", "event_id");
pub(crate) const PUBLISH_DELETE: &str = concat!(
    "DELETE FROM outbox_events WHERE seq IN (SELECT e.seq FROM outbox_events AS e, ",
    "(SELECT unhex(j.value ->> 0) AS event_id, unhex(j.value ->> 1) AS lease_token \
      FROM json_each(?1) AS j) AS h \
     WHERE e.event_id = h.event_id AND e.lease_token = h.lease_token \
       AND coalesce(e.published_at, e.dead_at) IS NULL) RETURNING event_id"
);
/// Each element `[id, token, error, the retry's strftime modifier, most attempts]`.
pub(crate) const FAIL: &str = update_fenced!(
    concat!(
        "attempts = e.attempts + 1, last_error = h.error, lease_token = NULL, \
         available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', h.delay), \
         dead_at = CASE WHEN e.attempts + 1 >= h.max_attempts THEN ",
        now!(),
        " END"
    ),
    ", j.value ->> 2 AS error, j.value ->> 3 AS delay, j.value ->> 4 AS max_attempts",
    "event_id, dead_at IS NOT NULL"
);
pub(crate) const RELEASE: &str =
    update_fenced!(concat!("lease_token = NULL, available_at = ", now!()), "", "event_id");
/// Each element `[id, token, the delay's strftime modifier]`.
pub(crate) const SNOOZE: &str = update_fenced!(
    "lease_token = NULL, available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', h.delay)",
    ", j.value ->> 2 AS delay",
    "event_id"
);
/// `?2` the lease's `strftime` modifier.
pub(crate) const RENEW: &str =
    update_fenced!("available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?2)", "", "event_id");
pub(crate) const STILL_LEASED: &str = concat!(
    "SELECT e.event_id FROM outbox_events AS e, ",
    "(SELECT unhex(j.value ->> 0) AS event_id, unhex(j.value ->> 1) AS lease_token \
      FROM json_each(?1) AS j) AS h \
     WHERE e.event_id = h.event_id AND e.lease_token = h.lease_token \
       AND coalesce(e.published_at, e.dead_at) IS NULL"
);

/// Deletes up to `?2` rows published before the modifier `?1` (a negative delay) applied to
/// now, oldest first, on the `published_at` index.
pub(crate) const PURGE_PUBLISHED: &str = "\
    DELETE FROM outbox_events WHERE seq IN ( \
        SELECT seq FROM outbox_events \
        WHERE published_at < strftime('%Y-%m-%d %H:%M:%f', 'now', ?1) \
        ORDER BY published_at LIMIT ?2)";

/// The relay's SQLite pool, and its turn to write: the relay's writing transactions (a lease,
/// a batch of acknowledgements, renewals, retention) take turns in the process rather than on
/// SQLite's lock, where the one that finds it taken sleeps in SQLite's busy handler (1 ms,
/// then 2, 5, 10, ...) however soon the lock is free again. The application's transactions
/// still meet them on the lock.
#[derive(Debug, Clone)]
pub struct Writer {
    pub(crate) pool: SqlitePool,
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Writer {
    pub(crate) fn new(pool: SqlitePool) -> Self {
        Writer { pool, turn: Arc::default() }
    }

    /// Waits for the relay's turn, then begins a transaction that holds SQLite's write lock.
    async fn begin(
        &self,
    ) -> Result<
        (tokio::sync::MutexGuard<'_, ()>, sqlx::Transaction<'static, sqlx::Sqlite>),
        sqlx::Error,
    > {
        let turn = self.turn.lock().await;
        Ok((turn, self.pool.begin_with("BEGIN IMMEDIATE").await?))
    }
}

/// A candidate row: its `seq`, whether its previous lease expired, and its position.
struct Candidate {
    seq: i64,
    expired: bool,
    available_at: DateTime<Utc>,
}

/// Where each leased row stood before its lease, by `seq`.
type Positions = HashMap<i64, DateTime<Utc>>;

/// Leases up to `limit` available rows of the plan's types, oldest first across them, in one
/// transaction that holds the write lock; `held`: the rows the relay holds, whose expired
/// leases are not counted.
pub(crate) async fn lease(
    pool: &Writer,
    plan: &LeasePlan,
    _scan: Scan<'_>,
    limit: i64,
    held: &[Uuid],
) -> Result<Vec<LeasedEvent>, sqlx::Error> {
    let token = Uuid::new_v4();
    let held: HashSet<Uuid> = held.iter().copied().collect();
    let (_turn, mut tx) = pool.begin().await?;
    let conn: &mut SqliteConnection = &mut tx;
    let mut candidates = Vec::new();
    for ((aggregate_type, event_type, subscriber), newest) in lease_keys(conn, plan).await? {
        let rows = sqlx::query(CANDIDATES)
            .bind(&aggregate_type)
            .bind(&event_type)
            .bind(&subscriber)
            .bind(newest)
            .bind(plan.skip_dead_ordered)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        for row in rows {
            let event_id: Uuid = row.try_get(1)?;
            let lease_token: Option<Uuid> = row.try_get(2)?;
            candidates.push(Candidate {
                seq: row.try_get(0)?,
                expired: lease_token.is_some() && !held.contains(&event_id),
                available_at: instant(row.try_get(3)?)?,
            });
        }
    }
    // Each type's oldest rows came first; the oldest of them all are leased.
    candidates.sort_by_key(|c| (c.available_at, c.seq));
    candidates.truncate(usize::try_from(limit).unwrap_or(0));
    let positions: Positions = candidates.iter().map(|c| (c.seq, c.available_at)).collect();
    let lease_for = delay_modifier(micros(plan.lease_timeout));
    let mut leased = Vec::with_capacity(candidates.len());
    for expired in [false, true] {
        let seqs: Vec<i64> =
            candidates.iter().filter(|c| c.expired == expired).map(|c| c.seq).collect();
        if seqs.is_empty() {
            continue;
        }
        let sql = if expired { LEASE_EXPIRED } else { LEASE };
        let rows = sqlx::query(sql)
            .bind(token)
            .bind(&lease_for)
            .bind(serde_json::to_string(&seqs).expect("integers serialize"))
            .bind(plan.max_expired_leases)
            .fetch_all(&mut *conn)
            .await?;
        for row in &rows {
            leased.push(leased_event(row, token, &positions)?);
        }
    }
    tx.commit().await?;
    leased.sort_by_key(|row| row.position);
    Ok(leased)
}

/// The keys a lease reads: the plan's types, or every type with pending rows (the plan's up
/// to their versions) and the subscribers' copies it lists.
async fn lease_keys(
    conn: &mut SqliteConnection,
    plan: &LeasePlan,
) -> Result<Vec<(LeaseKey, i32)>, sqlx::Error> {
    let mut keys = plan.types.listed();
    if let LeaseTypes::Only(_) = plan.types {
        return Ok(keys);
    }
    keys.retain(|((_, _, subscriber), _)| !subscriber.is_empty());
    let mut after = (String::new(), String::new());
    while let Some((aggregate_type, event_type)) =
        sqlx::query_as::<_, (String, String)>(NEXT_PENDING_TYPE)
            .bind(&after.0)
            .bind(&after.1)
            .fetch_optional(&mut *conn)
            .await?
    {
        let key = (aggregate_type.clone(), event_type.clone(), String::new());
        let newest = plan.types.newest_version(&key);
        keys.push((key, newest));
        after = (aggregate_type, event_type);
    }
    Ok(keys)
}

fn leased_event(
    row: &SqliteRow,
    token: Uuid,
    positions: &Positions,
) -> Result<LeasedEvent, sqlx::Error> {
    let seq: i64 = row.try_get(11)?;
    let available_at = positions
        .get(&seq)
        .copied()
        .ok_or_else(|| sqlx::Error::Protocol(format!("leased row {seq} was not a candidate")))?;
    let headers: String = row.try_get(5)?;
    Ok(LeasedEvent {
        event_id: row.try_get(0)?,
        aggregate_type: row.try_get(1)?,
        aggregate_id: row.try_get(2)?,
        event_type: row.try_get(3)?,
        payload: row.try_get(4)?,
        headers: serde_json::from_str(&headers).map_err(|e| sqlx::Error::Decode(e.into()))?,
        created_at: instant(row.try_get(6)?)?,
        attempts: row.try_get(7)?,
        expired_leases: row.try_get(8)?,
        died: row.try_get(9)?,
        event_version: row.try_get(10)?,
        position: (available_at, seq),
        ordered: row.try_get(12)?,
        subscriber: row.try_get(13)?,
        source_event_id: row.try_get(14)?,
        lease_token: token,
    })
}

/// An instant as the schema stores it.
pub(crate) fn instant(text: &str) -> Result<DateTime<Utc>, sqlx::Error> {
    NaiveDateTime::parse_from_str(text, INSTANT)
        .map(|at| at.and_utc())
        .map_err(|e| sqlx::Error::Decode(format!("instant {text:?}: {e}").into()))
}

/// `[id, token, values...]` in hex, then each value, for the fenced statements.
fn batch(rows: impl Iterator<Item = (Uuid, Uuid, Vec<serde_json::Value>)>) -> String {
    let rows = rows.map(|(id, token, values)| {
        let mut row = vec![id.simple().to_string().into(), token.simple().to_string().into()];
        row.extend(values);
        serde_json::Value::Array(row)
    });
    serde_json::Value::Array(rows.collect()).to_string()
}

fn pairs(ids: &[Uuid], tokens: &[Uuid]) -> String {
    batch(ids.iter().zip(tokens).map(|(id, token)| (*id, *token, Vec::new())))
}

/// Runs the fenced statement `sql` on the batch in a transaction of its own (with `extra` bound
/// as `?2`, if any); returns what it returned of each row touched.
async fn on_fenced<O>(
    pool: &Writer,
    sql: &'static str,
    batch: String,
    extra: Option<String>,
) -> Result<Vec<O>, sqlx::Error>
where
    O: for<'r> sqlx::FromRow<'r, SqliteRow> + Send + Unpin,
{
    let (_turn, mut tx) = pool.begin().await?;
    let query = sqlx::query_as(sql).bind(batch);
    let query = match extra {
        Some(extra) => query.bind(extra),
        None => query,
    };
    let done = query.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(done)
}

fn ids(rows: Vec<(Uuid,)>) -> Vec<Uuid> {
    rows.into_iter().map(|(id,)| id).collect()
}

pub(crate) async fn publish(
    pool: &Writer,
    ids_: &[Uuid],
    tokens: &[Uuid],
    on_publish: OnPublish,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let sql = match on_publish {
        OnPublish::Mark => PUBLISH,
        OnPublish::Delete => PUBLISH_DELETE,
    };
    Ok(ids(on_fenced(pool, sql, pairs(ids_, tokens), None).await?))
}

pub(crate) async fn fail(
    pool: &Writer,
    failures: &Failures,
) -> Result<Vec<(Uuid, bool)>, sqlx::Error> {
    let rows = failures.0.iter().map(|f| {
        let delay = delay_modifier(micros(f.retry_in));
        (f.event_id, f.token, vec![f.error.clone().into(), delay.into(), f.max_attempts.into()])
    });
    on_fenced(pool, FAIL, batch(rows), None).await
}

pub(crate) async fn release(
    pool: &Writer,
    ids_: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    Ok(ids(on_fenced(pool, RELEASE, pairs(ids_, tokens), None).await?))
}

pub(crate) async fn snooze(pool: &Writer, snoozes: &Snoozes) -> Result<Vec<Uuid>, sqlx::Error> {
    let rows = snoozes
        .0
        .iter()
        .map(|&(id, token, delay)| (id, token, vec![delay_modifier(micros(delay)).into()]));
    Ok(ids(on_fenced(pool, SNOOZE, batch(rows), None).await?))
}

pub(crate) async fn renew(
    pool: &Writer,
    ids_: &[Uuid],
    tokens: &[Uuid],
    lease_timeout: Duration,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let lease_for = Some(delay_modifier(micros(lease_timeout)));
    Ok(ids(on_fenced(pool, RENEW, pairs(ids_, tokens), lease_for).await?))
}

pub(crate) async fn still_leased(
    pool: &Writer,
    ids: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(STILL_LEASED).bind(pairs(ids, tokens)).fetch_all(&pool.pool).await
}

pub(crate) async fn purge_published(
    pool: &Writer,
    older_than: Duration,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let micros = micros(older_than);
    let before = format!("-{}.{:06} seconds", micros / 1_000_000, micros % 1_000_000);
    let (_turn, mut tx) = pool.begin().await?;
    let purged = sqlx::query(PURGE_PUBLISHED).bind(before).bind(limit).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(purged.rows_affected())
}
