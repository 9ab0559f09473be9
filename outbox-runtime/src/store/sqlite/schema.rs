//! Applying the SQLite migrations, with their history in `outbox_migrations`.

use sqlx::migrate::Migrator;
use sqlx::{Executor, SqliteConnection, SqlitePool};

use crate::error::Error;

/// The SQLite migrations, embedded at compile time.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations-sqlite");

/// Applies the migrations the database lacks, in one transaction that takes SQLite's write lock
/// first (`BEGIN IMMEDIATE`): a second migrator, in this process or another, waits for it (up
/// to the pool's busy timeout) and then finds them applied. The history is a table of the
/// outbox's own, so the application's `_sqlx_migrations` neither sees nor disturbs it.
pub(super) async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    let conn: &mut SqliteConnection = &mut tx;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS outbox_migrations ( \
             version     INTEGER PRIMARY KEY, \
             description TEXT NOT NULL, \
             checksum    BLOB NOT NULL, \
             applied_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')) \
         ) STRICT",
    )
    .execute(&mut *conn)
    .await?;
    let applied: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT version, checksum FROM outbox_migrations")
            .fetch_all(&mut *conn)
            .await?;
    for migration in crate::migrate::pending(&MIGRATOR, &applied)? {
        let sql: &'static str = migration.sql.as_ref();
        conn.execute(sql).await?;
        sqlx::query(
            "INSERT INTO outbox_migrations (version, description, checksum) VALUES (?1, ?2, ?3)",
        )
        .bind(migration.version)
        .bind(migration.description.as_ref())
        .bind(migration.checksum.as_ref())
        .execute(&mut *conn)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Checks the history against this version's migrations (see `crate::check_schema`).
pub(super) async fn check(pool: &SqlitePool) -> Result<(), Error> {
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master \
                        WHERE type = 'table' AND name = 'outbox_events')",
    )
    .fetch_one(pool)
    .await?;
    if !exists {
        return crate::migrate::check_own_history(&MIGRATOR, None);
    }
    let applied: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM outbox_migrations").fetch_all(pool).await?;
    crate::migrate::check_own_history(&MIGRATOR, Some(&applied))
}
