//! What a relay did: counters readable while it runs, a health signal, and (with the
//! `metrics` feature, on by default) the same figures through the `metrics` facade.
//!
//! Facade names, all labelled by `event_type` (and by `subscriber` for the deliveries of a
//! [subscriber](crate::RelayBuilder::subscriber)): counters `outbox_delivered_total`,
//! `outbox_failed_total`, `outbox_retried_total`, `outbox_dead_total`, `outbox_rejected_total`
//! (failures a handler [rejected](crate::Reject), dead at once), `outbox_snoozed_total`
//! ([snoozes](crate::Snooze), not failures); histograms
//! `outbox_handler_duration_seconds` and `outbox_delivery_latency_seconds` (from `created_at`
//! to the acknowledgement); gauges, unlabelled, `outbox_pending`, `outbox_dead`,
//! `outbox_oldest_pending_age_seconds` and `outbox_pending_newer_version` (rows of a handled
//! type written at a newer version than the relay reads) and `outbox_paused_types` (event types
//! [paused](crate::pauses)), refreshed every 15 s by a running relay; and
//! `outbox_sink_available` (1 or 0) on a forwarding relay.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

#[cfg(feature = "metrics")]
use crate::error::ErrorChain;
use crate::forward::{SinkHealth, SinkStatus};

/// A live view of a relay's counters and health; get it with
/// [`Relay::metrics`](crate::Relay::metrics) before running the relay.
#[derive(Debug, Clone)]
pub struct RelayMetrics(Arc<Counters>);

#[derive(Debug)]
struct Counters {
    /// Owned by the relay; read here.
    sink: Option<Arc<SinkHealth>>,
    delivered: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    rejected: AtomicU64,
    snoozed: AtomicU64,
    handed_back: AtomicU64,
    lost_leases: AtomicU64,
    running: AtomicBool,
    /// Milliseconds after `epoch` of the last statement that reached the database.
    last_contact: AtomicU64,
    epoch: Instant,
}

impl RelayMetrics {
    /// The metrics of a relay; `sink`: the state of the sink it forwards to, if any.
    pub(crate) fn new(sink: Option<Arc<SinkHealth>>) -> Self {
        Self(Arc::new(Counters {
            sink,
            delivered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dead: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            snoozed: AtomicU64::new(0),
            handed_back: AtomicU64::new(0),
            lost_leases: AtomicU64::new(0),
            running: AtomicBool::new(false),
            last_contact: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        }))
    }
}

/// What a relay has done since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayCounts {
    /// Events delivered (their handler returned `Ok`, or the broker confirmed the forwarded
    /// message) and published.
    pub delivered: u64,
    /// Failed deliveries recorded (handler error, panic, timeout, undecodable payload, unknown
    /// event type, a message the broker refused); the dead ones included.
    pub failed: u64,
    /// Rows this relay marked dead: their attempts or expired leases ran out, or their
    /// handler rejected them.
    pub dead: u64,
    /// Failed deliveries whose handler [rejected](crate::Reject) the event, which made it dead
    /// at once (counted in `failed` and `dead` too).
    pub rejected: u64,
    /// Deliveries whose handler [snoozed](crate::Snooze): handed back for later, no attempt
    /// counted.
    pub snoozed: u64,
    /// Leased rows handed back with no attempt counted: unstarted or cancelled at shutdown, or
    /// not delivered because the sink or the database was unavailable.
    pub handed_back: u64,
    /// Acknowledgements refused because the lease had expired and another relay took the row.
    pub lost_leases: u64,
}

impl RelayMetrics {
    /// The counts so far.
    pub fn counts(&self) -> RelayCounts {
        let c = &self.0;
        RelayCounts {
            delivered: c.delivered.load(Relaxed),
            failed: c.failed.load(Relaxed),
            dead: c.dead.load(Relaxed),
            rejected: c.rejected.load(Relaxed),
            snoozed: c.snoozed.load(Relaxed),
            handed_back: c.handed_back.load(Relaxed),
            lost_leases: c.lost_leases.load(Relaxed),
        }
    }

    /// Whether the broker of a forwarding relay takes messages; `None` for a relay that does
    /// not forward. While it is [`SinkStatus::Unavailable`] forwarded events wait pending,
    /// with no attempt counted.
    pub fn sink_status(&self) -> Option<SinkStatus> {
        self.0.sink.as_ref().map(|sink| sink.status())
    }

    /// Whether the relay is running and reached the database within `max_silence`: the
    /// signal for a liveness or readiness probe. An idle relay still polls, so a healthy one
    /// reaches the database at least every poll interval.
    pub fn is_healthy(&self, max_silence: Duration) -> bool {
        self.0.running.load(Relaxed)
            && self.since_database_contact().is_some_and(|silence| silence <= max_silence)
    }

    /// How long ago the relay last reached the database; `None` if it never did.
    pub fn since_database_contact(&self) -> Option<Duration> {
        let millis = self.0.last_contact.load(Relaxed);
        (millis != u64::MAX).then(|| {
            let at = self.0.epoch + Duration::from_millis(millis);
            at.elapsed()
        })
    }

    pub(crate) fn set_running(&self, running: bool) {
        self.0.running.store(running, Relaxed);
    }

    pub(crate) fn database_reached(&self) {
        let millis = self.0.epoch.elapsed().as_millis().try_into().unwrap_or(u64::MAX - 1);
        self.0.last_contact.store(millis, Relaxed);
    }

    /// `subscriber`: empty for a type's own handler.
    pub(crate) fn delivered(&self, event_type: &str, subscriber: &str, created_at: DateTime<Utc>) {
        self.0.delivered.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        {
            let latency = (Utc::now() - created_at).to_std().unwrap_or_default();
            let labels = labels(event_type, subscriber);
            metrics::counter!("outbox_delivered_total", labels.clone()).increment(1);
            metrics::histogram!("outbox_delivery_latency_seconds", labels)
                .record(latency.as_secs_f64());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (event_type, subscriber, created_at);
    }

    pub(crate) fn failed(&self, event_type: &str, subscriber: &str, dead: bool, rejected: bool) {
        self.0.failed.fetch_add(1, Relaxed);
        if dead {
            self.0.dead.fetch_add(1, Relaxed);
        }
        if rejected {
            self.0.rejected.fetch_add(1, Relaxed);
        }
        #[cfg(feature = "metrics")]
        {
            let labels = labels(event_type, subscriber);
            metrics::counter!("outbox_failed_total", labels.clone()).increment(1);
            if rejected {
                metrics::counter!("outbox_rejected_total", labels.clone()).increment(1);
            }
            let outcome = if dead { "outbox_dead_total" } else { "outbox_retried_total" };
            metrics::counter!(outcome, labels).increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (event_type, subscriber);
    }

    pub(crate) fn snoozed(&self, event_type: &str, subscriber: &str) {
        self.0.snoozed.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!("outbox_snoozed_total", labels(event_type, subscriber)).increment(1);
        #[cfg(not(feature = "metrics"))]
        let _ = (event_type, subscriber);
    }

    /// A row whose lease expired on its last attempt.
    pub(crate) fn died_on_expiry(&self, event_type: &str) {
        self.0.dead.fetch_add(1, Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!("outbox_dead_total", "event_type" => event_type.to_owned()).increment(1);
        #[cfg(not(feature = "metrics"))]
        let _ = event_type;
    }

    pub(crate) fn handler_finished(&self, event_type: &str, took: Duration) {
        #[cfg(feature = "metrics")]
        metrics::histogram!("outbox_handler_duration_seconds", "event_type" => event_type.to_owned())
            .record(took.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = (event_type, took);
    }

    pub(crate) fn handed_back(&self, n: u64) {
        self.0.handed_back.fetch_add(n, Relaxed);
    }

    pub(crate) fn lost_leases(&self, n: u64) {
        self.0.lost_leases.fetch_add(n, Relaxed);
    }
}

/// A delivery's labels: its event type, and its subscriber if it has one (so the series of a type
/// with one handler keep the labels they always had).
#[cfg(feature = "metrics")]
fn labels(event_type: &str, subscriber: &str) -> Vec<metrics::Label> {
    let mut labels = vec![metrics::Label::new("event_type", event_type.to_owned())];
    if !subscriber.is_empty() {
        labels.push(metrics::Label::new("subscriber", subscriber.to_owned()));
    }
    labels
}

/// How often the table-wide gauges are refreshed, and how old a shared reading they take.
#[cfg(feature = "metrics")]
const GAUGE_REFRESH: Duration = Duration::from_secs(15);

/// Sets the table-wide gauges every [`GAUGE_REFRESH`] from the reading the relays of the
/// database share (one of them counts per interval: counting visits every pending row).
/// `newest_read` is the newest version this relay reads of each type it handles: pending rows of
/// a newer version wait for another relay, and are counted apart.
#[cfg(feature = "metrics")]
pub(crate) async fn refresh_gauges(
    pool: sqlx::PgPool,
    newest_read: std::collections::HashMap<(String, String), u32>,
) {
    let mut every = tokio::time::interval(GAUGE_REFRESH);
    loop {
        every.tick().await;
        match crate::stats::shared_stats_by_type(&pool, GAUGE_REFRESH).await {
            Ok(None) => {} // another relay is taking the reading
            Ok(Some(by_type)) => {
                let waiting: i64 = by_type
                    .iter()
                    .filter(|t| {
                        let key = (t.aggregate_type.clone(), t.event_type.clone());
                        newest_read.get(&key).is_some_and(|&newest| t.version > newest)
                    })
                    .map(|t| t.pending)
                    .sum();
                if waiting > 0 {
                    tracing::warn!(
                        waiting,
                        "outbox events of a newer version than this relay reads are waiting \
                         for a relay that reads them"
                    );
                }
                metrics::gauge!("outbox_pending_newer_version").set(waiting as f64);
                let stats = crate::OutboxStats::total(&by_type);
                metrics::gauge!("outbox_pending").set(stats.pending as f64);
                metrics::gauge!("outbox_dead").set(stats.dead as f64);
                let age = stats.oldest_pending_age.unwrap_or_default().as_secs_f64();
                metrics::gauge!("outbox_oldest_pending_age_seconds").set(age);
            }
            Err(error) => {
                tracing::warn!(
                    error = %ErrorChain(&error),
                    "cannot refresh the outbox gauges; they keep their last values until it \
                     succeeds (the relay's role reads and writes outbox.stats_reading: see \
                     docs/least-privilege.sql)"
                )
            }
        }
        match crate::pauses::paused(&pool).await {
            Ok(paused) => metrics::gauge!("outbox_paused_types").set(paused.len() as f64),
            Err(error) => tracing::warn!(
                error = %ErrorChain(&error),
                "cannot count the paused event types for the gauge outbox_paused_types; it keeps \
                 its last value (the relay's role reads outbox.paused_types: see \
                 docs/least-privilege.sql)"
            ),
        }
    }
}
