//! Running a relay until nothing is left for it to deliver soon, then reporting what happened.
//!
//! The drain is over when no row the relay leases is *due*: being delivered, or deliverable
//! within the horizon (see [`Drain::horizon`]). The relay's statements and the drain's reading
//! go through the same table, so once a reading finds nothing due, nothing is in flight: every
//! delivery's outcome was written (a failure that retries within the horizon leaves its row
//! due). The drain watches for that with a short poll of one statement, and ends the moment it
//! holds: it never sleeps for a fixed time.

use std::fmt::Write;
use std::pin::pin;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::error::Error;
use crate::relay::{Backoff, BuildError, RelayBuilder};
use crate::store::testing::{self as store, DrainRow, Relayed};
use crate::testing::report::{DrainReport, Outcome};

/// The relay's poll interval in a drain, unless the caller set one: retries and delayed rows
/// are found by polling.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// The relay's backoff in a drain, unless the caller set one: well inside the default horizon,
/// so a failing row retries until it is delivered or dead (ten attempts take about 0.7 s).
const BACKOFF: Backoff =
    Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(100), jitter: false };

/// How often the drain reads whether anything is still due.
const WATCH_INTERVAL: Duration = Duration::from_millis(10);

/// The most due events a timeout's message lists.
const LISTED: usize = 10;

/// Runs the relay `builder` builds until nothing it leases is due within one second, shuts it
/// down gracefully, and reports what happened to each event: [`Drain`] with its defaults.
///
/// # Errors
/// See [`DrainError`]; a drain that takes more than 30 s fails naming the events still due.
pub async fn drain<S: Clone + Send + Sync + 'static>(
    builder: RelayBuilder<S>,
) -> Result<DrainReport, DrainError> {
    Drain::new(builder).run().await
}

/// A drain with its settings; [`drain`] runs one with the defaults.
///
/// The relay runs with test speeds wherever the builder kept the default: a 10 ms poll interval
/// and a backoff of 10 ms doubling up to 100 ms, without jitter. Every other setting is the
/// builder's (lower `max_attempts` to see dead letters sooner).
#[must_use = "a drain does nothing until `run` is awaited"]
pub struct Drain<S> {
    builder: RelayBuilder<S>,
    horizon: Duration,
    timeout: Duration,
}

impl<S: Clone + Send + Sync + 'static> Drain<S> {
    /// A drain of the relay `builder` builds, with a horizon of 1 s and a timeout of 30 s.
    pub fn new(builder: RelayBuilder<S>) -> Self {
        Drain { builder, horizon: Duration::from_secs(1), timeout: Duration::from_secs(30) }
    }

    /// How far ahead the drain waits for rows to become deliverable. A row available within it
    /// (a short delay, a retry after the backoff) is waited for and delivered; one available
    /// later is reported [`Pending`](Outcome::Pending), or [`Failed`](Outcome::Failed) if it
    /// failed before. Default 1 s.
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// How long the drain may take before it gives up with [`DrainError::TimedOut`]. Default
    /// 30 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs the relay until nothing is due, shuts it down gracefully and reports.
    ///
    /// On a timeout the relay is dropped rather than shut down, so a hung handler cannot hold
    /// the test up further: its row's lease simply expires.
    pub async fn run(self) -> Result<DrainReport, DrainError> {
        let relay = self.builder.or_test_speeds(POLL_INTERVAL, BACKOFF).build()?;
        let metrics = relay.metrics();
        // Its reading is PostgreSQL's so far.
        let Some(pool) = relay.pool().postgres().cloned() else {
            let backend = relay.pool().name();
            return Err(BuildError::Unsupported { backend, what: "`testing::drain`" }.into());
        };
        // What the relay refuses to start on (no schema, an outdated one) is the relay's error,
        // before the drain's own readings could fail on it.
        crate::check_schema(&pool).await.map_err(DrainError::Relay)?;
        let since = store::now(&pool).await.map_err(|error| DrainError::Database(error.into()))?;
        let watch =
            Watch { pool, relayed: Relayed::of(relay.lease_plan()), since, horizon: self.horizon };

        let (stop, stopped) = oneshot::channel::<()>();
        let mut running = pin!(relay.run_until(async move {
            let _ = stopped.await;
        }));
        let settled = tokio::select! {
            // Before the signal the relay stops only on a fatal error.
            finished = &mut running => {
                let counts = finished.map_err(DrainError::Relay)?;
                return Ok(DrainReport::new(watch.reading().await?, counts));
            }
            settled = tokio::time::timeout(self.timeout, watch.until_settled()) => settled,
        };
        match settled {
            Ok(reading) => {
                let rows = reading?;
                let _ = stop.send(());
                let counts = running.await.map_err(DrainError::Relay)?;
                Ok(DrainReport::new(rows, counts))
            }
            Err(_) => {
                let report = DrainReport::new(watch.reading().await?, metrics.counts());
                Err(DrainError::TimedOut { after: self.timeout, report: Box::new(report) })
            }
        }
    }
}

/// What the drain reads to tell whether the relay is done.
struct Watch {
    pool: PgPool,
    relayed: Relayed,
    since: chrono::DateTime<chrono::Utc>,
    horizon: Duration,
}

impl Watch {
    /// Reads until no row is due; returns that reading.
    async fn until_settled(&self) -> Result<Vec<DrainRow>, DrainError> {
        loop {
            let rows = self.reading().await?;
            if !rows.iter().any(|row| row.due) {
                return Ok(rows);
            }
            tokio::time::sleep(WATCH_INTERVAL).await;
        }
    }

    async fn reading(&self) -> Result<Vec<DrainRow>, DrainError> {
        store::drain_reading(&self.pool, &self.relayed, self.since, self.horizon)
            .await
            .map_err(|error| DrainError::Database(error.into()))
    }
}

/// Why a [`drain`] did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    /// The builder does not build a relay.
    #[error("the relay does not build")]
    Build(#[from] BuildError),
    /// The relay stopped with an error (the outbox schema missing or outdated, a forwarding sink
    /// not ready).
    #[error("the relay stopped with an error")]
    Relay(#[source] Error),
    /// The drain could not read the outbox to see what is left.
    #[error("cannot read what the relay has left to deliver")]
    Database(#[source] Error),
    /// Events were still due when the timeout passed: a handler that hangs, a horizon longer
    /// than the timeout, rows leased by a relay that died (until their leases expire).
    #[error("{}", timed_out(*after, report))]
    TimedOut {
        /// The drain's timeout.
        after: Duration,
        /// What happened until then; the events still due have [`Outcome::Due`].
        report: Box<DrainReport>,
    },
}

/// `drain timed out after 30s with 2 events still due: ...`, listing the first few.
fn timed_out(after: Duration, report: &DrainReport) -> String {
    let due: Vec<_> = report.with_outcome(Outcome::Due).collect();
    let mut message =
        format!("drain timed out after {after:?} with {} events still due", due.len());
    for (n, event) in due.iter().take(LISTED).enumerate() {
        let _ = write!(message, "{} {event}", if n == 0 { ":" } else { ";" });
    }
    if due.len() > LISTED {
        let _ = write!(message, "; and {} more", due.len() - LISTED);
    }
    message
}
