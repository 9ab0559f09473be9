//! Every SQL statement of the crate, next to the schema in `migrations/` it is tuned for.
//!
//! Values are always bound, never formatted into SQL. Statements that touch many rows take
//! arrays and `UNNEST` them, so a batch costs one round trip.

use std::time::Duration;

mod ack;
mod emit;
mod lease;
mod ops;
mod sleepers;

pub(crate) use ack::{fail, publish, publish_in, release, renew, still_leased, Failures};
pub(crate) use emit::{event_for_key, insert_events, InsertShared, NewEvents};
pub(crate) use lease::{lease, LeaseFilter, LeaseRequest, LeasedEvent, RELAY_SESSION};
pub(crate) use ops::{
    dead, discard_dead, purge_published, requeue_dead, stats_by_type, DeadSelection,
};
pub(crate) use sleepers::{register_sleeper, unregister_sleeper};

/// The statements whose plans the tests check, by name.
#[cfg(feature = "test-hooks")]
pub(crate) use {
    ack::{FAIL, PUBLISH, PUBLISH_ONE, RELEASE, RENEW, STILL_LEASED},
    lease::{LEASE_ANY, LEASE_HANDLED},
    ops::PURGE_PUBLISHED,
};

/// The channel the insert trigger notifies; relays LISTEN on it.
pub(crate) const NOTIFY_CHANNEL: &str = "outbox_events";

/// Delays past this are capped: PostgreSQL timestamps end in the year 294276.
const MAX_DELAY: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.min(MAX_DELAY).as_micros()).unwrap_or(i64::MAX)
}
