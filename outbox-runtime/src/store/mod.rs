//! The seam between the crate and its databases: each backend's statements in a folder of its
//! own (`postgres/`, `sqlite/`, `mysql/`), behind [`Store`], and what they share.
//!
//! PostgreSQL is the crate's first backend and the relay, the operations and the console run
//! on it alone; its statements are re-exported here under their own names, for the rest of the
//! crate. What every backend does goes through [`Store`], implemented once per backend.

use std::future::Future;

use uuid::Uuid;

use crate::error::Error;
use crate::stats::OutboxStats;

mod db;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
mod new_events;
mod outcomes;
mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

pub(crate) use db::Db;
pub(crate) use new_events::{micros, Available, InsertShared, NewEvents};
pub(crate) use outcomes::{Failures, Snoozes};
pub(crate) use postgres::*;

/// What the crate asks of a database, implemented once per backend (the public face is
/// [`Backend`](crate::Backend), which this seals).
pub trait Store: sqlx::Database {
    /// The longest aggregate id and idempotency key the schema holds, in characters.
    const MAX_ID_CHARS: usize = usize::MAX;

    /// Inserts the rows in the caller's transaction; returns the ids actually inserted (an
    /// idempotency key already stored inserts nothing).
    fn insert_events(
        conn: &mut Self::Connection,
        shared: InsertShared<'_>,
        rows: &NewEvents,
    ) -> impl Future<Output = Result<Vec<Uuid>, sqlx::Error>> + Send;

    /// The event stored earlier under an idempotency key, as the caller's transaction sees it
    /// once the key's insert gave way.
    fn event_for_key(
        conn: &mut Self::Connection,
        aggregate_type: &str,
        idempotency_key: &str,
    ) -> impl Future<Output = Result<Option<Uuid>, sqlx::Error>> + Send;

    /// Creates or upgrades the outbox's tables.
    fn migrate(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<(), Error>> + Send;

    /// Checks that the tables have every migration this version needs.
    fn check_schema(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<(), Error>> + Send;

    /// The outbox's health figures.
    fn stats(pool: &sqlx::Pool<Self>) -> impl Future<Output = Result<OutboxStats, Error>> + Send;

    /// The pool as a relay holds it; `Err` with the database's name where the relay does not
    /// run yet.
    fn relay_db(pool: sqlx::Pool<Self>) -> Result<Db, &'static str>;
}

/// A statement built at run time, for sqlx (0.9 asks that it be marked). Only its shape is
/// built: its values are bound, never formatted into it.
#[cfg(all(any(feature = "sqlite", feature = "mysql"), not(feature = "sqlx-0-9")))]
pub(crate) fn built(sql: &str) -> &str {
    sql
}

/// A statement built at run time, for sqlx (0.9 asks that it be marked). Only its shape is
/// built: its values are bound, never formatted into it.
#[cfg(all(any(feature = "sqlite", feature = "mysql"), feature = "sqlx-0-9"))]
pub(crate) fn built(sql: &str) -> sqlx::AssertSqlSafe<&str> {
    sqlx::AssertSqlSafe(sql)
}

/// The insert `insert` followed by `rows` copies of `row`, comma-separated, then `tail`.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn multi_row(insert: &str, row: &str, rows: usize, tail: &str) -> String {
    let mut sql = String::with_capacity(insert.len() + rows * (row.len() + 2) + tail.len());
    sql.push_str(insert);
    for i in 0..rows {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(row);
    }
    sql.push_str(tail);
    sql
}
