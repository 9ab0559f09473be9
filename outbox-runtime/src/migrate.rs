//! Applying the outbox schema with sqlx's migrator.

use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::error::Error;

/// The outbox migrations (`migrations/` at the repository root), embedded at compile time.
static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Creates or upgrades the outbox schema: the `outbox` schema, its `outbox.events` table,
/// indexes and notify trigger. Safe to call at every start-up and from several processes at
/// once (sqlx's migrator serializes them with an advisory lock).
///
/// The history of these migrations is kept in `outbox._sqlx_migrations`, apart from your own
/// application's `_sqlx_migrations`: your `sqlx::migrate!()` and `sqlx migrate run` neither see
/// nor disturb it, so call both at start-up, in either order.
///
/// ```no_run
/// # use sqlx::migrate::Migrator;
/// # async fn start(pool: sqlx::PgPool, app: Migrator) -> Result<(), Box<dyn std::error::Error>> {
/// app.run(&pool).await?; // your own `sqlx::migrate!()`, as before
/// outbox_runtime::migrate(&pool).await?; // the outbox's
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
    // CREATE SCHEMA IF NOT EXISTS can still race with itself, hence the lock.
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('outbox_runtime.migrate'))")
        .execute(&mut *tx)
        .await?;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS outbox").execute(&mut *tx).await?;
    tx.commit().await?;

    // The migrator keeps its history in the first schema of the search path; a pool of its
    // own keeps that setting out of the caller's pool.
    let options = (*pool.connect_options()).clone().options([("search_path", "outbox")]);
    let outbox_pool = PgPoolOptions::new().max_connections(1).connect_with(options).await?;
    let migrated = MIGRATOR.run(&outbox_pool).await;
    outbox_pool.close().await;
    Ok(migrated?)
}
