//! Pausing delivery of an event type: while it is paused no relay leases its rows (a relay
//! leasing when the pause lands stops with its next lease, within a second), and its events wait
//! pending; resuming wakes the relays. Rows leased before the pause are delivered.
//!
//! ```no_run
//! # use outbox_runtime::sqlx;
//! use outbox_runtime::pauses;
//! # async fn ops(pool: sqlx::PgPool) -> Result<(), outbox_runtime::Error> {
//! pauses::pause(&pool, "order", "order.placed", Some("the mailer is down")).await?;
//! // ... the mailer is back:
//! pauses::resume(&pool, "order", "order.placed").await?;
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::error::Error;
use crate::store;

/// A paused event type.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PausedType {
    /// The aggregate type.
    pub aggregate_type: String,
    /// The event type.
    pub event_type: String,
    /// When it was paused.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub paused_at: DateTime<Utc>,
    /// Why, as the operator said.
    pub reason: Option<String>,
}

/// Pauses delivery of `(aggregate_type, event_type)`, with an optional reason; returns whether it
/// was running (pausing a paused type changes nothing, its time and reason included).
pub async fn pause(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    reason: Option<&str>,
) -> Result<bool, Error> {
    Ok(store::pause(pool, aggregate_type, event_type, reason).await?)
}

/// Resumes delivery of `(aggregate_type, event_type)` and wakes the relays; returns whether it
/// was paused.
pub async fn resume(pool: &PgPool, aggregate_type: &str, event_type: &str) -> Result<bool, Error> {
    Ok(store::resume(pool, aggregate_type, event_type).await?)
}

/// Every paused type, the longest paused first.
pub async fn paused(pool: &PgPool) -> Result<Vec<PausedType>, Error> {
    let rows = store::paused(pool).await?;
    Ok(rows
        .into_iter()
        .map(|(aggregate_type, event_type, paused_at, reason)| PausedType {
            aggregate_type,
            event_type,
            paused_at,
            reason,
        })
        .collect())
}
