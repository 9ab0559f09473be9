//! The schema the migrations go into.

use sqlx::PgPool;

use super::Query;

/// Creates the `outbox` schema if it is missing, where the migrator keeps its history.
/// `CREATE SCHEMA IF NOT EXISTS` can still race with itself, hence the lock.
pub(crate) async fn create_schema(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    migrate_lock_query().execute(&mut *tx).await?;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS outbox").execute(&mut *tx).await?;
    tx.commit().await
}

pub(super) fn migrate_lock_query<'q>() -> Query<'q> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('outbox_runtime.migrate'))")
}
