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
//! **Subscribers**: [`replay`] delivers an event to every subscriber of its type again;
//! [`replay_to`] to one subscriber alone: one that had a bug, or one added later that should
//! start from a point in the past (keep published events at least that long: see
//! [`retention`]).
//!
//! [`retention`]: crate::RelayBuilder::retention
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
/// again and wakes the relays; returns how many. (Subscribers' copies are not counted: an event
/// replayed goes to each subscriber of its type again.)
pub async fn replay(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<u64, Error> {
    Ok(store::replay(pool, aggregate_type, event_type, from, until).await?)
}

/// Delivers the events of `(aggregate_type, event_type)` published in `[from, until)` once more
/// to the subscriber `subscriber` alone (a new copy of each, due now; a copy it has pending or
/// dead is left as it is) and wakes the relays; returns how many. The subscriber's relays take
/// them once it is registered, which it is when one of them runs.
///
/// ```no_run
/// # use outbox_runtime::sqlx;
/// use chrono::{Duration, Utc};
/// # async fn ops(pool: sqlx::PgPool) -> Result<(), outbox_runtime::Error> {
/// // The search index is new: give it the last week of orders.
/// let week_ago = Utc::now() - Duration::days(7);
/// let (order, placed) = ("order", "order.placed");
/// outbox_runtime::replay::replay_to(&pool, "search-index", order, placed, week_ago, Utc::now())
///     .await?;
/// # Ok(()) }
/// ```
pub async fn replay_to(
    pool: &PgPool,
    subscriber: &str,
    aggregate_type: &str,
    event_type: &str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<u64, Error> {
    Ok(store::replay_to(pool, subscriber, aggregate_type, event_type, from, until).await?)
}
