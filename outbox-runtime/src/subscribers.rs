//! The subscribers relays run (see [`RelayBuilder::subscriber`](crate::RelayBuilder::subscriber)),
//! as operators see them: what each has pending and dead, and removing one for good.
//!
//! ```no_run
//! # use outbox_runtime::sqlx;
//! # async fn ops(pool: sqlx::PgPool) -> Result<(), outbox_runtime::Error> {
//! for s in outbox_runtime::subscribers::list(&pool).await? {
//!     println!("{} on {}/{}: {} pending, {} dead", s.subscriber, s.aggregate_type, s.event_type, s.pending, s.dead);
//! }
//! // The search index is gone from the code: forget it.
//! outbox_runtime::subscribers::remove(&pool, "search-index").await?;
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::Error;
use crate::store::{self, SubscriberRow};

/// A registered subscriber of one event type.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SubscriberStatus {
    /// The subscriber's name.
    pub subscriber: String,
    /// The aggregate type of the events it takes.
    pub aggregate_type: String,
    /// The event type it takes.
    pub event_type: String,
    /// When a relay first ran it.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub registered_at: DateTime<Utc>,
    /// Its copies of events still to deliver: events it failed or snoozed, events waiting behind
    /// an earlier one of their aggregate, and events other relays leased while it did not run.
    pub pending: u64,
    /// When the oldest event among those was emitted.
    #[serde(serialize_with = "crate::serialize::optional_instant")]
    pub oldest_pending: Option<DateTime<Utc>>,
    /// Its copies that are dead (dead letters for it alone).
    pub dead: u64,
}

impl From<SubscriberRow> for SubscriberStatus {
    fn from(row: SubscriberRow) -> Self {
        SubscriberStatus {
            subscriber: row.subscriber,
            aggregate_type: row.aggregate_type,
            event_type: row.event_type,
            registered_at: row.registered_at,
            pending: u64::try_from(row.pending).unwrap_or_default(),
            oldest_pending: row.oldest_pending,
            dead: u64::try_from(row.dead).unwrap_or_default(),
        }
    }
}

/// Every registered subscriber, by name then type.
pub async fn list(pool: &PgPool) -> Result<Vec<SubscriberStatus>, Error> {
    Ok(store::subscribers(pool).await?.into_iter().map(SubscriberStatus::from).collect())
}

/// What [`remove`] deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Removed {
    /// Its registrations, one per event type.
    pub registrations: u64,
    /// Its copies still to deliver.
    pub pending: u64,
    /// Its dead copies.
    pub dead: u64,
}

/// Removes the subscriber `subscriber` for good: its registrations, so no event is copied for it
/// any more, and its pending and dead copies (published ones stay as history, for retention).
/// Remove its code from every relay first: a relay that still runs it registers it again when
/// it starts.
pub async fn remove(pool: &PgPool, subscriber: &str) -> Result<Removed, Error> {
    let (registrations, pending, dead) = store::remove_subscriber(pool, subscriber).await?;
    let count = |n: i64| u64::try_from(n).unwrap_or_default();
    Ok(Removed { registrations: count(registrations), pending: count(pending), dead: count(dead) })
}
