//! The sqlx the integration tests run on, under the name `sqlx`: 0.8, or 0.9 with the feature
//! `sqlx-0-9` (which takes precedence, as in outbox-runtime). The tests depend on this crate
//! renamed to `sqlx`, so `#[sqlx::test]`, `sqlx::query` and `sqlx::migrate!` (whose expansions
//! name `::sqlx`) need no change to run the whole suite on either version.

#[cfg(feature = "sqlx-0-9")]
pub use sqlx_0_9::*;

#[cfg(all(feature = "sqlx-0-8", not(feature = "sqlx-0-9")))]
pub use sqlx_0_8::*;

/// SQL text built at run time, as both versions take it: sqlx 0.9 takes only `&'static str`
/// (or text wrapped in its own `AssertSqlSafe`, which 0.8 lacks). A test builds a handful of
/// such statements, so leaking them costs nothing.
pub fn static_sql(sql: String) -> &'static str {
    Box::leak(sql.into_boxed_str())
}
