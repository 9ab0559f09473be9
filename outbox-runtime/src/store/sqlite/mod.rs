//! Every SQLite statement of the crate, next to the schema in `outbox-runtime/migrations-sqlite/`
//! it is written for.
//!
//! SQLite runs in the process and writes one transaction at a time: an insert is a call, not a
//! round trip, and the order in which rows draw their `seq` is the order their transactions
//! commit, with no lock of the crate's own.

mod emit;
pub(crate) mod ops;
pub(crate) mod relay;
mod schema;

use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use uuid::Uuid;

use super::{InsertShared, NewEvents, Store};
use crate::error::Error;
use emit::delay_modifier;

/// An instant as the schema stores it: UTC, as SQLite's `strftime('%Y-%m-%d %H:%M:%f')` writes
/// it, so that bound and computed instants compare as text.
const INSTANT: &str = "%Y-%m-%d %H:%M:%S%.3f";

impl Store for Sqlite {
    async fn stats(pool: &SqlitePool) -> Result<crate::stats::OutboxStats, Error> {
        Ok(ops::stats(pool).await?)
    }

    fn relay_db(pool: SqlitePool) -> Result<crate::store::Db, &'static str> {
        Ok(crate::store::Db::Sqlite(relay::Writer::new(pool)))
    }

    async fn insert_events(
        conn: &mut SqliteConnection,
        shared: InsertShared<'_>,
        rows: &NewEvents,
    ) -> Result<Vec<Uuid>, sqlx::Error> {
        emit::insert_events(conn, shared, rows).await
    }

    async fn event_for_key(
        conn: &mut SqliteConnection,
        aggregate_type: &str,
        idempotency_key: &str,
    ) -> Result<Option<Uuid>, sqlx::Error> {
        emit::event_for_key(conn, aggregate_type, idempotency_key).await
    }

    async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
        schema::migrate(pool).await
    }

    async fn check_schema(pool: &SqlitePool) -> Result<(), Error> {
        schema::check(pool).await
    }
}
