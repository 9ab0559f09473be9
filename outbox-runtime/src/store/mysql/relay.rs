//! The relay's statements on MySQL and MariaDB: the lease and the fenced acknowledgements.
//!
//! What PostgreSQL does in one statement takes a short transaction here: neither MySQL nor
//! MariaDB has `UPDATE ... RETURNING`. The rows are locked
//! first, `FOR UPDATE SKIP LOCKED` (rows another relay or an operator holds are left to them,
//! and no relay ever waits on one), then updated by their primary key, then read back. The
//! relay's connections run in `READ COMMITTED`, so a locking read takes no gap locks that
//! would hold back producers' inserts.
//!
//! Plan-proof: each statement names its index (`FORCE INDEX`), and a batch is a `JSON_TABLE`
//! joined first (`STRAIGHT_JOIN`) to the table by its primary or unique key, so neither
//! statistics (an outbox analyzed while empty) nor a batch's size can turn a lookup into a
//! scan, and each statement has one text, prepared once per connection.
//!
//! A lease scans each type from the head of the pending index; the scan's starting position
//! (`Scan::From`) is PostgreSQL's answer to its dead index entries, which InnoDB's purge removes
//! on its own.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySqlConnection, MySqlPool, Row};
use uuid::Uuid;

use crate::store::{
    micros, Failures, LeaseKey, LeasePlan, LeaseTypes, LeasedEvent, OnPublish, Scan, Snoozes,
};

/// The rows of one lease key (`?` aggregate type, event type, subscriber) a relay may lease:
/// available, up to the newest version it reads, and for an ordered row, first among its
/// aggregate's undelivered ordered rows (dead ones too, unless the last `?` skips them).
macro_rules! leasable {
    () => {
        "FROM outbox_events r FORCE INDEX (outbox_events_pending_by_type) \
         WHERE r.published_at IS NULL AND r.dead_at IS NULL \
           AND r.aggregate_type = ? AND r.event_type = ? AND r.subscriber = ? \
           AND r.available_at <= UTC_TIMESTAMP(6) AND r.event_version <= ? \
           AND (NOT r.ordered OR NOT EXISTS ( \
               SELECT 1 FROM outbox_events p FORCE INDEX (outbox_events_undelivered_by_aggregate) \
               WHERE p.aggregate_type = r.aggregate_type AND p.aggregate_id = r.aggregate_id \
                 AND p.published_at IS NULL AND p.seq < r.seq AND p.ordered \
                 AND p.subscriber IN ('', r.subscriber) AND (p.dead_at IS NULL OR NOT ?))) \
         ORDER BY r.available_at, r.seq "
    };
}

/// The oldest leasable row of a key, read without locking it: where the key stands in line.
pub(crate) const HEAD: &str = concat!("SELECT r.available_at ", leasable!(), "LIMIT 1");

/// Locks up to `?` leasable rows of a key, the oldest first, skipping rows others hold.
pub(crate) const CANDIDATES: &str = concat!(
    "SELECT r.seq, r.event_id, r.lease_token, r.expired_leases, r.available_at ",
    leasable!(),
    "LIMIT ? FOR UPDATE SKIP LOCKED"
);

/// The first type with pending rows after `(?, ?)`: one probe of the pending index per type,
/// for a relay that leases every type.
pub(crate) const NEXT_PENDING_TYPE: &str = "\
    SELECT CAST(aggregate_type AS CHAR), CAST(event_type AS CHAR) \
    FROM outbox_events FORCE INDEX (outbox_events_pending_by_type) \
    WHERE published_at IS NULL AND dead_at IS NULL \
      AND (aggregate_type > ? OR aggregate_type = ? AND event_type > ?) \
    ORDER BY aggregate_type, event_type LIMIT 1";

/// The rows of `?`, a JSON array of `[seq, ...]`, joined by primary key: `$columns` of the
/// batch's `j` come first, then the table's `e`.
macro_rules! by_seq {
    ($columns:literal) => {
        concat!(
            "JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$[0]'",
            $columns,
            ")) j STRAIGHT_JOIN outbox_events e FORCE INDEX (PRIMARY) ON e.seq = j.seq"
        )
    };
}

/// Leases the rows `[seq, expired_leases, dead, last_error]` of `?` under the token `?` for
/// `?` microseconds: the expired leases counted, and the rows that reached the most dead.
pub(crate) const LEASE: &str = concat!(
    "UPDATE ",
    by_seq!(
        ", expired_leases INT PATH '$[1]', dead BOOLEAN PATH '$[2]', last_error TEXT PATH '$[3]'"
    ),
    " SET e.expired_leases = j.expired_leases, \
          e.dead_at = IF(j.dead, UTC_TIMESTAMP(6), NULL), \
          e.last_error = IF(j.dead, j.last_error, e.last_error), \
          e.lease_token = ?, \
          e.available_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"
);

/// The leased rows of `?` (`[seq]`), as `leased_event` reads them.
pub(crate) const LEASED: &str = concat!(
    "SELECT e.event_id, CAST(e.aggregate_type AS CHAR), CAST(e.aggregate_id AS CHAR), \
            CAST(e.event_type AS CHAR), CAST(e.payload AS CHAR), CAST(e.headers AS CHAR), \
            e.created_at, e.attempts, e.expired_leases, e.dead_at IS NOT NULL, e.event_version, \
            e.seq, e.ordered, CAST(e.subscriber AS CHAR), e.source_event_id FROM ",
    by_seq!("")
);

/// The fence: of `?` (`[id, token]` in hex), the rows still leased under the token named,
/// neither published nor dead, locked (those others hold are skipped: see [`STILL_LEASED`]).
pub(crate) const FENCED: &str = "\
    SELECT e.seq, e.event_id, e.attempts \
    FROM JSON_TABLE(?, '$[*]' COLUMNS (id CHAR(32) PATH '$[0]', token CHAR(32) PATH '$[1]')) h \
    STRAIGHT_JOIN outbox_events e FORCE INDEX (outbox_events_event_id) \
        ON e.event_id = UNHEX(h.id) AND e.lease_token = UNHEX(h.token) \
    WHERE e.published_at IS NULL AND e.dead_at IS NULL \
    FOR UPDATE SKIP LOCKED";

/// Which of `?` (as [`FENCED`] takes them) are still leased, without locking.
pub(crate) const STILL_LEASED: &str = "\
    SELECT e.event_id \
    FROM JSON_TABLE(?, '$[*]' COLUMNS (id CHAR(32) PATH '$[0]', token CHAR(32) PATH '$[1]')) h \
    STRAIGHT_JOIN outbox_events e FORCE INDEX (outbox_events_event_id) \
        ON e.event_id = UNHEX(h.id) AND e.lease_token = UNHEX(h.token) \
    WHERE e.published_at IS NULL AND e.dead_at IS NULL";

pub(crate) const PUBLISH: &str =
    concat!("UPDATE ", by_seq!(""), " SET e.published_at = UTC_TIMESTAMP(6)");
pub(crate) const PUBLISH_DELETE: &str = concat!("DELETE e FROM ", by_seq!(""));
/// `[seq, attempts, dead, error, retry in microseconds]`.
pub(crate) const FAIL: &str = concat!(
    "UPDATE ",
    by_seq!(", attempts INT PATH '$[1]', dead BOOLEAN PATH '$[2]', error TEXT PATH '$[3]', micros BIGINT PATH '$[4]'"),
    " SET e.attempts = j.attempts, e.last_error = j.error, e.lease_token = NULL, \
          e.available_at = UTC_TIMESTAMP(6) + INTERVAL j.micros MICROSECOND, \
          e.dead_at = IF(j.dead, UTC_TIMESTAMP(6), NULL)"
);
pub(crate) const RELEASE: &str =
    concat!("UPDATE ", by_seq!(""), " SET e.lease_token = NULL, e.available_at = UTC_TIMESTAMP(6)");
/// `[seq, delay in microseconds]`.
pub(crate) const SNOOZE: &str = concat!(
    "UPDATE ",
    by_seq!(", micros BIGINT PATH '$[1]'"),
    " SET e.lease_token = NULL, e.available_at = UTC_TIMESTAMP(6) + INTERVAL j.micros MICROSECOND"
);
/// `[seq]`, then the lease in microseconds.
pub(crate) const RENEW: &str = concat!(
    "UPDATE ",
    by_seq!(""),
    " SET e.available_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"
);

/// Deletes up to `?` rows published more than `?` microseconds ago, oldest first.
pub(crate) const PURGE_PUBLISHED: &str = "\
    DELETE FROM outbox_events \
    WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
    ORDER BY published_at LIMIT ?";

/// Binds a lease key's values to a [`leasable!`] statement.
macro_rules! bind_key {
    ($query:expr, $key:expr, $plan:expr) => {
        $query
            .bind(&$key.0 .0)
            .bind(&$key.0 .1)
            .bind(&$key.0 .2)
            .bind($key.1)
            .bind($plan.skip_dead_ordered)
    };
}

/// A lease key and the newest version read of it.
type Key = (LeaseKey, i32);

/// Leases up to `limit` available rows of the plan's types in one short transaction: the
/// types whose oldest row has waited longest first, each locking no more rows than are still
/// wanted. `held`: the rows the relay holds, whose expired leases are not counted.
pub(crate) async fn lease(
    pool: &MySqlPool,
    plan: &LeasePlan,
    _scan: Scan<'_>,
    limit: i64,
    held: &[Uuid],
) -> Result<Vec<LeasedEvent>, sqlx::Error> {
    let token = Uuid::new_v4();
    let held: HashSet<Uuid> = held.iter().copied().collect();
    let mut tx = pool.begin().await?;
    let conn: &mut MySqlConnection = &mut tx;
    let mut heads = Vec::new();
    for key in lease_keys(conn, plan).await? {
        let head: Option<DateTime<Utc>> =
            bind_key!(sqlx::query_scalar(HEAD), key, plan).fetch_optional(&mut *conn).await?;
        heads.extend(head.map(|at| (at, key)));
    }
    heads.sort_by_key(|head| head.0);
    let mut rows = Vec::new();
    let mut positions = HashMap::new();
    for (_, key) in heads {
        let wanted = limit - rows.len() as i64;
        if wanted <= 0 {
            break;
        }
        let candidates = bind_key!(sqlx::query(CANDIDATES), key, plan)
            .bind(wanted)
            .fetch_all(&mut *conn)
            .await?;
        for candidate in candidates {
            let seq: i64 = candidate.try_get(0)?;
            let event_id: Uuid = candidate.try_get(1)?;
            let lease_token: Option<Uuid> = candidate.try_get(2)?;
            let mut expired_leases: i32 = candidate.try_get(3)?;
            let mut dead = false;
            let mut last_error = None;
            if lease_token.is_some() && !held.contains(&event_id) {
                expired_leases += 1;
                if expired_leases >= plan.max_expired_leases {
                    dead = true;
                    last_error = Some(format!(
                        "its lease expired {expired_leases} times before a relay acknowledged it"
                    ));
                }
            }
            positions.insert(seq, candidate.try_get::<DateTime<Utc>, _>(4)?);
            rows.push(serde_json::json!([seq, expired_leases, dead, last_error]));
        }
    }
    if rows.is_empty() {
        tx.commit().await?;
        return Ok(Vec::new());
    }
    let seqs: Vec<_> = rows.iter().map(|row| serde_json::json!([row[0]])).collect();
    sqlx::query(LEASE)
        .bind(serde_json::Value::Array(rows).to_string())
        .bind(token)
        .bind(micros(plan.lease_timeout))
        .execute(&mut *conn)
        .await?;
    let leased = sqlx::query(LEASED)
        .bind(serde_json::Value::Array(seqs).to_string())
        .fetch_all(&mut *conn)
        .await?;
    tx.commit().await?;
    let mut leased = leased
        .iter()
        .map(|row| leased_event(row, token, &positions))
        .collect::<Result<Vec<_>, _>>()?;
    leased.sort_by_key(|row| row.position);
    Ok(leased)
}

/// The keys a lease reads: the plan's types, or every type with pending rows (the plan's up
/// to their versions) and the subscribers' copies it lists.
async fn lease_keys(conn: &mut MySqlConnection, plan: &LeasePlan) -> Result<Vec<Key>, sqlx::Error> {
    let mut keys = plan.types.listed();
    if let LeaseTypes::Only(_) = plan.types {
        return Ok(keys);
    }
    keys.retain(|((_, _, subscriber), _)| !subscriber.is_empty());
    let mut after = (String::new(), String::new());
    while let Some((aggregate_type, event_type)) =
        sqlx::query_as::<_, (String, String)>(NEXT_PENDING_TYPE)
            .bind(&after.0)
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
    row: &MySqlRow,
    token: Uuid,
    positions: &HashMap<i64, DateTime<Utc>>,
) -> Result<LeasedEvent, sqlx::Error> {
    let seq: i64 = row.try_get(11)?;
    let available_at = positions
        .get(&seq)
        .copied()
        .ok_or_else(|| sqlx::Error::Protocol(format!("leased row {seq} was not a candidate")))?;
    let headers: String = row.try_get(5)?;
    let died: i64 = row.try_get(9)?;
    Ok(LeasedEvent {
        event_id: row.try_get(0)?,
        aggregate_type: row.try_get(1)?,
        aggregate_id: row.try_get(2)?,
        event_type: row.try_get(3)?,
        payload: row.try_get(4)?,
        headers: serde_json::from_str(&headers).map_err(|e| sqlx::Error::Decode(e.into()))?,
        created_at: row.try_get(6)?,
        attempts: row.try_get(7)?,
        expired_leases: row.try_get(8)?,
        died: died != 0,
        event_version: row.try_get(10)?,
        position: (available_at, seq),
        ordered: row.try_get(12)?,
        subscriber: row.try_get(13)?,
        source_event_id: row.try_get(14)?,
        lease_token: token,
    })
}

/// `[[id, token], ...]` in hex, for [`FENCED`] and [`STILL_LEASED`].
fn id_token_pairs(ids: &[Uuid], tokens: &[Uuid]) -> String {
    let pairs = ids.iter().zip(tokens).map(|(id, token)| {
        serde_json::json!([id.simple().to_string(), token.simple().to_string()])
    });
    serde_json::Value::Array(pairs.collect()).to_string()
}

/// A fenced row, locked: its `seq`, id and attempts so far.
struct Fenced {
    seq: i64,
    event_id: Uuid,
    attempts: i32,
}

/// Locks the rows still leased under their tokens in `tx`, skipping rows others hold.
async fn fence(
    conn: &mut MySqlConnection,
    ids: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Fenced>, sqlx::Error> {
    let rows: Vec<(i64, Uuid, i32)> =
        sqlx::query_as(FENCED).bind(id_token_pairs(ids, tokens)).fetch_all(conn).await?;
    Ok(rows
        .into_iter()
        .map(|(seq, event_id, attempts)| Fenced { seq, event_id, attempts })
        .collect())
}

/// Runs `sql` on the fenced rows of `ids` and `tokens`, each as the JSON row `values` makes
/// of it, in one transaction; returns the rows done. `extra` is bound after the batch.
async fn on_fenced(
    pool: &MySqlPool,
    ids: &[Uuid],
    tokens: &[Uuid],
    sql: &'static str,
    values: impl Fn(&Fenced) -> serde_json::Value,
    extra: Option<i64>,
) -> Result<Vec<Fenced>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let fenced = fence(&mut tx, ids, tokens).await?;
    if !fenced.is_empty() {
        let batch = serde_json::Value::Array(fenced.iter().map(values).collect()).to_string();
        let query = sqlx::query(sql).bind(batch);
        let query = match extra {
            Some(extra) => query.bind(extra),
            None => query,
        };
        query.execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(fenced)
}

fn seq(row: &Fenced) -> serde_json::Value {
    serde_json::json!([row.seq])
}

fn ids(rows: Vec<Fenced>) -> Vec<Uuid> {
    rows.into_iter().map(|row| row.event_id).collect()
}

pub(crate) async fn publish(
    pool: &MySqlPool,
    ids_: &[Uuid],
    tokens: &[Uuid],
    on_publish: OnPublish,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let sql = match on_publish {
        OnPublish::Mark => PUBLISH,
        OnPublish::Delete => PUBLISH_DELETE,
    };
    Ok(ids(on_fenced(pool, ids_, tokens, sql, seq, None).await?))
}

pub(crate) async fn fail(
    pool: &MySqlPool,
    failures: &Failures,
) -> Result<Vec<(Uuid, bool)>, sqlx::Error> {
    let by_id: HashMap<Uuid, _> = failures.0.iter().map(|f| (f.event_id, f)).collect();
    let (ids_, tokens): (Vec<Uuid>, Vec<Uuid>) =
        failures.0.iter().map(|f| (f.event_id, f.token)).unzip();
    let dies = |row: &Fenced| row.attempts + 1 >= by_id[&row.event_id].max_attempts;
    let values = |row: &Fenced| {
        let failure = by_id[&row.event_id];
        serde_json::json!([
            row.seq,
            row.attempts + 1,
            dies(row),
            failure.error,
            micros(failure.retry_in)
        ])
    };
    let done = on_fenced(pool, &ids_, &tokens, FAIL, values, None).await?;
    Ok(done.iter().map(|row| (row.event_id, dies(row))).collect())
}

pub(crate) async fn release(
    pool: &MySqlPool,
    ids_: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    Ok(ids(on_fenced(pool, ids_, tokens, RELEASE, seq, None).await?))
}

pub(crate) async fn snooze(pool: &MySqlPool, snoozes: &Snoozes) -> Result<Vec<Uuid>, sqlx::Error> {
    let delays: HashMap<Uuid, Duration> =
        snoozes.0.iter().map(|&(id, _, delay)| (id, delay)).collect();
    let (ids_, tokens): (Vec<Uuid>, Vec<Uuid>) =
        snoozes.0.iter().map(|&(id, token, _)| (id, token)).unzip();
    let values = |row: &Fenced| serde_json::json!([row.seq, micros(delays[&row.event_id])]);
    Ok(ids(on_fenced(pool, &ids_, &tokens, SNOOZE, values, None).await?))
}

pub(crate) async fn renew(
    pool: &MySqlPool,
    ids_: &[Uuid],
    tokens: &[Uuid],
    lease_timeout: Duration,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let lease = Some(micros(lease_timeout));
    Ok(ids(on_fenced(pool, ids_, tokens, RENEW, seq, lease).await?))
}

pub(crate) async fn still_leased(
    pool: &MySqlPool,
    ids: &[Uuid],
    tokens: &[Uuid],
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(STILL_LEASED).bind(id_token_pairs(ids, tokens)).fetch_all(pool).await
}

pub(crate) async fn purge_published(
    pool: &MySqlPool,
    older_than: Duration,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let purged = sqlx::query(PURGE_PUBLISHED).bind(micros(older_than)).bind(limit).execute(pool);
    Ok(purged.await?.rows_affected())
}
