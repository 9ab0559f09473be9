//! Acknowledgements: outcomes of deliveries, applied in batches with one statement per kind.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc::UnboundedReceiver;
use uuid::Uuid;

use crate::relay::config::Backoff;
use crate::relay::metrics::RelayMetrics;
use crate::store::{self, Failures};

/// How a delivery ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    Delivered,
    Failed {
        error: String,
        earlier_failures: u32,
    },
    /// Not delivered and not the row's fault: hand it back without counting an attempt.
    Released,
}

/// The outcome of one leased row, fenced by the lease's token.
#[derive(Debug)]
pub(crate) struct Ack {
    pub(crate) event_id: Uuid,
    pub(crate) token: Uuid,
    pub(crate) outcome: Outcome,
}

/// Most acknowledgements applied in one statement.
const MAX_BATCH: usize = 1_000;

/// Rows this relay holds a lease on, from lease to acknowledgement; their leases are renewed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Held(Arc<Mutex<HashMap<Uuid, Uuid>>>);

impl Held {
    pub(crate) fn insert(&self, event_id: Uuid, token: Uuid) {
        self.lock().insert(event_id, token);
    }

    fn remove(&self, acks: &[Ack]) {
        let mut held = self.lock();
        for ack in acks {
            held.remove(&ack.event_id);
        }
    }

    /// `(event ids, tokens)` of every held row.
    fn columns(&self) -> (Vec<Uuid>, Vec<Uuid>) {
        self.lock().iter().map(|(id, token)| (*id, *token)).unzip()
    }

    fn count_where(&self, predicate: impl Fn(&Uuid) -> bool) -> usize {
        self.lock().keys().filter(|id| predicate(id)).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Uuid>> {
        // The map stays consistent even if a holder panicked: every operation is one call.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(crate) struct Acker {
    pub(crate) pool: PgPool,
    pub(crate) held: Held,
    pub(crate) metrics: RelayMetrics,
    pub(crate) backoff: Backoff,
    pub(crate) max_attempts: i32,
    /// How long to keep retrying a failed acknowledgement: after that the leases have expired
    /// and the rows are delivered again anyway.
    pub(crate) lease_timeout: Duration,
}

impl Acker {
    /// Applies acknowledgements until every sender is gone and the channel is drained. While a
    /// batch is being written the next one gathers, so batches grow with the load.
    pub(crate) async fn run(self, mut acks: UnboundedReceiver<Ack>) {
        let mut batch = Vec::new();
        while let Some(first) = acks.recv().await {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match acks.try_recv() {
                    Ok(ack) => batch.push(ack),
                    Err(_) => break,
                }
            }
            self.apply(&batch).await;
            self.held.remove(&batch);
            batch.clear();
        }
    }

    async fn apply(&self, batch: &[Ack]) {
        let (mut published, mut released) = (Columns::default(), Columns::default());
        let mut failures = Failures::default();
        for ack in batch {
            match &ack.outcome {
                Outcome::Delivered => published.push(ack),
                Outcome::Released => released.push(ack),
                Outcome::Failed { error, earlier_failures } => failures.push(
                    ack.event_id,
                    ack.token,
                    error.clone(),
                    self.backoff.delay(*earlier_failures),
                ),
            }
        }

        if !published.ids.is_empty() {
            let pool = &self.pool;
            if let Some(done) = retrying("publish", self.lease_timeout, || {
                store::publish(pool, &published.ids, &published.tokens)
            })
            .await
            {
                self.metrics.add_delivered(done.len());
                self.count_lost(published.ids.len() - done.len(), "published");
            }
        }
        if !failures.event_ids.is_empty() {
            let (pool, max) = (&self.pool, self.max_attempts);
            if let Some(done) = retrying("record failures", self.lease_timeout, || {
                store::fail(pool, &failures, max)
            })
            .await
            {
                self.metrics.add_failed(done.len());
                let dead: Vec<Uuid> = done.iter().filter(|f| f.dead).map(|f| f.event_id).collect();
                if !dead.is_empty() {
                    tracing::warn!(
                        ?dead,
                        "outbox events exhausted their attempts and are now dead"
                    );
                    self.metrics.add_dead(dead.len());
                }
                self.count_lost(failures.event_ids.len() - done.len(), "failed");
            }
        }
        if !released.ids.is_empty() {
            let pool = &self.pool;
            if let Some(done) = retrying("release", self.lease_timeout, || {
                store::release(pool, &released.ids, &released.tokens)
            })
            .await
            {
                self.metrics.add_released(done as usize);
            }
        }
    }

    fn count_lost(&self, lost: usize, outcome: &str) {
        if lost > 0 {
            tracing::warn!(
                lost,
                outcome,
                "outbox acknowledgements refused: the lease expired and another relay took the rows"
            );
            self.metrics.add_lost_leases(lost);
        }
    }
}

/// Keeps the leases of held rows alive while their handlers run or wait to start.
pub(crate) async fn renew_leases(pool: PgPool, held: Held, lease_timeout: Duration) {
    let mut every = tokio::time::interval(lease_timeout / 3);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let (ids, tokens) = held.columns();
        if ids.is_empty() {
            continue;
        }
        match store::renew(&pool, &ids, &tokens, lease_timeout).await {
            Ok(renewed) => {
                // Rows acknowledged since the snapshot are not renewed, and not lost either.
                let renewed: HashSet<Uuid> = renewed.into_iter().collect();
                let lost = held.count_where(|id| !renewed.contains(id));
                if lost > 0 {
                    tracing::warn!(
                        lost,
                        "outbox leases expired before renewal: another relay may deliver those rows too"
                    );
                }
            }
            Err(error) => tracing::warn!(%error, "cannot renew outbox leases"),
        }
    }
}

#[derive(Default)]
struct Columns {
    ids: Vec<Uuid>,
    tokens: Vec<Uuid>,
}

impl Columns {
    fn push(&mut self, ack: &Ack) {
        self.ids.push(ack.event_id);
        self.tokens.push(ack.token);
    }
}

/// Runs an acknowledgement statement, retrying database errors for up to `patience`. Giving up
/// loses no event: the rows' leases expire and they are delivered again.
async fn retrying<T, F, Fut>(what: &str, patience: Duration, mut statement: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let started = tokio::time::Instant::now();
    let mut delay = Duration::from_millis(50);
    loop {
        match statement().await {
            Ok(done) => return Some(done),
            Err(error) if started.elapsed() + delay < patience => {
                tracing::warn!(%error, retry_in = ?delay, "outbox acknowledgement ({what}) failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(error) => {
                tracing::error!(%error, "outbox acknowledgement ({what}) failed; the rows will be redelivered");
                return None;
            }
        }
    }
}
