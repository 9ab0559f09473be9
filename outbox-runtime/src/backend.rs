//! The databases the outbox runs on.

use crate::store::Store;

/// A database the outbox runs on: [`sqlx::Postgres`], and with the crate's features `sqlite`
/// and `mysql`, [`sqlx::Sqlite`](https://docs.rs/sqlx/latest/sqlx/struct.Sqlite.html) and
/// [`sqlx::MySql`](https://docs.rs/sqlx/latest/sqlx/struct.MySql.html) (MySQL 8 and
/// MariaDB 10.6 and newer). [`emit`](crate::emit) takes that database's transaction, and
/// [`migrate`](crate::migrate), [`stats`](crate::stats) and
/// [`Relay::builder`](crate::Relay::builder) its pool. What the relay does on each is in the
/// README's table of databases.
///
/// Sealed: the crate implements it for each database it has statements for.
pub trait Backend: Store {}

impl Backend for sqlx::Postgres {}
#[cfg(feature = "sqlite")]
impl Backend for sqlx::Sqlite {}
#[cfg(feature = "mysql")]
impl Backend for sqlx::MySql {}
