//! Health figures for dashboards and alerts.

use std::time::Duration;

use sqlx::PgPool;

use crate::backend::Backend;
use crate::error::Error;
use crate::store;

/// How the outbox is doing, as one consistent reading.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Events not yet published and not dead, whether available now, leased, delayed, or waiting
    /// to retry (`count_pending` of [the reference design](crate#the-reference-design)).
    pub pending: i64,
    /// Events that exhausted their attempts or their expired leases (`count_poisoned` of
    /// [the reference design](crate#the-reference-design)).
    pub dead: i64,
    /// How long ago the oldest pending event was emitted: the relay's lag. `None` when nothing
    /// is pending.
    #[serde(
        rename = "oldest_pending_age_secs",
        serialize_with = "crate::serialize::optional_seconds"
    )]
    pub oldest_pending_age: Option<Duration>,
}

/// Reads [`OutboxStats`], on any [`Backend`]: on PostgreSQL the totals of [`stats_by_type`],
/// from the same statement.
pub async fn stats<DB: Backend>(pool: &sqlx::Pool<DB>) -> Result<OutboxStats, Error> {
    DB::stats(pool).await
}

impl OutboxStats {
    /// The totals of a [`stats_by_type`] reading, so a report of both shows one consistent
    /// reading.
    pub fn total(by_type: &[TypeStats]) -> Self {
        OutboxStats {
            pending: by_type.iter().map(|t| t.pending).sum(),
            dead: by_type.iter().map(|t| t.dead).sum(),
            oldest_pending_age: by_type.iter().filter_map(|t| t.oldest_pending_age).max(),
        }
    }
}

/// [`OutboxStats`] of one `(aggregate_type, event_type)` at one version.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct TypeStats {
    /// The aggregate type.
    pub aggregate_type: String,
    /// The event type.
    pub event_type: String,
    /// The version its events were written at: a relay leaves rows newer than its handler's
    /// type reads (see [`NewerVersions`](crate::NewerVersions)), and they wait here.
    pub version: u32,
    /// Its pending events.
    pub pending: i64,
    /// Its dead events.
    pub dead: i64,
    /// How long ago its oldest pending event was emitted.
    #[serde(
        rename = "oldest_pending_age_secs",
        serialize_with = "crate::serialize::optional_seconds"
    )]
    pub oldest_pending_age: Option<Duration>,
}

/// [`OutboxStats`] per event type and version, for those that have pending or dead events.
pub async fn stats_by_type(pool: &PgPool) -> Result<Vec<TypeStats>, Error> {
    Ok(store::stats_by_type(pool).await?.into_iter().map(TypeStats::from_counts).collect())
}

/// [`stats_by_type`] as the relays of a database share it, at most `max_age` old, for their
/// gauges: `None` while another relay takes the reading.
#[cfg_attr(not(any(feature = "metrics", feature = "test-hooks")), allow(dead_code))]
pub(crate) async fn shared_stats_by_type(
    pool: &PgPool,
    max_age: Duration,
) -> Result<Option<Vec<TypeStats>>, Error> {
    let reading = store::shared_stats_by_type(pool, max_age).await?;
    Ok(reading.map(|rows| rows.into_iter().map(TypeStats::from_counts).collect()))
}

impl TypeStats {
    fn from_counts(
        (aggregate_type, event_type, version, pending, dead, age): store::TypeCounts,
    ) -> Self {
        TypeStats {
            aggregate_type,
            event_type,
            version: u32::try_from(version).unwrap_or(1),
            pending,
            dead,
            oldest_pending_age: age.map(seconds),
        }
    }
}

fn seconds(secs: f64) -> Duration {
    Duration::from_secs_f64(secs.max(0.0))
}
