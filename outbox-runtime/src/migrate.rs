//! Applying the outbox schema with sqlx's migrator, and checking that a schema has every
//! migration this version needs before anything runs on it.

use std::fmt;
use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{MigrateError, Migration, MigrationSource, Migrator};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::backend::Backend;
use crate::error::{Error, ErrorChain};
use crate::store::{self, History};

/// The outbox migrations (`migrations/` in this package, so the published crate has them),
/// embedded at compile time.
static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Creates or upgrades the outbox schema: the `outbox` schema, its `outbox.events` table,
/// indexes and notify trigger. Safe to call at every start-up and from several processes at
/// once (sqlx's migrator serializes them with an advisory lock).
///
/// The history of these migrations is kept in `outbox._sqlx_migrations`, apart from your own
/// application's `_sqlx_migrations`: your `sqlx::migrate!()` and `sqlx migrate run` neither see
/// nor disturb it, so call both at start-up, in either order. To run the outbox's migrations
/// through your own migrator and history instead, see [`with_outbox_migrations`].
///
/// ```no_run
/// # use outbox_runtime::sqlx;
/// # use sqlx::migrate::Migrator;
/// # async fn start(pool: sqlx::PgPool, app: Migrator) -> Result<(), Box<dyn std::error::Error>> {
/// app.run(&pool).await?; // your own `sqlx::migrate!()`, as before
/// outbox_runtime::migrate(&pool).await?; // the outbox's
/// # Ok(()) }
/// ```
///
/// On SQLite and MySQL the tables are `outbox_events` and its siblings, in the pool's own
/// database, and their history is `outbox_migrations`.
pub async fn migrate<DB: Backend>(pool: &sqlx::Pool<DB>) -> Result<(), Error> {
    DB::migrate(pool).await
}

/// [`migrate`] on PostgreSQL.
pub(crate) async fn postgres(pool: &PgPool) -> Result<(), Error> {
    store::create_schema(pool).await?;

    // The migrator keeps its history in the first schema of the search path; a pool of its
    // own keeps that setting out of the caller's pool.
    let options = (*pool.connect_options()).clone().options([("search_path", "outbox")]);
    let outbox_pool = PgPoolOptions::new().max_connections(1).connect_with(options).await?;
    let migrated = MIGRATOR.run(&outbox_pool).await;
    outbox_pool.close().await;
    Ok(migrated?)
}

/// Your application's migrations plus the outbox's, as one migrator with one history (your
/// `_sqlx_migrations`), for applications that apply every schema change through their own
/// migrator. Use it instead of [`migrate`], not beside it.
///
/// ```no_run
/// # use outbox_runtime::sqlx;
/// # async fn start(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// # let app: sqlx::migrate::Migrator = unimplemented!(); // your `sqlx::migrate!()`
/// outbox_runtime::with_outbox_migrations(&app).await?.run(&pool).await?;
/// # Ok(()) }
/// ```
///
/// The result has sqlx's default settings (locking on, missing migrations an error); set them
/// again if your migrator changed them. Fails if a version of yours equals one of the outbox's.
pub async fn with_outbox_migrations(app: &Migrator) -> Result<Migrator, Error> {
    if let Some(clash) = app.iter().find(|m| MIGRATOR.iter().any(|o| o.version == m.version)) {
        return Err(MigrateError::Source(
            format!(
                "migration version {} is used by both the outbox and the application",
                clash.version
            )
            .into(),
        )
        .into());
    }
    let all = app.iter().chain(MIGRATOR.iter()).cloned().collect();
    Ok(Migrator::new(Migrations(all)).await?)
}

/// Migrations already in memory, as a [`MigrationSource`].
#[derive(Debug)]
struct Migrations(Vec<Migration>);

impl<'s> MigrationSource<'s> for Migrations {
    fn resolve(self) -> BoxFuture<'s, Result<Vec<Migration>, BoxDynError>> {
        Box::pin(async move { Ok(self.0) })
    }
}

/// One of the outbox's migrations: its version (the number its file name starts with) and its
/// description (the rest of the name, as sqlx reads it). Displays as
/// `20261202000002 (sql producers)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchemaVersion {
    /// The migration's version.
    pub version: i64,
    /// The migration's description.
    pub description: &'static str,
}

impl fmt::Display for SchemaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.version, self.description)
    }
}

/// Checks that the outbox schema has every migration this version of the crate needs, and
/// fails with what to do when it does not: [`Error::SchemaMissing`] without an outbox schema,
/// [`Error::SchemaOutdated`] naming the schema's version and the one needed when migrations
/// are missing, [`Error::MigrationsUnreadable`] naming the grant when the role may not read the
/// migration history. [`Relay::run_until`](crate::Relay::run_until) runs it before leasing, and
/// the `outbox` CLI before every command but `migrate`; call it yourself in a readiness check.
///
/// A schema with migrations newer than this version knows passes, logged at info: see
/// [`Error::SchemaOutdated`]. The history read is the one [`migrate`] writes,
/// `outbox._sqlx_migrations`, or, when there is none, the `_sqlx_migrations` in the search path
/// (where [`with_outbox_migrations`] puts it). With neither, or a history holding none of the
/// outbox's migrations, there is nothing to compare: the check passes, logged at debug.
///
/// The relay role needs `SELECT (version, success)` on the history, which
/// `docs/least-privilege.sql` grants.
///
/// On SQLite and MySQL the history is `outbox_migrations`, which [`migrate`] writes, and a
/// database without `outbox_events` is [`Error::SchemaMissing`].
pub async fn check_schema<DB: Backend>(pool: &sqlx::Pool<DB>) -> Result<(), Error> {
    DB::check_schema(pool).await
}

/// [`check_schema`] on PostgreSQL.
pub(crate) async fn check_postgres(pool: &PgPool) -> Result<(), Error> {
    let found = store::find_schema(pool).await?;
    if !found.events {
        return Err(Error::SchemaMissing);
    }
    let Some(history) = found.history else {
        tracing::debug!(
            "the outbox schema has no migration history to check: neither \
             `outbox._sqlx_migrations` nor a `_sqlx_migrations` in the search path"
        );
        return Ok(());
    };
    let applied = store::applied_migrations(pool, history).await.map_err(|cause| {
        if cause.as_database_error().and_then(|db| db.code()).as_deref() == Some(PERMISSION_DENIED)
        {
            let role = sql_identifier(&found.role);
            Error::MigrationsUnreadable { role, table: history.table(), cause }
        } else {
            Error::from(cause)
        }
    })?;
    judge(compare(&known(&MIGRATOR), &applied, history), history.table())
}

/// [`check_schema`] for a backend whose history is the outbox's own: `applied`, or `None` when
/// the database has no outbox table.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn check_own_history(
    migrator: &'static Migrator,
    applied: Option<&[i64]>,
) -> Result<(), Error> {
    let applied = applied.ok_or(Error::SchemaMissing)?;
    judge(compare(&known(migrator), applied, History::Outbox), "outbox_migrations")
}

/// The migrations of `migrator` that `applied` (a history's `(version, checksum)`s) lacks, in
/// order; one applied with another checksum is an error: it was edited after it ran.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn pending(
    migrator: &'static Migrator,
    applied: &[(i64, Vec<u8>)],
) -> Result<Vec<&'static Migration>, MigrateError> {
    let mut pending = Vec::new();
    for migration in migrator.iter() {
        match applied.iter().find(|(version, _)| *version == migration.version) {
            Some((_, checksum)) if **checksum != *migration.checksum => {
                return Err(MigrateError::VersionMismatch(migration.version));
            }
            Some(_) => {}
            None => pending.push(migration),
        }
    }
    Ok(pending)
}

/// What a comparison of the history with this version's migrations means for the caller.
fn judge(verdict: Verdict, table: &'static str) -> Result<(), Error> {
    match verdict {
        Verdict::Current => Ok(()),
        Verdict::Outdated { applied, needed } => Err(Error::SchemaOutdated { applied, needed }),
        Verdict::Newer { count, newest } => {
            tracing::info!(
                newer_migrations = count,
                newest,
                "the outbox schema has migrations newer than this version knows (a newer \
                 version migrated it); running on it, as the outbox's migrations only add"
            );
            Ok(())
        }
        Verdict::Unrelated => {
            tracing::debug!(
                table,
                "the migration history holds none of the outbox's migrations: not checked"
            );
            Ok(())
        }
    }
}

/// [`check_schema`] for the relay's start: a database error (the database unreachable for a
/// while) is logged and the check tried again, as the relay does with every database error;
/// everything else is the answer.
pub(crate) async fn await_schema(db: &crate::store::Db) -> Result<(), Error> {
    let mut retry = Duration::from_millis(100);
    loop {
        match db.check_schema().await {
            Err(Error::Database(error)) => {
                tracing::warn!(error = %ErrorChain(&error), retry_in = ?retry, "cannot check the outbox schema");
            }
            checked => return checked,
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(Duration::from_secs(10));
    }
}

/// SQLSTATE `insufficient_privilege`.
const PERMISSION_DENIED: &str = "42501";

/// This version's migrations of `migrator`, oldest first.
fn known(migrator: &'static Migrator) -> Vec<SchemaVersion> {
    let mut known: Vec<SchemaVersion> = migrator
        .iter()
        .filter(|migration| !migration.migration_type.is_down_migration())
        .map(|migration| SchemaVersion {
            version: migration.version,
            description: &migration.description,
        })
        .collect();
    known.sort_by_key(|migration| migration.version);
    known
}

/// How a schema's history compares with this version's migrations.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// It has all of them, and nothing newer.
    Current,
    /// It lacks some; the newest it has and the newest it lacks.
    Outdated { applied: SchemaVersion, needed: SchemaVersion },
    /// It has all of them, and `count` newer ones (only told in the outbox's own history).
    Newer { count: usize, newest: i64 },
    /// It has none of them: not the outbox's history.
    Unrelated,
}

/// `known` oldest first; `applied` in any order.
fn compare(known: &[SchemaVersion], applied: &[i64], history: History) -> Verdict {
    let has = |migration: &&SchemaVersion| applied.contains(&migration.version);
    let Some(newest_applied) = known.iter().rev().find(has) else {
        return Verdict::Unrelated;
    };
    if let Some(needed) = known.iter().rev().find(|migration| !has(migration)) {
        return Verdict::Outdated { applied: *newest_applied, needed: *needed };
    }
    let newest_known = known.last().map_or(i64::MIN, |migration| migration.version);
    // The application's own history holds its own migrations too, newer or not.
    let newer = applied.iter().filter(|version| **version > newest_known);
    match (history, newer.clone().max()) {
        (History::Outbox, Some(newest)) => Verdict::Newer { count: newer.count(), newest: *newest },
        _ => Verdict::Current,
    }
}

/// `name` as an SQL identifier: bare when PostgreSQL would read it back unchanged, else quoted.
fn sql_identifier(name: &str) -> String {
    let mut chars = name.chars();
    let bare = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$');
    if bare {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn version(version: i64, description: &'static str) -> SchemaVersion {
        SchemaVersion { version, description }
    }

    const KNOWN: [SchemaVersion; 3] =
        [version(1, "create outbox"), version(2, "expired leases"), version(3, "sql producers")];

    #[test]
    fn all_applied_is_current() {
        assert_eq!(compare(&KNOWN, &[3, 1, 2], History::Outbox), Verdict::Current);
    }

    #[test]
    fn a_missing_migration_names_the_newest_applied_and_the_newest_needed() {
        let outdated = Verdict::Outdated { applied: KNOWN[1], needed: KNOWN[2] };
        assert_eq!(compare(&KNOWN, &[1, 2], History::Outbox), outdated);
        assert_eq!(compare(&KNOWN, &[1, 2], History::SearchPath), outdated);
        // A gap: the newest it has is newer than the one it lacks.
        let gap = Verdict::Outdated { applied: KNOWN[2], needed: KNOWN[1] };
        assert_eq!(compare(&KNOWN, &[1, 3], History::Outbox), gap);
    }

    #[test]
    fn newer_migrations_are_told_only_in_the_outbox_history() {
        let newer = Verdict::Newer { count: 2, newest: 5 };
        assert_eq!(compare(&KNOWN, &[1, 2, 3, 4, 5], History::Outbox), newer);
        // The application's history holds the application's migrations.
        assert_eq!(compare(&KNOWN, &[1, 2, 3, 4, 5], History::SearchPath), Verdict::Current);
    }

    #[test]
    fn a_history_without_outbox_migrations_is_not_the_outbox_one() {
        assert_eq!(compare(&KNOWN, &[], History::Outbox), Verdict::Unrelated);
        assert_eq!(compare(&KNOWN, &[7, 8], History::SearchPath), Verdict::Unrelated);
    }

    #[test]
    fn the_embedded_migrations_are_known_oldest_first() {
        let known = known(&MIGRATOR);
        assert!(known.len() >= 5, "{known:?}");
        assert!(known.windows(2).all(|pair| pair[0].version < pair[1].version), "{known:?}");
        let expired = known.iter().find(|m| m.version == 20261201000001).unwrap();
        assert_eq!(expired.to_string(), "20261201000001 (expired leases)");
    }

    #[test]
    fn roles_are_quoted_only_when_they_must_be() {
        assert_eq!(sql_identifier("outbox_relay"), "outbox_relay");
        assert_eq!(sql_identifier("Relay"), "\"Relay\"");
        assert_eq!(sql_identifier("relay-1"), "\"relay-1\"");
        assert_eq!(sql_identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(sql_identifier("1relay"), "\"1relay\"");
    }
}
