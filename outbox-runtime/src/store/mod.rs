//! Every SQL statement of the crate, next to the schema in `migrations/` it is tuned for.
//!
//! Values are always bound, never formatted into SQL. Statements that touch many rows take
//! arrays and `UNNEST` them, so a batch costs one round trip.

use std::time::Duration;

/// The channel the insert trigger notifies; relays LISTEN on it.
pub(crate) const NOTIFY_CHANNEL: &str = "outbox_events";

/// Delays past this are capped: PostgreSQL timestamps end in the year 294276.
const MAX_DELAY: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.min(MAX_DELAY).as_micros()).unwrap_or(i64::MAX)
}

mod emit;
mod lease;
mod ops;

pub(crate) use emit::*;
pub(crate) use lease::*;
pub(crate) use ops::*;
