//! Applying the outbox schema with sqlx's migrator.

use futures_util::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{MigrateError, Migration, MigrationSource, Migrator};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::error::Error;
use crate::store;

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
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
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
