//! The overview's reading, which the page and the API both serve.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::error::ErrorChain;
use crate::pauses::PausedType;
use crate::relays::RelayStatus;
use crate::store::{self, ActivityRow};
use crate::{Error, OutboxStats, TypeStats};

/// The outbox at one moment: `outbox status`, and what the relays did over the last day.
#[derive(Serialize)]
pub(super) struct Reading {
    #[serde(flatten)]
    pub(super) stats: OutboxStats,
    /// Events the relays delivered in the last hour.
    pub(super) delivered_last_hour: i64,
    pub(super) by_type: Vec<TypeStats>,
    pub(super) relays: Vec<RelayStatus>,
    pub(super) paused: Vec<PausedType>,
    /// The minutes of the last day in which a relay ran, oldest first.
    pub(super) activity: Vec<Minute>,
    /// Why `activity` could not be read (the rest of the reading stands).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) activity_error: Option<String>,
}

/// One minute of the relays' activity.
#[derive(Serialize)]
pub(super) struct Minute {
    #[serde(serialize_with = "crate::serialize::instant")]
    pub(super) minute: DateTime<Utc>,
    pub(super) delivered: i64,
    pub(super) pending: Option<i64>,
    pub(super) dead: Option<i64>,
    pub(super) oldest_pending_age_secs: Option<f64>,
}

pub(super) async fn read(pool: &PgPool, now: DateTime<Utc>) -> Result<Reading, Error> {
    // The charts are a part the page can do without: a role that may not read them still
    // sees the rest.
    let activity = async { Ok::<_, Error>(store::activity(pool, now - Duration::days(1)).await) };
    let (by_type, relays, paused, activity) = tokio::try_join!(
        crate::stats_by_type(pool),
        crate::relays::relays(pool),
        crate::pauses::paused(pool),
        activity,
    )?;
    let (activity, activity_error) = match activity {
        Ok(activity) => (activity, None),
        Err(error) => {
            let error = Error::from(error);
            tracing::warn!(error = %ErrorChain(&error), "outbox console cannot read outbox.activity");
            let advice = "grant the console's role SELECT on outbox.activity \
                          (docs/least-privilege.sql)";
            (Vec::new(), Some(format!("{}; {advice}", ErrorChain(&error))))
        }
    };
    let hour_ago = now - Duration::hours(1);
    Ok(Reading {
        stats: OutboxStats::total(&by_type),
        delivered_last_hour: activity
            .iter()
            .filter(|row| row.minute > hour_ago)
            .map(|row| row.delivered)
            .sum(),
        by_type,
        relays,
        paused,
        activity: activity.into_iter().map(Minute::from).collect(),
        activity_error,
    })
}

impl From<ActivityRow> for Minute {
    fn from(row: ActivityRow) -> Self {
        Minute {
            minute: row.minute,
            delivered: row.delivered,
            pending: row.pending,
            dead: row.dead,
            oldest_pending_age_secs: row.oldest_pending_age_secs,
        }
    }
}
