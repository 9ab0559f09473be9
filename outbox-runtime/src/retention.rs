//! Retention: deleting published events once they are old enough.

use std::time::Duration;

use sqlx::PgPool;

use crate::error::{Error, ErrorChain};
use crate::store::{self, Db};

/// Rows deleted per statement: small enough that no statement holds many locks for long.
pub(crate) const PURGE_BATCH: i64 = 1_000;

/// Deletes events published more than `older_than` ago, in batches of 1,000 rows oldest first,
/// until none is left; returns how many were deleted. Pending and dead events are never touched.
///
/// Safe to run beside relays and producers: each batch is its own short statement on the
/// `published_at` index, and skips rows another statement has locked. A relay can run it
/// periodically for you: see `RelayBuilder::retention`.
pub async fn purge_published(pool: &PgPool, older_than: Duration) -> Result<u64, Error> {
    let mut total = 0;
    loop {
        let deleted = store::purge_published(pool, older_than, PURGE_BATCH).await?;
        total += deleted;
        if deleted < PURGE_BATCH as u64 {
            return Ok(total);
        }
    }
}

/// A relay's retention task: purges once a minute, pausing between batches as long as the last
/// one took, so the purge holds its connection half the time at most and never competes with
/// delivery for long, yet deletes far faster than a relay publishes (see BENCHMARKS.md).
pub(crate) async fn purge_periodically(pool: Db, keep_for: Duration) {
    let mut every = tokio::time::interval(Duration::from_secs(60));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        loop {
            let started = tokio::time::Instant::now();
            match pool.purge_published(keep_for, PURGE_BATCH).await {
                Ok(deleted) if deleted == PURGE_BATCH as u64 => {
                    tokio::time::sleep(started.elapsed()).await;
                }
                Ok(deleted) => {
                    tracing::debug!(deleted, "outbox retention pass done");
                    break;
                }
                Err(error) => {
                    tracing::warn!(error = %ErrorChain(&error), "outbox retention failed; retrying in a minute");
                    break;
                }
            }
        }
    }
}
