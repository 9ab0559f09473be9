//! How the operations types serialize: the JSON shapes `outbox ... --json` prints and the
//! console's API serves, one definition for both. Instants are UTC with microseconds (what
//! PostgreSQL keeps), durations are seconds as a number under a `_secs` name.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serializer;

/// `2026-12-07T03:17:03.123456Z`.
pub(crate) fn instant<S: Serializer>(at: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&at.format("%Y-%m-%dT%H:%M:%S%.6fZ"))
}

/// [`instant`], or `null`.
pub(crate) fn optional_instant<S: Serializer>(
    at: &Option<DateTime<Utc>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => instant(at, serializer),
        None => serializer.serialize_none(),
    }
}

/// Seconds, with their fraction.
pub(crate) fn seconds<S: Serializer>(
    duration: &Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

/// [`seconds`], or `null`.
pub(crate) fn optional_seconds<S: Serializer>(
    duration: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => seconds(duration, serializer),
        None => serializer.serialize_none(),
    }
}
