//! The relays' entries in `outbox.relays`: each running relay's heartbeat, and the list
//! operators read.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{micros, Query, Rows};

/// What a relay writes of itself at every heartbeat.
#[derive(Debug, Clone)]
pub(crate) struct RelayEntry {
    pub(crate) relay_id: Uuid,
    pub(crate) host: String,
    pub(crate) pid: i32,
    pub(crate) version: &'static str,
    pub(crate) lease_mode: &'static str,
    pub(crate) handles: Vec<String>,
    pub(crate) forwards: Option<Vec<String>>,
}

/// Writes the relay's entry, or refreshes its heartbeat and figures: an upsert, so an entry
/// removed meanwhile (by the cleanup of silent relays, after a long pause) comes back.
pub(crate) async fn heartbeat(
    pool: &PgPool,
    entry: &RelayEntry,
    held: usize,
    delivered: u64,
) -> Result<(), sqlx::Error> {
    heartbeat_query(entry, held, delivered).execute(pool).await?;
    Ok(())
}

pub(super) fn heartbeat_query(entry: &RelayEntry, held: usize, delivered: u64) -> Query<'_> {
    sqlx::query(
        "INSERT INTO outbox.relays (relay_id, host, pid, version, lease_mode, handles, \
                                    forwards_to, held, delivered) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (relay_id) DO UPDATE \
         SET heartbeat_at = now(), held = excluded.held, delivered = excluded.delivered",
    )
    .bind(entry.relay_id)
    .bind(&entry.host)
    .bind(entry.pid)
    .bind(entry.version)
    .bind(entry.lease_mode)
    .bind(&entry.handles)
    .bind(entry.forwards.as_deref())
    .bind(i32::try_from(held).unwrap_or(i32::MAX))
    .bind(i64::try_from(delivered).unwrap_or(i64::MAX))
}

/// Removes the entries of relays silent for longer than `after`: killed long ago.
pub(crate) async fn forget_silent(pool: &PgPool, after: Duration) -> Result<u64, sqlx::Error> {
    Ok(forget_silent_query(after).execute(pool).await?.rows_affected())
}

pub(super) fn forget_silent_query<'q>(after: Duration) -> Query<'q> {
    sqlx::query(
        "DELETE FROM outbox.relays \
         WHERE heartbeat_at < now() - $1::bigint * interval '1 microsecond'",
    )
    .bind(micros(after))
}

/// Removes a relay's entry: it stopped.
pub(crate) async fn withdraw(pool: &PgPool, relay_id: Uuid) -> Result<(), sqlx::Error> {
    withdraw_query(relay_id).execute(pool).await?;
    Ok(())
}

pub(super) fn withdraw_query<'q>(relay_id: Uuid) -> Query<'q> {
    sqlx::query("DELETE FROM outbox.relays WHERE relay_id = $1").bind(relay_id)
}

/// A row of `outbox.relays`, with the seconds since its heartbeat by the database clock.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RelayRow {
    pub(crate) relay_id: Uuid,
    pub(crate) host: String,
    pub(crate) pid: i32,
    pub(crate) version: String,
    pub(crate) lease_mode: String,
    pub(crate) handles: Vec<String>,
    pub(crate) forwards_to: Option<Vec<String>>,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) heartbeat_at: DateTime<Utc>,
    pub(crate) since_heartbeat: f64,
    pub(crate) held: i32,
    pub(crate) delivered: i64,
}

/// Every relay's entry, the longest running first.
pub(crate) async fn relays(pool: &PgPool) -> Result<Vec<RelayRow>, sqlx::Error> {
    relays_query().fetch_all(pool).await
}

pub(super) fn relays_query<'q>() -> Rows<'q, RelayRow> {
    sqlx::query_as(
        "SELECT relay_id, host, pid, version, lease_mode, handles, forwards_to, started_at, \
                heartbeat_at, extract(epoch FROM now() - heartbeat_at)::float8 AS since_heartbeat, \
                held, delivered \
         FROM outbox.relays ORDER BY started_at, relay_id",
    )
}
