//! The relay's entry in `outbox.relays` (see `crate::relays`): written at start, refreshed by a
//! heartbeat with the rows it holds and the events it delivered, removed when it stops. It is for
//! operators: failing to write it is logged and never stops the relay. PostgreSQL's alone so far:
//! on the other databases a relay keeps no entry.

use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::error::{Error, ErrorChain};
use crate::relay::held::HeldRows;
use crate::relay::metrics::RelayMetrics;
use crate::relays::{FORGET_AFTER, HEARTBEAT_INTERVAL};
use crate::store::{self, Db, RelayEntry};

/// What a relay says of itself, decided when it was built.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    pub(crate) lease_mode: &'static str,
    pub(crate) handles: Vec<String>,
    pub(crate) forwards: Option<Vec<String>>,
}

/// Keeps the relay's entry until `stop` fires or is dropped, then removes it.
pub(crate) async fn keep_registered(
    db: Db,
    registration: Registration,
    held: HeldRows,
    metrics: RelayMetrics,
    mut stop: oneshot::Receiver<()>,
) {
    let Some(pool) = db.postgres().cloned() else {
        let _ = stop.await;
        return;
    };
    let entry = RelayEntry {
        relay_id: Uuid::new_v4(),
        host: gethostname::gethostname().to_string_lossy().into_owned(),
        pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        version: env!("CARGO_PKG_VERSION"),
        lease_mode: registration.lease_mode,
        handles: registration.handles,
        forwards: registration.forwards,
    };
    if let Err(error) = store::forget_silent(&pool, FORGET_AFTER).await {
        warn(&error.into(), "cannot remove the entries of relays silent for a day");
    }
    let mut beats = tokio::time::interval(HEARTBEAT_INTERVAL);
    let mut activity = Activity::default();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = beats.tick() => {
                let delivered = metrics.counts().delivered;
                if let Err(error) = store::heartbeat(&pool, &entry, held.get(), delivered).await {
                    warn(&error.into(), "cannot write its heartbeat to outbox.relays");
                }
                activity.record(&pool, delivered).await;
            }
        }
    }
    activity.flush(&pool, metrics.counts().delivered).await;
    if let Err(error) = store::withdraw(&pool, entry.relay_id).await {
        warn(&error.into(), "cannot remove its entry from outbox.relays");
    }
}

/// The relay's part of `outbox.activity`: what it recorded so far.
#[derive(Default)]
struct Activity {
    /// Deliveries already added.
    recorded: u64,
    /// The minute (Unix minutes, local clock) of the last write: an idle relay writes once a
    /// minute, in case the minute still lacks its reading.
    minute: Option<u64>,
    /// The last write failed (warned once per run of failures: a missing grant would fail
    /// every heartbeat).
    failing: bool,
}

impl Activity {
    async fn record(&mut self, pool: &PgPool, delivered: u64) {
        let minute = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs() / 60);
        if delivered == self.recorded && self.minute == Some(minute) {
            return;
        }
        match self.write(pool, delivered).await {
            Ok(()) => (self.minute, self.failing) = (Some(minute), false),
            Err(error) if !self.failing => {
                self.failing = true;
                tracing::warn!(
                    error = %ErrorChain(&error),
                    "outbox relay cannot record its activity in outbox.activity; delivery goes \
                     on, and the console's charts miss what this relay delivers until it can (if \
                     permission is denied, grant the relay's role SELECT, INSERT, UPDATE, DELETE \
                     on outbox.activity: docs/least-privilege.sql)"
                );
            }
            Err(_) => {}
        }
    }

    /// At a graceful stop: adds the deliveries since the last heartbeat, and takes no reading
    /// (the next relay's heartbeat does), so the stop is not held up by a count.
    async fn flush(&mut self, pool: &PgPool, delivered: u64) {
        if delivered > self.recorded && !self.failing {
            if let Err(error) = store::add_delivered(pool, delivered - self.recorded).await {
                let error = Error::from(error);
                tracing::warn!(
                    error = %ErrorChain(&error),
                    "outbox relay cannot add its last deliveries to outbox.activity as it stops; \
                     the console's charts miss them, nothing else"
                );
            }
        }
    }

    /// Adds the deliveries since the last write to the minute's row (counted as recorded once
    /// added, so a failed reading adds nothing twice), and takes the minute's reading if no
    /// relay has.
    async fn write(&mut self, pool: &PgPool, delivered: u64) -> Result<(), Error> {
        let reading_due = store::add_delivered(pool, delivered - self.recorded).await?;
        self.recorded = delivered;
        if reading_due {
            let stats = crate::stats(pool).await?;
            let age = stats.oldest_pending_age.map(|age| age.as_secs_f64());
            store::record_reading(pool, stats.pending, stats.dead, age).await?;
        }
        Ok(())
    }
}

fn warn(error: &Error, what: &str) {
    tracing::warn!(
        error = %ErrorChain(error),
        "outbox relay {what}; delivery goes on, and `outbox status` shows the relay as silent \
         until a heartbeat succeeds (if permission is denied, grant the relay's role SELECT, \
         INSERT, UPDATE, DELETE on outbox.relays: docs/least-privilege.sql)"
    );
}
