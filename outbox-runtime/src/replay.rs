//! Replaying published events: the rows of a type published in a time range become pending
//! again, and the relays deliver them once more, to the handlers (or the broker) of today.
//!
//! What a replayed event keeps: its **event id** (a consumer that deduplicates by id, an inbox,
//! skips it: emit new events when they must count as new), its idempotency key, payload, headers
//! and `last_error`; `attempts` and expired leases start from zero. **Ordering**: a replayed
//! ordered event is an undelivered event of its aggregate again, so the aggregate's later events
//! that are still pending wait behind it, and the replayed ones go out in their original order.
//! Only rows still in the table can be replayed: retention, `purge_published` and
//! `delete_on_publish` remove them.
//!
//! ```no_run
//! # use outbox_runtime::sqlx;
//! use chrono::{Duration, Utc};
//! use outbox_runtime::replay;
//! # async fn ops(pool: sqlx::PgPool) -> Result<(), outbox_runtime::Error> {
//! // The projection's handler had a bug for the last two hours; it is fixed and deployed.
//! let (from, until) = (Utc::now() - Duration::hours(2), Utc::now());
//! println!("replaying {}", replay::count(&pool, "order", "order.placed", from, until).await?);
//! replay::replay(&pool, "order", "order.placed", from, until).await?;
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::Error;
use crate::store;

/// How many events of `(aggregate_type, event_type)` were published in `[from, until)`: what
/// [`replay`] with the same arguments would make pending now.
pub async fn count(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<u64, Error> {
    let count = store::count_published(pool, aggregate_type, event_type, from, until).await?;
    Ok(u64::try_from(count).unwrap_or_default())
}

/// Makes the events of `(aggregate_type, event_type)` published in `[from, until)` pending
/// again and wakes the relays; returns how many.
pub async fn replay(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<u64, Error> {
    Ok(store::replay(pool, aggregate_type, event_type, from, until).await?)
}
