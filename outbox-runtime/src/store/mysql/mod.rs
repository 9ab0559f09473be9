//! Every MySQL and MariaDB statement of the crate, next to the schema in
//! `outbox-runtime/migrations-mysql/` it is written for. Each runs on MySQL 8 and MariaDB 10.6+
//! alike: no `RETURNING` (MySQL has none), no partial indexes, instants from `UTC_TIMESTAMP(6)`.

mod emit;
pub(crate) mod ops;
pub(crate) mod relay;
mod schema;

use sqlx::{MySql, MySqlConnection, MySqlPool};
use uuid::Uuid;

use super::{InsertShared, NewEvents, Store};
use crate::error::Error;

impl Store for MySql {
    const MAX_ID_CHARS: usize = emit::MAX_ID_CHARS;

    async fn stats(pool: &MySqlPool) -> Result<crate::stats::OutboxStats, Error> {
        Ok(ops::stats(pool).await?)
    }

    fn relay_db(pool: MySqlPool) -> Result<crate::store::Db, &'static str> {
        Ok(crate::store::Db::MySql(pool))
    }

    async fn insert_events(
        conn: &mut MySqlConnection,
        shared: InsertShared<'_>,
        rows: &NewEvents,
    ) -> Result<Vec<Uuid>, sqlx::Error> {
        emit::insert_events(conn, shared, rows).await
    }

    async fn event_for_key(
        conn: &mut MySqlConnection,
        aggregate_type: &str,
        idempotency_key: &str,
    ) -> Result<Option<Uuid>, sqlx::Error> {
        emit::event_for_key(conn, aggregate_type, idempotency_key).await
    }

    async fn migrate(pool: &MySqlPool) -> Result<(), Error> {
        schema::migrate(pool).await
    }

    async fn check_schema(pool: &MySqlPool) -> Result<(), Error> {
        schema::check(pool).await
    }
}
