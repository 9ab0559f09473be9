//! Items the derive's generated code names. Not public API: exempt from semver, and only
//! guaranteed to match an `outbox-macros` of exactly the same version (the workspace pins it).

pub use serde;

/// Turns the `#[outbox(id)]` field into the stored aggregate id. A named function rather than
/// `ToString::to_string` so a non-`Display` id type fails with the bound spelled out here.
#[inline]
pub fn aggregate_id<T: ?Sized + core::fmt::Display>(id: &T) -> String {
    id.to_string()
}

/// The relay's default lease statement, for the test that checks its plan ignores published
/// history. Parameters: `$1` limit, `$2` token, `$3` lease micros, `$4` max attempts, `$5` skip
/// dead ordered, `$6`/`$7` handled aggregate and event types.
pub const LEASE_SQL: &str = crate::store::LEASE_HANDLED;

/// The settings of the relay's lease connection, for the test that checks its reused plan.
pub const LEASE_SESSION: &str = crate::store::LEASE_SESSION;

/// The relay's statements one at a time, for the model-based test that checks the table's
/// invariants after every step. Not for applications: the relay drives these.
pub mod steps {
    use std::time::Duration;

    use sqlx::PgPool;
    use uuid::Uuid;

    use crate::store::{self, Failures, LeaseFilter, LeaseRequest};

    /// A leased row: `(event id, token, attempts, died on expiry)`.
    pub type Leased = (Uuid, Uuid, i32, bool);

    /// Leases up to `limit` rows of any type.
    pub async fn lease(
        pool: &PgPool,
        limit: i64,
        lease_timeout: Duration,
        max_attempts: i32,
    ) -> Result<Vec<Leased>, sqlx::Error> {
        let request = LeaseRequest {
            limit,
            lease_timeout,
            max_attempts,
            skip_dead_ordered: false,
            filter: LeaseFilter::All,
        };
        let rows = store::lease(pool, request).await?;
        Ok(rows.into_iter().map(|r| (r.event_id, r.lease_token, r.attempts, r.died)).collect())
    }

    /// Publishes under `token`; whether the lease was still valid.
    pub async fn publish(pool: &PgPool, event_id: Uuid, token: Uuid) -> Result<bool, sqlx::Error> {
        Ok(!store::publish(pool, &[event_id], &[token]).await?.is_empty())
    }

    /// Records a failure under `token`; `None` if refused, else whether the row died.
    pub async fn fail(
        pool: &PgPool,
        event_id: Uuid,
        token: Uuid,
        error: &str,
        retry_in: Duration,
        max_attempts: i32,
    ) -> Result<Option<bool>, sqlx::Error> {
        let mut failures = Failures::default();
        failures.push(event_id, token, error.to_owned(), retry_in);
        let recorded = store::fail(pool, &failures, max_attempts).await?;
        Ok(recorded.first().map(|f| f.dead))
    }

    /// Hands a row back under `token`; whether the lease was still valid.
    pub async fn release(pool: &PgPool, event_id: Uuid, token: Uuid) -> Result<bool, sqlx::Error> {
        Ok(store::release(pool, &[event_id], &[token]).await? == 1)
    }
}
