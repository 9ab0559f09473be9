//! Wake-up registrations: relays asleep on LISTEN, for producers to NOTIFY.
//!
//! A registration raises the flag `outbox.relays_asleep` (a trigger on the registrations keeps
//! it), and the insert trigger's WHEN reads that flag for every row: while it is down, producers
//! run nothing. Up, the trigger's function looks for a registration that wants the row (at READ
//! COMMITTED each of its statements reads a fresh snapshot) and notifies at commit. A producer
//! that read the flag before it went up may never look. Every insert takes its RowExclusiveLock
//! on `outbox.events` before reading the flag, and holds it until its transaction ends: so a
//! relay registers, then reads which transactions hold that lock ([`inserting_transactions`]),
//! and looks for rows again as each of them ends. A producer missing from that read took the
//! lock later (and reads the flag up, and the committed registration) or has ended, and a
//! transaction releases its locks only once its commit is visible, so the relay's next look
//! finds its rows. (A producer at REPEATABLE READ reads the registrations in its first
//! snapshot, which may be older: the README's caveat.) Reading `pg_locks` needs no privilege
//! and takes no lock a producer could queue behind, only the lock manager's own latches for
//! microseconds.

use std::time::Duration;

use sqlx::{Executor, PgPool, Row};
use uuid::Uuid;

use super::{micros, Query, Scalar};

/// Registers a relay as asleep until `until` from now, for producers to NOTIFY it.
pub(crate) async fn register_sleeper(
    pool: &PgPool,
    relay_id: Uuid,
    event_types: Option<&[String]>,
    until: Duration,
) -> Result<(), sqlx::Error> {
    register_query(relay_id, event_types, until).execute(pool).await?;
    Ok(())
}

pub(super) fn register_query<'q>(
    relay_id: Uuid,
    event_types: Option<&'q [String]>,
    until: Duration,
) -> Query<'q> {
    sqlx::query(
        "INSERT INTO outbox.sleeping_relays (relay_id, event_types, until) \
         VALUES ($1, $2, now() + $3::bigint * interval '1 microsecond') \
         ON CONFLICT (relay_id) DO UPDATE SET event_types = $2, until = excluded.until",
    )
    .bind(relay_id)
    .bind(event_types)
    .bind(micros(until))
}

/// The transactions (virtual transaction ids) writing to `outbox.events` in this database: all
/// of them, or those of `among` still writing. Run after a registration raised the flag, it names
/// the producers that may have read the flag down.
pub(crate) async fn inserting_transactions(
    pool: &PgPool,
    among: Option<&[String]>,
) -> Result<Vec<String>, sqlx::Error> {
    inserting_transactions_query(among).fetch_all(pool).await
}

/// Every INSERT (and UPDATE or DELETE) holds RowExclusiveLock on the table until its transaction
/// ends. Such locks usually take the fast path, which `pg_locks` lists too. Relays' own updates
/// show as well: one more look each when they end.
pub(super) fn inserting_transactions_query(among: Option<&[String]>) -> Scalar<'_, String> {
    sqlx::query_scalar(
        "SELECT l.virtualtransaction FROM pg_locks l \
         WHERE l.locktype = 'relation' \
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND l.relation = 'outbox.events'::regclass \
           AND l.mode = 'RowExclusiveLock' AND l.granted \
           AND ($1::text[] IS NULL OR l.virtualtransaction = ANY ($1))",
    )
    .bind(among)
}

pub(crate) async fn unregister_sleeper(pool: &PgPool, relay_id: Uuid) -> Result<(), sqlx::Error> {
    unregister_query(relay_id).execute(pool).await?;
    Ok(())
}

pub(super) fn unregister_query<'q>(relay_id: Uuid) -> Query<'q> {
    sqlx::query("DELETE FROM outbox.sleeping_relays WHERE relay_id = $1").bind(relay_id)
}

/// Sends a notification with `payload` on the relays' channel: the listener's check that
/// notifications reach it.
pub(crate) async fn notify_relays(pool: &PgPool, payload: &str) -> Result<(), sqlx::Error> {
    notify_query(payload).execute(pool).await?;
    Ok(())
}

pub(super) fn notify_query(payload: &str) -> Query<'_> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(super::NOTIFY_CHANNEL).bind(payload)
}

/// The backend serving a connection, sent as a simple query: through any pooler it runs as one
/// message on one server connection (a prepared statement's parse and execution could land on
/// two).
pub(crate) async fn backend_pid(conn: &mut sqlx::PgConnection) -> Result<i32, sqlx::Error> {
    conn.fetch_one("SELECT pg_backend_pid()").await?.try_get(0)
}
