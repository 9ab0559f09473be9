//! Wake-up registrations: relays asleep on LISTEN, for producers to NOTIFY.

use std::time::Duration;

use sqlx::{Executor, PgPool, Row};
use uuid::Uuid;

use super::{micros, Query, Scalar};

/// Registers a relay as asleep until `until_micros` from now, for producers to NOTIFY it.
/// Returns false without registering if producers are inserting right now (they hold the lock
/// shared): their rows are about to commit, so the relay should look again instead of sleeping.
pub(crate) async fn register_sleeper(
    pool: &PgPool,
    relay_id: Uuid,
    event_types: Option<&[String]>,
    until: Duration,
) -> Result<bool, sqlx::Error> {
    // One statement, so it is never left half done when the relay stops while it runs: the
    // lock is taken first and held until the registration commits.
    let registered = register_query(relay_id, event_types, until).fetch_optional(pool).await?;
    Ok(registered.is_some())
}

pub(super) fn register_query<'q>(
    relay_id: Uuid,
    event_types: Option<&'q [String]>,
    until: Duration,
) -> Scalar<'q, bool> {
    sqlx::query_scalar(
        "INSERT INTO outbox.sleeping_relays (relay_id, event_types, until) \
         SELECT $1, $2, now() + $3::bigint * interval '1 microsecond' \
         WHERE pg_try_advisory_xact_lock(hashtextextended('outbox.sleeping_relays', 0)) \
         ON CONFLICT (relay_id) DO UPDATE SET event_types = $2, until = excluded.until \
         RETURNING true",
    )
    .bind(relay_id)
    .bind(event_types)
    .bind(micros(until))
}

/// Withdraws a relay's registration: it is awake and looks for rows by itself.
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
