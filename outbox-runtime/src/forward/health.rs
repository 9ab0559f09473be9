//! Whether the relay's sink answers. A delivery that finds the broker unavailable marks the sink
//! down; from then on the relay leases nothing for it and hands back what it holds, with no
//! attempt counted, while [`probe`] checks the sink with backoff; once a check passes the sink is
//! up again and the relay is woken to lease. One log line per change, a gauge
//! (`outbox_sink_available`, 1 or 0) and [`RelayMetrics::sink_status`] show the state.
//!
//! [`RelayMetrics::sink_status`]: crate::RelayMetrics::sink_status

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{watch, Notify};

use crate::error::ErrorChain;
use crate::forward::{Sink, SinkError};

/// The first probe's delay after the sink went down; doubled after each failed probe.
const FIRST_PROBE: Duration = Duration::from_millis(250);
/// The longest delay between probes.
const MAX_PROBE_DELAY: Duration = Duration::from_secs(5);
/// Longest one probe may take before it counts as failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a forwarding relay's broker takes messages.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SinkStatus {
    /// The broker answers (or nothing went wrong yet).
    Available,
    /// The broker could not be reached or did not confirm: events wait, no attempt counted,
    /// and the relay checks the broker until it answers.
    Unavailable {
        /// What the sink reported, cause included.
        reason: String,
        /// Since when.
        since: DateTime<Utc>,
    },
}

/// The sink's state, owned by the relay and shared with its forwarding route and metrics.
#[derive(Debug)]
pub(crate) struct SinkHealth {
    status: watch::Sender<SinkStatus>,
}

impl SinkHealth {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(SinkHealth { status: watch::Sender::new(SinkStatus::Available) })
    }

    pub(crate) fn status(&self) -> SinkStatus {
        self.status.borrow().clone()
    }

    pub(crate) fn is_available(&self) -> bool {
        matches!(*self.status.borrow(), SinkStatus::Available)
    }

    /// A delivery found the broker unavailable.
    pub(crate) fn went_down(&self, error: &SinkError) {
        let changed = self.status.send_if_modified(|status| match status {
            SinkStatus::Available => {
                *status = SinkStatus::Unavailable { reason: error.to_string(), since: Utc::now() };
                true
            }
            SinkStatus::Unavailable { .. } => false,
        });
        if changed {
            tracing::warn!(
                error = %ErrorChain(error),
                "outbox sink unavailable: forwarding paused, events wait with no attempt counted; \
                 checking the broker until it answers"
            );
            gauge(false);
        }
    }

    /// A probe failed: the status shows its reason, the freshest.
    fn still_down(&self, why: String) {
        tracing::debug!(%why, "outbox sink still unavailable");
        self.status.send_modify(|status| {
            if let SinkStatus::Unavailable { reason, .. } = status {
                *reason = why;
            }
        });
    }

    fn came_back(&self) {
        let was = self.status.send_replace(SinkStatus::Available);
        if let SinkStatus::Unavailable { since, .. } = was {
            let down_for = (Utc::now() - since).to_std().unwrap_or_default();
            tracing::warn!(?down_for, "outbox sink available again: forwarding resumed");
            gauge(true);
        }
    }

    /// Resolves once the sink is available.
    pub(crate) async fn available(&self) {
        let mut status = self.status.subscribe();
        let _ = status.wait_for(|status| matches!(status, SinkStatus::Available)).await;
    }

    async fn unavailable(&self) {
        let mut status = self.status.subscribe();
        let _ = status.wait_for(|status| matches!(status, SinkStatus::Unavailable { .. })).await;
    }
}

fn gauge(available: bool) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("outbox_sink_available").set(if available { 1.0 } else { 0.0 });
    #[cfg(not(feature = "metrics"))]
    let _ = available;
}

/// Runs until cancelled: whenever the sink is down, checks it with backoff until it answers,
/// then marks it up and wakes the relay.
pub(crate) async fn probe(sink: Arc<dyn Sink>, health: Arc<SinkHealth>, wake: Arc<Notify>) {
    gauge(true);
    loop {
        health.unavailable().await;
        let mut delay = FIRST_PROBE;
        loop {
            tokio::time::sleep(delay).await;
            match tokio::time::timeout(PROBE_TIMEOUT, sink.check()).await {
                Ok(Ok(())) => break,
                Ok(Err(error)) => health.still_down(ErrorChain(&error).to_string()),
                Err(_) => {
                    health.still_down(format!("the check got no answer in {PROBE_TIMEOUT:?}"))
                }
            }
            delay = (delay * 2).min(MAX_PROBE_DELAY);
        }
        health.came_back();
        wake.notify_one();
    }
}
