//! Acknowledgements: outcomes of deliveries, applied in batches with one statement per kind.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::mpsc::UnboundedReceiver;
use uuid::Uuid;

use crate::relay::config::Backoff;
use crate::relay::held::Held;
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
    /// Delivered and published by the handler's own transaction: only counted here.
    Published,
    /// A transactional handler's acknowledgement was refused: the lease was taken over.
    LeaseLost,
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
            // Acknowledge under the current token: if this relay re-leased a row it was
            // already delivering, the delivery under way answers for the new lease.
            for ack in &mut batch {
                ack.token = self.held.token(ack.event_id).unwrap_or(ack.token);
            }
            self.apply(&batch).await;
            self.held.forget(batch.drain(..).map(|ack| ack.event_id));
        }
    }

    async fn apply(&self, batch: &[Ack]) {
        let (mut published, mut released) = (Columns::default(), Columns::default());
        let mut failures = Failures::default();
        for ack in batch {
            match &ack.outcome {
                Outcome::Published => self.metrics.add_delivered(1),
                Outcome::LeaseLost => self.count_lost(1, "published"),
                Outcome::Delivered => published.push(ack),
                Outcome::Released => released.push(ack),
                Outcome::Failed { error, earlier_failures } => failures.push(
                    ack.event_id,
                    ack.token,
                    error.clone(),
                    self.backoff.delay(earlier_failures + 1),
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
