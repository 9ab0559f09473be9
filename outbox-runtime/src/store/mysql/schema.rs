//! Applying the MySQL and MariaDB migrations, with their history in `outbox_migrations`.

use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{Executor, MySqlConnection, MySqlPool};

use crate::error::Error;

/// The MySQL and MariaDB migrations, embedded at compile time.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations-mysql");

/// The start of the named lock that makes concurrent migrators of one database take turns.
const LOCK: &str = "outbox_migrate:";

/// `ER_DUP_KEYNAME`: an index of that name exists.
const DUPLICATE_KEY_NAME: u16 = 1061;

/// How long a migrator waits for another to finish.
const LOCK_WAIT: Duration = Duration::from_secs(300);

/// Applies the migrations the database lacks, under a named lock (`GET_LOCK`; the names are the
/// server's, so this one ends with the database's): a second migrator waits for it and then
/// finds them applied. MySQL commits each `CREATE` by itself, so each migration is recorded
/// right after it ran; its statements are written to be run again should a migrator die between
/// the two (`IF NOT EXISTS`), or, for an index (which MySQL 8 cannot create `IF NOT EXISTS`),
/// are that one statement, and an index found there already is that run's. The history is a table of the outbox's own, apart from the
/// application's `_sqlx_migrations`.
pub(super) async fn migrate(pool: &MySqlPool) -> Result<(), Error> {
    let mut conn = pool.acquire().await?;
    // Lock names are at most 64 characters; database names too.
    let lock: String = format!("{LOCK}{}", database(&mut conn).await?).chars().take(64).collect();
    let got: Option<i32> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
        .bind(&lock)
        .bind(LOCK_WAIT.as_secs())
        .fetch_one(&mut *conn)
        .await?;
    if got != Some(1) {
        return Err(MigrateError::Execute(sqlx::Error::Protocol(format!(
            "another migrator held the lock `{lock}` for {LOCK_WAIT:?}: is one stuck?"
        )))
        .into());
    }
    let applied = apply(&mut conn).await;
    let released = sqlx::query("SELECT RELEASE_LOCK(?)").bind(&lock).execute(&mut *conn).await;
    applied?;
    released?;
    Ok(())
}

fn is_duplicate_key_name(error: &dyn sqlx::error::DatabaseError) -> bool {
    let error = error.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>();
    error.is_some_and(|error| error.number() == DUPLICATE_KEY_NAME)
}

/// The database the connection uses.
async fn database(conn: &mut MySqlConnection) -> Result<String, sqlx::Error> {
    let name: Option<String> = sqlx::query_scalar("SELECT DATABASE()").fetch_one(conn).await?;
    name.ok_or_else(|| {
        sqlx::Error::Configuration(
            "the pool's connections use no database: name one in the URL, as in \
             mysql://user@host/app"
                .into(),
        )
    })
}

async fn apply(conn: &mut MySqlConnection) -> Result<(), Error> {
    conn.execute(
        "CREATE TABLE IF NOT EXISTS outbox_migrations ( \
             version     BIGINT       NOT NULL PRIMARY KEY, \
             description VARCHAR(255) NOT NULL, \
             checksum    VARBINARY(64) NOT NULL, \
             applied_at  DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)) \
         ) ENGINE = InnoDB",
    )
    .await?;
    let applied: Vec<(i64, Vec<u8>)> =
        sqlx::query_as("SELECT version, checksum FROM outbox_migrations")
            .fetch_all(&mut *conn)
            .await?;
    for migration in crate::migrate::pending(&MIGRATOR, &applied)? {
        let sql: &'static str = migration.sql.as_ref();
        match conn.execute(sql).await {
            Ok(_) => {}
            Err(sqlx::Error::Database(error)) if is_duplicate_key_name(&*error) => {}
            Err(error) => return Err(error.into()),
        }
        sqlx::query(
            "INSERT INTO outbox_migrations (version, description, checksum) VALUES (?, ?, ?)",
        )
        .bind(migration.version)
        .bind(migration.description.as_ref())
        .bind(migration.checksum.as_ref())
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Checks the history against this version's migrations (see `crate::check_schema`).
pub(super) async fn check(pool: &MySqlPool) -> Result<(), Error> {
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.tables \
                        WHERE table_schema = DATABASE() AND table_name = 'outbox_events')",
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
