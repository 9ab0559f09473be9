//! Health figures for dashboards and alerts.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::Error;
use crate::store;

/// How the outbox is doing, as one consistent reading.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Events not yet published and not dead (the reference design's `count_pending`), whether
    /// available now, leased, delayed, or waiting to retry.
    pub pending: i64,
    /// Events that exhausted their attempts (the reference design's `count_poisoned`).
    pub dead: i64,
    /// How long ago the oldest pending event was emitted: the relay's lag. `None` when nothing
    /// is pending.
    pub oldest_pending_age: Option<Duration>,
}

/// Reads [`OutboxStats`] in one statement.
pub async fn stats(pool: &PgPool) -> Result<OutboxStats, Error> {
    let (pending, dead, age) = store::stats(pool).await?;
    Ok(OutboxStats {
        pending,
        dead,
        oldest_pending_age: age.map(|secs| Duration::from_secs_f64(secs.max(0.0))),
    })
}
