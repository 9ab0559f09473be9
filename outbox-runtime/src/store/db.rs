//! The database a relay runs on, chosen at run time: one backend's pool, and its statements.
//!
//! A relay is a value applications keep in their own types (`Relay<AppState>`), so the
//! backend is not one of its type parameters: it holds a [`Db`], and each statement it runs
//! picks the backend's by a `match`, a branch per statement (which costs nothing beside its
//! round trip). The features only PostgreSQL has are reached through [`Db::postgres`].

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::{Failures, LeasePlan, LeasedEvent, OnPublish, Scan, Snoozes};
use crate::error::Error;

/// One backend's pool.
#[derive(Debug, Clone)]
pub enum Db {
    Postgres(PgPool),
    #[cfg(feature = "sqlite")]
    Sqlite(super::sqlite::relay::Writer),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

/// Runs `$call` with the pool of whichever backend `$db` is, as `$pool`, on that backend's
/// statements as `$statements`.
macro_rules! on_backend {
    ($db:expr, |$pool:ident, $statements:ident| $call:expr) => {
        match $db {
            Db::Postgres($pool) => {
                use crate::store::postgres as $statements;
                $call
            }
            #[cfg(feature = "sqlite")]
            Db::Sqlite($pool) => {
                use crate::store::sqlite::relay as $statements;
                $call
            }
            #[cfg(feature = "mysql")]
            Db::MySql($pool) => {
                use crate::store::mysql::relay as $statements;
                $call
            }
        }
    };
}

impl Db {
    /// The database's name, for messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Db::Postgres(_) => "PostgreSQL",
            #[cfg(feature = "sqlite")]
            Db::Sqlite(_) => "SQLite",
            #[cfg(feature = "mysql")]
            Db::MySql(_) => "MySQL",
        }
    }

    /// The pool, if the database is PostgreSQL: what only it has (LISTEN/NOTIFY, the relays'
    /// registry, subscribers, held transactions) runs on it.
    pub(crate) fn postgres(&self) -> Option<&PgPool> {
        match self {
            Db::Postgres(pool) => Some(pool),
            #[cfg(feature = "sqlite")]
            Db::Sqlite(_) => None,
            #[cfg(feature = "mysql")]
            Db::MySql(_) => None,
        }
    }

    /// Leases up to `limit` available rows under a fresh fencing token (see `postgres::lease`).
    pub(crate) async fn lease(
        &self,
        plan: &LeasePlan,
        scan: Scan<'_>,
        limit: i64,
        held: &[Uuid],
    ) -> Result<Vec<LeasedEvent>, sqlx::Error> {
        on_backend!(self, |pool, store| store::lease(pool, plan, scan, limit, held).await)
    }

    /// Marks delivered rows published, or deletes them; returns the ids done.
    pub(crate) async fn publish(
        &self,
        ids: &[Uuid],
        tokens: &[Uuid],
        on_publish: OnPublish,
    ) -> Result<Vec<Uuid>, sqlx::Error> {
        on_backend!(self, |pool, store| store::publish(pool, ids, tokens, on_publish).await)
    }

    /// Records failed deliveries; returns the ids done, each with whether it died.
    pub(crate) async fn fail(&self, failures: &Failures) -> Result<Vec<(Uuid, bool)>, sqlx::Error> {
        on_backend!(self, |pool, store| store::fail(pool, failures).await)
    }

    /// Hands leased rows back without counting an attempt; returns the ids done.
    pub(crate) async fn release(
        &self,
        ids: &[Uuid],
        tokens: &[Uuid],
    ) -> Result<Vec<Uuid>, sqlx::Error> {
        on_backend!(self, |pool, store| store::release(pool, ids, tokens).await)
    }

    /// Hands snoozed rows back, due after their delays; returns the ids done.
    pub(crate) async fn snooze(&self, snoozes: &Snoozes) -> Result<Vec<Uuid>, sqlx::Error> {
        on_backend!(self, |pool, store| store::snooze(pool, snoozes).await)
    }

    /// Pushes the lease deadline of rows still held under their tokens; returns those renewed.
    pub(crate) async fn renew(
        &self,
        ids: &[Uuid],
        tokens: &[Uuid],
        lease_timeout: Duration,
    ) -> Result<Vec<Uuid>, sqlx::Error> {
        on_backend!(self, |pool, store| store::renew(pool, ids, tokens, lease_timeout).await)
    }

    /// Which of the rows are still leased under their tokens.
    pub(crate) async fn still_leased(
        &self,
        ids: &[Uuid],
        tokens: &[Uuid],
    ) -> Result<Vec<Uuid>, sqlx::Error> {
        on_backend!(self, |pool, store| store::still_leased(pool, ids, tokens).await)
    }

    /// Checks that the schema has every migration this version needs.
    pub(crate) async fn check_schema(&self) -> Result<(), Error> {
        match self {
            Db::Postgres(pool) => crate::check_schema(pool).await,
            #[cfg(feature = "sqlite")]
            Db::Sqlite(writer) => crate::check_schema(&writer.pool).await,
            #[cfg(feature = "mysql")]
            Db::MySql(pool) => crate::check_schema(pool).await,
        }
    }

    /// Deletes up to `limit` rows published more than `older_than` ago; returns how many.
    pub(crate) async fn purge_published(
        &self,
        older_than: Duration,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        on_backend!(self, |pool, store| store::purge_published(pool, older_than, limit).await)
    }
}
