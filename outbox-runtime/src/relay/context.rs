//! What a handler learns about the event beside its payload.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// What the relay knows of a leased row besides its payload.
pub(crate) struct RowMeta {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    /// The version the payload was written at.
    pub(crate) version: u32,
    pub(crate) headers: serde_json::Value,
    /// Failed deliveries before this one.
    pub(crate) attempts: u32,
    /// Leases that expired before this one.
    pub(crate) expired_leases: u32,
    pub(crate) created_at: DateTime<Utc>,
}

/// The delivery context handed to a handler with its event: ids, headers, how often it was
/// tried before, and the relay's shared state.
#[derive(Debug, Clone)]
pub struct EventContext<S = ()> {
    state: S,
    event_id: Uuid,
    aggregate_id: String,
    version: u32,
    headers: serde_json::Value,
    attempts: u32,
    expired_leases: u32,
    created_at: DateTime<Utc>,
}

impl<S> EventContext<S> {
    pub(crate) fn new(state: S, meta: RowMeta) -> Self {
        let RowMeta {
            event_id,
            aggregate_id,
            version,
            headers,
            attempts,
            expired_leases,
            created_at,
            ..
        } = meta;
        Self {
            state,
            event_id,
            aggregate_id,
            version,
            headers,
            attempts,
            expired_leases,
            created_at,
        }
    }

    /// The relay's shared state (see `RelayBuilder::state`).
    pub fn state(&self) -> &S {
        &self.state
    }

    /// The event's id, as `emit` returned it. Stable across retries: use it to deduplicate.
    pub fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// The aggregate id the event was emitted with.
    pub fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }

    /// The version the event was emitted at (its `event_version`), before any upcasting to
    /// the handler's type.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All headers the event was emitted with, as a JSON object.
    pub fn headers(&self) -> &serde_json::Value {
        &self.headers
    }

    /// One header, if present and a string.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.as_str()
    }

    /// The event's failed deliveries before this one: its `attempts` column, the count that
    /// [`max_attempts`](crate::RelayBuilder::max_attempts) limits. 0 on the first delivery, and
    /// after [snoozes](crate::Snooze), which are not failures.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Leases of the event that expired before this delivery (a relay died or stalled while it
    /// held the event), counted apart from [`attempts`](Self::attempts).
    pub fn expired_leases(&self) -> u32 {
        self.expired_leases
    }

    /// When the event was emitted (the emitting transaction's start, database clock).
    pub fn created_at(&self) -> DateTime<Utc> {
        self.created_at
    }
}
