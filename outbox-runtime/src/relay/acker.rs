//! Acknowledgements: outcomes of deliveries, applied in batches with one statement per kind.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::mpsc::UnboundedReceiver;
use uuid::Uuid;

use crate::relay::config::Backoff;
use crate::relay::held::{self, Held};
use crate::relay::metrics::RelayMetrics;
use crate::store::{self, Failures, LeasedEvent};

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
    pub(crate) event_type: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) outcome: Outcome,
}

impl Ack {
    pub(crate) fn new(row: &LeasedEvent, outcome: Outcome) -> Self {
        Ack {
            event_id: row.event_id,
            token: row.lease_token,
            event_type: row.event_type.clone(),
            created_at: row.created_at,
            outcome,
        }
    }
}

/// Most acknowledgements applied in one statement.
const MAX_BATCH: usize = 1_000;
/// How long the first acknowledgement of a batch waits for others to join it.
const ACK_LINGER: std::time::Duration = std::time::Duration::from_millis(5);

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
    ///
    /// It also renews the leases of held rows, every third of the lease timeout: between its
    /// own writes, because acknowledgements and renewals lock overlapping rows, and two
    /// statements locking them in different orders from two connections would deadlock.
    pub(crate) async fn run(self, mut acks: UnboundedReceiver<Ack>) {
        let mut renewals = tokio::time::interval(self.lease_timeout / 3);
        renewals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        renewals.tick().await;
        let mut batch = Vec::new();
        loop {
            let first = tokio::select! {
                biased;
                _ = renewals.tick() => {
                    held::renew_leases(&self.pool, &self.held, self.lease_timeout).await;
                    continue;
                }
                received = acks.recv() => match received {
                    Some(ack) => ack,
                    None => break,
                },
            };
            batch.push(first);
            // Gather what finishes in the next few milliseconds too: one statement for a
            // hundred rows costs about what one costs for a single row.
            let until = tokio::time::Instant::now() + ACK_LINGER;
            while batch.len() < MAX_BATCH {
                match tokio::time::timeout_at(until, acks.recv()).await {
                    Ok(Some(ack)) => batch.push(ack),
                    Ok(None) | Err(_) => break,
                }
            }
            // Settled rows are no longer renewed, and are acknowledged under the lease their
            // delivery answers for (see `Held::settle`).
            for ack in &mut batch {
                ack.token = self.held.settle(ack.event_id, ack.token);
            }
            self.apply(&batch).await;
            batch.clear();
        }
    }

    async fn apply(&self, batch: &[Ack]) {
        let of =
            |wanted: fn(&Outcome) -> bool| batch.iter().filter(move |ack| wanted(&ack.outcome));
        for ack in of(|o| matches!(o, Outcome::Published)) {
            self.metrics.delivered(&ack.event_type, ack.created_at);
        }
        self.count_lost(of(|o| matches!(o, Outcome::LeaseLost)).count(), "published");

        let delivered: Vec<&Ack> = of(|o| matches!(o, Outcome::Delivered)).collect();
        if !delivered.is_empty() {
            let (ids, tokens) = columns(&delivered);
            let pool = &self.pool;
            let publish = || store::publish(pool, &ids, &tokens);
            if let Some(done) = retrying("publish", self.lease_timeout, publish).await {
                let done: HashSet<Uuid> = done.into_iter().collect();
                for ack in delivered.iter().filter(|ack| done.contains(&ack.event_id)) {
                    self.metrics.delivered(&ack.event_type, ack.created_at);
                }
                self.count_lost(delivered.len() - done.len(), "published");
            }
        }

        let failed: Vec<&Ack> = of(|o| matches!(o, Outcome::Failed { .. })).collect();
        if !failed.is_empty() {
            let mut failures = Failures::default();
            for ack in &failed {
                if let Outcome::Failed { error, earlier_failures } = &ack.outcome {
                    let retry_in = self.backoff.delay(earlier_failures + 1);
                    failures.push(ack.event_id, ack.token, error.clone(), retry_in);
                }
            }
            let (pool, max) = (&self.pool, self.max_attempts);
            let record = || store::fail(pool, &failures, max);
            if let Some(done) = retrying("record failures", self.lease_timeout, record).await {
                let dead: HashSet<Uuid> =
                    done.iter().filter(|f| f.dead).map(|f| f.event_id).collect();
                let recorded: HashSet<Uuid> = done.iter().map(|f| f.event_id).collect();
                for ack in failed.iter().filter(|ack| recorded.contains(&ack.event_id)) {
                    self.metrics.failed(&ack.event_type, dead.contains(&ack.event_id));
                }
                if !dead.is_empty() {
                    tracing::warn!(
                        ?dead,
                        "outbox events exhausted their attempts and are now dead"
                    );
                }
                self.count_lost(failed.len() - recorded.len(), "failed");
            }
        }

        let released: Vec<&Ack> = of(|o| matches!(o, Outcome::Released)).collect();
        if !released.is_empty() {
            let (ids, tokens) = columns(&released);
            let pool = &self.pool;
            let release = || store::release(pool, &ids, &tokens);
            if let Some(done) = retrying("release", self.lease_timeout, release).await {
                self.metrics.released(done);
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
            self.metrics.lost_leases(lost as u64);
        }
    }
}

/// `(event ids, tokens)` of some acknowledgements, for one statement.
fn columns(acks: &[&Ack]) -> (Vec<Uuid>, Vec<Uuid>) {
    acks.iter().map(|ack| (ack.event_id, ack.token)).unzip()
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
