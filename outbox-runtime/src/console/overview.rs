//! The overview's reading, which the page and the API both serve.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::pauses::PausedType;
use crate::relays::RelayStatus;
use crate::{store, Error, OutboxStats, TypeStats};

/// The outbox at one moment: `outbox status`, and what was published over the last hour.
#[derive(Serialize)]
pub(super) struct Reading {
    #[serde(flatten)]
    pub(super) stats: OutboxStats,
    pub(super) published_last_hour: i64,
    #[serde(rename = "published_per_minute", serialize_with = "per_minute")]
    pub(super) per_minute: Vec<(DateTime<Utc>, i64)>,
    pub(super) by_type: Vec<TypeStats>,
    pub(super) relays: Vec<RelayStatus>,
    pub(super) paused: Vec<PausedType>,
}

pub(super) async fn read(pool: &PgPool, now: DateTime<Utc>) -> Result<Reading, Error> {
    let hour_ago = now - chrono::Duration::hours(1);
    let per_minute = async { Ok::<_, Error>(store::published_per_minute(pool, hour_ago).await?) };
    let (by_type, relays, paused, per_minute) = tokio::try_join!(
        crate::stats_by_type(pool),
        crate::relays::relays(pool),
        crate::pauses::paused(pool),
        per_minute,
    )?;
    Ok(Reading {
        stats: OutboxStats::total(&by_type),
        published_last_hour: per_minute.iter().map(|(_, count)| count).sum(),
        per_minute,
        by_type,
        relays,
        paused,
    })
}

/// `[{"minute": instant, "published": int}]`.
fn per_minute<S: serde::Serializer>(
    minutes: &[(DateTime<Utc>, i64)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Minute {
        #[serde(serialize_with = "crate::serialize::instant")]
        minute: DateTime<Utc>,
        published: i64,
    }
    let minutes = minutes.iter().map(|&(minute, published)| Minute { minute, published });
    serializer.collect_seq(minutes)
}
