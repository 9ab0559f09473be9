//! The relay's statements on SQLite: the lease and the fenced acknowledgements.
//!
//! SQLite writes one transaction at a time, so what PostgreSQL needs row locks and
//! `SKIP LOCKED` for is a transaction that takes the write lock first (`BEGIN IMMEDIATE`):
//! while one relay leases, no other statement writes, and the rows it reads are the rows it
//! updates. Each statement is a short index probe, run many times in one transaction (a call
//! into the library, not a round trip): by rowid, by the unique `event_id`, or a range of the
//! partial `outbox_events_pending_by_type` index, so no statistics can turn them into scans.
//!
//! A lease scans each type from the head of that index every time: SQLite removes an index
//! entry with its row, so unlike PostgreSQL the head holds no dead entries to step over, and the
//! scan's starting position (`Scan::From`) is not needed.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection, SqlitePool};
use uuid::Uuid;

use super::{delay_modifier, INSTANT};
use crate::store::{
    micros, Failures, LeasePlan, LeaseTypes, LeasedEvent, OnPublish, Scan, Snoozes,
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

/// The fence: the row `?1` still leased under the token `?2`, neither published nor dead.
macro_rules! fenced {
    () => {
        " WHERE event_id = ?1 AND lease_token = ?2 AND published_at IS NULL AND dead_at IS NULL"
    };
}

pub(crate) const PUBLISH: &str =
    concat!("UPDATE outbox_events SET published_at = ", now!(), fenced!());
pub(crate) const PUBLISH_DELETE: &str = concat!("DELETE FROM outbox_events", fenced!());
/// `?3` the error, `?4` the retry's `strftime` modifier, `?5` the most attempts.
pub(crate) const FAIL: &str = concat!(
    "UPDATE outbox_events SET attempts = attempts + 1, last_error = ?3, lease_token = NULL, \
         available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?4), \
         dead_at = CASE WHEN attempts + 1 >= ?5 THEN ",
    now!(),
    " END",
    fenced!(),
    " RETURNING dead_at IS NOT NULL"
);
pub(crate) const RELEASE: &str =
    concat!("UPDATE outbox_events SET lease_token = NULL, available_at = ", now!(), fenced!());
/// `?3` the delay's `strftime` modifier.
pub(crate) const SNOOZE: &str = concat!(
    "UPDATE outbox_events SET lease_token = NULL, \
         available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?3)",
    fenced!()
);
/// `?3` the lease's `strftime` modifier.
pub(crate) const RENEW: &str = concat!(
    "UPDATE outbox_events SET available_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?3)",
    fenced!()
);
pub(crate) const STILL_LEASED: &str = concat!("SELECT 1 FROM outbox_events", fenced!());

/// Deletes up to `?2` rows published before the modifier `?1` (a negative delay) applied to
/// now, oldest first, on the `published_at` index.
pub(crate) const PURGE_PUBLISHED: &str = "\
    DELETE FROM outbox_events WHERE seq IN ( \
        SELECT seq FROM outbox_events \
        WHERE published_at < strftime('%Y-%m-%d %H:%M:%f', 'now', ?1) \
        ORDER BY published_at LIMIT ?2)";

/// A candidate row: its `seq`, whether its previous lease expired, and its position.
struct Candidate {
    seq: i64,
    expired: bool,
    available_at: DateTime<Utc>,
}

/// Leases up to `limit` available rows of the plan's types, oldest first across them, in one
/// transaction that holds the write lock; `held`: the rows the relay holds, whose expired
/// leases are not counted.
pub(crate) async fn lease(
    pool: &SqlitePool,
    plan: &LeasePlan,
    _scan: Scan<'_>,
    limit: i64,
    held: &[Uuid],
) -> Result<Vec<LeasedEvent>, sqlx::Error> {
    let token = Uuid::new_v4();
    let held: HashSet<Uuid> = held.iter().copied().collect();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let conn: &mut SqliteConnection = &mut tx;
    let mut candidates = Vec::new();
    for (aggregate_type, event_type, subscriber, newest) in lease_keys(conn, plan).await? {
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
            leased.push(leased_event(row, token, &candidates)?);
        }
    }
    tx.commit().await?;
    leased.sort_by_key(|row| row.position);
    Ok(leased)
}

/// The keys a lease reads: the plan's types, or every type with pending rows (the plan's up
/// to their versions).
async fn lease_keys(
    conn: &mut SqliteConnection,
    plan: &LeasePlan,
) -> Result<Vec<(String, String, String, i32)>, sqlx::Error> {
    let (LeaseTypes::Only(types) | LeaseTypes::All(types)) = &plan.types;
    let listed = (0..types.event_types.len()).map(|i| {
        let key = (&types.aggregate_types[i], &types.event_types[i], &types.subscribers[i]);
        (key.0.clone(), key.1.clone(), key.2.clone(), types.versions[i])
    });
    if let LeaseTypes::Only(_) = plan.types {
        return Ok(listed.collect());
    }
    let mut keys: Vec<_> = listed.filter(|key| !key.2.is_empty()).collect();
    let mut after = (String::new(), String::new());
    while let Some((aggregate_type, event_type)) =
        sqlx::query_as::<_, (String, String)>(NEXT_PENDING_TYPE)
            .bind(&after.0)
            .bind(&after.1)
            .fetch_optional(&mut *conn)
            .await?
    {
        let newest = (0..types.event_types.len())
            .find(|&i| {
                types.aggregate_types[i] == aggregate_type
                    && types.event_types[i] == event_type
                    && types.subscribers[i].is_empty()
            })
            .map_or(i32::MAX, |i| types.versions[i]);
        keys.push((aggregate_type.clone(), event_type.clone(), String::new(), newest));
        after = (aggregate_type, event_type);
    }
    Ok(keys)
}

fn leased_event(
    row: &SqliteRow,
    token: Uuid,
    candidates: &[Candidate],
) -> Result<LeasedEvent, sqlx::Error> {
    let seq: i64 = row.try_get(11)?;
    let available_at =
        candidates.iter().find(|c| c.seq == seq).map(|c| c.available_at).ok_or_else(|| {
            sqlx::Error::Protocol(format!("leased row {seq} was not a candidate"))
        })?;
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

/// Runs the fenced statement `sql` for each row in one transaction holding the write lock;
/// returns the ids it touched. Each row's third value, if any, is bound after its id and token.
async fn each_fenced(
    pool: &SqlitePool,
    sql: &'static str,
    rows: impl IntoIterator<Item = (Uuid, Uuid, Option<String>)>,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let mut done = Vec::new();
    for (event_id, token, value) in rows {
        let query = sqlx::query(sql).bind(event_id).bind(token);
        let query = match value {
            Some(value) => query.bind(value),
            None => query,
        };
        if query.execute(&mut *tx).await?.rows_affected() == 1 {
            done.push(event_id);
        }
    }
    tx.commit().await?;
    Ok(done)
}

/// Each id with its token, and nothing more to bind.
fn pairs(ids: &[Uuid], tokens: &[Uuid]) -> Vec<(Uuid, Uuid, Option<String>)> {
    ids.iter().zip(tokens).map(|(id, token)| (*id, *token, None)).collect()
}

pub(crate) async fn publish(
    pool: &SqlitePool,
    ids: &[Uuid],
    tokens: &[Uuid],
    on_publish: OnPublish,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let sql = match on_publish {
        OnPublish::Mark => PUBLISH,
        OnPublish::Delete => PUBLISH_DELETE,
    };
    each_fenced(pool, sql, pairs(ids, tokens)).await
}

pub(crate) async fn fail(
    pool: &SqlitePool,
    failures: &Failures,
) -> Result<Vec<(Uuid, bool)>, sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let mut done = Vec::new();
    for failure in &failures.0 {
        let died: Option<bool> = sqlx::query_scalar(FAIL)
            .bind(failure.event_id)
            .bind(failure.token)
            .bind(&failure.error)
            .bind(delay_modifier(micros(failure.retry_in)))
            .bind(failure.max_attempts)
            .fetch_optional(&mut *tx)
            .await?;
        done.extend(died.map(|died| (failure.event_id, died)));
    }
    tx.commit().await?;
    Ok(done)
}

pub(crate) async fn release(
    pool: &SqlitePool,
    ids: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    each_fenced(pool, RELEASE, pairs(ids, tokens)).await
}

pub(crate) async fn snooze(pool: &SqlitePool, snoozes: &Snoozes) -> Result<Vec<Uuid>, sqlx::Error> {
    let rows: Vec<_> = snoozes
        .0
        .iter()
        .map(|&(id, token, delay)| (id, token, Some(delay_modifier(micros(delay)))))
        .collect();
    each_fenced(pool, SNOOZE, rows).await
}

pub(crate) async fn renew(
    pool: &SqlitePool,
    ids: &[Uuid],
    tokens: &[Uuid],
    lease_timeout: Duration,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let lease_for = delay_modifier(micros(lease_timeout));
    let rows: Vec<_> =
        ids.iter().zip(tokens).map(|(id, token)| (*id, *token, Some(lease_for.clone()))).collect();
    each_fenced(pool, RENEW, rows).await
}

pub(crate) async fn still_leased(
    pool: &SqlitePool,
    ids: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut leased = Vec::new();
    for (id, token) in ids.iter().zip(tokens) {
        let found = sqlx::query(STILL_LEASED).bind(id).bind(token).fetch_optional(&mut *conn);
        if found.await?.is_some() {
            leased.push(*id);
        }
    }
    Ok(leased)
}

pub(crate) async fn purge_published(
    pool: &SqlitePool,
    older_than: Duration,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let micros = micros(older_than);
    let before = format!("-{}.{:06} seconds", micros / 1_000_000, micros % 1_000_000);
    let purged = sqlx::query(PURGE_PUBLISHED).bind(before).bind(limit).execute(pool).await?;
    Ok(purged.rows_affected())
}
