//! Acknowledgements: outcomes of deliveries, written in batches with one statement per kind.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::ErrorChain;
use crate::relay::config::RelayConfig;
use crate::relay::fan_out::Took;
use crate::relay::held::Held;
use crate::relay::metrics::RelayMetrics;
use crate::store::{self, Copy, Db, Failures, FanOuts, Snoozes};

/// How a delivery ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    Delivered,
    Failed(Failed),
    /// Not delivered and not the row's fault: hand it back without counting an attempt.
    HandedBack,
    /// The handler asked to be called again after `delay`: hand it back for then, without
    /// counting an attempt.
    Snoozed {
        delay: Duration,
    },
    /// Delivered and published by the handler's own transaction: only counted here.
    Published,
    /// A transactional handler's acknowledgement was refused: the lease was taken over.
    LeaseLost,
    /// Delivered to the relay's subscribers of its type: how it ended for each one.
    FannedOut(Vec<(Arc<str>, Took)>),
}

/// A failed delivery, as its row records it.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: String,
    /// When the row is due again, if it lives.
    pub(crate) retry_in: Duration,
    /// Failed deliveries after which its handler's rows are dead.
    pub(crate) max_attempts: u32,
    /// The handler rejected the event: dead now, whatever its attempts.
    pub(crate) rejected: bool,
}

/// The outcome of one held row. It is written under the row's current lease token, which
/// [`Held`] keeps.
#[derive(Debug)]
pub(crate) struct Ack {
    pub(crate) event_id: Uuid,
    pub(crate) event_type: String,
    /// The subscriber of a copy; empty for an event as emitted.
    pub(crate) subscriber: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) outcome: Outcome,
}

/// Most acknowledgements applied in one statement.
const MAX_BATCH: usize = 1_000;
/// How long the first acknowledgement of a batch waits for others to join it.
const ACK_LINGER: Duration = Duration::from_millis(5);
/// How soon an acknowledgement of a row someone else had locked is tried again.
const BUSY_RETRY: Duration = Duration::from_millis(100);

pub(crate) struct Acker {
    pub(crate) pool: Db,
    pub(crate) held: Held,
    pub(crate) metrics: RelayMetrics,
    /// Whether a delivered row is marked published or deleted; and the lease timeout, how long
    /// to keep retrying a failed acknowledgement (after that the leases have expired and the
    /// rows are delivered again anyway).
    pub(crate) config: Arc<RelayConfig>,
}

impl Acker {
    /// Applies acknowledgements until every sender is gone and the channel is drained. While a
    /// batch is being written the next one gathers, so batches grow with the load.
    pub(crate) async fn run(self, mut acks: UnboundedReceiver<Ack>) {
        // Acknowledgements of rows someone else had locked, to try again.
        let mut busy: Vec<Ack> = Vec::new();
        let mut retry_at = Instant::now();
        loop {
            let first = tokio::select! {
                biased;
                () = tokio::time::sleep_until(retry_at), if !busy.is_empty() => None,
                received = acks.recv() => match received {
                    Some(ack) => Some(ack),
                    None => break,
                },
            };
            let mut batch = std::mem::take(&mut busy);
            if let Some(first) = first {
                batch.push(first);
                // Gather what finishes in the next few milliseconds too: one statement for a
                // hundred rows costs about what one costs for a single row.
                let until = Instant::now() + ACK_LINGER;
                while batch.len() < MAX_BATCH {
                    match tokio::time::timeout_at(until, acks.recv()).await {
                        Ok(Some(ack)) => batch.push(ack),
                        Ok(None) | Err(_) => break,
                    }
                }
            }
            busy = self.apply(batch).await;
            retry_at = Instant::now() + BUSY_RETRY;
        }
        // Shutting down: rows locked by someone else get until their leases run out.
        let patience = Instant::now() + self.config.lease_timeout;
        while !busy.is_empty() && Instant::now() < patience {
            tokio::time::sleep(BUSY_RETRY).await;
            busy = self.apply(busy).await;
        }
        self.held.settle(busy.iter().map(|ack| ack.event_id));
    }

    /// Writes a batch of outcomes; returns those of rows someone else had locked.
    async fn apply(&self, batch: Vec<Ack>) -> Vec<Ack> {
        let mut delivered = Vec::new();
        let mut failed = Vec::new();
        let mut handed_back = Vec::new();
        let mut snoozed = Vec::new();
        let mut fanned_out = Vec::new();
        let mut settled = Vec::new();
        for ack in batch {
            match ack.outcome {
                Outcome::Delivered => delivered.push(ack),
                Outcome::Failed(_) => failed.push(ack),
                Outcome::HandedBack => handed_back.push(ack),
                Outcome::Snoozed { .. } => snoozed.push(ack),
                Outcome::FannedOut(_) => fanned_out.push(ack),
                Outcome::Published => {
                    self.metrics.delivered(&ack.event_type, &ack.subscriber, ack.created_at);
                    settled.push(ack.event_id);
                }
                Outcome::LeaseLost => {
                    self.count_lost(1, "published");
                    settled.push(ack.event_id);
                }
            }
        }
        self.held.settle(settled);

        let mut busy = HashSet::new();
        let (pool, on_publish) = (&self.pool, self.config.on_publish);
        let written = self
            .write("publish", &delivered, |held| async move {
                let (ids, tokens) = columns(&held);
                let done = pool.publish(&ids, &tokens, on_publish).await?;
                Ok(done.into_iter().map(|id| (id, false)).collect())
            })
            .await;
        for ack in written.done {
            self.metrics.delivered(&ack.event_type, &ack.subscriber, ack.created_at);
        }
        busy.extend(written.busy);

        let written = self
            .write("record failures", &failed, |held| async move {
                let mut failures = Failures::default();
                for (ack, token) in held {
                    if let Outcome::Failed(failed) = &ack.outcome {
                        // A rejected row dies at any count of attempts.
                        let max_attempts = if failed.rejected { 0 } else { failed.max_attempts };
                        let error = failed.error.clone();
                        failures.push(ack.event_id, token, error, failed.retry_in, max_attempts);
                    }
                }
                pool.fail(&failures).await
            })
            .await;
        for ack in &written.done {
            let rejected = matches!(&ack.outcome, Outcome::Failed(failed) if failed.rejected);
            let dead = written.dead.contains(&ack.event_id);
            self.metrics.failed(&ack.event_type, &ack.subscriber, dead, rejected);
        }
        if !written.dead.is_empty() {
            let dead = &written.dead;
            tracing::warn!(?dead, "outbox events exhausted their attempts and are now dead");
        }
        busy.extend(written.busy);

        let written = self
            .write("hand back", &handed_back, |held| async move {
                let (ids, tokens) = columns(&held);
                let done = pool.release(&ids, &tokens).await?;
                Ok(done.into_iter().map(|id| (id, false)).collect())
            })
            .await;
        self.metrics.handed_back(written.done.len() as u64);
        busy.extend(written.busy);

        let written = self
            .write("snooze", &snoozed, |held| async move {
                let mut snoozes = Snoozes::default();
                for (ack, token) in held {
                    if let Outcome::Snoozed { delay } = ack.outcome {
                        snoozes.push(ack.event_id, token, delay);
                    }
                }
                let done = pool.snooze(&snoozes).await?;
                Ok(done.into_iter().map(|id| (id, false)).collect())
            })
            .await;
        for ack in &written.done {
            self.metrics.snoozed(&ack.event_type, &ack.subscriber);
        }
        busy.extend(written.busy);

        let written = self
            .write("fan out", &fanned_out, |held| async move {
                let mut fan_outs = FanOuts::default();
                for (ack, token) in held {
                    if let Outcome::FannedOut(took) = &ack.outcome {
                        fan_outs.push(ack.event_id, token, took.iter().map(copy));
                    }
                }
                // `build` refuses subscribers on the other databases.
                let Some(pool) = pool.postgres() else {
                    return Err(sqlx::Error::Configuration("subscribers need PostgreSQL".into()));
                };
                let done = store::fan_out(pool, &fan_outs, on_publish).await?;
                Ok(done.into_iter().map(|id| (id, false)).collect())
            })
            .await;
        for ack in &written.done {
            self.count_fanned_out(ack);
        }
        busy.extend(written.busy);
        delivered
            .into_iter()
            .chain(failed)
            .chain(handed_back)
            .chain(snoozed)
            .chain(fanned_out)
            .filter(|ack| busy.contains(&ack.event_id))
            .collect()
    }

    /// Writes one kind of outcome with `statement` (given the acknowledgements with the rows'
    /// current tokens, it returns the ids it wrote, each with whether the row died). Rows it did not write are either
    /// locked by someone else (busy: tried again soon) or no longer held under this lease
    /// (lost: another relay took them over). Every row but the busy ones is settled.
    async fn write<'a, F, Fut>(&self, what: &str, acks: &'a [Ack], statement: F) -> Written<'a>
    where
        F: Fn(Vec<(&'a Ack, Uuid)>) -> Fut,
        Fut: Future<Output = Result<Vec<(Uuid, bool)>, sqlx::Error>>,
    {
        let mut written = Written::default();
        if acks.is_empty() {
            return written;
        }
        let held: Vec<(&Ack, Uuid)> =
            acks.iter().filter_map(|ack| Some((ack, self.held.token(ack.event_id)?))).collect();
        let (ids, tokens) = columns(&held);
        let write = || statement(held.clone());
        let Some(done) = retrying(what, self.config.lease_timeout, write).await else {
            self.held.settle(ids); // the leases expire and the rows are delivered again
            return written;
        };
        written.dead = done.iter().filter(|(_, dead)| *dead).map(|(id, _)| *id).collect();
        let done: HashSet<Uuid> = done.into_iter().map(|(id, _)| id).collect();
        let (missing_ids, missing_tokens): (Vec<Uuid>, Vec<Uuid>) =
            ids.iter().zip(&tokens).filter(|(id, _)| !done.contains(id)).unzip();
        let mut still_leased: HashSet<Uuid> = if missing_ids.is_empty() {
            HashSet::new()
        } else {
            let check = || self.pool.still_leased(&missing_ids, &missing_tokens);
            retrying("check leases", self.config.lease_timeout, check)
                .await
                .unwrap_or_default()
                .into_iter()
                .collect()
        };
        // Rows this relay leased again meanwhile (their old lease had expired) are still ours,
        // under the new token: recorded already (the token changed), or about to be (a lease
        // statement is under way). Tried again, under the token then recorded.
        let leasing = self.held.is_leasing();
        still_leased.extend(missing_ids.iter().zip(&missing_tokens).filter_map(|(id, token)| {
            let leased_again = leasing || self.held.token(*id).is_some_and(|now| now != *token);
            leased_again.then_some(*id)
        }));
        let lost = missing_ids.len() - still_leased.len();
        self.count_lost(lost, what);
        let settled =
            ids.iter().copied().filter(|id| !still_leased.contains(id) && !done.contains(id));
        self.held.settle(settled);
        let written_under = ids.iter().zip(&tokens).filter(|(id, _)| done.contains(id));
        let leased_again = self.held.settle_written(written_under.map(|(id, token)| (*id, *token)));
        if !leased_again.is_empty() {
            let (ids, tokens): (Vec<Uuid>, Vec<Uuid>) = leased_again.into_iter().unzip();
            let release = || self.pool.release(&ids, &tokens);
            // Not handed back: the new lease expires and the row is delivered then.
            let _ = retrying("hand back", self.config.lease_timeout, release).await;
        }
        for (ack, _) in held {
            if done.contains(&ack.event_id) {
                written.done.push(ack);
            } else if still_leased.contains(&ack.event_id) {
                written.busy.push(ack.event_id);
            }
        }
        written
    }

    /// Counts an event's deliveries to subscribers, once acknowledged.
    fn count_fanned_out(&self, ack: &Ack) {
        let Outcome::FannedOut(took) = &ack.outcome else { return };
        for (subscriber, took) in took {
            match took {
                Took::Delivered => {
                    self.metrics.delivered(&ack.event_type, subscriber, ack.created_at)
                }
                Took::Failed(failed) => {
                    let dead = failed.rejected || failed.max_attempts <= 1;
                    if dead {
                        tracing::warn!(
                            event_id = %ack.event_id,
                            %subscriber,
                            "outbox event is dead for this subscriber: its copy waits in the \
                             dead letters"
                        );
                    }
                    self.metrics.failed(&ack.event_type, subscriber, dead, failed.rejected);
                }
                Took::Snoozed(_) => self.metrics.snoozed(&ack.event_type, subscriber),
                Took::Copied => {}
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

/// What one kind of acknowledgement wrote.
#[derive(Default)]
struct Written<'a> {
    done: Vec<&'a Ack>,
    /// Rows someone else had locked: still held, to try again.
    busy: Vec<Uuid>,
    /// Rows that died of the outcome written.
    dead: HashSet<Uuid>,
}

/// The copy a subscriber's outcome leaves (see [`store::fan_out`]).
fn copy((subscriber, took): &(Arc<str>, Took)) -> (&str, Copy<'_>) {
    let copy = match took {
        Took::Delivered => Copy::Taken,
        Took::Failed(failed) => Copy::Due {
            delay: failed.retry_in,
            attempts: 1,
            error: Some(&failed.error),
            dead: failed.rejected || failed.max_attempts <= 1,
        },
        Took::Snoozed(delay) => Copy::Due { delay: *delay, attempts: 0, error: None, dead: false },
        Took::Copied => Copy::Due { delay: Duration::ZERO, attempts: 0, error: None, dead: false },
    };
    (subscriber, copy)
}

/// `(event ids, tokens)` of some acknowledgements, for one statement.
fn columns(held: &[(&Ack, Uuid)]) -> (Vec<Uuid>, Vec<Uuid>) {
    held.iter().map(|(ack, token)| (ack.event_id, *token)).unzip()
}

/// Runs an acknowledgement statement, retrying database errors for up to `patience`. Giving up
/// loses no event: the rows' leases expire and they are delivered again.
async fn retrying<T, F, Fut>(what: &str, patience: Duration, mut statement: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let started = Instant::now();
    let mut delay = Duration::from_millis(50);
    loop {
        match statement().await {
            Ok(done) => return Some(done),
            Err(error) if started.elapsed() + delay < patience => {
                tracing::warn!(error = %ErrorChain(&error), retry_in = ?delay, "outbox acknowledgement ({what}) failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(error) => {
                tracing::error!(error = %ErrorChain(&error), "outbox acknowledgement ({what}) failed; the rows will be redelivered");
                return None;
            }
        }
    }
}
