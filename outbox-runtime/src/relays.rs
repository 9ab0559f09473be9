//! The relays running against an outbox, as their heartbeats tell: what `outbox status` lists.
//!
//! Every running [`Relay`](crate::Relay) keeps an entry in `outbox.relays`, refreshed every
//! [`HEARTBEAT_INTERVAL`] with the rows it holds and the events it delivered, and removed when
//! it stops gracefully. A relay that was killed (or lost the database) leaves its entry, whose
//! heartbeat grows old: after [`SILENT_AFTER`] it is [`silent`](RelayStatus::silent), and a
//! day later the next relay to start removes it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::Error;
use crate::store;

/// How often a running relay refreshes its entry.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// How long after its last heartbeat a relay counts as silent: three heartbeats missed.
pub const SILENT_AFTER: Duration = Duration::from_secs(15);

/// How long the entry of a silent relay is kept.
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// A relay's entry, as of its last heartbeat.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct RelayStatus {
    /// Made when the relay started; a restarted process is a new relay.
    pub relay_id: Uuid,
    /// The host name of the machine it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// The version of `outbox-runtime` it runs.
    pub version: String,
    /// `written` or `held_transaction` (see [`LeaseMode`](crate::LeaseMode)).
    pub lease_mode: String,
    /// The `aggregate_type/event_type` of each type it has a handler for.
    pub handles: Vec<String>,
    /// What it forwards to a broker, by `aggregate_type/event_type`; `*` for every type no
    /// handler takes. `None` when it forwards nothing.
    pub forwards: Option<Vec<String>>,
    /// When it started.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub heartbeat_at: DateTime<Utc>,
    /// How long ago that was, by the database's clock.
    #[serde(rename = "since_heartbeat_secs", serialize_with = "crate::serialize::seconds")]
    pub since_heartbeat: Duration,
    /// No heartbeat for longer than [`SILENT_AFTER`]: the relay died, hangs, or cannot reach the
    /// database.
    pub silent: bool,
    /// Rows it held leases on.
    pub held: u64,
    /// Events it delivered since it started.
    pub delivered: u64,
}

/// Every relay's entry, the longest running first.
pub async fn relays(pool: &PgPool) -> Result<Vec<RelayStatus>, Error> {
    let rows = store::relays(pool).await?;
    Ok(rows.into_iter().map(RelayStatus::from_row).collect())
}

impl RelayStatus {
    fn from_row(row: store::RelayRow) -> Self {
        let since_heartbeat = Duration::from_secs_f64(row.since_heartbeat.max(0.0));
        RelayStatus {
            relay_id: row.relay_id,
            host: row.host,
            pid: u32::try_from(row.pid).unwrap_or_default(),
            version: row.version,
            lease_mode: row.lease_mode,
            handles: row.handles,
            forwards: row.forwards_to,
            started_at: row.started_at,
            heartbeat_at: row.heartbeat_at,
            since_heartbeat,
            silent: since_heartbeat > SILENT_AFTER,
            held: u64::try_from(row.held).unwrap_or_default(),
            delivered: u64::try_from(row.delivered).unwrap_or_default(),
        }
    }
}
