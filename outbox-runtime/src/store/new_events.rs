//! What an emit writes, the same for every backend: the rows of one insert and what they share.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::event::EventType;

/// When an emitted event becomes deliverable.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Available {
    /// At the emitting transaction's start time (`now()`).
    #[default]
    Now,
    /// That long after `now()`, measured by the database clock.
    After(Duration),
    /// At that instant.
    At(DateTime<Utc>),
}

impl Available {
    /// As two parameters: an instant, or a delay in microseconds after the database's now.
    pub(crate) fn at_or_delay(self) -> (Option<DateTime<Utc>>, i64) {
        match self {
            Available::Now => (None, 0),
            Available::After(delay) => (None, micros(delay)),
            Available::At(at) => (Some(at), 0),
        }
    }
}

/// Delays past this are capped: a century, within every backend's calendar (SQLite's ends in
/// the year 9999, PostgreSQL's in 294276).
const MAX_DELAY: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

/// `duration` in microseconds, capped at [`MAX_DELAY`].
pub(crate) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.min(MAX_DELAY).as_micros()).unwrap_or(i64::MAX)
}

/// Column-wise rows for one multi-row insert.
#[derive(Default)]
pub struct NewEvents {
    pub(crate) event_ids: Vec<Uuid>,
    pub(crate) aggregate_ids: Vec<String>,
    pub(crate) payloads: Vec<String>,
    pub(crate) event_types: Vec<&'static str>,
    pub(crate) versions: Vec<i32>,
    pub(crate) ordered: Vec<bool>,
}

impl NewEvents {
    pub(crate) fn push(
        &mut self,
        event_id: Uuid,
        event_type: &'static EventType,
        aggregate_id: String,
        payload: String,
    ) {
        self.event_ids.push(event_id);
        self.aggregate_ids.push(aggregate_id);
        self.payloads.push(payload);
        self.event_types.push(event_type.name());
        // Versions above i32::MAX cannot be declared (the derive checks), nor stored.
        self.versions.push(i32::try_from(event_type.version()).unwrap_or(i32::MAX));
        self.ordered.push(event_type.ordered());
    }
}

/// What one insert statement shares across its rows.
pub struct InsertShared<'a> {
    pub(crate) aggregate_type: &'static str,
    pub(crate) headers: &'a str,
    pub(crate) available: Available,
    pub(crate) idempotency_key: Option<&'a str>,
}
