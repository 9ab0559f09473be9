//! What a drain reports: each event's outcome, and the relay's own counts.

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::relay::RelayCounts;
use crate::store::testing::DrainRow;

/// Where an event stands when a drain ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Published: a handler succeeded, after [`attempts`](DrainedEvent::attempts) failed
    /// deliveries.
    Delivered,
    /// Failed, and its next attempt is due only after the horizon (the relay's backoff is longer
    /// than it): [`last_error`](DrainedEvent::last_error) says why.
    Failed,
    /// Exhausted its attempts (or its expired leases): a dead letter, never delivered again.
    Dead,
    /// Never delivered nor failed, and not due within the horizon: delayed or
    /// [snoozed](crate::Snooze) past it, of a [paused](crate::pauses) type, or held back behind
    /// an earlier ordered event of its aggregate that is.
    Pending,
    /// Being delivered, or deliverable within the horizon. Only in the report of a drain that
    /// timed out: these are what it was waiting for.
    Due,
}

/// One event of the relay's types in a [`DrainReport`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DrainedEvent {
    /// The event's id, as `emit` returned it.
    pub event_id: Uuid,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The event type.
    pub event_type: String,
    /// The version it was written at.
    pub version: u32,
    /// Where it stands.
    pub outcome: Outcome,
    /// Its failed deliveries so far (before the drain too).
    pub attempts: u32,
    /// The text of its last failure, as the relay recorded it: the handler's error chain,
    /// `handler panicked: ...`, a timeout, a payload that does not decode. Kept once delivered.
    pub last_error: Option<String>,
    /// When a relay may deliver it next, unless it was delivered or is dead.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

impl DrainedEvent {
    pub(crate) fn from_row(row: DrainRow) -> Self {
        let outcome = if row.published {
            Outcome::Delivered
        } else if row.dead {
            Outcome::Dead
        } else if row.due {
            Outcome::Due
        } else if row.attempts > 0 {
            Outcome::Failed
        } else {
            Outcome::Pending
        };
        let settled = matches!(outcome, Outcome::Delivered | Outcome::Dead);
        DrainedEvent {
            event_id: row.event_id,
            aggregate_type: row.aggregate_type,
            aggregate_id: row.aggregate_id,
            event_type: row.event_type,
            // The column's check keeps both in range.
            version: u32::try_from(row.event_version).unwrap_or(1),
            outcome,
            attempts: u32::try_from(row.attempts).unwrap_or(0),
            last_error: row.last_error,
            next_attempt_at: (!settled).then_some(row.available_at),
        }
    }
}

impl fmt::Display for DrainedEvent {
    /// `` `order.placed` 0190… (Failed, 2 failed attempts, last error: ...) ``.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let DrainedEvent { event_type, event_id, outcome, attempts, .. } = self;
        write!(f, "`{event_type}` {event_id} ({outcome:?}, {attempts} failed attempts")?;
        if let Some(error) = &self.last_error {
            write!(f, ", last error: {error}")?;
        }
        f.write_str(")")
    }
}

/// What happened during a [`drain`](super::drain): every event of the relay's types that was
/// published or died meanwhile, or is still pending, in the order they were emitted; and the
/// relay's own counts.
#[derive(Debug, Clone)]
pub struct DrainReport {
    events: Vec<DrainedEvent>,
    counts: RelayCounts,
}

impl DrainReport {
    pub(crate) fn new(rows: Vec<DrainRow>, counts: RelayCounts) -> Self {
        DrainReport { events: rows.into_iter().map(DrainedEvent::from_row).collect(), counts }
    }

    /// Every event, in the order they were emitted.
    pub fn events(&self) -> &[DrainedEvent] {
        &self.events
    }

    /// The event with this id, if the report has it.
    pub fn event(&self, event_id: Uuid) -> Option<&DrainedEvent> {
        self.events.iter().find(|event| event.event_id == event_id)
    }

    /// The outcome of the event with this id, if the report has it.
    pub fn outcome(&self, event_id: Uuid) -> Option<Outcome> {
        self.event(event_id).map(|event| event.outcome)
    }

    /// The events with this outcome, in the order they were emitted.
    pub fn with_outcome(&self, outcome: Outcome) -> impl Iterator<Item = &DrainedEvent> + '_ {
        self.events.iter().filter(move |event| event.outcome == outcome)
    }

    /// What the relay counted while it ran: deliveries, failures, dead letters, rows handed back.
    pub fn counts(&self) -> RelayCounts {
        self.counts
    }
}
