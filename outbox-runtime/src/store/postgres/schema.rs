//! The schema the migrations go into, and the history of the ones applied.

use sqlx::PgPool;

use super::{Query, Rows, Scalar};

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

/// Where the outbox's migration history is kept, as this connection's role sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum History {
    /// `outbox._sqlx_migrations`, written by `migrate`.
    Outbox,
    /// `_sqlx_migrations` in the search path: the application's own, when it applied the
    /// outbox's migrations through `with_outbox_migrations`.
    SearchPath,
}

impl History {
    /// The table, as the statements name it.
    pub(crate) fn table(self) -> &'static str {
        match self {
            History::Outbox => "outbox._sqlx_migrations",
            History::SearchPath => "_sqlx_migrations",
        }
    }
}

/// What the schema check needs to know before it reads a history.
pub(crate) struct SchemaFound {
    /// The role the connection runs as, for a message about its grants.
    pub(crate) role: String,
    /// `outbox.events` exists.
    pub(crate) events: bool,
    /// The history to read, `None` when there is none to be seen.
    pub(crate) history: Option<History>,
}

/// Looks up the events table and the migration history. `to_regclass` needs no privilege on
/// the tables, only USAGE on the `outbox` schema, which every role of the outbox has.
pub(crate) async fn find_schema(pool: &PgPool) -> Result<SchemaFound, sqlx::Error> {
    let (role, events, outbox, search_path): (String, bool, bool, bool) =
        find_schema_query().fetch_one(pool).await?;
    let history = if outbox {
        Some(History::Outbox)
    } else if search_path {
        Some(History::SearchPath)
    } else {
        None
    };
    Ok(SchemaFound { role, events, history })
}

pub(super) fn find_schema_query<'q>() -> Rows<'q, (String, bool, bool, bool)> {
    sqlx::query_as(
        "SELECT current_user::text, \
                to_regclass('outbox.events') IS NOT NULL, \
                to_regclass('outbox._sqlx_migrations') IS NOT NULL, \
                to_regclass('_sqlx_migrations') IS NOT NULL",
    )
}

/// The versions `history` records as applied (sqlx records a failed one with `success` false).
/// Reads only `version` and `success`: the grant the relay role needs is on those two columns.
pub(crate) async fn applied_migrations(
    pool: &PgPool,
    history: History,
) -> Result<Vec<i64>, sqlx::Error> {
    applied_query(history).fetch_all(pool).await
}

pub(super) fn applied_query<'q>(history: History) -> Scalar<'q, i64> {
    sqlx::query_scalar(match history {
        History::Outbox => "SELECT version FROM outbox._sqlx_migrations WHERE success",
        History::SearchPath => "SELECT version FROM _sqlx_migrations WHERE success",
    })
}
