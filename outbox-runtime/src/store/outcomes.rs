//! The outcomes a relay writes for many rows at once, as every backend's statements take them.

use std::time::Duration;

use uuid::Uuid;

/// A failed delivery of a leased row.
pub(crate) struct Failure {
    pub(crate) event_id: Uuid,
    /// The lease it was delivered under.
    pub(crate) token: Uuid,
    pub(crate) error: String,
    /// How soon it is due again.
    pub(crate) retry_in: Duration,
    /// The most attempts of its handler; 0: dead now.
    pub(crate) max_attempts: i32,
}

/// Failed deliveries, for one statement.
#[derive(Default)]
pub(crate) struct Failures(pub(crate) Vec<Failure>);

impl Failures {
    /// A failure: its error, when the row is due again, the most attempts of its handler (0:
    /// dead now).
    pub(crate) fn push(
        &mut self,
        event_id: Uuid,
        token: Uuid,
        error: String,
        retry_in: Duration,
        max_attempts: u32,
    ) {
        // `build()` keeps the most attempts within `i32`.
        let max_attempts = i32::try_from(max_attempts).unwrap_or(i32::MAX);
        self.0.push(Failure { event_id, token, error, retry_in, max_attempts });
    }
}

/// Snoozed deliveries, for one statement: each row's id, lease token and delay.
#[derive(Default)]
pub(crate) struct Snoozes(pub(crate) Vec<(Uuid, Uuid, Duration)>);

impl Snoozes {
    pub(crate) fn push(&mut self, event_id: Uuid, token: Uuid, delay: Duration) {
        self.0.push((event_id, token, delay));
    }
}
